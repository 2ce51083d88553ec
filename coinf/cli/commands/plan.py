"""``coinf plan BUNDLE``: the planner's decision for a bundle, every candidate's predicted costs,
optionally as a PNG bar chart and with the exact min-cut optimum over all cuts."""

from __future__ import annotations

import argparse
import json
import math
import re
from typing import TYPE_CHECKING, Any

from coinf.cli import argtypes
from coinf.cli.paths import naming, writable_file
from coinf.errors import UserError

if TYPE_CHECKING:
    from coinf.wearable.planner.adapt import LinkEstimate

#: bytes per second of each accepted unit (k = 1000; BLE rates are quoted in kB/s here)
_UNITS = {"b/s": 1.0, "kb/s": 1e3, "mb/s": 1e6, "bit/s": 1 / 8, "kbit/s": 1e3 / 8,
          "mbit/s": 1e6 / 8}


def parse_bandwidth(text: str) -> float:
    """``"20kB/s"``, ``"160 kbit/s"``, ``"1MB/s"`` or a bare number of kB/s -> bytes/s."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([a-zA-Z/]*)\s*", text)
    if not m:
        raise UserError(f"--bandwidth {text!r}: expected a rate such as 20kB/s, 160kbit/s or "
                        "1MB/s")
    value, unit = float(m.group(1)), m.group(2)
    if not math.isfinite(value):
        raise UserError(f"--bandwidth {text!r}: expected a finite rate")
    if unit.lower() in ("kbps", "mbps", "bps"):
        raise UserError(f"--bandwidth {text!r}: {unit} is ambiguous (bits or bytes?); write "
                        f"kB/s (bytes) or kbit/s (bits)")
    per = 1e3 if not unit else _UNITS.get(unit.lower().replace("bytes", "b").replace("byte", "b"))
    if per is None:
        raise UserError(f"--bandwidth {text!r}: unknown unit {unit!r}; use B/s, kB/s, MB/s, "
                        "bit/s, kbit/s or Mbit/s")
    if not value > 0:
        raise UserError(f"--bandwidth must be > 0, got {text!r}")
    return value * per


def _link(args: argparse.Namespace) -> LinkEstimate:
    from coinf.wearable.planner.adapt import DEFAULT_LINK, LinkEstimate

    if args.bandwidth is not None and args.bandwidth_kbps is not None:
        raise UserError("give --bandwidth or --bandwidth-kbps, not both")
    if args.bandwidth_kbps is not None:
        if not args.bandwidth_kbps > 0:
            raise UserError("--bandwidth-kbps (kilobytes per second) must be > 0")
        bps: float | None = args.bandwidth_kbps * 1000.0
    else:
        bps = parse_bandwidth(args.bandwidth) if args.bandwidth is not None else None
    if args.rtt_ms is not None and args.rtt_ms < 0:
        raise UserError("--rtt-ms must be >= 0")
    given = [name for name, v in (("bandwidth", bps), ("RTT", args.rtt_ms)) if v is not None]
    if not given:
        source = "default: a BLE 4.2 estimate; set --bandwidth"
    elif len(given) == 2:
        source = "command line"
    else:
        source = f"{given[0]} from the command line, {'RTT' if bps else 'bandwidth'} default"
    return LinkEstimate(bps or DEFAULT_LINK.up_bps, bps or DEFAULT_LINK.down_bps,
                        DEFAULT_LINK.rtt_ms if args.rtt_ms is None else args.rtt_ms, source)


def profiles_note(wear: Any, hand: Any, args: argparse.Namespace) -> str:
    """Which profiles are measured and which are the built-in defaults, in one line."""
    from coinf.device.profile import default_profile_path

    parts = []
    for role, prof, given in (("wearable", wear, args.wearable_profile),
                              ("handheld", hand, args.handheld_profile)):
        if prof.is_builtin:
            where = given or default_profile_path(role)
            parts.append(f"{role}: built-in default {prof.name!r} (published-figure estimates, "
                         f"docs/PLANNER.md; no measured profile at {where})")
        else:
            parts.append(f"{role}: measured profile {prof.name!r}")
    return "profiles: " + "; ".join(parts)


def run(args: argparse.Namespace) -> int:
    from coinf.bundle import Bundle
    from coinf.wearable.planner.planner import Planner
    from coinf.wearable.planner.references import plan_json
    from coinf.wearable.policy import OBJECTIVES, load_policy

    if args.png:
        writable_file(args.png, "--png", make_folder=False)
    from coinf.cli.commands.discover import check_filters

    check_filters(args)
    if args.pipeline or args.discover is not None:
        from coinf.cli.commands import pipeline_plan

        return pipeline_plan.run(args, *load_profiles(args))
    if args.objective and args.objective not in OBJECTIVES:
        raise UserError(f"--objective must be one of {', '.join(OBJECTIVES)}")
    link = _link(args)
    if args.budget_ms is not None and args.budget_ms < 0:
        raise UserError("--budget-ms must be >= 0 (0 = fastest)")
    if not args.timeout > 0:
        raise UserError("--timeout must be > 0 s")
    bundle = Bundle.load(args.bundle)
    policy = load_policy(args.policy)[0]
    wear, hand = load_profiles(args)
    packings = tuple(s.strip() for s in args.packings.split(",") if s.strip()) or ("auto",)
    try:
        planner = Planner(bundle, wear, hand, policy, predictor_style=args.predictor,
                          packings=packings, timeout_s=args.timeout,
                          runtimes={"wearable": args.runtime, "handheld": args.handheld_runtime})
    except ValueError as exc:
        raise UserError(f"--packings: {exc}") from None
    wst, hst = device_statuses(args)
    budget = policy.latency_budget_ms if args.budget_ms is None else args.budget_ms
    choice = None
    links: dict[str, LinkEstimate] = {}
    if args.links:
        from coinf.wearable.planner.links import decide_links, parse_links

        links = parse_links(args.links)
        choice = decide_links(planner, links, args.objective, budget, True,
                              wearable_status=wst, handheld_status=hst)
        link = links[choice.link] if choice.link else next(iter(links.values()))
        d = choice.decision
    else:
        d = planner.decide(link, wst, hst, args.objective, budget)
    d.notes.insert(1, f"devices: wearable {wear.name!r}, handheld {hand.name!r}; per-inference "
                      f"timeout {args.timeout:g} s")
    d.notes.insert(2, profiles_note(wear, hand, args))
    out = d.to_json()
    status = {"wearable_status": wst, "handheld_status": hst, "objective": args.objective,
              "latency_budget_ms": budget}
    out.update(plan_json(planner, d, link_estimate=link, **status))
    if choice is not None:
        out["link"] = choice.to_json()
        out["per_link"] = {
            name: {k: v for k, v in plan_json(planner, pd, link_estimate=links[name],
                                              **status).items() if k in ("chosen", "reference")}
            for name, pd in choice.per_link.items()}
    plan = chosen_plan(bundle, planner, d)
    out["strategy"] = plan.strategy
    out["plan"] = plan.to_json()  # what `coinf run --plan` and PlacementOptions(plan=) run
    out["stages"] = str(plan)
    out["memory"] = memory_json(planner.memory)
    if args.optimal:
        out["optimal_cut"] = optimal_json(planner, d, link, wst, hst)
    if args.png:
        plot(args, d, out, bundle.root.name, link, wear, hand)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print_text(args, d, out, choice, links)
    return 0


def load_profiles(args: argparse.Namespace) -> tuple[Any, Any]:
    """The wearable's and the handheld's profiles (given or default), with the wearable's
    ``--wearable-slowdown`` and ``--memory-budget`` overrides."""
    from coinf.device.profile import load_or_default

    with naming("--wearable-profile", args.wearable_profile):
        wear = load_or_default("wearable", args.wearable_profile)
    with naming("--handheld-profile", args.handheld_profile):
        hand = load_or_default("handheld", args.handheld_profile)
    if args.wearable_slowdown is not None:
        if args.wearable_slowdown <= 0:
            raise UserError("--wearable-slowdown must be > 0")
        wear.slowdown = args.wearable_slowdown
    if args.memory_budget is not None:
        if not args.memory_budget > 0:
            raise UserError(f"--memory-budget must be > 0 MB, got {args.memory_budget:g}")
        wear.memory_budget_mb = args.memory_budget
    return wear, hand


def device_statuses(args: argparse.Namespace) -> tuple[Any, Any]:
    """The wearable's and the handheld's battery status given on the command line (None when
    not given)."""
    from coinf.device.status import DeviceStatus

    wst = DeviceStatus(battery_pct=args.wearable_battery) if args.wearable_battery is not None \
        else None
    hst = DeviceStatus(battery_pct=args.handheld_battery, charging=args.handheld_charging) \
        if args.handheld_battery is not None or args.handheld_charging else None
    return wst, hst


def memory_json(mem: Any) -> dict[str, Any]:
    """The wearable's memory budget, the runtime's overhead and each head's peak (none without
    a budget)."""
    return {"budget_mb": mem.budget_mb, "overhead_mb": round(mem.overhead_mb, 2),
            "heads": [h.to_json() for h in mem.heads().values()]
            if mem.budget_mb is not None else []}


def optimal_json(planner: Any, d: Any, link: LinkEstimate, wst: Any, hst: Any) -> dict[str, Any]:
    """``--optimal``: the exact min-cut over every cut beside the best candidate's latency."""
    cut = planner.optimal_cut(link, wst, hst)
    best = min(r.latency_ms(d.streaming) for r in d.rows if r.id not in d.excluded)
    return {"latency_ms": cut.latency_ms, "wearable_nodes": len(cut.wearable),
            "crossing": list(cut.crossing), "best_candidate_latency_ms": best}


