"""``coinf bench map``: where cooperation pays, measured end to end: every real model x link x
objective.

Per model the demo's preparation runs once (build, split, calibrate on real inputs,
``coinf demo``'s ``--out`` cache). Per link (``ble``: the pi-zero-2w radio, 1M PHY without DLE;
``ble-2m``: BLE 5 with the 2M PHY and DLE; ``wifi``: the Pi Zero 2 W's 802.11n preset) and
objective (``latency``; ``energy``: least wearable energy, the handheld plugged in), the planner
picks a plan with the built-in Pi Zero 2 W and laptop profiles and names the reference points
(wearable-only, the raw input offloaded, the input's best packing offloaded, the best split,
the learned split where one exists). Every one of them is then run for real, per link, in
three processes (``coinf demo``'s ``measure``: the emulated radio or Wi-Fi air, the handheld
daemon and the wearable slowed to the Pi's speed: by default each head takes the time the
Pi profile predicts for it layer by layer, ``--wearable-compute scaled`` multiplies this
machine's time by one factor per model instead, which keeps this CPU's per-layer shares and
its run-to-run noise); a point predicted to take longer than
``--max-run-s`` is reported as predicted, not run. A cell reports the chosen plan, the points
and the chosen plan's **regret**: its measured latency (or wearable energy) over the best
measured point's (medians over ``--repeat`` runs after one warm-up run, which opens the cut's
slices), with a rank test of the chosen plan's runs
against the best's (``p_vs_best``: whether a miss is beyond the run-to-run noise).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from coinf.cli import argtypes
from coinf.cli.bench import emit, options, progress

MODELS = ("mobilenetv2_imagenet", "swift_f0", "yolov8n_faces", "ppocr_rec", "ppocr_det")
LINKS = ("ble", "ble-2m", "wifi")
OBJECTIVES = ("latency", "energy")
#: which measured figure each objective ranks by
KEY = {"latency": "latency_ms", "energy": "wearable_mj"}


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default=",".join(MODELS),
                        help="comma-separated pretrained models (default: %(default)s)")
    parser.add_argument("--links", default=",".join(LINKS),
                        help="comma-separated links (default %(default)s)")
    parser.add_argument("--objectives", default=",".join(OBJECTIVES),
                        help="comma-separated: latency, energy (default %(default)s)")
    parser.add_argument("--out", default="out/map", help="where models and bundles are kept")
    parser.add_argument("--samples", type=argtypes.positive_int, default=300,
                        help="real inputs each model is calibrated on (default %(default)s)")
    parser.add_argument("--samples-for", action="append", default=[], metavar="MODEL=N",
                        help="another count for one model (a heavy one calibrates slowly), "
                             "e.g. ppocr_det=60; repeatable")
    parser.add_argument("--repeat", type=argtypes.positive_int, default=3,
                        help="runs per measured point (median; default %(default)s)")
    parser.add_argument("--max-run-s", type=argtypes.seconds, default=20.0,
                        help="points predicted to take longer per run are not run")
    parser.add_argument("--wearable-compute", choices=("profile", "scaled"), default="profile",
                        help="profile (default): each head takes the time the built-in Pi Zero "
                        "2 W profile predicts for it, layer by layer; scaled: this machine's "
                        "time x one slowdown per model (this CPU's share per layer)")
    options.add_png(parser, "the map as a grid")
    options.add_json(parser)
    parser.set_defaults(func=run)


def _names(text: str, known: tuple[str, ...] | dict[str, Any], what: str) -> list[str]:
    from coinf.errors import UserError

    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in known]
    if not names or bad:
        raise UserError(f"--{what} {text!r}: expected some of {', '.join(known)}")
    return names


def plan_points(bundle: Any, link_name: str, objective: str) -> dict[str, Any]:
    """The planner's choice and reference points (predicted) for one cell, with the built-in
    Pi Zero 2 W and laptop profiles."""
    from coinf.device.profile import DeviceProfile
    from coinf.device.status import DeviceStatus
    from coinf.wearable.planner.links import link_estimate
    from coinf.wearable.planner.planner import Planner
    from coinf.wearable.planner.references import plan_json
    from coinf.wearable.policy import Policy

    planner = Planner(bundle, DeviceProfile.pi_zero_2w(), DeviceProfile.laptop(),
                      Policy(objective=objective))
    link = link_estimate(link_name)
    hst = DeviceStatus(charging=True)  # plugged in: only the wearable's energy counts
    budget = 0 if objective == "latency" else None
    d = planner.decide(link, None, hst, objective, budget)
    return plan_json(planner, d, link_estimate=link, handheld_status=hst, objective=objective,
                     latency_budget_ms=budget)


def _transport(link_name: str) -> dict[str, Any]:
    from coinf.wearable.planner.links import NAMED

    kind, preset = NAMED[link_name]
    if kind == "wifi":
        return {"transport": "wifi", "wifi_preset": preset, "preset": "pi-zero-2w"}
    return {"transport": "ble", "preset": preset, "wifi_preset": "pi-zero-2w-wifi"}


def measure_link(prep: Any, link_name: str, points: dict[str, dict[str, Any]], slowdown: float,
                 args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Run every point (config id -> predicted entry) over the link; measured figures by id."""
    from coinf.cli.commands.demo import measure
    from coinf.device.profile import DeviceProfile
    from coinf.wearable.planner.links import link_estimate

    pw = DeviceProfile.pi_zero_2w().power
    tx_w, rx_w, wake_mj = pw.radio(link_estimate(link_name).kind)
    ids = [i for i, e in points.items() if e["latency_ms"] <= args.max_run_s * 1e3]
    out: dict[str, dict[str, Any]] = {
        i: {"measured": False, "why": f"predicted {e['latency_ms'] / 1e3:.0f} s per run "
                                      f"(> --max-run-s {args.max_run_s:g})"}
        for i, e in points.items() if i not in ids}
    if not ids:
        return out
    ns = argparse.Namespace(repeat=args.repeat, **_transport(link_name))
    rows, _ = measure(ns, prep.bundle_dir, ids, slowdown, prep.input_file,
                      "pi-zero-2w" if args.wearable_compute == "profile" else None)
    for r in rows:
        rid = r["candidate"] if r["packing"] == "raw" else f"{r['candidate']}~{r['packing']}"
        runs = r.get("runs", {})
        per_run = [_energy(pw, tx_w, rx_w, wake_mj, {k: v[i] for k, v in runs.items()})
                   for i in range(len(runs.get("total_ms", [])))]
        out[rid] = {"measured": True, "latency_ms": round(r["total_ms"], 1),
                    "wearable_mj": round(_energy(pw, tx_w, rx_w, wake_mj, r), 1),
                    "bytes": round(r["bytes_up"]), "match": r["match"],
                    "times_ms": {k: round(r[f"{k}_ms"], 1)
                                 for k in ("head", "pack", "transfer", "tail", "return")},
                    "runs": {"latency_ms": [round(t, 1) for t in runs.get("total_ms", [])],
                             "wearable_mj": [round(e, 1) for e in per_run]}}
    return out


