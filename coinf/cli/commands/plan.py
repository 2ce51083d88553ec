"""``coinf plan BUNDLE``: the planner's decision for a bundle, every candidate's predicted costs,
optionally as a PNG bar chart and with the exact min-cut optimum over all cuts."""

from __future__ import annotations

import argparse
import json

from coinf.errors import UserError


def check_output_file(path: str, flag: str) -> None:
    """Refuse an output file that cannot be written, before any work (one line, exit 2)."""
    import os
    from pathlib import Path

    out = Path(path)
    folder = out.parent
    if out.is_dir():
        raise UserError(f"{flag} {path}: is a folder; give a file name such as {out / 'plan.png'}")
    if not folder.is_dir():
        raise UserError(f"{flag} {path}: the folder {folder} does not exist (create it first)")
    if not os.access(folder, os.W_OK):
        raise UserError(f"{flag} {path}: the folder {folder} is not writable")


def run(args: argparse.Namespace) -> int:
    from coinf.convert.bundle import Bundle
    from coinf.device.profile import load_or_default
    from coinf.device.status import DeviceStatus
    from coinf.wearable.planner.adapt import LinkEstimate
    from coinf.wearable.planner.planner import Planner
    from coinf.wearable.policy import OBJECTIVES, load_policy

    if args.objective and args.objective not in OBJECTIVES:
        raise UserError(f"--objective must be one of {', '.join(OBJECTIVES)}")
    if args.bandwidth_kbps <= 0 or args.rtt_ms < 0:
        raise UserError("--bandwidth-kbps must be > 0 and --rtt-ms >= 0")
    if args.budget_ms is not None and args.budget_ms < 0:
        raise UserError("--budget-ms must be >= 0 (0 = fastest)")
    if args.png:
        check_output_file(args.png, "--png")
    bundle = Bundle.load(args.bundle)
    policy = load_policy(args.policy)[0]
    wear = load_or_default("wearable", args.wearable_profile)
    hand = load_or_default("handheld", args.handheld_profile)
    if args.wearable_slowdown is not None:
        if args.wearable_slowdown <= 0:
            raise UserError("--wearable-slowdown must be > 0")
        wear.slowdown = args.wearable_slowdown
    packings = tuple(s.strip() for s in args.packings.split(",") if s.strip()) or ("auto",)
    try:
        planner = Planner(bundle, wear, hand, policy, predictor_style=args.predictor,
                          packings=packings)
    except ValueError as exc:
        raise UserError(f"--packings: {exc}") from None
    bps = args.bandwidth_kbps * 1000.0
    link = LinkEstimate(bps, bps, args.rtt_ms, "command line")
    wst = DeviceStatus(battery_pct=args.wearable_battery) if args.wearable_battery is not None \
        else None
    hst = DeviceStatus(battery_pct=args.handheld_battery, charging=args.handheld_charging) \
        if args.handheld_battery is not None or args.handheld_charging else None
    budget = policy.latency_budget_ms if args.budget_ms is None else args.budget_ms
    d = planner.decide(link, wst, hst, args.objective, budget)
    out = d.to_json()
    if args.optimal:
        cut = planner.optimal_cut(link, wst, hst)
        best = min(r.latency_ms(d.streaming) for r in d.rows)
        out["optimal_cut"] = {"latency_ms": cut.latency_ms, "wearable_nodes": len(cut.wearable),
                              "crossing": list(cut.crossing),
                              "best_candidate_latency_ms": best}
    if args.png:
        from coinf.wearable.planner.chart import plot_decision

        plot_decision(d, args.png, f"{bundle.root.name}: {d.scheduler}")
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(d.explain())
        if args.optimal:
            o = out["optimal_cut"]
            print(f"min-cut optimum over every cut: {o['latency_ms']:.1f} ms "
                  f"({o['wearable_nodes']} nodes on the wearable, sends "
                  f"{', '.join(o['crossing']) or 'nothing'}); best candidate "
                  f"{o['best_candidate_latency_ms']:.1f} ms")
        if args.png:
            print(f"chart: {args.png}")
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle")
    parser.add_argument("--objective", help="auto, latency, energy, throughput, "
                                            "neurosurgeon-latency, neurosurgeon-energy, dyno")
    parser.add_argument("--budget-ms", type=float, help="latency budget (default: the policy's)")
    parser.add_argument("--bandwidth-kbps", type=float, default=20.0,
                        help="link bandwidth in kB/s (default 20)")
    parser.add_argument("--rtt-ms", type=float, default=30.0)
    parser.add_argument("--wearable-profile", help="default <config dir>/wearable-profile.json")
    parser.add_argument("--handheld-profile", help="default <config dir>/handheld-profile.json")
    parser.add_argument("--wearable-slowdown", type=float, help="override the profile's slowdown")
    parser.add_argument("--wearable-battery", type=float, metavar="PCT")
    parser.add_argument("--handheld-battery", type=float, metavar="PCT")
    parser.add_argument("--handheld-charging", action="store_true")
    parser.add_argument("--policy", help="policy file (default $COINF_CONFIG or "
                                         "~/.config/coinf/policy.json)")
    parser.add_argument("--predictor", choices=("coinf", "neurosurgeon"), default="coinf")
    parser.add_argument("--packings", default="auto",
                        help="comma-separated packings to consider with each cut, e.g. "
                             "raw,f16,q8,q4 (needs `coinf calibrate`); default auto: every "
                             "calibrated packing within the policy's accuracy tolerance")
    parser.add_argument("--optimal", action="store_true",
                        help="also solve the exact min-cut over every cut of the graph")
    parser.add_argument("--png", help="write a per-candidate stacked bar chart")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(func=run)
