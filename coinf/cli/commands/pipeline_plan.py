"""``coinf plan BUNDLE --helpers CONFIG`` (or ``--pipeline CONFIG``, or ``--discover``): the
strategy a Session given these helpers runs (local, depth split or pipeline, compared on the
device profiles: the plan itself under ``plan``), every strategy with spatial partition's
prediction beside them (never chosen: ``spatial`` says why), and the DP split over every device
measured here, one row per stage (device, slice, compute, link to the next device, compressor)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from coinf.errors import UserError


def run(args: argparse.Namespace) -> int:
    from coinf.bundle import Bundle
    from coinf.device.profile import load_or_default
    from coinf.wearable.pipeline import PipelineSession, load_helpers
    from coinf.wearable.pipeline_config import DEFAULT_BANDWIDTH_BPS as PRIOR_BPS
    from coinf.wearable.planner.planner import Planner
    from coinf.wearable.planner.strategy import SPATIAL_NOT_RUN, choose_strategy, to_plan
    from coinf.wearable.policy import load_policy

    if args.pipeline and args.discover is not None:
        raise UserError("give --helpers CONFIG or --discover, not both")
    helpers = load_helpers(args.pipeline) if args.pipeline else None
    slowdown = args.wearable_slowdown if args.wearable_slowdown is not None else 1.0
    if not slowdown >= 1:
        raise UserError("--wearable-slowdown must be >= 1 with --pipeline")
    bundle = Bundle.load(args.bundle)
    if helpers is None:
        from coinf.cli.commands.discover import discovered_helpers

        helpers = discovered_helpers(args, bundle)
        if not helpers:
            raise UserError(f"--discover found no helper serving {bundle.identity} in "
                            f"{args.discover:g} s (coinf discover lists every announced one)")
    # packing="auto": each link's packing and compressor as the session would choose them at
    # the configured bandwidth (raw unless the bundle is calibrated or has compressors)
    sess = PipelineSession(bundle, helpers, slowdown=slowdown, threads=1, packing="auto")
    plan = sess.plan()  # measures this machine (as the wearable) once; connects to nothing
    assert plan is not None
    notes = device_notes(sess, helpers, plan, slowdown)
    rows = plan.rows(sess.link_choices(plan))
    from coinf.wearable.planner.strategy import choose, compare

    devices = ["wearable", *(h.name for h in helpers)]
    objective = "throughput" if args.objective == "throughput" else "latency"
    options = compare(sess.priced_points(), devices, sess._speeds(devices),
                      sess._bandwidths(devices), [h.latency_s for h in helpers],
                      sess._result_bytes, bundle.model_path, objective)
    best, why = choose([o for o in options if o.runnable], objective)
    # what a Session given these helpers runs: the same comparison on the device profiles
    planner = Planner(bundle, load_or_default("wearable", args.wearable_profile),
                      load_or_default("handheld", args.handheld_profile),
                      load_policy(args.policy)[0])
    run_options, run_best, run_why = choose_strategy(bundle, planner, helpers, objective,
                                                     PRIOR_BPS)
    plan_obj = to_plan(run_best, bundle)
    out: dict[str, Any] = {
        "strategy": plan_obj.strategy, "plan": plan_obj.to_json(), "why": run_why,
        "alternatives": [o.to_json() for o in run_options],
        "devices": list(plan.devices), "cuts": list(plan.cuts), "stages": rows,
        "bottleneck_ms": round(plan.split.bottleneck_s * 1e3, 3),
        "bound_fps": round(plan.split.bound_fps, 2), "notes": notes,
        "objective": objective, "strategies": [o.to_json() for o in options],
        "chosen": best.name, "why_measured_here": why, "spatial": SPATIAL_NOT_RUN,
    }
    if args.png:
        from coinf.wearable.planner.pipeline_chart import plot_pipeline

        plot_pipeline(rows, args.png, f"{bundle.root.name}: pipeline over "
                      f"{len(plan.devices)} devices", [*notes, f"chosen for {objective}: {why}"])
        out["chart"] = str(args.png)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print_text(out, options, plan_obj, args.png)
    return 0


def device_notes(sess: Any, helpers: list[Any], plan: Any, slowdown: float) -> list[str]:
    """The devices' speeds and links the pipeline plan assumed, one note each (the wearable's
    measured here, the helpers' from the config or defaults)."""
    from coinf.wearable.pipeline import DEFAULT_BANDWIDTH_BPS

    wear = sess._speeds(["wearable"])[0]
    notes = [f"wearable speed measured here: {wear / 1e9:.2f} GFLOP/s"
             + (f" (x{slowdown:g} slowdown)" if slowdown != 1 else "")]
    for h in helpers:
        speed = (f"{h.speed_flops / 1e9:g} GFLOP/s from the config" if h.speed_flops
                 else "speed unknown: assumed the wearable's until measured")
        link = (f"{h.bandwidth_bps / 1e3:g} kB/s" if h.bandwidth_bps
                else f"{DEFAULT_BANDWIDTH_BPS / 1e3:g} kB/s (default)")
        notes.append(f"{h.name} at {h.address}: {speed}; link into it {link}")
    if len(plan.devices) < len(helpers) + 1:
        notes.append(f"the bundle has nested cuts for {len(plan.devices)} devices only")
    return notes


def print_text(out: dict[str, Any], options: list[Any], plan_obj: Any, png: str | None) -> None:
    """The text report: the DP's stages, the strategies measured here and the one a Session
    given these helpers runs."""
    from coinf.wearable.planner.strategy import SPATIAL_NOT_RUN

    rows, objective = out["stages"], out["objective"]
    print(f"pipeline over {len(out['devices'])} devices: cuts {', '.join(out['cuts'])}")
    print(f"{'#':>2}  {'device':<10} {'slice':<14} {'compute ms':>11} {'link ms':>9}  "
          f"compressor")
    for i, r in enumerate(rows, 1):
        link = "-" if r["link_ms"] is None else f"{r['link_ms']:.2f}"
        print(f"{i:>2}  {r['device']:<10} {r['slice']:<14} {r['compute_ms']:>11.2f} "
              f"{link:>9}  {r['compressor'] or '-'}"
              + (f" ({r['link_bytes']} B)" if r["link_bytes"] is not None else ""))
    print(f"bottleneck {out['bottleneck_ms']:.2f} ms per frame -> at most "
          f"{out['bound_fps']:.1f} frames/s")
    for note in out["notes"]:
        print(f"  {note}")
    print()
    print(f"{'strategy':<12} {'latency ms':>11} {'frames/s':>9}  devices / detail")
    for o in options:
        lat = f"{o.latency_s * 1e3:.2f}" if o.latency_s != float("inf") else "-"
        notes = [n for n in o.notes if n != SPATIAL_NOT_RUN]
        print(f"{o.name:<12} {lat:>11} {o.throughput_fps:>9.2f}  {', '.join(o.devices)}: "
              f"{o.detail}" + "".join(f" ({n})" for n in notes)
              + (" [predicted, not run]" if not o.runnable else ""))
    print(f"chosen for {objective} (measured here): {out['why_measured_here']}")
    print(f"  {SPATIAL_NOT_RUN}")
    print(f"a Session given these helpers runs (device profiles): {plan_obj}\n  {out['why']}")
    if png:
        print(f"chart: {png}")
