"""``coinf demo``: the main job on one machine, on a real pretrained model, against what a user
would do without coinf.

The default model is ``ppocr_rec`` (PaddleOCR's PP-OCRv4 text recogniser from the
``rapidocr-onnxruntime`` wheel: about a second per word crop on a Pi Zero 2 W, the case where a
wearable needs help); ``--model`` takes any pretrained model of ``coinf models list`` (e.g.
``mobilenetv2_imagenet``) or a zoo model. The demo

1. builds, splits and verifies the model, and calibrates every packing -- the standard codecs
   on the model input, the quantizing ones at the cuts that send least -- on real inputs with
   the task's metric (demo_prep.py; kept in ``--out`` and reused);
2. derives the emulated wearable's slowdown from the built-in Pi Zero 2 W profile against this
   machine (:func:`coinf.device.emulation.profile_slowdown`);
3. with ``--transport auto`` (the default) lets the planner choose the link among the Pi's two,
   BLE and Wi-Fi (:func:`choose_link`), and asks it, with the built-in Pi Zero 2 W and laptop
   profiles, for its choice on that link and the four reference points (wearable-only, the raw
   input offloaded, the input offloaded through its best packing within the quality
   tolerance, the best split) under two conditions: the link preset's bandwidth, then the
   bandwidth dropped to ``--dropped``;
4. runs the choice and the reference points for real, on a held-out real input, in separate
   processes: the emulated radio (``coinf radio``: BLE GATT, or the Wi-Fi air's shaped TCP),
   the handheld daemon and the wearable (``coinf run``), the wearable slowed down by the factor
   of step 2. A reference point predicted to take over ``--max-run-s`` per run is reported as
   predicted. Exits 1 when a lossless configuration's output differs from the whole model's.

The last line of stdout is one JSON object (``--json``: the only output on stdout): ``model``,
``transport`` and ``link`` (each link's predicted winner and why the planner chose one),
``chosen`` and ``reference`` (each measured: ``latency_ms``, ``wearable_mj``, ``bytes``,
``quality_loss``), and the conditions' predictions.
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

from coinf.cli import argtypes
from coinf.cli.bench import progress


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="a pretrained model of `coinf models list` (default %(default)s), "
                             "or a zoo model (random weights)")
    parser.add_argument("--out", default="out/demo", help="where models and bundles are kept")
    parser.add_argument("--transport", default="auto", choices=["auto", "ble", "wifi", "socket"],
                        help="auto (default): the planner chooses between the Pi Zero 2 W's "
                             "two links, BLE (--preset) and Wi-Fi (--wifi-preset), and the demo "
                             "runs over the one it chose (BLE when the wearable keeps the work); "
                             "ble: through the emulated BLE radio; wifi: through the emulated "
                             "Wi-Fi air; socket: a local socket")
    parser.add_argument("--wifi-preset", default="pi-zero-2w-wifi",
                        help="Wi-Fi preset of --transport wifi (default %(default)s)")
    parser.add_argument("--preset", default="pi-zero-2w", help="radio preset (default %(default)s)")
    parser.add_argument("--repeat", type=argtypes.positive_int, default=2,
                        help="runs per configuration (median)")
    parser.add_argument("--slowdown", type=argtypes.slowdown, default=None,
                        help="wearable is K x slower than this machine (default: from the "
                        "built-in Pi Zero 2 W profile against this machine)")
    parser.add_argument("--budget-ms", type=argtypes.milliseconds, default=1000.0,
                        help="the app's latency budget per frame (default %(default)s)")
    parser.add_argument("--dropped", type=argtypes.kbps, default=5.0, metavar="KB_S",
                        help="bandwidth of the second condition in kB/s (default %(default)s)")
    parser.add_argument("--samples", type=argtypes.positive_int, default=300,
                        help="real inputs the packings are calibrated on (default %(default)s; "
                             "299 establish a 1 pp bound)")
    parser.add_argument("--max-run-s", type=argtypes.seconds, default=15.0,
                        help="reference points predicted to take longer per run are reported "
                             "as predicted, not run (default %(default)s)")
    parser.add_argument("--learned", default=None, metavar="BUNDLE",
                        help="also offer the learned bottlenecks `coinf compress` trained into "
                             "this bundle of the same model (copied in; nothing is trained)")
    parser.add_argument("--json", action="store_true", help="only the JSON summary on stdout")
    parser.set_defaults(func=run)


DEFAULT_MODEL = "ppocr_rec"
KINDS = ("wearable_only", "handheld_raw", "handheld_codec", "best_split")


def plan_condition(bundle: Any, name: str, bps: float, rtt_ms: float,
                   budget_ms: float, kind: str = "ble", wake_ms: float = 0.0) -> dict[str, Any]:
    """The planner's decision with the built-in profiles, the handheld plugged in (charging:
    only wearable energy counts), a latency budget and every calibrated packing; the chosen
    configuration and the four reference points (wearable/planner/references.py)."""
    from coinf.device.profile import DeviceProfile
    from coinf.device.status import DeviceStatus
    from coinf.wearable.planner.adapt import LinkEstimate
    from coinf.wearable.planner.planner import Planner
    from coinf.wearable.planner.references import plan_json
    from coinf.wearable.policy import Policy

    planner = Planner(bundle, DeviceProfile.pi_zero_2w(), DeviceProfile.laptop(),
                      Policy(latency_budget_ms=budget_ms))
    link = LinkEstimate(bps, bps, rtt_ms, name, kind=kind, wake_ms=wake_ms)
    hst = DeviceStatus(charging=True)
    d = planner.decide(link, None, hst, "auto", budget_ms)
    ref = plan_json(planner, d, link_estimate=link, handheld_status=hst, objective="auto",
                    latency_budget_ms=budget_ms)
    rows = {r.id: r for r in d.rows}
    wo, ho = bundle.candidates[-1].id, bundle.candidates[0].id

    def pick(cid: str) -> dict[str, Any]:
        r = rows[cid]
        return {"candidate": cid, "label": r.label, "latency_ms": round(r.latency_ms(), 1),
                "wearable_energy_mj": round(r.wearable_energy_mj, 1),
                "excluded": d.excluded.get(cid)}

    return {
        "condition": name, "bandwidth_kB_s": round(bps / 1e3, 2), "rtt_ms": rtt_ms,
        "budget_ms": budget_ms, "chosen": pick(d.winner), "why": d.why,
        "wearable_only": pick(wo), "handheld_only": pick(ho),
        "quality": ref.get("quality"),
        "plan": {"chosen": ref["chosen"], "reference": ref["reference"],
                 "reference_missing": ref["reference_missing"]},
        "rows": [{"candidate": r.id, "label": r.label, "bytes": r.crossing_bytes,
                  "latency_ms": round(r.latency_ms(), 1),
                  "wearable_energy_mj": round(r.wearable_energy_mj, 1),
                  "excluded": r.id in d.excluded} for r in d.rows],
        "notes": [n for n in d.notes if n.startswith("compute times")],
    }


def demo_links(ble_preset: str, wifi_name: str) -> dict[str, Any]:
    """The Pi Zero 2 W's two links as the demo assumes them: BLE at the radio preset's ATT
    capacity, Wi-Fi at its preset (:func:`~coinf.wearable.planner.links.preset_estimate`)."""
    from coinf.wearable.planner.links import preset_estimate

    return {"ble": preset_estimate("ble", ble_preset), "wifi": preset_estimate("wifi", wifi_name)}


def choose_link(bundle: Any, links: dict[str, Any], budget_ms: float) -> Any:
    """The planner's link choice (:func:`~coinf.wearable.planner.links.decide_links`) under the
    demo's objective and conditions (built-in profiles, the handheld plugged in)."""
    from coinf.device.profile import DeviceProfile
    from coinf.device.status import DeviceStatus
    from coinf.wearable.planner.links import decide_links
    from coinf.wearable.planner.planner import Planner
    from coinf.wearable.policy import Policy

    planner = Planner(bundle, DeviceProfile.pi_zero_2w(), DeviceProfile.laptop(),
                      Policy(latency_budget_ms=budget_ms))
    return decide_links(planner, links, "auto", budget_ms, budget_given=True,
                        handheld_status=DeviceStatus(charging=True))


