"""``coinf bench rate``: bytes against task-quality loss for every way of sending the model's work.

Two families of points, measured on the same real inputs with the task's own metric:

* **offload**: the model input (the handheld-only candidate) through every standard codec x
  quality (JPEG, WebP, PNG for images; PCM16, FLAC for audio), the quantizing packings and raw;
* **split**: every packing at every chosen cut (by default the cuts with the fewest crossing
  bytes, where a split could beat a codec at all).

* **learned**: every learned bottleneck in the bundle (``coinf compress``), its code sent as
  ``gN+latent`` (:mod:`coinf.cli.bench.rate_learned`).

``summary`` gives, at the tolerance (1 pp by default, the measured loss), the fewest bytes each
family needs: ``best_codec_bytes`` (a standard codec on the input), ``best_split_bytes`` (any
packing at a cut), ``best_input_packing_bytes`` (q/qz on the input) and ``best_learned_bytes``
(None without learned bottlenecks). ``--png`` draws the
rate-quality plot (bytes on a log axis). With ``--model NAME`` a pretrained model of
``coinf models list`` is built, split and fed its own real inputs.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from coinf.cli import argtypes
from coinf.cli.bench import emit, options, progress
from coinf.errors import InputError


def register(parser: argparse.ArgumentParser) -> None:
    options.add_json(parser)
    parser.add_argument("--model", default=None,
                        help="a pretrained model (`coinf models list`): built, split and fed "
                             "its own real inputs")
    parser.add_argument("--bundle", default=None, help="any bundle (with --data)")
    options.add_data(parser)
    options.add_limit(parser)
    parser.add_argument("--samples", type=argtypes.positive_int, default=300,
                        help="with --model: real inputs to make (default %(default)s)")
    parser.add_argument("--metric", default=None,
                        help="quality metric (see coinf calibrate --metric; --model: the "
                             "model's task metric)")
    parser.add_argument("--metric-output", action="append", default=[], metavar="NAME")
    parser.add_argument("--cuts", type=argtypes.positive_int, default=4,
                        help="split cuts measured: the N with the fewest crossing bytes "
                             "(default %(default)s)")
    parser.add_argument("--candidates", default=None,
                        help="comma-separated candidate ids instead of --cuts")
    options.add_tolerance(parser)
    options.add_png(parser, "the rate-quality plot")
    parser.add_argument("--work", default=None, metavar="DIR",
                        help="with --model: where the model and bundle are built "
                             "(default: a temporary folder)")
    parser.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    if (args.model is None) == (args.bundle is None):
        raise InputError("give either --model NAME or --bundle DIR --data FILE")
    if args.bundle is not None and args.data is None:
        raise InputError("--bundle needs --data FILE.npz (the bundle's own inputs)")
    for name in ("limit", "samples", "cuts"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise InputError(f"--{name} must be >= 1, got {value}")
    if not 0 <= args.tolerance <= 100:
        raise InputError(f"--tolerance must be in [0, 100] pp, got {args.tolerance}")
    if args.png:
        from coinf.cli.paths import writable_file

        writable_file(args.png, "--png", make_folder=False)
    if args.work:
        from coinf.cli.paths import writable_dir

        writable_dir(args.work, "--work")


def _prepare_model(args: argparse.Namespace, work: Path) -> tuple[Any, str, str | None, dict]:
    """Build the pretrained model, split it, write its real inputs: (bundle, data, metric,
    model info)."""
    from coinf.bundle import Bundle
    from coinf.models import pretrained, realdata

    spec = pretrained.spec_for(args.model)
    progress(f"building {spec.name} from {spec.package}=={spec.version}")
    onnx_path = pretrained.build(spec.name, work)
    from coinf.cli.commands.demo_prep import ensure_bundle

    out = ensure_bundle(onnx_path, work / f"{spec.name}.bundle", spec.post)
    data = work / realdata.data_file(spec.name, args.samples)
    if not data.exists():
        progress(f"making {args.samples} real inputs")
        realdata.write_npz(spec.name, data, args.samples, 0)
    info = {"name": spec.name, "package": spec.package, "version": spec.version,
            "license": spec.licence, "sha256": spec.sha256, "pretrained": True,
            "post": spec.post}
    if not args.metric_output and not args.metric:
        args.metric_output = list(spec.metric_outputs)
    return Bundle.load(out), str(data), args.metric or spec.metric, info


def _cands(bundle: Any, args: argparse.Namespace) -> list[Any]:
    if args.candidates:
        return [bundle.candidate(c) for c in args.candidates.split(",")]
    splits = [c for c in bundle.candidates if not (c.is_handheld_only or c.is_wearable_only)]
    splits.sort(key=lambda c: c.crossing_bytes)
    first = next(c for c in bundle.candidates if c.is_handheld_only)
    return [first, *splits[: args.cuts]]


def run(args: argparse.Namespace) -> int:
    from coinf.ble_protocol.packing import PackSpec
    from coinf.bundle import Bundle
    from coinf.convert import calibrate as cal
    from coinf.convert.metrics import parse_metric
    from coinf.convert.packcal import Options

    _check(args)
    with tempfile.TemporaryDirectory(prefix="coinf-rate-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        model: dict[str, Any] | None = None
        if args.model:
            bundle, data_path, metric_name, model = _prepare_model(args, work)
        else:
            bundle, data_path, metric_name = Bundle.load(args.bundle), args.data, args.metric
        data = cal.load_dataset(data_path, bundle, args.limit)
        metric = parse_metric(metric_name, args.metric_output, [t.name for t in bundle.outputs])
        opts = Options(metric=metric, tolerance_pp=args.tolerance)
        points = []
        criteria: dict[str, Any] = {}
        from coinf.convert.pool import calibrate_many

        cands = _cands(bundle, args)
        progress(f"calibrating {', '.join(c.id for c in cands)} on {len(data)} inputs ...")
        tables = calibrate_many(
            bundle.root, data_path,
            [(c.id, cal.DEFAULT_SPECS if c.is_handheld_only else cal.SPLIT_SPECS)
             for c in cands], opts, args.limit, progress)
        for cand in cands:
            rows = criteria[cand.id] = tables[cand.id]
            total = max(cand.head.flops + cand.tail.flops, 1)
            share = round(cand.head.flops / total, 4)  # of the model's compute on the wearable
            for r in rows:
                spec = PackSpec.parse(r["spec"])
                family = ("codec" if spec.is_media else "input") if cand.is_handheld_only \
                    else "split"
                points.append({"family": family, "cut": cand.id, "label": cand.label,
                               "wearable_share": share,
                               "packing": r["spec"], "method": _method(spec),
                               "bytes": r["mean_bytes"], "quality_loss": r["accuracy_drop_pp"],
                               "quality_loss_bound": 0.0 if r.get("exact") else
                               r["accuracy_drop_upper_pp"], "exact": bool(r.get("exact")),
                               "quality_loss_all": r.get("accuracy_drop_all_pp",
                                                         r["accuracy_drop_pp"]),
                               "encode_ms": r.get("encode_ms"), "decode_ms": r.get("decode_ms")})
            points.append({"family": "input" if cand.is_handheld_only else "split",
                           "cut": cand.id, "label": cand.label, "packing": "raw",
                           "wearable_share": share,
                           "method": "raw", "bytes": float(cand.crossing_bytes),
                           "quality_loss": 0.0, "quality_loss_bound": 0.0})
        from coinf.cli.bench.rate_learned import learned_points

        learned = learned_points(bundle, data, opts)
        if learned:
            progress(f"{len(learned)} learned bottleneck(s) measured")
        points += learned
        from coinf.convert.packrows import criterion_summary

        quality = criterion_summary(criteria)
        meta = {cal.META_KEY: {"data": data.name, "metric": metric.name, **quality}}
        line = cal.criterion_line(meta)
        if line:
            progress(line)
        result = {"bench": "rate", "bundle": str(bundle.root.name), "samples": len(data),
                  "data": data.name, "metric": metric.describe(), "tolerance_pp": args.tolerance,
                  "quality": {**quality, "text": line},
                  "points": points, "summary": summary(points, args.tolerance)}
        if model is not None:
            result["model"] = model
        if args.png:
            from coinf.cli.bench.rate_chart import plot_rate

            what = metric.name + (f" on {', '.join(metric.outputs)}" if metric.outputs else "")
            plot_rate(points, args.png, f"{model['name'] if model else bundle.root.name}: "
                      f"{len(data)} real inputs, task metric {what}", args.tolerance,
                      quality.get("criterion"))
            result["png"] = args.png
    emit(result)
    return 0


def _method(spec: Any) -> str:
    """The plot's line a packing belongs to."""
    if spec.is_media:
        return spec.codec
    return {"q": "q (bit planes + LZ4)", "qz": "qz (levels + zstd)",
            "ans": "ans (levels + rANS, calibrated priors)"}.get(spec.codec, spec.codec)


def summary(points: list[dict[str, Any]], tolerance: float) -> dict[str, Any]:
    """Fewest bytes of each family whose measured loss is within ``tolerance`` (None if
    none), the configuration that gives it, and whether its 95% bound establishes it."""
    out: dict[str, Any] = {}
    for key, family in (("best_codec", "codec"), ("best_split", "split"),
                        ("best_input_packing", "input"), ("best_learned", "learned")):
        ok = [p for p in points if p["family"] == family and p["quality_loss"] <= tolerance]
        best = min(ok, key=lambda p: p["bytes"]) if ok else None
        out[f"{key}_bytes"] = None if best is None else round(best["bytes"], 1)
        out[key] = None if best is None else {
            "cut": best["cut"], "packing": best["packing"],
            "quality_loss": best["quality_loss"],
            "established": best["quality_loss_bound"] <= tolerance}
    if out["best_codec_bytes"] and out["best_split_bytes"]:
        out["split_over_codec_bytes"] = round(out["best_split_bytes"] / out["best_codec_bytes"], 3)
    if out["best_codec_bytes"] and out["best_learned_bytes"]:
        out["learned_over_codec_bytes"] = round(
            out["best_learned_bytes"] / out["best_codec_bytes"], 3)
    return out
