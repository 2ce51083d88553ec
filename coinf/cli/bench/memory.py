"""``coinf bench memory --bundle B``: every head's measured peak RSS next to its prediction.

Each head runs in a fresh process (:mod:`coinf.device.memprofile`); ``predicted_mb`` is what the
planner would assume for the same head with no profile (weights + peak activations + the default
runtime overhead), so the error columns show how far the unprofiled prediction is off.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from coinf.cli import argtypes
from coinf.cli.bench import emit, options, progress
from coinf.cli.bench.fit_chart import Point, model_name, plot_fit


def register(parser: argparse.ArgumentParser) -> None:
    options.add_bundle(parser, required=True)
    options.add_threads(parser)
    parser.add_argument("--runs", type=argtypes.positive_int, default=2,
                        help="inferences per head process")
    parser.add_argument("--only", help="comma-separated candidate ids (default: every head)")
    options.add_png(parser, "every head's peak RSS")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from coinf.bundle import Bundle
    from coinf.device.memprofile import runtime_baseline_mb, slice_peak_rss_mb
    from coinf.errors import UserError
    from coinf.wearable.planner.memory import MemoryModel

    if not 1 <= args.threads <= 256 or args.runs < 1:
        raise UserError("--threads must be in [1, 256] and --runs >= 1")
    options.check_png(args.png)
    bundle = Bundle.load(args.bundle)
    wanted = {c.strip() for c in args.only.split(",")} if args.only else None
    known = {c.id for c in bundle.candidates}
    if wanted and wanted - known:
        raise UserError(f"--only: no candidate {sorted(wanted - known)} in {bundle.root}; it has "
                        f"{', '.join(sorted(known))}")
    model = MemoryModel(bundle, None, None)  # no profile: the unprofiled prediction
    heads = model.heads()
    progress("measuring the runtime baseline (empty model)")
    base = runtime_baseline_mb(args.threads)
    rows: list[dict[str, Any]] = []
    todo = [c for c in bundle.candidates if c.head.file is not None
            and (wanted is None or c.id in wanted)]
    for i, c in enumerate(todo):
        assert c.head.file is not None
        measured = slice_peak_rss_mb(bundle.path(c.head.file), args.threads, args.runs)
        h = heads[c.id]
        rows.append({"id": c.id, "label": c.label, "head_peak_rss_mb": measured,
                     "predicted_mb": round(h.predicted_mb, 2),
                     "weights_mb": round(h.weights_mb, 3),
                     "activations_mb": round(h.activations_mb, 3),
                     "error_mb": round(h.predicted_mb - measured, 2)})
        progress(f"{i + 1}/{len(todo)} {c.id}: measured {measured:.1f} MB, predicted "
                 f"{h.predicted_mb:.1f} MB")
    errs: list[float] = [abs(float(r["error_mb"])) for r in rows]
    result = {"bundle": str(bundle.root), "threads": args.threads,
              "runtime_baseline_mb": base, "default_overhead_mb": model.overhead_mb,
              "median_abs_error_mb": round(statistics.median(errs), 2) if errs else None,
              "max_abs_error_mb": max(errs) if errs else None, "candidates": rows}
    if args.png:
        plot_fit([Point(r["id"], r["predicted_mb"], r["head_peak_rss_mb"]) for r in rows],
                 args.png, f"{model_name(bundle)}: each head's peak RSS in a fresh process, "
                 "predicted without a profile", "MB")
        result["png"] = args.png
    emit(result)
    return 0
