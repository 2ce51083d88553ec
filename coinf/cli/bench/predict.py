"""``coinf bench predict --bundle B``: predicted vs measured latency of every candidate slice.

The predictors come from the synthetic single-layer sweep (trained here, or loaded from a device
profile with ``--profile``), so they never saw this model. A slice's prediction is the sum of its
nodes' predictions plus one empty-run overhead.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import onnx

from coinf.cli.bench import emit, median, progress
from coinf.errors import UserError


def run(args: argparse.Namespace) -> int:
    from coinf.convert.bundle import Bundle
    from coinf.device.features import node_features
    from coinf.device.predict import Predictor
    from coinf.device.profile import DeviceProfile
    from coinf.device.sweep import make_session, random_feeds, run_sweep, time_session

    bundle = Bundle.load(args.bundle)
    if args.profile:
        pred = DeviceProfile.load(args.profile).predictor
        if pred is None:
            raise UserError(f"{args.profile} has no predictor; run `coinf profile --train`")
    else:
        from coinf.device.predict import require_training_deps

        require_training_deps()
        samples, overhead = run_sweep(args.scale, args.seed, args.threads, 5, progress)
        pred = Predictor.train(samples, threads=args.threads, run_overhead_ms=overhead)
    feats = node_features(onnx.load(str(bundle.model_path)))
    per_style = {s: pred.predict_nodes(feats, s) for s in ("coinf", "neurosurgeon")}
    rows: list[dict[str, Any]] = []
    for cand in bundle.candidates:
        for side, part in (("head", cand.head), ("tail", cand.tail)):
            if part.file is None or not part.nodes:
                continue
            sess = make_session(str(bundle.path(part.file)), args.threads)
            measured = time_session(sess, random_feeds(sess), 2, args.repeats, 5.0)
            row = {"slice": f"{cand.id}.{side}", "nodes": len(part.nodes),
                   "measured_ms": measured}
            for style, p in per_style.items():
                row[f"{style}_ms"] = sum(p.get(n, 0.0) for n in part.nodes) + pred.run_overhead_ms
            rows.append(row)
            progress(f"{row['slice']}: measured {measured:.3f} ms, predicted "
                     f"{row['coinf_ms']:.3f} ms")

    def within(style: str, tol: float) -> float:
        ok = [abs(r[f"{style}_ms"] / r["measured_ms"] - 1) <= tol for r in rows
              if r["measured_ms"] > 0]
        return sum(ok) / len(ok) if ok else float("nan")

    emit({"model": Path(bundle.root).name, "slices": len(rows),
          "within_10pct": within("coinf", 0.10),
          "within_10pct_neurosurgeon": within("neurosurgeon", 0.10),
          "within_25pct": within("coinf", 0.25),
          "median_abs_rel_error": median([abs(r["coinf_ms"] / r["measured_ms"] - 1)
                                          for r in rows if r["measured_ms"] > 0]),
          "r2": pred.r2_table(), "per_slice": rows})
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bundle", required=True)
    parser.add_argument("--profile", help="device profile holding trained predictors "
                                          "(default: run the sweep here)")
    parser.add_argument("--scale", type=float, default=0.5, help="sweep size when training here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="(output is always JSON)")
    parser.set_defaults(func=run)
