"""``coinf demo``: the main job on one machine, on a model where cooperation pays.

The default model is ``wearcam``, a 96x96 RGB camera-frame classifier (models/onnx). The demo

1. splits it into a bundle (reused when up to date) and verifies every candidate;
2. derives the emulated wearable's slowdown from the built-in Pi Zero 2 W profile against this
   machine (:func:`coinf.device.emulation.profile_slowdown`);
3. asks the planner, with the built-in Pi Zero 2 W and laptop profiles, for every candidate's
   latency and wearable energy under two conditions -- the ``pi-zero-2w`` radio preset's
   bandwidth, then the bandwidth dropped to ``--dropped`` kB/s -- and shows its choice
   against wearable-only and handheld-only;
4. runs the planner's choice and both extremes for real: the emulated radio (a ``coinf radio``
   process), a handheld daemon process and a wearable process (``coinf run``) talking BLE GATT
   through it, the wearable slowed down by the factor of step 2. Exits 1 on an output mismatch.

The last line of stdout is one JSON object (``--json``: the only output on stdout): for each
condition the chosen candidate against the best extreme, for latency and wearable energy.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coinf.cli.bench import progress


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="wearcam", help="zoo model (default %(default)s)")
    parser.add_argument("--out", default="out/demo", help="where bundles are kept")
    parser.add_argument("--transport", default="ble", choices=["ble", "socket"],
                        help="ble: through the emulated radio (default); socket: local socket")
    parser.add_argument("--preset", default="pi-zero-2w", help="radio preset (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per candidate (median)")
    parser.add_argument("--slowdown", type=float, default=None,
                        help="wearable is K x slower than this machine (default: from the "
                        "built-in Pi Zero 2 W profile against this machine)")
    parser.add_argument("--budget-ms", type=float, default=1000.0,
                        help="the app's latency budget per frame (default %(default)s)")
    parser.add_argument("--dropped", type=float, default=5.0, metavar="KB_S",
                        help="bandwidth of the second condition in kB/s (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="only the JSON summary on stdout")
    parser.set_defaults(func=run)


def ensure_bundle(model: Path, out: Path) -> Path:
    """Split ``model`` into ``out`` unless a bundle of the same model file is already there."""
    from coinf.convert.bundle import MANIFEST, Bundle, sha256_file
    from coinf.convert.split import split_model

    if (out / MANIFEST).is_file():
        try:
            source = Bundle.load(out).meta.get("source", {})
            if source.get("sha256") == sha256_file(model):
                progress(f"reusing bundle {out}")
                return out
        except Exception as exc:
            progress(f"rebuilding bundle {out} ({exc})")
    progress(f"splitting {model} into {out} ...")
    t0 = time.perf_counter()
    split_model(model, out, verify=True, force=True)
    progress(f"split + verify took {time.perf_counter() - t0:.1f} s")
    return out


def plan_condition(bundle: Any, name: str, bps: float, rtt_ms: float,
                   budget_ms: float) -> dict[str, Any]:
    """The planner's decision with the built-in profiles, the handheld plugged in (charging:
    only wearable energy counts) and a latency budget; every candidate's row."""
    from coinf.device.profile import DeviceProfile
    from coinf.device.status import DeviceStatus
    from coinf.wearable.planner.adapt import LinkEstimate
    from coinf.wearable.planner.planner import Planner
    from coinf.wearable.policy import Policy

    planner = Planner(bundle, DeviceProfile.pi_zero_2w(), DeviceProfile.laptop(),
                      Policy(latency_budget_ms=budget_ms), packings=("raw",))
    link = LinkEstimate(bps, bps, rtt_ms, name)
    d = planner.decide(link, None, DeviceStatus(charging=True), "auto", budget_ms)
    rows = {r.id: r for r in d.rows}
    wo, ho = bundle.candidates[-1].id, bundle.candidates[0].id

    def pick(cid: str) -> dict[str, Any]:
        r = rows[cid]
        return {"candidate": cid, "label": r.label, "latency_ms": round(r.latency_ms(), 1),
                "wearable_energy_mj": round(r.wearable_energy_mj, 1),
                "excluded": d.excluded.get(cid)}

    extremes = [pick(wo), pick(ho)]
    feasible = [e for e in extremes if e["excluded"] is None] or extremes
    best_lat = min(feasible, key=lambda e: e["latency_ms"])
    best_en = min(feasible, key=lambda e: e["wearable_energy_mj"])
    chosen = pick(d.winner)
    return {
        "condition": name, "bandwidth_kB_s": round(bps / 1e3, 2), "rtt_ms": rtt_ms,
        "budget_ms": budget_ms, "chosen": chosen, "why": d.why,
        "wearable_only": extremes[0], "handheld_only": extremes[1],
        "latency_vs_best_extreme": {"chosen_ms": chosen["latency_ms"],
                                    "best_extreme": best_lat["candidate"],
                                    "best_extreme_ms": best_lat["latency_ms"]},
        "wearable_energy_vs_best_extreme": {"chosen_mj": chosen["wearable_energy_mj"],
                                            "best_extreme": best_en["candidate"],
                                            "best_extreme_mj": best_en["wearable_energy_mj"]},
        "rows": [{"candidate": r.id, "label": r.label, "bytes": r.crossing_bytes,
                  "latency_ms": round(r.latency_ms(), 1),
                  "wearable_energy_mj": round(r.wearable_energy_mj, 1),
                  "excluded": r.id in d.excluded} for r in d.rows],
        "notes": [n for n in d.notes if n.startswith("compute times")],
    }