def plot(args: argparse.Namespace, d: Any, out: dict[str, Any], model: str, link: LinkEstimate,
         wear: Any, hand: Any) -> None:
    """``--png``: the decision's bar chart, keeping the reference points, under a line of
    context (link, devices, timeout)."""
    from coinf.wearable.planner.chart import plot_decision

    slow = f" (x{wear.slowdown:g} slowdown)" if wear.slowdown != 1 else ""
    context = (f"link {link.up_bps / 1e3:g} kB/s each way, RTT {link.rtt_ms:g} ms "
               f"({link.source})  |  wearable {wear.name}{slow}, handheld {hand.name}  |  "
               f"per-inference timeout {args.timeout:g} s")
    refs = tuple(e["id"] for e in out["reference"].values() if e)
    plot_decision(d, args.png, model, context, keep=refs)


def print_text(args: argparse.Namespace, d: Any, out: dict[str, Any], choice: Any,
               links: dict[str, LinkEstimate]) -> None:
    """The text report: the decision explained, its stages and reference points, each link's
    with ``--links``, the min-cut optimum with ``--optimal`` and the chart's path."""
    print(d.explain())
    print(f"stages: {out['stages']}")
    print(references_text(out))
    if choice is not None:
        print(f"link: {choice.link or 'none (local)'}: {choice.why}")
        for name, entry in out["per_link"].items():
            print(references_text({**entry, "quality": None}).replace(
                "against what a user would do (predicted):",
                f"on {name} ({links[name].source}):"))
    if args.optimal:
        o = out["optimal_cut"]
        print(f"min-cut optimum over every cut: {o['latency_ms']:.1f} ms "
              f"({o['wearable_nodes']} nodes on the wearable, sends "
              f"{', '.join(o['crossing']) or 'nothing'}); best candidate "
              f"{o['best_candidate_latency_ms']:.1f} ms")
    if args.png:
        print(f"chart: {args.png}")


