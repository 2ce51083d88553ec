"""``coinf compress BUNDLE --data FILE_OR_DIR [--cut CUT]``: train learned bottlenecks
(docs/BOTTLENECK.md). Needs torch and onnx2torch (the ``compress`` extra), on the laptop.
Without ``--cut`` it picks the cuts worth training (:func:`coinf.convert.bottleneck.pick_cuts`)
and trains three rate points at each, their quantisation steps chosen from the cut's statistics
and calibration (:mod:`coinf.convert.bottleneck_rate`), within ``--time-limit`` (25 min by
default). ``--remeasure --test FILE_OR_DIR`` measures a cut's registered ones again on other
held-out feeds, without training (onnxruntime only)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from coinf.cli import argtypes
from coinf.errors import InputError, ModelError

DEFAULT_LAMBDAS = (1e-6,)
#: without --cut: how many cuts and the time for all of them (the rate points' gains and lambdas
#: come from a sweep at each cut, convert/bottleneck_rate.py)
AUTO_CUTS = 2
AUTO_TIME_LIMIT_S = 1500.0
#: without --cut: full resolution, a latent as wide as the cut's channels up to this many (a
#: rotation, no fewer dimensions: the design that met the goal on MobileNetV2; at its c023 a
#: strided 16-wide latent kept 22 % of the answers, a 32-wide one of 64 channels 67 %)
AUTO_MAX_LATENT = 64


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", help="split bundle directory (made by `coinf split`)")
    parser.add_argument("--cut", metavar="CUT",
                        help="candidate id whose one crossing tensor the bottleneck compresses "
                        "(default: pick the --cuts most worth it)")
    parser.add_argument("--cuts", type=argtypes.integer(1, 16), default=AUTO_CUTS,
                        help="without --cut: how many cuts to train at, fewest crossing bytes "
                        f"first among those with at most half the FLOPs in the head (default "
                        f"{AUTO_CUTS})")
    parser.add_argument("--data", default=None, metavar="FILE_OR_DIR",
                        help="unlabelled feeds: an .npz (per model input (N, *shape) or N "
                             "along its batch axis, exactly its dtype) or a folder of them")
    parser.add_argument("--test", default=None, metavar="FILE_OR_DIR",
                        help="held-out feeds to measure on (default: the last eighth of --data)")
    parser.add_argument("--remeasure", action="store_true",
                        help="no training: measure the cut's learned bottlenecks again on "
                             "--test and update their figures in the bundle")
    parser.add_argument("--tolerance", type=argtypes.number(0, 100, lo_open=True),
                        default=1.0, metavar="PP",
                        help="quality loss the points must be shown within (95 %% bound; "
                        "default %(default)s pp, the policy's default): sets how many feeds "
                        "are held out to measure them")
    parser.add_argument("--lambda", dest="lams", action="append",
                        type=argtypes.number(0), metavar="L",
                        help="rate weight per bit of the latent (repeatable: one operating "
                             f"point each; default {DEFAULT_LAMBDAS[0]:g})")
    parser.add_argument("--latent", type=argtypes.integer(1, 1024), default=None,
                        help="latent channels (default 16 with --cut; without, the cut's "
                        f"channels up to {AUTO_MAX_LATENT})")
    parser.add_argument("--hidden", type=argtypes.integer(1, 1024), default=48,
                        help="channels of the encoder's and decoder's hidden layers (default 48)")
    parser.add_argument("--stride", type=argtypes.integer(1, 4), default=None,
                        help="spatial downsampling of the latent (default 2 with --cut, 1 "
                        "without)")
    parser.add_argument("--gain", dest="gains", action="append",
                        type=argtypes.number(0, 1e4, lo_open=True), metavar="G",
                        help="initial latent scale: 1 / quantisation step in principal-component "
                             "units (repeatable: one point each with each lambda; default 16 "
                             "with --cut, else three from a sweep of the cut's rate and "
                             "output error against its calibrated packings)")
    parser.add_argument("--steps", type=argtypes.positive_int, default=1500,
                        help="training steps per lambda (default 1500)")
    parser.add_argument("--batch", type=argtypes.integer(1, 4096), default=16,
                        help="feeds per step (default 16)")
    parser.add_argument("--lr", type=argtypes.number(0, 1, lo_open=True), default=1e-3,
                        help="peak learning rate (default 1e-3)")
    parser.add_argument("--time-limit", type=argtypes.seconds, default=None, metavar="S",
                        help="stop training after S seconds in all (the points are still "
                             "exported; --resume continues them; default: none with --cut, "
                             f"else {AUTO_TIME_LIMIT_S:g} s)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the checkpoints of an earlier run with the same "
                             "settings")
    parser.add_argument("--work", default=None, metavar="DIR",
                        help="checkpoints and exports (default ~/.cache/coinf/compress/...)")
    parser.add_argument("--threads", type=argtypes.threads, default=1,
                        help="torch threads (default 1)")
    parser.add_argument("--seed", type=argtypes.seed, default=0)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from coinf.bundle import Bundle
    from coinf.cli.paths import writable_dir
    from coinf.cli.progress import Bar
    from coinf.convert import bottleneck as bn
    from coinf.deps import require, require_full

    if args.remeasure:
        return _remeasure(args)
    if args.data is None:
        raise InputError("--data is required to train (or --remeasure --test FILE to measure "
                         "the registered bottlenecks again)")
    bundle = Bundle.load(args.bundle)
    auto = args.cut is None
    if auto:
        cuts = [c.id for c in bn.pick_cuts(bundle, args.cuts)]
    else:
        bn.check_cut(bundle, args.cut)
        cuts = [args.cut]
    data = bn.load_data(bundle, args.data, "--data")
    test = bn.load_data(bundle, args.test, "--test", bn.MIN_TEST) if args.test else None
    train, held = bn.split_data(data, test, tolerance_pp=args.tolerance)
    lams = list(dict.fromkeys(args.lams or (() if auto else DEFAULT_LAMBDAS)))
    gains = list(dict.fromkeys(args.gains or (() if auto else (16.0,))))
    limit = args.time_limit if args.time_limit is not None or not auto else AUTO_TIME_LIMIT_S
    require_full("coinf.convert.bottleneck_train")
    require("torch", "compress", "coinf compress")
    require("onnx2torch", "compress", "coinf compress")
    import torch

    from coinf.convert import bottleneck_train as bt

    torch.set_num_threads(args.threads)
    stride = args.stride or (1 if auto else 2)
    base = bt.Config(lam=0.0, latent=args.latent or 16, hidden=args.hidden, stride=stride,
                     steps=args.steps, batch=args.batch, lr=args.lr, seed=args.seed,
                     gain=gains[0] if gains else 16.0)
    n_tr, n_te = len(next(iter(train.values()))), len(next(iter(held.values())))
    points_per_cut = (len(lams) or 1) * (len(gains) or 3)
    print(f"training {points_per_cut} bottleneck(s) at {', '.join(cuts)} on {n_tr} feeds, "
          f"measuring on {n_te} held out"
          + ("" if limit is None else f", within {limit:g} s"), file=sys.stderr)
    if auto and not gains:
        _note_uncalibrated(bundle)
    began, trained = time.monotonic(), 0
    for k, cut in enumerate(cuts):
        if auto:
            cand = bundle.candidate(cut)
            share = cand.head.flops / max(bundle.candidates[-1].head.flops, 1)
            print(f"cut {k + 1} of {len(cuts)}: {cut} ({cand.label}; crossing "
                  f"{cand.crossing_bytes} B, {100 * share:.0f} % of the FLOPs in the head)",
                  file=sys.stderr)
        left = None if limit is None else max(
            (limit - (time.monotonic() - began)) / (len(cuts) - k), 1.0)
        work = writable_dir(_work_dir(args, bundle, cut, auto), "--work")
        cfg = _config_at(base, cut, bundle.candidate(cut).crossing[0].shape,
                         auto and args.latent is None)
        try:
            points, notes = bt.compress(bundle, cut, train, held, lams, cfg, work,
                                        args.resume, left, Bar(), gains, args.tolerance,
                                        lambda line: print(line, file=sys.stderr))
        except (NotImplementedError, ModelError) as exc:  # a tail torch cannot take
            if not auto:
                if isinstance(exc, ModelError):
                    raise
                raise InputError(f"--cut {cut}: {exc}") from None
            print(f"note: skipped {cut}: {exc}", file=sys.stderr)
            continue
        bundle = Bundle.load(bundle.root)
        trained += len(points)
        for line in _table(points, bundle.candidate(cut).crossing_bytes):
            print(line)
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
        print(f"bundle {bundle.root}: {len(points)} learned bottleneck(s) at {cut} (crossing "
              f"{bundle.candidate(cut).crossing_bytes} B float32); {LEGEND}")
    if not trained:
        raise InputError(f"no cut of {', '.join(cuts)} could be trained (see the notes above); "
                         f"name another with --cut")
    return 0


def _note_uncalibrated(bundle: Any) -> None:
    """Say so when ``bundle`` has no task metric to choose the rate points by."""
    from coinf.convert.bottleneck_rate import FALLBACK_REL_L2, calibration_metric

    if calibration_metric(bundle) is None:
        print(f"note: {bundle.root} was never calibrated with a task metric: the rate points "
              f"are chosen by {100 * FALLBACK_REL_L2:g} % output error, usually far more "
              f"bytes than the task needs; run `coinf calibrate BUNDLE --data LABELLED.npz "
              f"--metric M --candidates CUT` first to choose them by the task's own loss",
              file=sys.stderr)


def _table(points: Sequence[Any], crossing_bytes: int) -> list[str]:
    """The summary table the command prints (a task-loss column when the points have one)."""
    loss = any(p.task_loss_pp is not None for p in points)
    lines = [f"{'lambda':>8}  {'gain':>5}  {'code':>14}  {'bytes/frame':>11}  {'ratio':>6}  "
             f"{'agreement':>9}  " + (f"{'task loss':>9}  " if loss else "") + "enc MFLOPs"]
    for p in points:
        ratio = crossing_bytes / max(p.mean_bytes, 1.0)
        cell = "" if not loss else ("        -  " if p.task_loss_pp is None
                                    else f"{p.task_loss_pp:6.2f} pp  ")
        lines.append(f"{p.lam:8g}  {p.gain:5g}  {'x'.join(map(str, p.code_shape[1:])):>14}  "
                     f"{p.mean_bytes:11.1f}  {ratio:6.0f}  {100 * p.agreement:8.1f}%  {cell}"
                     f"{p.flops / 1e6:10.2f}")
    return lines


#: what the table's quality columns mean
LEGEND = ("on the held-out feeds, agreement = top-1 agreement with the original model (a "
          "classifier; else 1 - its outputs' normalised squared error), task loss = the "
          "calibrated metric's loss against the unpacked model")


def _config_at(base: Any, cut: str, shape: tuple[int, ...], widest: bool) -> Any:
    """``base`` for ``cut``'s crossing of ``shape``: the latent as wide as its channels (up to
    :data:`AUTO_MAX_LATENT`) when ``widest``, else never wider than a patch's values (noted)."""
    patch = shape[1] * base.stride ** (len(shape) - 2)  # values a latent column sees
    if widest:
        return dataclasses.replace(base, latent=min(shape[1], AUTO_MAX_LATENT))
    if base.latent <= patch:
        return base
    print(f"note: {cut}: latent {base.latent} > the {patch} values of a {base.stride}-wide "
          f"patch of its {shape[1]} channels; latent {patch} there", file=sys.stderr)
    return dataclasses.replace(base, latent=patch)


