"""``coinf models list``, ``coinf models build NAME|--all [--large] --out DIR``,
``coinf models data NAME --out FILE.npz [-n N] [--seed S]`` (real calibration inputs of a
pretrained model), ``coinf models prune [MODEL] --out FILE`` (SMCD group-lasso pruning of a
LeNet) and ``coinf models compressors -o DIR`` (a jointly fine-tuned compressor set of
``digitnet``).

Listing reads the committed ONNX files with onnx only; torch is imported when building a zoo
model. Pretrained models (``coinf.models.pretrained``) are built from their pip packages without
torch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from coinf.cli import argtypes
from coinf.cli.paths import writable_dir, writable_file
from coinf.deps import require_full
from coinf.errors import UserError


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    ls = sub.add_parser("list", help="table of the zoo models and their committed files")
    ls.set_defaults(func=_list)
    b = sub.add_parser("build", help="rebuild models from their PyTorch builders (needs torch)")
    b.add_argument("name", nargs="?", metavar="NAME", help="model name (see `coinf models list`)")
    b.add_argument("--all", action="store_true", help="build every model")
    b.add_argument("--large", action="store_true", help="build the large variant (NAME_large.onnx)")
    b.add_argument("--out", required=True, type=Path, metavar="DIR", help="output directory")
    b.set_defaults(func=_build)
    d = sub.add_parser("data", help="real calibration inputs of a pretrained model (an .npz for "
                                    "`coinf calibrate --data`)")
    d.add_argument("name", metavar="NAME", help="pretrained model name (see `coinf models list`)")
    d.add_argument("--out", required=True, type=Path, metavar="FILE.npz", help="file to write")
    d.add_argument("-n", type=argtypes.positive_int, default=300,
                   help="number of feeds (default %(default)s)")
    d.add_argument("--seed", type=argtypes.seed, default=0,
                   help="random seed (default %(default)s)")
    d.set_defaults(func=_data)
    p = sub.add_parser("prune", help="SMCD: group-lasso pruning of a LeNet into a smaller dense "
                                     "model (needs torch; docs/PRUNING.md)")
    p.add_argument("model", nargs="?", default=None, metavar="MODEL",
                   help="a coinf LeNet ONNX file (default: the zoo's trained lenet_digits)")
    p.add_argument("--out", required=True, type=Path, metavar="FILE", help="pruned .onnx to write")
    p.add_argument("--strength", type=argtypes.number(0, 10, lo_open=True, hi_open=True),
                   default=3e-4, help="group lasso strength (lambda_g)")
    p.add_argument("--threshold", type=argtypes.number(0, 1, hi_open=True), default=0.05,
                   help="relative unit contribution below which a unit is removed")
    p.add_argument("--epochs", type=argtypes.count, default=30, help="sparsifying epochs")
    p.add_argument("--finetune-epochs", type=argtypes.count, default=20, help="fine-tuning epochs")
    p.set_defaults(func=_prune)
    c = sub.add_parser("compressors", help="a compressor set: Table-I autoencoders at the cuts of "
                                           "the digit CNN, fine-tuned jointly with one backbone "
                                           "and quantization-aware codes (needs torch; "
                                           "docs/PIPELINE.md)")
    c.add_argument("-o", "--out", required=True, type=Path, metavar="DIR",
                   help="directory to write backbone.onnx, <cut>-g<N>.enc/dec.onnx, index.json")
    c.add_argument("--model", default="digitnet", help="backbone (only digitnet has sets)")
    c.add_argument("--cuts", default="pool1,pool2", help="cuts (default %(default)s)")
    c.add_argument("--gammas", default="2,4,8", help="compression ratios (default %(default)s)")
    c.add_argument("--packings", default=None,
                   help="packings whose accuracy is measured (default: raw,q8,q4,q2,qz4,qz2)")
    c.add_argument("--epochs", type=int, default=None,
                   help="joint fine-tuning epochs (default 15)")
    c.add_argument("--freeze-backbone", action="store_true",
                   help="train the compressors only (the backbone stays the zoo model)")
    c.set_defaults(func=_compressors)

    def usage(args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(func=usage)


def _human(n: float) -> str:
    for unit in ("", "k", "M", "G"):
        if abs(n) < 1000:
            return f"{n:.0f}{unit}" if unit == "" else f"{n:.1f}{unit}"
        n /= 1000
    return f"{n:.1f}T"


def _list(args: argparse.Namespace) -> int:
    from coinf.models.zoo import ZOO, committed_path, model_stats

    header = ("name", "family", "input", "nodes", "params", "size", "papers")
    rows = [header]
    for name, spec in ZOO.items():
        path = committed_path(name)
        shape = " ".join(s.describe() for s in spec.inputs)
        if path.is_file():
            st = model_stats(path)
            facts = (str(st.nodes), _human(st.params), f"{st.size_bytes / 1e6:.2f} MB")
        else:
            facts = ("-", "-", "missing")
        rows.append((name, spec.family, shape, *facts, ",".join(spec.papers)))
    _table(rows)
    _list_pretrained()
    return 0


def _table(rows: Sequence[tuple[str, ...]], file: TextIO | None = None) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=file)


def _list_pretrained() -> None:
    """The pretrained models' table, after the zoo's and a blank line."""
    from coinf.models.pretrained import PRETRAINED, installed_version

    print("\npretrained (`coinf models build NAME --out DIR`, no torch; docs/MODELS.md):")
    rows: list[tuple[str, ...]] = [
        ("name", "task", "package", "licence", "sha256", "input", "installed")]
    for name, spec in PRETRAINED.items():
        have = installed_version(spec)
        state = "yes" if have == spec.version else "no" if have is None else f"no ({have})"
        shape = " ".join(s.describe() for s in spec.inputs)
        rows.append((name, spec.task, spec.requirement, spec.licence, spec.sha256[:12], shape,
                     state))
    _table(rows)


def _build(args: argparse.Namespace) -> int:
    from coinf.models.pretrained import PRETRAINED
    from coinf.models.zoo import ZOO, build, require_torch, spec_for

    if args.all == (args.name is not None):
        raise UserError(f"give one model NAME or --all (models: {', '.join(ZOO)}; pretrained: "
                        f"{', '.join(PRETRAINED)})")
    if args.name in PRETRAINED:
        return _build_pretrained(args)
    if args.name is not None and args.name not in ZOO:
        raise UserError(f"unknown model {args.name!r}; expected one of: {', '.join(ZOO)}, or a "
                        f"pretrained one: {', '.join(PRETRAINED)}")
    names = list(ZOO) if args.all else [spec_for(args.name).name]
    writable_dir(args.out, "--out")  # refused now, not after the build
    require_torch()
    for i, name in enumerate(names, 1):
        print(
            f"[{i}/{len(names)}] building {name}{' (large)' if args.large else ''}", file=sys.stderr
        )
        path = build(
            name, args.out, large=args.large, progress=lambda m: print("  " + m, file=sys.stderr)
        )
        print(path)
    return 0


def _build_pretrained(args: argparse.Namespace) -> int:
    from coinf.models.pretrained import build, require_package, spec_for

    if args.large:
        raise UserError(f"--large: {args.name!r} is a pretrained model; it has one size")
    writable_dir(args.out, "--out")  # refused now, not after the build
    spec = spec_for(args.name)
    require_package(spec)  # MissingDependency naming pkg==version, before any work
    print(f"building {spec.name} from {spec.requirement} ({spec.licence})", file=sys.stderr)
    print(build(spec.name, args.out))
    return 0


def _data(args: argparse.Namespace) -> int:
    from coinf.models.pretrained import spec_for
    from coinf.models.realdata import write_npz

    spec = spec_for(args.name)
    if args.n < 1:
        raise UserError(f"-n {args.n}: expected at least 1 feed")
    if args.out.suffix != ".npz" or args.out.is_dir():
        raise UserError(f"--out {args.out}: expected a file name ending in .npz")
    writable_file(args.out, "--out")
    source = write_npz(spec.name, args.out, args.n, args.seed)
    print(f"{args.out}: {args.n} feeds of {' '.join(s.describe() for s in spec.inputs)} "
          f"from {source}")
    print(f"calibrate with: coinf calibrate BUNDLE --data {args.out} --metric {spec.metric}"
          + "".join(f" --metric-output {o}" for o in spec.metric_outputs), file=sys.stderr)
    return 0


def parse_set_args(cuts: str, gammas: str, packings: str | None
                   ) -> tuple[list[str], list[int], list[str] | None]:
    """Validated ``--cuts``, ``--gammas``, ``--packings`` of a digitnet compressor set."""
    from coinf.ble_protocol.packing import PackSpec

    known_cuts, known_gammas = ("pool1", "pool2"), (2, 4, 8)
    cut_list = [c.strip() for c in cuts.split(",") if c.strip()]
    if not cut_list or any(c not in known_cuts for c in cut_list):
        raise UserError(f"--cuts {cuts!r}: expected a comma-separated list of "
                        f"{', '.join(known_cuts)}")
    try:
        gamma_list = [int(g) for g in gammas.split(",") if g.strip()]
    except ValueError:
        gamma_list = []
    if not gamma_list or any(g not in known_gammas for g in gamma_list):
        raise UserError(f"--gammas {gammas!r}: expected a comma-separated list of 2, 4, 8")
    if packings is None:
        return cut_list, gamma_list, None
    pack_list = [p.strip() for p in packings.split(",") if p.strip()]
    for p in pack_list:
        try:
            PackSpec.parse(p)
        except ValueError as exc:
            raise UserError(f"--packings: {exc}") from None
    if not pack_list:
        raise UserError("--packings is empty; expected e.g. raw,q4,q2")
    return cut_list, gamma_list, pack_list


def _compressors(args: argparse.Namespace) -> int:
    from coinf.models.zoo import require_torch

    if args.model != "digitnet":
        raise UserError(f"--model {args.model!r}: only 'digitnet' has compressor sets (the "
                        "LeNet compressors are per gamma: `coinf bench compress --model lenet`)")
    cuts, gammas, packings = parse_set_args(args.cuts, args.gammas, args.packings)
    if args.epochs is not None and args.epochs < 0:
        raise UserError(f"--epochs {args.epochs}: expected a count >= 0")
    writable_dir(args.out, "--out")  # refused now, not after the build
    require_torch()
    from coinf.convert.compressor_set import FINETUNE_EPOCHS, PACKINGS, export_set

    index = export_set(args.out, cuts=cuts, gammas=gammas,
                       epochs=FINETUNE_EPOCHS if args.epochs is None else args.epochs,
                       packings=packings or PACKINGS, freeze_backbone=args.freeze_backbone,
                       progress=lambda m: print(m, file=sys.stderr, flush=True))
    print(f"{args.out}: backbone.onnx and {len(index['compressors'])} compressors "
          f"(index.json; base accuracy {index['base_accuracy']['raw']:.4f})")
    return 0


def _prune(args: argparse.Namespace) -> int:
    from coinf.models.zoo import committed_path, require_torch

    require_full("coinf.models.pruning")  # the Pi wheel has neither the builders nor the zoo
    src = Path(args.model) if args.model else committed_path("lenet_digits")
    if not src.is_file():
        raise UserError(f"MODEL {src}: no such file")
    if args.out.suffix != ".onnx" or args.out.is_dir():
        raise UserError(f"--out {args.out}: expected a file name ending in .onnx")
    writable_file(args.out, "--out")
    import onnx

    try:  # a damaged file is the user's, not a protobuf traceback after torch loads
        onnx.load(str(src), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError, ...; as convert.graph does
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"MODEL {src} is not a readable ONNX model: {msg}") from None
    require_torch()
    from coinf.models.pruning import PruneConfig, prune_lenet_file

    cfg = PruneConfig(strength=args.strength, threshold=args.threshold,
                      sparsify_epochs=args.epochs, finetune_epochs=args.finetune_epochs)
    meta = prune_lenet_file(src, args.out, cfg, progress=lambda m: print(m, file=sys.stderr))
    print(f"{args.out}: widths {meta['widths_before']} -> {meta['widths_after']}, test accuracy "
          f"{meta['test_accuracy_before']:.4f} -> {meta['test_accuracy']:.4f}")
    return 0
