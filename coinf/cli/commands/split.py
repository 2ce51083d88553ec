"""``coinf split MODEL.onnx -o BUNDLE``: slice a model into a split bundle (docs/BUNDLE.md).

``coinf split --list BUNDLE`` prints a bundle's candidate table; ``--show ID`` one candidate.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from coinf.cli import argtypes
from coinf.cli.progress import Bar as _Bar
from coinf.errors import ModelError, UserError


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", help="the ONNX model to split")
    parser.add_argument("-o", "--output", metavar="BUNDLE", help="bundle directory to write")
    parser.add_argument("--verify", action="store_true",
                        help="check tail(head(x)) == model(x) for every candidate")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE",
                        help="value of a symbolic input dim (default 1), or of one axis of "
                             "one input whatever its symbol: INPUT[AXIS]=VALUE; repeatable")
    parser.add_argument("--freeze", action="append", default=[], metavar="NAME=VALUE",
                        help="make an input a constant (JSON value); If nodes it decides are "
                             "inlined; repeatable")
    parser.add_argument("--input-data", default=None, metavar="FILE.npz",
                        help="representative inputs (one feed, or N on a new leading axis): "
                             "they size symbolic dims and feed shape inference and --verify")
    parser.add_argument("--state", action="append", default=[], metavar="INPUT=OUTPUT",
                        help="a recurrent state pair (OUTPUT is fed back as INPUT); default: "
                             "detected by name; repeatable")
    parser.add_argument("--post", default=None, metavar="SPEC",
                        help="post-processing appended before splitting, so only what the app "
                             "needs comes back: topk:K, argmax, boxes:K (a YOLO-style detector)"
                             " or FILE.onnx (docs/BUNDLE.md)")
    parser.add_argument("--max-candidates", type=argtypes.integer(2), default=None, metavar="K",
                        help="keep at most K candidate cuts including the extremes (default 64)")
    parser.add_argument("--shared-weights", choices=("auto", "yes", "no"), default="auto",
                        help="store weights once in BUNDLE/weights.bin instead of in every "
                             "slice (auto: when self-contained slices would hold > 16 MB of "
                             "weights in all)")
    parser.add_argument("--tflite", action="store_true",
                        help="also write a verified float32 .tflite head and tail per candidate "
                             "(as `coinf convert tflite BUNDLE`; needs the tflite extra)")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing bundle at BUNDLE (refused otherwise)")
    parser.add_argument("--list", metavar="BUNDLE", help="print the candidate table of a bundle")
    parser.add_argument("--show", metavar="ID", help="with --list: print one candidate in full")
    parser.set_defaults(func=run)


def parse_dims(items: list[str]) -> dict[str, int]:
    dims: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().isdigit() or int(value) < 1:
            raise ModelError(f"--dim {item!r}: expected NAME=VALUE with VALUE a positive integer")
        dims[name.strip()] = int(value)
    return dims


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return str(n)


def _fmt_flops(n: int) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def table(bundle: Any) -> str:
    rows = [("id", "label", "tensors", "crossing", "head FLOPs", "tail FLOPs", "head nodes")]
    for c in bundle.candidates:
        rows.append((c.id, c.label[:32], str(len(c.crossing)), _fmt_bytes(c.crossing_bytes),
                     _fmt_flops(c.head.flops), _fmt_flops(c.tail.flops), str(len(c.head.nodes))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def run(args: argparse.Namespace) -> int:
    from coinf.bundle import Bundle

    if args.list:
        bundle = Bundle.load(args.list)
        if args.show:
            print(json.dumps(bundle.candidate(args.show).to_json(), indent=1))
        else:
            print(table(bundle))
        return 0
    if args.show:
        raise UserError("--show ID needs --list BUNDLE")
    if not args.model or not args.output:
        raise UserError("usage: coinf split MODEL.onnx -o BUNDLE [--verify] [--dim N=V] "
                         "[--max-candidates K]  (or coinf split --list BUNDLE)")
    if not Path(args.model).is_file():  # the error alone, before the first progress line
        raise UserError(f"{args.model}: no such model file (expected an .onnx file)")
    from coinf.convert.cuts import DEFAULT_MAX_CANDIDATES
    from coinf.convert.freeze import parse_freeze
    from coinf.convert.split import split_model
    from coinf.convert.state import parse_state

    dims = parse_dims(args.dim)
    freeze = parse_freeze(args.freeze)
    state = parse_state(args.state)
    if args.tflite:  # no converter: say so before splitting, not after
        from coinf.convert.tflite import converter_python

        converter_python()
    k = DEFAULT_MAX_CANDIDATES if args.max_candidates is None else args.max_candidates
    t0 = time.perf_counter()
    bundle = split_model(args.model, args.output, dims=dims, verify=args.verify,
                         progress=_Bar(), max_candidates=k, force=args.force,
                         freeze=freeze, input_data=args.input_data, state=state or None,
                         post=args.post, shared_weights={"auto": None, "yes": True, "no": False}[
                             args.shared_weights])
    summary = None
    if args.tflite:
        from coinf.cli.commands.convert import convert_tflite

        summary = convert_tflite(args.output)
        bundle = type(bundle).load(args.output)
    took = time.perf_counter() - t0
    stats = bundle.meta.get("stats", {})
    cross = [c.crossing_bytes for c in bundle.candidates[:-1]]
    print(table(bundle))
    print()
    print(f"model        {args.model}  ({stats.get('nodes')} nodes: "
          f"{stats.get('dynamic_nodes')} dynamic, {stats.get('constant_nodes')} constant)")
    print(f"total FLOPs  {_fmt_flops(int(stats.get('total_flops', 0)))}")
    print(f"candidates   {len(bundle.candidates)}  (crossing {_fmt_bytes(min(cross))} .. "
          f"{_fmt_bytes(max(cross))})")
    for name, spec in (bundle.meta.get("frozen") or {}).items():
        print(f"frozen       {name} = {spec['value']} ({spec['dtype']}); Session fills it")
    for pair in bundle.meta.get("state") or []:
        print(f"state        {pair['output']} -> {pair['input']} (lossless unless calibrated "
              "with --pack-state)")
    if args.verify:
        print("verified     all candidates: tail(head(x)) == model(x) within 1e-5"
              + (f" on {args.input_data}" if args.input_data else ""))
    if summary is not None:
        from coinf.cli.commands.convert import print_summary

        print()
        print_summary(summary)
    print(f"bundle       {args.output}  written in {took:.2f} s")
    return 0