def _work_dir(args: argparse.Namespace, bundle: Any, cut: str, auto: bool) -> Path:
    """Checkpoints and exports: ``--work`` (per cut below it without ``--cut``) or the cache."""
    from coinf.convert import bottleneck_train as bt

    if args.work is None:
        return bt.default_work_dir(bundle, cut)
    return Path(args.work) / cut if auto else Path(args.work)


def _remeasure(args: argparse.Namespace) -> int:
    from coinf.bundle import Bundle
    from coinf.cli.progress import Bar
    from coinf.convert import bottleneck as bn

    if args.test is None:
        raise InputError("--remeasure needs --test FILE_OR_DIR (the held-out feeds)")
    if args.data is not None or args.lams or args.resume:
        raise InputError("--remeasure trains nothing: drop --data, --lambda and --resume")
    if args.cut is None:
        raise InputError("--remeasure needs --cut CUT (the cut whose learned bottlenecks to "
                         "measure again)")
    bundle = Bundle.load(args.bundle)
    bn.check_cut(bundle, args.cut)
    test = bn.load_data(bundle, args.test, "--test", bn.MIN_TEST)
    points = bn.remeasure(bundle, args.cut, test, Bar())
    for line in _table(points, bundle.candidate(args.cut).crossing_bytes):
        print(line)
    print(f"bundle {bundle.root}: {len(points)} learned bottleneck(s) at {args.cut} measured "
          f"again on {points[0].test_feeds} held-out feeds (latent packing: "
          + ", ".join(f"{p.lam:g} {p.latent_bytes:.0f} B" for p in points) + f"); {LEGEND}")
    return 0
