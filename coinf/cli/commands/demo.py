"""``coinf demo``: the main job on one machine.

Splits a zoo model into a bundle (reused when up to date), starts the emulated radio (a
``coinf radio`` process with BLE connection-event timing, ``pi-zero-2w`` preset by default), a
handheld daemon process and a wearable process (``coinf run``) that talk BLE GATT through it,
runs every candidate (an evenly spread subset on big models) and prints the per-candidate table.
Then it streams frames through the most balanced cut, one at a time and pipelined. Exits 1 on
any output mismatch.
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
    parser.add_argument("--model", default="lenet_digits", help="zoo model (default %(default)s)")
    parser.add_argument("--out", default="out/demo", help="where bundles are kept")
    parser.add_argument("--transport", default="ble", choices=["ble", "socket"],
                        help="ble: through the emulated radio (default); socket: local socket")
    parser.add_argument("--preset", default="pi-zero-2w", help="radio preset (default %(default)s)")
    parser.add_argument("--max", type=int, default=12, help="candidates to run (evenly spread)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per candidate (median)")
    parser.add_argument("--slowdown", type=float, default=10.0,
                        help="wearable is K x slower than this machine (default %(default)s, "
                        "roughly a Pi Zero 2 W core against a laptop core)")
    parser.add_argument("--stream", type=int, default=20, metavar="N",
                        help="frames in the streaming part (0 to skip)")
    parser.add_argument("--plan", type=int, default=5, metavar="N",
                        help="inferences with the planner choosing the cut (0 to skip)")
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


def run(args: argparse.Namespace) -> int:
    from coinf.cli.commands.run import format_plan, format_stream, format_table
    from coinf.errors import UserError
    from coinf.models import zoo

    if args.model not in zoo.ZOO:
        raise UserError(f"unknown model {args.model!r}; choose from {', '.join(zoo.ZOO)}")
    bundle_dir = ensure_bundle(zoo.committed_path(args.model), Path(args.out) / args.model)
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
                # both processes pair over the emulated radio with a one-off passkey
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

            def wearable(*extra: str) -> dict[str, Any]:
                proc = subprocess.run(
                    [*coinf, "run", str(bundle_dir), "--slowdown", str(args.slowdown),
                     *wear_args, "--json", *extra],
                    stdout=subprocess.PIPE, text=True, env=env, check=False,
                )
                if proc.returncode not in (0, 1) or not proc.stdout.strip():
                    raise UserError(f"the wearable process failed (exit {proc.returncode})")
                result: dict[str, Any] = json.loads(proc.stdout)
                return result

            progress(f"wearable process: running up to {args.max} candidates, streaming "
                     f"{args.stream} frames, then {args.plan} runs with the planner choosing ...")
            result = wearable("--all", "--max", str(args.max), "--repeat", str(args.repeat),
                              "--stream", str(args.stream), "--plan", str(args.plan))
            rows, stream, planned = result["rows"], result.get("stream"), result.get("plan")
    finally:
        for stop in reversed(stops):
            stop()
    print(f"\n{args.model}: {len(rows)} candidates, wearable (x{args.slowdown:g} slower) and "
          f"handheld in separate processes {where}\n")
    print(format_table(rows))
    best = min(rows, key=lambda r: r["total_ms"])
    print(f"\nfastest: {best['candidate']} ({best['label']}) at {best['total_ms']:.1f} ms")
    if stream:
        print(format_stream(stream))
    if planned:
        print(format_plan(planned))
    bad = [r["candidate"] for r in rows if not r["match"]]
    if bad:
        print(f"\nMISMATCH against the whole model at: {', '.join(bad)}")
        return 1
    print(f"all {len(rows)} candidates match the whole model (rtol 1e-4, atol 1e-5)")
    return 0