def references_text(out: dict[str, Any]) -> str:
    """The chosen plan beside the four reference points, one line each."""
    lines = ["against what a user would do (predicted):"]
    text = (out.get("quality") or {}).get("text")
    if text:
        lines.insert(0, text)
    for name, e in (("chosen", out["chosen"]), *out["reference"].items()):
        if e is None:
            why = out.get("reference_missing", {}).get(name)
            lines.append(f"  {name:<15} none feasible" + (f": {why}" if why else ""))
            continue
        bound = e.get("quality_loss_bound")
        q = f"quality loss {e['quality_loss']:.2f} pp" + (
            " (exact)" if e.get("exact") else f" (95% bound {bound:.1f})" if bound else "")
        lines.append(f"  {name:<15} {e['id']:<22} {e['latency_ms']:9.1f} ms "
                     f"{e['wearable_mj']:8.1f} mJ {e['bytes']:9,d} B  {q}")
    return "\n".join(lines)


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle")
    parser.add_argument("--objective", help="auto, latency, energy, throughput, "
                                            "neurosurgeon-latency, neurosurgeon-energy, dyno "
                                            "(default: the policy's; balanced = auto)")
    parser.add_argument("--budget-ms", type=argtypes.milliseconds,
                        help="latency budget in ms (default: the policy's; none = least energy)")
    parser.add_argument("--bandwidth", metavar="RATE",
                        help="link bandwidth, both ways: 20kB/s, 160kbit/s, 1MB/s; a bare number "
                             "is kB/s (default 20 kB/s, a BLE 4.2 estimate)")
    parser.add_argument("--bandwidth-kbps", type=argtypes.kbps, metavar="KB_PER_S",
                        help="the same in kilobytes (1000 B) per second, e.g. 20")
    parser.add_argument("--links", metavar="NAMES",
                        help="choose the link too, among these (comma-separated: ble, ble-dle, "
                             "ble-2m, wifi; a Pi Zero 2 W has ble,wifi): the plan and the "
                             "reference points on each (overrides --bandwidth)")
    parser.add_argument("--rtt-ms", type=argtypes.milliseconds,
                        help="round-trip time in ms (default 30)")
    parser.add_argument("--timeout", type=argtypes.seconds, default=30.0, metavar="S",
                        help="the Session's per-inference timeout in seconds (default 30): "
                             "plans whose predicted exchange x2 exceeds it are infeasible")
    parser.add_argument("--wearable-profile", type=argtypes.existing_file,
                        help="default <config dir>/wearable-profile.json")
    parser.add_argument("--handheld-profile", type=argtypes.existing_file,
                        help="default <config dir>/handheld-profile.json")
    parser.add_argument("--wearable-slowdown", type=argtypes.number(0, 1e4, lo_open=True),
                        help="override the profile's slowdown")
    parser.add_argument("--wearable-battery", type=argtypes.percent, metavar="PCT")
    parser.add_argument("--handheld-battery", type=argtypes.percent, metavar="PCT")
    parser.add_argument("--handheld-charging", action="store_true")
    parser.add_argument("--policy", type=argtypes.existing_file,
                        help="policy file (default $COINF_CONFIG or "
                                         "~/.config/coinf/policy.json)")
    parser.add_argument("--predictor", choices=("incontext", "coinf", "neurosurgeon"),
                        default="incontext",
                        help="layer predictor of an unprofiled model (default incontext: the "
                        "in-context slice predictor when the profile has one, else coinf)")
    parser.add_argument("--memory-budget", type=argtypes.megabytes, metavar="MB",
                        help="the wearable's memory budget for a head (default: the wearable "
                             "profile's, else 300 MB for a Pi Zero 2 W)")
    parser.add_argument("--packings", default="auto",
                        help="comma-separated packings to consider with each cut, e.g. "
                             "raw,f16,q8,q4 (needs `coinf calibrate`); default auto: every "
                             "calibrated packing within the policy's accuracy tolerance")
    parser.add_argument("--optimal", action="store_true",
                        help="also solve the exact min-cut over every cut of the graph")
    parser.add_argument("--png", help="write a bar chart of the candidates (Pareto front, "
                                      "the chosen one and the extremes)")
    for flag, who in (("--runtime", "the wearable's slices"),
                      ("--handheld-runtime", "the handheld's tails")):
        parser.add_argument(flag, choices=("onnxruntime", "litert", "auto"),
                            default="onnxruntime",
                            help=f"runtime of {who}: auto = the faster per slice as the "
                                 "profile measured it (default %(default)s)")
    parser.add_argument("--helpers", "--pipeline", dest="pipeline", metavar="CONFIG",
                        type=argtypes.existing_file,
                        help="the helpers of this config (docs/PIPELINE.md) too: the strategy "
                             "a Session given them runs (local, depth split or pipeline; "
                             "--objective throughput for a stream, else latency) and its plan, "
                             "spatial partition predicted beside them but never run "
                             "(docs/SPATIAL.md), and the DP's "
                             "stages measured here")
    from coinf.cli.commands.discover import add_discover

    add_discover(parser)  # the same, over the helpers found on the network
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(func=run)


def chosen_plan(bundle: Any, planner: Any, decision: Any) -> Any:
    """The decision's winner as the :class:`~coinf.wearable.plan.Plan` a Session runs, with
    its predicted latency and wearable energy."""
    import dataclasses

    from coinf.wearable.plan import Plan
    from coinf.wearable.planner.planner import parse_config_spec, split_config

    cid, spec = split_config(decision.winner)
    gamma, packing = parse_config_spec(spec)  # c002~g4+q8: compressor g4's code, q8
    cand = bundle.candidate(cid)
    runtimes = planner.stage_runtimes.get(cand.id, ("onnxruntime", "onnxruntime"))
    plan = Plan.for_candidate(bundle, cand, packing, runtimes=runtimes, gamma=gamma or 0)
    row = next(r for r in decision.rows if r.id == decision.winner)
    return dataclasses.replace(plan, predicted={
        "latency_ms": row.latency_ms(decision.streaming),
        "wearable_mj": row.wearable_energy_mj})