def format_links(choice: Any, transport: str) -> str:
    """The link decision in a few lines: each link's winner, and the link the demo runs on."""
    lines = ["the link, chosen by the planner among the Pi Zero 2 W's two (predicted):"]
    for name, e in choice.to_json()["per_link"].items():
        lines.append(f"  {name:<5} best {e['winner']:<22} {e['latency_ms']:>9.0f} ms "
                     f"{e['wearable_mj']:>8.0f} mJ")
    ran = transport.upper() if transport == "ble" else "Wi-Fi"
    lines.append(f"  -> {choice.why}; the demo runs over {ran}")
    return "\n".join(lines)


def format_condition(c: dict[str, Any]) -> str:
    lines = [f"{c['condition']}: link {c['bandwidth_kB_s']:g} kB/s each way, RTT "
             f"{c['rtt_ms']:g} ms; handheld plugged in (only wearable energy counts); latency "
             f"budget {c['budget_ms']:g} ms (predicted with the built-in profiles)"]
    plan = c["plan"]
    for name, e in (("chosen", plan["chosen"]), *plan["reference"].items()):
        if e is None:
            why = plan["reference_missing"].get(name, "none feasible")
            lines.append(f"  {name:<15} -- {why}")
            continue
        bound = e.get("quality_loss_bound")
        lines.append(f"  {name:<15} {e['id']:<22} sends {e['bytes']:>9,d} B "
                     f"{e['latency_ms']:>9.0f} ms {e['wearable_mj']:>8.0f} mJ  quality loss "
                     f"{e['quality_loss']:.2f} pp"
                     + (" (exact)" if e.get("exact") else f" (bound {bound:.2f})" if bound
                        else "")
                     + ("  [excluded: " + e["excluded"] + "]" if e.get("excluded") else ""))
    lines.append(f"  why: {c['why']}")
    return "\n".join(lines)


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad flags, an unwritable ``--out`` and a ``--learned`` that is no bundle before
    the model is built."""
    from coinf.cli.paths import writable_dir
    from coinf.errors import UserError

    if args.repeat < 1 or not args.dropped > 0 or args.budget_ms < 0 or args.samples < 1 \
            or not args.max_run_s > 0:
        raise UserError("--repeat and --samples must be >= 1, --dropped and --max-run-s > 0, "
                        "--budget-ms >= 0")
    if args.slowdown is not None and args.slowdown < 1:
        raise UserError(f"--slowdown must be >= 1, got {args.slowdown}")
    writable_dir(args.out, "--out")  # refused now, not after the model is built
    if args.learned is not None and not Path(args.learned, "manifest.json").is_file():
        raise UserError(f"--learned {args.learned}: not a bundle (no manifest.json)")


def run(args: argparse.Namespace) -> int:
    from coinf.bundle import Bundle
    from coinf.cli.commands.demo_prep import describe, prepare
    from coinf.cli.run_format import format_table
    from coinf.device.emulation import profile_slowdown
    from coinf.device.profile import DeviceProfile

    check_args(args)
    t_start = time.perf_counter()
    out = sys.stderr if args.json else sys.stdout
    prep = prepare(args.model, Path(args.out), args.samples,
                   None if args.learned is None else Path(args.learned))
    bundle = Bundle.load(prep.bundle_dir)
    pi = DeviceProfile.pi_zero_2w()
    slow, pi_ms, here_ms = profile_slowdown(str(bundle.model_path), pi)
    if args.slowdown is not None:
        slow = args.slowdown
    links = demo_links(args.preset, args.wifi_preset)
    link_choice = None
    if args.transport == "auto":
        link_choice = choose_link(bundle, links, args.budget_ms)
        chosen_kind = links[link_choice.link].kind if link_choice.link else "ble"
        args = argparse.Namespace(**{**vars(args), "transport": chosen_kind})
    est = links["wifi" if args.transport == "wifi" else "ble"]
    bps, rtt, kind, wake, name = est.up_bps, est.rtt_ms, est.kind, est.wake_ms, est.source
    conditions = [plan_condition(bundle, name, bps, rtt, args.budget_ms, kind, wake),
                  plan_condition(bundle, "bandwidth dropped", args.dropped * 1e3, rtt,
                                 args.budget_ms, kind, wake)]
    print(f"\n{describe(prep)}", file=out)
    print(f"emulated wearable = this machine x{slow:.1f} (the built-in Pi Zero 2 W profile "
          f"predicts {pi_ms:.0f} ms for the whole model; this machine runs it in "
          f"{here_ms:.1f} ms on one thread)\n", file=out)
    quality = conditions[0].get("quality") or {}
    if quality.get("text"):
        print(quality["text"] + "\n", file=out)
    if link_choice is not None:
        print(format_links(link_choice, args.transport) + "\n", file=out)
    for c in conditions:
        print(format_condition(c) + "\n", file=out)
    plan = conditions[0]["plan"]
    ids, skipped = points_to_run(plan, args.max_run_s)
    rows, where = measure(args, prep.bundle_dir, ids, slow, prep.input_file)
    print(f"measured: wearable (x{slow:.1f} slower) and handheld in separate processes "
          f"{where}", file=out)
    print(format_table(rows), file=out)
    by = {f"{r['candidate']}~{r['packing']}" if r["packing"] != "raw" else r["candidate"]: r
          for r in rows}

    def measured(e: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if e is None else with_measurement(e, by.get(e["id"]), skipped, pi.power, kind)

    chosen = measured(plan["chosen"])
    reference = {k: measured(plan["reference"][k]) for k in KINDS}
    assert chosen is not None
    for name, e in (("chosen", chosen), *reference.items()):
        if e is not None:
            print(measured_line(name, e, bundle, args.samples), file=out)
    done = [e for e in reference.values() if e is not None and e["measured"]]
    bad = [r["candidate"] for r in rows if not r["match"]]
    summary = {
        "model": prep.info, "slowdown": round(slow, 2), "pi_model_ms": round(pi_ms, 1),
        "transport": args.transport,
        "link": None if link_choice is None else link_choice.to_json(),
        "conditions": [{k: v for k, v in c.items() if k not in ("rows", "notes", "quality")}
                       for c in conditions],
        "choice_changes": conditions[0]["chosen"]["candidate"]
        != conditions[1]["chosen"]["candidate"],
        "quality": {k: v for k, v in quality.items() if k != "criterion_text"},
        "chosen": chosen, "reference": reference,
        "chosen_vs_best_reference": objective_comparison(chosen, done, args.budget_ms),
        "all_match": not bad, "seconds": round(time.perf_counter() - t_start, 1)}
    if bad:
        print(f"\nMISMATCH against the whole model at: {', '.join(bad)}", file=out)
    print(json.dumps(summary))
    return 1 if bad else 0


def points_to_run(plan: dict[str, Any], max_run_s: float) -> tuple[list[str], dict[str, str]]:
    """The configurations of the plan's choice and reference points to run, each once, and
    why the others are not (a reference point predicted to take over ``max_run_s`` per run)."""
    points = {"chosen": plan["chosen"], **plan["reference"]}
    ids: list[str] = []
    skipped: dict[str, str] = {}
    for name, e in points.items():
        if e is None or e["id"] in ids:
            continue
        if name != "chosen" and e["latency_ms"] > max_run_s * 1e3:
            skipped[e["id"]] = (f"not run: predicted {e['latency_ms'] / 1e3:.0f} s per run "
                                f"(> --max-run-s {max_run_s:g})")
            continue
        ids.append(e["id"])
    return ids, skipped


def wearable_mj(row: dict[str, Any], power: Any, kind: str) -> float:
    """The wearable's energy of a measured row: the Pi power model on its measured times over
    a ``kind`` radio."""
    tx_w, rx_w, wake_mj = power.radio(kind)
    sent = wake_mj if row["transfer_ms"] > 0 else 0.0
    return round((row["head_ms"] + row["pack_ms"]) * (power.cpu_active_w - power.cpu_idle_w)
                 + row["transfer_ms"] * tx_w + row["return_ms"] * rx_w + sent, 1)


def with_measurement(e: dict[str, Any], row: dict[str, Any] | None, skipped: dict[str, str],
                     power: Any, kind: str) -> dict[str, Any]:
    """A planned point with its prediction and, from its measured ``row``, its measured latency,
    wearable energy and bytes (without one: why it was not run)."""
    base = {"id": e["id"], "cut": e["cut"], "packing": e["packing"],
            "quality_loss": e["quality_loss"],
            "quality_loss_bound": e.get("quality_loss_bound"),
            "exact": bool(e.get("exact")),
            "predicted_latency_ms": e["latency_ms"], "predicted_wearable_mj": e["wearable_mj"]}
    if row is None:
        return {**base, "measured": False, "why": skipped.get(e["id"]),
                "latency_ms": None, "wearable_mj": None, "bytes": e["bytes"]}
    return {**base, "measured": True, "latency_ms": row["total_ms"],
            "wearable_mj": wearable_mj(row, power, kind), "bytes": round(row["bytes_up"]),
            "top1_same": row["top1_same"], "match": row["match"]}


def measured_line(name: str, e: dict[str, Any], bundle: Any, samples: int) -> str:
    """One point of the demo as measured (or why not), with its quality loss and its source."""
    text = (f"{e['latency_ms']:.0f} ms end to end, wearable energy {e['wearable_mj']:.0f}"
            f" mJ" if e["measured"] else e["why"])
    return (f"  {name:<15} {e['id']:<22} {text}; quality loss {e['quality_loss']:.2f} pp "
            f"({measured_on(bundle, e['id'], samples)})")


def measured_on(bundle: Any, config: str, samples: int) -> str:
    """Where a configuration's quality loss comes from: the demo's calibration, or a learned
    compressor's own held-out feeds (``c013~g5+latent``)."""
    from coinf.wearable.planner.planner import parse_config_spec, split_config

    cid, packing = split_config(config)
    gamma, _ = parse_config_spec(packing)
    comp = None if gamma is None else bundle.compressor(cid, gamma)
    if comp is not None and comp.test_feeds:
        return f"measured on its {comp.test_feeds} held-out inputs"
    return f"calibrated on {samples} real inputs"


