"""``coinf models list``, ``coinf models build NAME|--all [--large] --out DIR`` and
``coinf models prune [MODEL] --out FILE`` (SMCD group-lasso pruning of a LeNet).

Listing reads the committed ONNX files with onnx only; torch is imported when building.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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
    p = sub.add_parser("prune", help="SMCD: group-lasso pruning of a LeNet into a smaller dense "
                                     "model (needs torch; docs/PRUNING.md)")
    p.add_argument("model", nargs="?", default=None, metavar="MODEL",
                   help="a coinf LeNet ONNX file (default: the zoo's trained lenet_digits)")
    p.add_argument("--out", required=True, type=Path, metavar="FILE", help="pruned .onnx to write")
    p.add_argument("--strength", type=float, default=3e-4, help="group lasso strength (lambda_g)")
    p.add_argument("--threshold", type=float, default=0.05,
                   help="relative unit contribution below which a unit is removed")
    p.add_argument("--epochs", type=int, default=30, help="sparsifying epochs")
    p.add_argument("--finetune-epochs", type=int, default=20, help="fine-tuning epochs")
    p.set_defaults(func=_prune)

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
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _build(args: argparse.Namespace) -> int:
    from coinf.models.zoo import ZOO, build, require_torch, spec_for

    if args.all == (args.name is not None):
        raise UserError(f"give one model NAME or --all (models: {', '.join(ZOO)})")
    names = list(ZOO) if args.all else [spec_for(args.name).name]
    if args.out.exists() and not args.out.is_dir():
        raise UserError(f"--out {args.out} exists and is not a directory")
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


def _prune(args: argparse.Namespace) -> int:
    from coinf.models.zoo import committed_path, require_torch

    src = Path(args.model) if args.model else committed_path("lenet_digits")
    if not src.is_file():
        raise UserError(f"MODEL {src}: no such file")
    if args.out.suffix != ".onnx" or args.out.is_dir():
        raise UserError(f"--out {args.out}: expected a file name ending in .onnx")
    require_torch()
    from coinf.models.pruning import PruneConfig, prune_lenet_file

    cfg = PruneConfig(strength=args.strength, threshold=args.threshold,
                      sparsify_epochs=args.epochs, finetune_epochs=args.finetune_epochs)
    meta = prune_lenet_file(src, args.out, cfg, progress=lambda m: print(m, file=sys.stderr))
    print(f"{args.out}: widths {meta['widths_before']} -> {meta['widths_after']}, test accuracy "
          f"{meta['test_accuracy_before']:.4f} -> {meta['test_accuracy']:.4f}")
    return 0
