"""``coinf bench runtime --bundle B``: onnxruntime vs LiteRT on every slice of a bundle.

For each candidate's head and tail: the ONNX slice in onnxruntime and its TFLite twin in LiteRT,
same thread count, runs interleaved (ort, litert, litert, ort, ...) so machine noise hits both
alike; medians. ``max_rel_err`` is the largest ``max |litert - ort| / max |ort|`` over the
candidate's shipped TFLite slices, on the whole model's tensors for seeded random inputs.
``converted``/``total`` count slices (heads and tails) that ship a verified TFLite file.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from coinf.cli.bench import emit, median, options, progress


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bundle", required=True, help="bundle with TFLite slices "
                        "(coinf split --tflite, or coinf convert tflite)")
    options.add_threads(parser)
    options.add_repeats(parser, 15)
    options.add_warmup(parser, 3)
    options.add_json(parser)
    parser.set_defaults(func=run)


def _time_pair(a: Any, b: Any, feeds: dict[str, Any], warmup: int, repeats: int,
               ) -> tuple[float, float]:
    """Median ms of ``a.run`` and ``b.run``, interleaved, alternating which goes first."""
    ta: list[float] = []
    tb: list[float] = []
    for i in range(warmup + repeats):
        order = ((a, ta), (b, tb)) if i % 2 == 0 else ((b, tb), (a, ta))
        for sess, times in order:
            t0 = time.perf_counter()
            sess.run(None, feeds)
            if i >= warmup:
                times.append((time.perf_counter() - t0) * 1e3)
    return median(ta), median(tb)


def run(args: argparse.Namespace) -> int:
    from coinf.bundle import Bundle
    from coinf.convert.tflite import rel_err
    from coinf.convert.verify import reference
    from coinf.deps import litert_interpreter, litert_package
    from coinf.device.litert import open_litert, tflite_entry
    from coinf.device.sweep import make_session
    from coinf.errors import UserError

    if args.threads < 1 or args.repeats < 1 or args.warmup < 0:
        raise UserError("--threads and --repeats must be >= 1, --warmup >= 0")
    litert_interpreter()  # MissingDependency when no LiteRT runtime is installed
    bundle = Bundle.load(args.bundle)
    if "tflite" not in bundle.meta:
        raise UserError(f"bundle {args.bundle} has no TFLite slices; run "
                        f"`coinf convert tflite {args.bundle}` first")
    _, ref, _ = reference(bundle)
    rows = []
    converted = total = 0
    left_out = []
    for k, cand in enumerate(bundle.candidates):
        row: dict[str, Any] = {"id": cand.id, "label": cand.label}
        errs: list[float] = []
        for part_name in ("head", "tail"):
            part = cand.head if part_name == "head" else cand.tail
            row[f"{part_name}_ms_ort"] = row[f"{part_name}_ms_litert"] = None
            if part.file is None:
                continue
            total += 1
            ort = make_session(str(bundle.path(part.file)), args.threads)
            feeds = {i.name: ref[i.name] for i in ort.get_inputs()}  # type: ignore[attr-defined]
            if tflite_entry(cand, part_name) is None:
                why = cand.extra.get("tflite", {}).get(part_name, {}).get("error", "not converted")
                left_out.append({"id": cand.id, "part": part_name, "reason": why})
                row[f"{part_name}_ms_ort"] = _time_pair(ort, ort, feeds, args.warmup,
                                                        args.repeats)[0]
                continue
            converted += 1
            lite = open_litert(bundle, cand, part_name, args.threads)
            names = [o.name for o in ort.get_outputs()]  # type: ignore[attr-defined]
            want = ort.run(names, feeds)  # type: ignore[attr-defined]
            got = lite.run(names, feeds)
            errs += [rel_err(g, w) for g, w in zip(got, want, strict=True)]
            row[f"{part_name}_ms_ort"], row[f"{part_name}_ms_litert"] = _time_pair(
                ort, lite, feeds, args.warmup, args.repeats)
        row["max_rel_err"] = max(errs) if errs else None
        rows.append(row)
        progress(f"{k + 1}/{len(bundle.candidates)} {cand.id}: head ort {row['head_ms_ort']} "
                 f"litert {row['head_ms_litert']}, tail ort {row['tail_ms_ort']} "
                 f"litert {row['tail_ms_litert']}")
    ratios = [r[f"{p}_ms_litert"] / r[f"{p}_ms_ort"] for r in rows for p in ("head", "tail")
              if r[f"{p}_ms_litert"] is not None and r[f"{p}_ms_ort"]]
    shipped = [r["max_rel_err"] for r in rows if r["max_rel_err"] is not None]
    emit({
        "model": str(bundle.meta.get("source", {}).get("file", bundle.root.name)),
        "candidates": rows,
        "converted": converted,
        "total": total,
        "converted_ratio": round(converted / total, 4) if total else None,
        "max_rel_err": max(shipped) if shipped else None,
        "median_litert_over_ort": median(ratios) if ratios else None,
        "left_out": left_out,
        "threads": args.threads, "repeats": args.repeats, "warmup": args.warmup,
        "litert_package": litert_package(),
        "goal": {"converted_ratio": ">= 0.95", "max_rel_err": "<= 1e-4"},
    })
    return 0