def objective_comparison(chosen: dict[str, Any], refs: list[dict[str, Any]],
                         budget_ms: float) -> dict[str, Any]:
    """The choice against the best measured reference point in the demo's objective: least
    wearable energy among the runs within the latency budget (the fastest when none is)."""
    within = [e for e in refs if e["latency_ms"] <= budget_ms]
    key = "wearable_mj" if within else "latency_ms"
    best = min(within or refs, key=lambda e: e[key]) if refs else None
    out: dict[str, Any] = {
        "objective": f"least wearable energy within {budget_ms:g} ms" if within
        else "lowest latency (no reference point met the budget)",
        "chosen_within_budget": chosen["latency_ms"] <= budget_ms}
    if best is not None:
        out.update({"metric": key, "chosen": chosen[key], "best": best[key],
                    "best_is": best["id"], "ratio": round(chosen[key] / best[key], 4)
                    if best[key] else None})
    return out


def measure(args: argparse.Namespace, bundle_dir: Path, ids: list[str],
            slowdown: float, input_file: Path | None = None,
            compute_profile: str | None = None) -> tuple[list[dict[str, Any]], str]:
    """Run ``ids`` in a wearable process against a handheld process (through the emulated radio
    for ``--transport ble``); returns the rows of ``coinf run --json`` and where they ran.
    ``compute_profile`` times the wearable's slices by that profile (``coinf run
    --compute-profile``) instead of ``slowdown`` x this machine."""
    from coinf.errors import UserError

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    coinf = [sys.executable, "-m", "coinf"]
    stops: list[Callable[[], None]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="coinf-demo-") as tmp:
            hh_args, wear_args, where = _link_args(args, tmp, stops)
            if args.transport == "wifi":  # TLS as on a real link, with a one-off identity
                from coinf.ble_protocol.tls_store import one_machine_store

                env["COINF_TLS_DIR"] = str(one_machine_store(Path(tmp) / "tls").directory)
            _start_handheld([*coinf, "handheld", "--bundle", str(bundle_dir), *hh_args], env,
                            stops)
            if args.transport == "wifi":
                from coinf.ble_protocol.wifi_air import spawn as spawn_air

                relay, stop_air = spawn_air(args.wifi_preset, hh_args[1])  # --listen ADDRESS
                stops.append(stop_air)
                wear_args[-1] = relay
                progress(f"Wi-Fi air process: {args.wifi_preset}, the wearable dials {relay}")
            progress(f"wearable process: running {', '.join(ids)} (one warm-up run, then "
                     f"{args.repeat} measured, each) ...")
            proc = subprocess.run(
                [*coinf, "run", str(bundle_dir), "--slowdown", f"{slowdown:.3f}",
                 "--threads", "1", *wear_args, "--json", "--split", ",".join(ids),
                 "--repeat", str(args.repeat), "--warmup", "1",
                 *([] if compute_profile is None else ["--compute-profile", compute_profile]),
                 *([] if input_file is None else ["--input", f"{_input_name(bundle_dir)}="
                                                  f"{input_file}"])],
                stdout=subprocess.PIPE, text=True, env=env, check=False,
            )
            if proc.returncode not in (0, 1) or not proc.stdout.strip():
                raise UserError(f"the wearable process failed (exit {proc.returncode})")
            result: dict[str, Any] = json.loads(proc.stdout)
    finally:
        for stop in reversed(stops):
            stop()
    return list(result["rows"]), where


