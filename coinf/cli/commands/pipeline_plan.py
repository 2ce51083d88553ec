"""``coinf plan BUNDLE --helpers CONFIG`` (or ``--pipeline CONFIG``, or ``--discover``): what a
Session given these helpers runs, from the one planner
(:func:`~coinf.wearable.planner.strategy.choose_strategy`): local, a depth split to each helper
and a pipeline over them, one row each in the 2-device planner's columns (the wearable's compute,
the links, the helpers' compute, latency, energy, bytes, accuracy given up) plus frames per
second; spatial partition's prediction beside them (never chosen: ``spatial`` says why); the
chosen plan's stages (device, slice, compute, link to the next device, what it carries)."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from coinf.errors import UserError


def run(args: argparse.Namespace, wear: Any, hand: Any) -> int:
    """The report; ``wear`` and ``hand``: the device profiles (``coinf plan``'s options)."""
    from coinf.bundle import Bundle
    from coinf.wearable.pipeline_config import DEFAULT_BANDWIDTH_BPS as PRIOR_BPS
    from coinf.wearable.pipeline_config import load_helpers
    from coinf.wearable.planner.planner import Planner
    from coinf.wearable.planner.strategy import SPATIAL_NOT_RUN, choose_strategy, to_plan
    from coinf.wearable.policy import load_policy

    if args.pipeline and args.discover is not None:
        raise UserError("give --helpers CONFIG or --discover, not both")
    helpers = load_helpers(args.pipeline) if args.pipeline else None
    bundle = Bundle.load(args.bundle)
    if helpers is None:
        from coinf.cli.commands.discover import discovered_helpers

        helpers = discovered_helpers(args, bundle)
        if not helpers:
            raise UserError(f"--discover found no helper serving {bundle.identity} in "
                            f"{args.discover:g} s (coinf discover lists every announced one)")
    policy = load_policy(args.policy)[0]
    objective = args.objective if args.objective in ("throughput", "energy") else "latency"
    planner = Planner(bundle, wear, hand, policy)
    options, best, why = choose_strategy(bundle, planner, helpers, objective, PRIOR_BPS,
                                         bundle.model_path)
    plan = to_plan(best, bundle)
    rows = stage_rows(bundle, best, plan)
    notes = device_notes(helpers, wear, hand)
    out: dict[str, Any] = {
        "strategy": plan.strategy, "plan": plan.to_json(), "why": why,
        "objective": objective, "chosen": best.name,
        "devices": best.devices, "cuts": list(best.cuts), "stages": rows,
        "bottleneck_ms": round(max(best.stage_s) * 1e3, 3),
        "bound_fps": round(best.throughput_fps, 2),
        "strategies": [o.to_json() for o in options], "notes": notes,
        "spatial": SPATIAL_NOT_RUN,
    }
    if args.png:
        from coinf.wearable.planner.pipeline_chart import plot_pipeline

        plot_pipeline(rows, args.png, f"{bundle.root.name}: {plan.strategy} over "
                      f"{len(best.devices)} device(s)", [*notes, f"chosen for {objective}: {why}"])
        out["chart"] = str(args.png)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print_text(out, options, plan, args.png)
    return 0


def stage_rows(bundle: Any, option: Any, plan: Any) -> list[dict[str, Any]]:
    """One row per stage of the chosen plan: device, slice, runtime, predicted compute, the
    link to the next device and what it carries (its option and bytes, headers included)."""
    from coinf.wearable.planner.codec_costs import parse_config_spec
    from coinf.wearable.planner.compress_select import OVERHEAD_BYTES, link_options

    out = []
    for i, st in enumerate(plan.stages):
        link = option.stage_s[2 * i + 1] * 1e3 if 2 * i + 1 < len(option.stage_s) else None
        carried = st.packing if link is not None else None
        size = None
        if carried is not None:
            gamma, packing = parse_config_spec(carried)
            cand = bundle.candidate(st.end)
            options = link_options(cand, bundle.compressors(cand.id), OVERHEAD_BYTES)
            size = next((o.nbytes for o in options
                         if o.gamma == (gamma or 1) and o.packing == packing), None)
        out.append({"device": st.device, "slice": st.slice, "runtime": st.runtime,
                    "compute_ms": round(option.stage_s[2 * i] * 1e3, 3),
                    "link_ms": None if link is None else round(link, 3),
                    "compressor": carried,
                    "link_bytes": None if size is None else int(size)})
    return out


def device_notes(helpers: list[Any], wear: Any, hand: Any) -> list[str]:
    """The devices' speeds and links the plan assumed, one note each."""
    from coinf.wearable.pipeline_config import DEFAULT_BANDWIDTH_BPS

    slow = f" (x{wear.slowdown:g} slowdown)" if wear.slowdown != 1 else ""
    notes = [f"wearable: profile '{wear.name}'{slow}; helpers without a speed: profile "
             f"'{hand.name}' (a Session then measures every device's speed and link)"]
    for h in helpers:
        speed = (f"{h.speed_flops / 1e9:g} GFLOP/s from the config" if h.speed_flops
                 else f"speed of profile '{hand.name}'")
        link = (f"{h.bandwidth_bps / 1e3:g} kB/s" if h.bandwidth_bps
                else f"{DEFAULT_BANDWIDTH_BPS / 1e3:g} kB/s (default)")
        notes.append(f"{h.name} at {h.address}: {speed}; link into it {link}")
    return notes


def print_text(out: dict[str, Any], options: list[Any], plan: Any, png: str | None) -> None:
    """Every strategy in the 2-device planner's columns, the chosen plan's stages, why."""
    from coinf.wearable.planner.strategy import SPATIAL_NOT_RUN

    print(f"{'  strategy':<14}{'head':>8}{'xfer':>9}{'tail':>9}{'latency':>10}{'E_wear':>9}"
          f"{'E_help':>9}{'bytes':>10}{'acc':>6}{'fps':>8}  devices / detail")
    print(f"{'':<14}{'ms':>8}{'ms':>9}{'ms':>9}{'ms':>10}{'mJ':>9}{'mJ':>9}{'':>10}"
          f"{'pp':>6}")
    for o in options:
        c = o.columns()
        mark = "*" if o.name == out["chosen"] and o.devices == out["devices"] else " "
        cells = "".join(f"{_cell(c[k], 1):>{w}}" for k, w in (
            ("head_ms", 8), ("xfer_ms", 9), ("tail_ms", 9), ("latency_ms", 10),
            ("wearable_mj", 9), ("helpers_mj", 9)))
        notes = [n for n in o.notes if n != SPATIAL_NOT_RUN]
        print(f"{mark} {o.name:<12}{cells}{_cell(c['bytes'], 0):>10}{_cell(c['loss_pp'], 2):>6}"
              f"{_cell(c['fps'], 1):>8}  {', '.join(o.devices)}: {o.detail}"
              + "".join(f" ({n})" for n in notes)
              + (" [predicted, not run]" if not o.runnable else ""))
    print(f"chosen for {out['objective']}: {out['why']}")
    print(f"stages: {plan}")
    for i, r in enumerate(out["stages"], 1):
        link = "" if r["link_ms"] is None else \
            f"; link {r['link_ms']:.2f} ms carrying {r['compressor']} ({r['link_bytes']} B)"
        print(f"  {i}. {r['device']}: {r['slice']} {r['compute_ms']:.2f} ms{link}")
    for note in out["notes"]:
        print(f"note: {note}")
    print(f"note: {SPATIAL_NOT_RUN}")
    if png:
        print(f"chart: {png}")


def _cell(v: float, digits: int) -> str:
    if not math.isfinite(v):
        return "-"
    return f"{v:,.{digits}f}" if digits == 0 else f"{v:.{digits}f}"
