"""``coinf profile``: measure this device and write its device profile.

* ``--bundle B``: per-node latency (onnxruntime profiler) and directly measured head/tail slice
  latency of every candidate, stored under the bundle's identity;
* ``--train``: run the synthetic single-layer sweep and store the layer predictors (prints the
  held-out R² per layer kind);
* neither: print the profile.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from coinf.errors import UserError


def run(args: argparse.Namespace) -> int:
    from coinf.device.profile import DeviceProfile, default_profile_path, load_or_default

    out = Path(args.out) if args.out else default_profile_path(args.role)
    prof = load_or_default(args.role, out) if out.is_file() else DeviceProfile.default(args.role)
    if args.name:
        prof.name = args.name
    if args.threads is not None:
        if not 1 <= args.threads <= 256:
            raise UserError(f"--threads must be in [1, 256], got {args.threads}")
        prof.threads = args.threads
    if args.slowdown is not None:
        if not 0 < args.slowdown < 1e4:
            raise UserError(f"--slowdown must be in (0, 10000), got {args.slowdown}")
        prof.slowdown = args.slowdown
    if args.repeats < 1 or args.warmup < 0:
        raise UserError("--repeats must be >= 1 and --warmup >= 0")
    changed = args.threads is not None or args.slowdown is not None or bool(args.name)
    report: dict[str, object] = {"profile": str(out), "name": prof.name, "role": prof.role}
    if args.train:
        from coinf.device.predict import Predictor, require_training_deps

        require_training_deps()  # before the sweep, not after it
        from coinf.device.sweep import run_sweep

        scale = 0.1 if args.quick else args.scale
        samples, overhead = run_sweep(scale, args.seed, prof.threads, args.repeats,
                                      progress=lambda m: print(m, file=sys.stderr))
        prof.predictor = Predictor.train(samples, device=prof.name, threads=prof.threads,
                                         run_overhead_ms=overhead)
        report["samples"] = len(samples)
        report["r2"] = prof.predictor.r2_table()
        changed = True
    if args.bundle:
        from coinf.convert.bundle import Bundle
        from coinf.device.profile import profile_bundle

        bundle = Bundle.load(args.bundle)
        mp = profile_bundle(bundle, prof.threads, args.warmup, args.repeats,
                            slices=not args.no_slices,
                            progress=lambda m: print(m, file=sys.stderr))
        prof.models[bundle.identity] = mp
        errs = [abs(v) for v in mp.node_sum_error.values()]
        report.update({"bundle": str(bundle.root), "identity": bundle.identity,
                       "nodes": len(mp.nodes), "candidates": len(mp.candidates),
                       "median_abs_node_sum_error": sorted(errs)[len(errs) // 2] if errs else None})
        changed = True
    if changed:
        prof.save(out)
        print(json.dumps(report, indent=1))
    else:
        obj = prof.to_json()
        if obj.get("predictor"):
            obj["predictor"] = {"kinds": sorted(obj["predictor"]["kinds"]),
                                "r2": prof.predictor.r2_table() if prof.predictor else {}}
        obj["models"] = {k: {"nodes": len(v["nodes"]), "candidates": len(v["candidates"])}
                         for k, v in obj["models"].items()}
        obj["file"] = str(out) if out.is_file() else "(built-in default; not saved)"
        print(json.dumps(obj, indent=1))
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bundle", help="profile this bundle's nodes and candidate slices")
    parser.add_argument("--train", action="store_true",
                        help="run the synthetic layer sweep and train the latency predictors")
    parser.add_argument("--quick", action="store_true", help="tiny sweep (CI-size)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="sweep size multiplier (default 1: ~640 layers)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--role", choices=("wearable", "handheld"), default="wearable")
    parser.add_argument("--name", help="device name stored in the profile")
    parser.add_argument("--out", help="profile file (default: <config dir>/<role>-profile.json)")
    parser.add_argument("--threads", type=int, help="onnxruntime intra-op threads")
    parser.add_argument("--slowdown", type=float,
                        help="multiply every time (emulate a slower device)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs (median)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs first")
    parser.add_argument("--no-slices", action="store_true",
                        help="per-node times only; skip measuring each candidate's slices")
    parser.set_defaults(func=run)