def _link_args(args: argparse.Namespace, tmp: str,
               stops: list[Callable[[], None]]) -> tuple[list[str], list[str], str]:
    """The handheld's and the wearable's link flags for ``args.transport``, and where the runs
    go. ``ble`` starts the emulated radio (its stop appended to ``stops``) and hands a one-off
    passkey over in a file of ``tmp``; ``wifi``'s wearable flags end with a placeholder for the
    Wi-Fi air's relay."""
    if args.transport == "ble":
        from coinf.ble_protocol.radio import spawn
        from coinf.ble_protocol.radio.params import preset

        capacity = preset(args.preset).capacity_bps()
        wspec, hspec, stop_radio = spawn(args.preset)
        stops.append(stop_radio)
        progress(f"radio process: preset {args.preset}, ATT capacity "
                 f"{capacity / 1000:.1f} kB/s each way")
        from coinf.cli.passkey import write_passkey_file

        # a one-off passkey, handed over in a 0600 file (never argv); one-off bond
        # stores: the demo's devices leave no bond behind
        passkey = write_passkey_file(tmp, secrets.randbelow(1_000_000))
        return (["--transport", "ble", "--hci", hspec, "--passkey-file", passkey,
                 "--keystore", f"{tmp}/bonds/handheld.json"],
                ["--transport", "ble", "--hci", wspec, "--passkey-file", passkey,
                 "--keystore", f"{tmp}/bonds/wearable.json"],
                f"over BLE GATT through the emulated {args.preset} radio "
                f"({capacity / 1000:.1f} kB/s ATT capacity)")
    if args.transport == "wifi":
        from coinf.ble_protocol.wifi_preset import wifi_preset

        w = wifi_preset(args.wifi_preset)
        return (["--listen", f"tcp:127.0.0.1:{_free_port()}"],
                ["--transport", "socket", "--handheld", "WIFI"],
                f"over TLS 1.3 through the emulated {w.name} Wi-Fi air "
                f"({w.throughput_bps / 1e6:g} MB/s, RTT {w.rtt_ms:g} ms)")
    address = f"unix:{tmp}/handheld.sock"
    return (["--listen", address], ["--transport", "socket", "--handheld", address],
            "over a local socket (transfer is socket time, not radio time)")


def _start_handheld(argv: list[str], env: dict[str, str],
                    stops: list[Callable[[], None]]) -> None:
    """Start the handheld daemon (its stop appended to ``stops``) and wait for its ready
    line."""
    from coinf.errors import UserError

    handheld = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)

    def stop_handheld() -> None:
        handheld.terminate()
        handheld.wait(10)

    stops.append(stop_handheld)
    assert handheld.stdout is not None
    ready = handheld.stdout.readline()
    if "serving" not in ready:
        raise UserError("the handheld daemon did not start (see its error above)")
    progress(f"handheld process {handheld.pid}: {ready.strip()}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _input_name(bundle_dir: Path) -> str:
    from coinf.bundle import Bundle

    return Bundle.load(bundle_dir).inputs[0].name
