"""``coinf convert tflite BUNDLE``: add verified float32 TFLite heads and tails to a bundle.

Every candidate's ONNX slices are converted (onnx2tf, TF-free ``flatbuffer_direct``), checked
against onnxruntime and composed against the whole model; a slice that fails is left out with its
reason in the manifest (docs/BUNDLE.md, "TFLite slices"). ``coinf split --tflite`` does the same
right after splitting.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from coinf.cli import argtypes
from coinf.errors import UserError


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="format", metavar="FORMAT")
    tfl = sub.add_parser("tflite", help="add verified TFLite slices to a bundle",
                         description=__doc__.split("\n\n")[0] if __doc__ else None)
    tfl.add_argument("bundle", nargs="?", help="bundle directory (from `coinf split`)")
    tfl.add_argument("--candidates", metavar="IDS",
                     help="comma-separated candidate ids to convert (default: all)")
    tfl.add_argument("--install-converter", action="store_true",
                     help="first pip-install onnx2tf 2.6.9 (without its Python >= 3.12 pin) "
                          "and its dependencies into this environment")
    tfl.add_argument("--python", metavar="PY",
                     help="run the converter with this interpreter (one that has onnx2tf)")
    tfl.add_argument("--timeout", type=argtypes.seconds, default=600.0, metavar="S",
                     help="seconds one slice may take to convert (default %(default)s)")
    tfl.set_defaults(func=run)
    comp = sub.add_parser("compressors", help="attach a compressor set (autoencoders) to a bundle",
                          description="Check a compressor set (`coinf models compressors -o "
                          "DIR`) against a bundle split from its backbone.onnx, copy it into "
                          "the bundle and record it in the manifest (the bundle's identity "
                          "changes: every device needs the same compressors).")
    comp.add_argument("bundle", nargs="?",
                      help="bundle directory (`coinf split DIR/backbone.onnx`)")
    comp.add_argument("set", nargs="?", help="compressor set directory (with index.json)")
    comp.set_defaults(func=run_compressors)

    def usage(args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(func=usage)


def print_summary(summary: Any, out: Any = sys.stdout) -> None:
    """The per-candidate table and the converted/total line."""
    rows = [("id", "head", "tail"), *summary.rows()]
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    for r in rows:
        print(f"{r[0].ljust(widths[0])}  {r[1].ljust(widths[1])}  {r[2]}".rstrip(), file=out)
    print(f"\ntflite       {summary.converted}/{summary.total} slices converted and verified "
          f"(within 1e-4 relative of onnxruntime) in {summary.seconds:.1f} s", file=out)
    left = summary.total - summary.converted
    if left:
        print(f"left out     {left} slice(s): they run with onnxruntime (reasons above and in "
              "the manifest)", file=out)


def convert_tflite(bundle_dir: str, candidates: str | None = None, python: str | None = None,
                   install: bool = False, timeout: float = 600.0) -> Any:
    """Shared by ``coinf convert tflite`` and ``coinf split --tflite``."""
    from coinf.bundle import Bundle
    from coinf.cli.progress import Bar
    from coinf.convert.tflite import convert_bundle, install_converter

    bundle = Bundle.load(bundle_dir)
    if install:
        print("installing the converter (onnx2tf 2.6.9) ...", file=sys.stderr, flush=True)
        install_converter()
    ids = [c.strip() for c in candidates.split(",") if c.strip()] if candidates else None
    if timeout <= 0:
        raise UserError(f"--timeout must be > 0 s, got {timeout}")
    return convert_bundle(bundle, candidates=ids, python=python, progress=Bar(),
                          timeout_s=timeout)


def run(args: argparse.Namespace) -> int:
    if not args.bundle:
        raise UserError("usage: coinf convert tflite BUNDLE [--candidates IDS] "
                        "[--install-converter] [--python PY]")
    summary = convert_tflite(args.bundle, args.candidates, args.python, args.install_converter,
                             args.timeout)
    print_summary(summary)
    return 0


def run_compressors(args: argparse.Namespace) -> int:
    """``coinf convert compressors BUNDLE DIR``."""
    from coinf.convert.compressors import attach

    if not args.bundle or not args.set:
        raise UserError("usage: coinf convert compressors BUNDLE SET_DIR")
    bundle = attach(args.bundle, args.set)
    for comp in bundle.compressors():
        sizes = ", ".join(f"{k} {v} B" for k, v in sorted(comp.code_bytes.items()))
        accs = ", ".join(f"{k} {v:.4f}" for k, v in sorted(comp.accuracy.items()))
        print(f"{comp.label:14s} code {list(comp.code.shape)} ({sizes}); accuracy {accs}")
    print(f"\nbundle {bundle.root}: {len(bundle.compressors())} compressor(s) attached, "
          f"identity {bundle.identity}")
    return 0