def _energy(pw: Any, tx_w: float, rx_w: float, wake_mj: float, r: dict[str, float]) -> float:
    """A run's wearable energy in mJ from its times: compute and packing over idle, the radio
    sending and receiving, one wake-up when it sent anything."""
    sent = wake_mj if r["transfer_ms"] > 0 else 0.0
    return ((r["head_ms"] + r["pack_ms"]) * (pw.cpu_active_w - pw.cpu_idle_w)
            + r["transfer_ms"] * tx_w + r["return_ms"] * rx_w + sent)


def rank_test(a: list[float], b: list[float]) -> float:
    """Two-sided p-value of the Mann-Whitney rank-sum test that runs ``a`` and ``b`` come
    from one distribution: exact (every split of the pooled runs) when there are at most
    10^5 splits, else the normal approximation; 1.0 when either is empty."""
    import itertools
    import math

    if not a or not b:
        return 1.0
    pooled = sorted(a + b)
    rank = {v: sum(i + 1 for i, w in enumerate(pooled) if w == v) / pooled.count(v)
            for v in pooled}
    ranks = [rank[v] for v in a + b]
    k, n = len(a), len(a) + len(b)
    mean = k * (n + 1) / 2
    seen = abs(sum(ranks[:k]) - mean)
    if math.comb(n, k) <= 100_000:
        sums = [sum(ranks[i] for i in c) for c in itertools.combinations(range(n), k)]
        return sum(abs(x - mean) >= seen - 1e-9 for x in sums) / len(sums)
    sd = math.sqrt(k * (n - k) * (n + 1) / 12)
    return math.erfc(seen / sd / math.sqrt(2)) if sd else 1.0


def kind_of(bundle: Any, config: str) -> str:
    """``local``, ``offload`` (the input sent, packed or not) or ``split``."""
    cand = bundle.candidate(config.split("~", 1)[0])
    return "local" if cand.is_wearable_only else "offload" if cand.is_handheld_only else "split"