def format_condition(c: dict[str, Any]) -> str:
    lines = [f"{c['condition']}: link {c['bandwidth_kB_s']:g} kB/s each way, RTT "
             f"{c['rtt_ms']:g} ms; handheld plugged in (only wearable energy counts); latency "
             f"budget {c['budget_ms']:g} ms (predicted with the built-in profiles)",
             f"  {'candidate':<10} {'cut after':<26} {'sends B':>8} {'latency ms':>11} "
             f"{'wearable mJ':>12}"]
    for r in c["rows"]:
        mark = "*" if r["candidate"] == c["chosen"]["candidate"] else (
            "x" if r["excluded"] else " ")
        label = r["label"] if len(r["label"]) <= 26 else "…" + r["label"][-25:]
        lines.append(f"{mark} {r['candidate']:<10} {label:<26} {r['bytes']:>8} "
                     f"{r['latency_ms']:>11.1f} {r['wearable_energy_mj']:>12.1f}")
    ch, wo, ho = c["chosen"], c["wearable_only"], c["handheld_only"]
    lines.append(f"  planner chose {ch['candidate']} ({ch['label']}): {ch['latency_ms']:.0f} ms, "
                 f"{ch['wearable_energy_mj']:.0f} mJ on the wearable | wearable-only "
                 f"{wo['latency_ms']:.0f} ms, {wo['wearable_energy_mj']:.0f} mJ | handheld-only "
                 f"{ho['latency_ms']:.0f} ms, {ho['wearable_energy_mj']:.0f} mJ")
    lines.append(f"  why: {c['why']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from coinf.cli.commands.run import format_table
    from coinf.convert.bundle import Bundle
    from coinf.device.emulation import profile_slowdown
    from coinf.device.profile import DeviceProfile
    from coinf.errors import UserError
    from coinf.models import zoo

    if args.model not in zoo.ZOO:
        raise UserError(f"unknown model {args.model!r}; choose from {', '.join(zoo.ZOO)}")
    if args.repeat < 1 or not args.dropped > 0 or args.budget_ms < 0:
        raise UserError("--repeat must be >= 1, --dropped > 0 and --budget-ms >= 0")
    if args.slowdown is not None and args.slowdown < 1:
        raise UserError(f"--slowdown must be >= 1, got {args.slowdown}")
    t_start = time.perf_counter()
    out = sys.stderr if args.json else sys.stdout
    bundle_dir = ensure_bundle(zoo.committed_path(args.model), Path(args.out) / args.model)
    bundle = Bundle.load(bundle_dir)
    pi = DeviceProfile.pi_zero_2w()
    slow, pi_ms, here_ms = profile_slowdown(str(bundle.model_path), pi)
    if args.slowdown is not None:
        slow = args.slowdown
    from coinf.ble_protocol.radio.params import preset

    radio = preset(args.preset)
    bps, rtt = radio.capacity_bps(), 30.0
    conditions = [plan_condition(bundle, f"{args.preset} radio preset", bps, rtt,
                                 args.budget_ms),
                  plan_condition(bundle, "bandwidth dropped", args.dropped * 1e3, rtt,
                                 args.budget_ms)]
    print(f"\n{args.model}: {zoo.spec_for(args.model).description}", file=out)
    print(f"emulated wearable = this machine x{slow:.1f} (the built-in Pi Zero 2 W profile "
          f"predicts {pi_ms:.0f} ms for the whole model; this machine runs it in "
          f"{here_ms:.1f} ms on one thread)\n", file=out)
    for c in conditions:
        print(format_condition(c) + "\n", file=out)
    chosen = conditions[0]["chosen"]["candidate"]
    wo, ho = bundle.candidates[-1].id, bundle.candidates[0].id
    ids = list(dict.fromkeys([chosen, wo, ho]))
    rows, where = measure(args, bundle_dir, ids, slow)
    by = {r["candidate"]: r for r in rows}
    pw = pi.power

    def energy(r: dict[str, Any]) -> float:  # the Pi power model on measured times
        return round((r["head_ms"] + r["pack_ms"]) * (pw.cpu_active_w - pw.cpu_idle_w)
                     + r["transfer_ms"] * pw.ble_tx_w + r["return_ms"] * pw.ble_rx_w, 1)

    print(f"measured: wearable (x{slow:.1f} slower) and handheld in separate processes "
          f"{where}", file=out)
    print(format_table(rows), file=out)
    for r in rows:
        print(f"  {r['candidate']}: {r['total_ms']:.0f} ms end to end, wearable energy "
              f"{energy(r):.0f} mJ (Pi power model x measured times)", file=out)
    measured = {cid: {"latency_ms": by[cid]["total_ms"], "wearable_energy_mj": energy(by[cid]),
                      "match": by[cid]["match"]} for cid in ids if cid in by}
    bad = [r["candidate"] for r in rows if not r["match"]]
    summary = {
        "model": args.model, "slowdown": round(slow, 2), "pi_model_ms": round(pi_ms, 1),
        "conditions": [{k: v for k, v in c.items() if k not in ("rows", "notes")}
                       for c in conditions],
        "choice_changes": conditions[0]["chosen"]["candidate"]
        != conditions[1]["chosen"]["candidate"],
        "measured": measured,
        "cooperation_wins": {
            "latency": measured.get(chosen, {}).get("latency_ms", float("inf"))
            < min(measured[c]["latency_ms"] for c in (wo, ho) if c in measured),
            "wearable_energy": measured.get(chosen, {}).get("wearable_energy_mj", float("inf"))
            < min(measured[c]["wearable_energy_mj"] for c in (wo, ho) if c in measured)},
        "all_match": not bad, "seconds": round(time.perf_counter() - t_start, 1)}
    if bad:
        print(f"\nMISMATCH against the whole model at: {', '.join(bad)}", file=out)
    print(json.dumps(summary))
    return 1 if bad else 0


def measure(args: argparse.Namespace, bundle_dir: Path, ids: list[str],
            slowdown: float) -> tuple[list[dict[str, Any]], str]:
    """Run ``ids`` in a wearable process against a handheld process (through the emulated radio
    for ``--transport ble``); returns the rows of ``coinf run --json`` and where they ran."""
    from coinf.errors import UserError

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    coinf = [sys.executable, "-m", "coinf"]
    stops: list[Callable[[], None]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="coinf-demo-") as tmp:
            if args.transport == "ble":
                from coinf.ble_protocol.radio import spawn
                from coinf.ble_protocol.radio.params import preset

                capacity = preset(args.preset).capacity_bps()
                wspec, hspec, stop_radio = spawn(args.preset)
                stops.append(stop_radio)
                progress(f"radio process: preset {args.preset}, ATT capacity "
                         f"{capacity / 1000:.1f} kB/s each way")
                passkey = str(secrets.randbelow(1_000_000))
                hh_args = ["--transport", "ble", "--hci", hspec, "--passkey", passkey]
                wear_args = ["--transport", "ble", "--hci", wspec, "--passkey", passkey]
                where = (f"over BLE GATT through the emulated {args.preset} radio "
                         f"({capacity / 1000:.1f} kB/s ATT capacity)")
            else:
                address = f"unix:{tmp}/handheld.sock"
                hh_args = ["--listen", address]
                wear_args = ["--transport", "socket", "--handheld", address]
                where = "over a local socket (transfer is socket time, not radio time)"
            handheld = subprocess.Popen(
                [*coinf, "handheld", "--bundle", str(bundle_dir), *hh_args],
                stdout=subprocess.PIPE, text=True, env=env,
            )

            def stop_handheld() -> None:
                handheld.terminate()
                handheld.wait(10)

            stops.append(stop_handheld)
            assert handheld.stdout is not None
            ready = handheld.stdout.readline()
            if "serving" not in ready:
                raise UserError("the handheld daemon did not start (see its error above)")
            progress(f"handheld process {handheld.pid}: {ready.strip()}")
            progress(f"wearable process: running {', '.join(ids)} ({args.repeat} runs each) ...")
            proc = subprocess.run(
                [*coinf, "run", str(bundle_dir), "--slowdown", f"{slowdown:.3f}",
                 "--threads", "1", *wear_args, "--json", "--split", ",".join(ids),
                 "--repeat", str(args.repeat)],
                stdout=subprocess.PIPE, text=True, env=env, check=False,
            )
            if proc.returncode not in (0, 1) or not proc.stdout.strip():
                raise UserError(f"the wearable process failed (exit {proc.returncode})")
            result: dict[str, Any] = json.loads(proc.stdout)
    finally:
        for stop in reversed(stops):
            stop()
    return list(result["rows"]), where