def cell(bundle: Any, plan: dict[str, Any], measured: dict[str, dict[str, Any]],
         objective: str) -> dict[str, Any]:
    """One cell: the chosen plan and the points, measured, and the regret."""
    key = KEY[objective]
    named = {"chosen": plan["chosen"], **plan["reference"]}
    entries: dict[str, Any] = {}
    for name, e in named.items():
        if e is None:
            entries[name] = None
            continue
        m = measured.get(e["id"], {"measured": False, "why": "not run"})
        entries[name] = {"id": e["id"], "kind": kind_of(bundle, e["id"]),
                         "quality_loss": e["quality_loss"], "exact": bool(e.get("exact")),
                         "predicted_latency_ms": e["latency_ms"],
                         "predicted_wearable_mj": e["wearable_mj"], **m}
    runs = [e for e in entries.values() if e is not None and e["measured"]]
    best = min(runs, key=lambda e: e[key]) if runs else None
    chosen = entries["chosen"]
    local = entries.get("wearable_only")
    out: dict[str, Any] = {"objective": objective, "chosen": chosen, "points": entries,
                           "best_measured": None if best is None else best["id"],
                           "winner_kind": None if best is None else best["kind"]}
    if best is not None and chosen["measured"]:
        out["regret"] = round(chosen[key] / best[key], 4) if best[key] else None
        if best is not chosen and best["id"] != chosen["id"]:  # is the gap beyond the noise?
            out["p_vs_best"] = round(rank_test(chosen.get("runs", {}).get(key, []),
                                               best.get("runs", {}).get(key, [])), 4)
    if local is not None and local["measured"] and best is not None and best[key]:
        out["best_vs_local"] = round(local[key] / best[key], 3)  # > 1: cooperation pays
    return out


def run(args: argparse.Namespace) -> int:
    from coinf.bundle import Bundle
    from coinf.cli.commands.demo_prep import prepare
    from coinf.cli.paths import writable_dir
    from coinf.device.emulation import profile_slowdown
    from coinf.device.profile import DeviceProfile
    from coinf.errors import UserError
    from coinf.models.pretrained import PRETRAINED
    from coinf.wearable.planner.links import NAMED

    models = _names(args.models, PRETRAINED, "models")
    links = _names(args.links, NAMED, "links")
    objectives = _names(args.objectives, KEY, "objectives")
    writable_dir(args.out, "--out")
    samples = {m: args.samples for m in models}
    for item in args.samples_for:
        name, _, n = item.partition("=")
        if name not in samples or not n.isdigit() or int(n) < 1:
            raise UserError(f"--samples-for {item!r}: expected MODEL=N with MODEL one of "
                            f"--models ({', '.join(models)}) and N >= 1")
        samples[name] = int(n)
    t0 = time.perf_counter()
    cells, info = [], {}
    for model in models:
        prep = prepare(model, Path(args.out), samples[model])
        bundle = Bundle.load(prep.bundle_dir)
        slow, pi_ms, _ = profile_slowdown(str(bundle.model_path), DeviceProfile.pi_zero_2w())
        info[model] = {**prep.info, "pi_model_ms": round(pi_ms, 1), "slowdown": round(slow, 2)}
        for link in links:
            plans = {o: plan_points(bundle, link, o) for o in objectives}
            points = {e["id"]: e for p in plans.values()
                      for e in (p["chosen"], *p["reference"].values()) if e is not None}
            progress(f"{model} over {link}: measuring {len(points)} points "
                     f"({', '.join(points)})")
            measured = measure_link(prep, link, points, slow, args)
            for o in objectives:
                c = cell(bundle, plans[o], measured, o)
                cells.append({"model": model, "link": link, **c})
                progress(f"  {o}: chose {c['chosen']['id']}, best measured "
                         f"{c['best_measured']} ({c['winner_kind']}), regret {c.get('regret')}")
    result = {"bench": "map", "models": info, "links": links, "objectives": objectives,
              "wearable_compute": args.wearable_compute,
              "cells": cells, "summary": summary(cells),
              "seconds": round(time.perf_counter() - t0, 1)}
    if args.png:
        from coinf.cli.bench.map_chart import plot_map

        plot_map(cells, models, links, objectives, args.png)
        result["png"] = args.png
    emit(result)
    return 0


def summary(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Regret over the cells, how many within 2 %, and who wins where."""
    regrets = [c["regret"] for c in cells if c.get("regret") is not None]
    wins: dict[str, int] = {}
    for c in cells:
        if c["winner_kind"]:
            wins[c["winner_kind"]] = wins.get(c["winner_kind"], 0) + 1
    pays = [c for c in cells if (c.get("best_vs_local") or 0) >= 2.0]
    misses = [c for c in cells if (c.get("regret") or 0) > 1.02]
    return {"cells": len(cells), "measured_cells": len(regrets),
            "regret_max": max(regrets) if regrets else None,
            "regret_median": statistics.median(regrets) if regrets else None,
            "within_2pct": sum(r <= 1.02 for r in regrets), "winners": wins,
            # a miss whose runs a rank test cannot tell from the best's (p >= 0.05) is within
            # this machine's run-to-run noise
            "misses": [f"{c['model']}/{c['link']}/{c['objective']}: regret {c['regret']}, "
                       f"p {c.get('p_vs_best')}" for c in misses],
            "misses_beyond_noise": sum((c.get("p_vs_best") or 0.0) < 0.05 for c in misses),
            "cooperation_2x": [f"{c['model']}/{c['link']}/{c['objective']}: "
                               f"{c['best_measured']} {c['best_vs_local']}x" for c in pays]}
