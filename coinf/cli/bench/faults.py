"""``coinf bench faults``: inferences over the emulated radio while the system is hurt.

Separate processes: ``coinf radio`` (fixed ports, so it can come back), ``coinf handheld`` over
BLE, and this process as the wearable (a Session on its own bumble host). In turn: the handheld
is killed and restarted, the handheld is stopped (SIGSTOP) and resumed, the radio process is
killed and restarted. Every inference is checked against the whole model run locally.
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from coinf.cli import argtypes
from coinf.cli.bench import emit, progress


def _free_port_pair() -> int:
    """A port P with P and P+1 free (the radio's wearable and handheld sides)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with socket.socket() as s2:
            try:
                s2.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


class Procs:
    """The radio and handheld processes, restartable."""

    def __init__(self, bundle: Path, preset: str, port: int) -> None:
        self.bundle, self.preset, self.port = bundle, preset, port
        self.radio: subprocess.Popen[str] | None = None
        self.handheld: subprocess.Popen[str] | None = None
        self.cmd = [sys.executable, "-m", "coinf"]
        # the emulated devices pair with a one-off passkey (a real wearable shows it)
        self.passkey = secrets.randbelow(900_000) + 100_000

    @property
    def wearable_hci(self) -> str:
        return f"tcp-client:127.0.0.1:{self.port}"

    def start_radio(self, *settings: str) -> None:
        sets = [arg for s in settings for arg in ("--set", s)]
        self.radio = subprocess.Popen(
            [*self.cmd, "radio", "--preset", self.preset, "--listen", f"127.0.0.1:{self.port}",
             *sets],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.radio.stdout is not None
        seen = 0
        while seen < 2:  # wearable=..., handheld=...
            line = self.radio.stdout.readline()
            if not line:
                raise RuntimeError("the radio process did not start")
            seen += line.startswith(("wearable=", "handheld="))

    def start_handheld(self) -> None:
        self.handheld = subprocess.Popen(
            [*self.cmd, "handheld", "--bundle", str(self.bundle), "--transport", "ble", "--hci",
             f"tcp-client:127.0.0.1:{self.port + 1}", "--passkey", str(self.passkey)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.handheld.stdout is not None
        self.handheld.stdout.readline()

    @staticmethod
    def kill(proc: subprocess.Popen[str] | None) -> None:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def stop_all(self) -> None:
        if self.handheld is not None and self.handheld.poll() is None:
            os.kill(self.handheld.pid, signal.SIGCONT)
        self.kill(self.handheld)
        self.kill(self.radio)


def run(args: argparse.Namespace) -> int:
    import onnxruntime as ort

    from coinf import LinkOptions, PlacementOptions, RunOptions, Session, SessionOptions
    from coinf.bundle import Bundle
    from coinf.cli.sample import bundle_feeds

    bundle = Bundle.load(args.bundle)
    feeds = [bundle_feeds(bundle, seed) for seed in range(16)]
    ref = ort.InferenceSession(str(bundle.model_path), providers=["CPUExecutionProvider"])
    want = [ref.run(None, f) for f in feeds]
    procs = Procs(bundle.root, args.preset, _free_port_pair())
    phases = ["baseline", "handheld_killed", "handheld_stopped", "radio_killed",
              "chunk_faults"]
    per_phase = max(1, args.inferences // len(phases))
    totals = {"inferences": 0, "correct": 0, "wrong": 0, "errors": 0, "hangs": 0,
              "fallbacks": 0}
    rows: list[dict[str, Any]] = []
    procs.start_radio()
    procs.start_handheld()
    try:
        pairing = {"passkey": procs.passkey, "pairing_window_s": math.inf}
        link = LinkOptions(transport=f"ble:{procs.wearable_hci}", transport_options=pairing,
                           timeout=args.timeout, max_backoff_s=1.0, fallback=True)
        with Session(bundle, SessionOptions(placement=PlacementOptions(split=args.split),
                                            link=link)) as sess:
            sess.connect()
            for phase in phases:
                progress(f"phase {phase}: {per_phase} inferences")
                fault_at, heal_at = per_phase // 4, per_phase // 2
                worst_after, offloaded_after, resumed = 0.0, 0, phase == "baseline"
                i, healed_t, resumed_s, injected_t = 0, 0.0, 0.0, 0.0
                healed = phase == "baseline"
                # the fault lasts at least --fault-s; after the heal, go on until offloading
                # resumed (3 offloaded inferences) or 30 s passed
                while (i < per_phase or not healed
                       or (not resumed and time.monotonic() - healed_t < 30)):
                    if i == fault_at and not injected_t:
                        inject(phase, procs, args)
                        injected_t = time.monotonic()
                    if (not healed and i >= heal_at
                            and time.monotonic() - injected_t >= args.fault_s):
                        heal(phase, procs)
                        healed, healed_t = True, time.monotonic()
                    i += 1
                    if i > per_phase:
                        time.sleep(0.05)  # waiting: no need to spin
                    k = totals["inferences"] % len(feeds)
                    t0 = time.perf_counter()
                    try:
                        outs = sess.run(None, feeds[k], RunOptions(tag=phase))
                    except Exception as exc:  # counted, the benchmark goes on
                        totals["errors"] += 1
                        progress(f"  error: {type(exc).__name__}: {exc}")
                        continue
                    finally:
                        totals["inferences"] += 1
                    ms = (time.perf_counter() - t0) * 1e3
                    stats = sess.last_run
                    assert stats is not None
                    ok = all(np.allclose(o, w, rtol=1e-4, atol=1e-5)
                             for o, w in zip(outs, want[k], strict=True))
                    totals["correct" if ok else "wrong"] += 1
                    totals["fallbacks"] += stats.fallback is not None
                    totals["hangs"] += ms > args.hang_s * 1e3
                    if i > fault_at:
                        worst_after = max(worst_after, ms)
                    if healed and i > heal_at and not stats.local:
                        offloaded_after += 1
                        if not resumed and offloaded_after >= 3:
                            resumed, resumed_s = True, time.monotonic() - healed_t
                rows.append({"phase": phase, "worst_ms_after_fault": round(worst_after, 1),
                             "offloaded_after_heal": offloaded_after, "resumed": resumed,
                             "resumed_s_after_heal": round(resumed_s, 2) if healed_t else None})
                progress(f"  worst {worst_after:.0f} ms after the fault, "
                         f"{offloaded_after} offloaded after the heal")
    finally:
        procs.stop_all()
    emit({**totals,
          "worst_ms": max(r["worst_ms_after_fault"] for r in rows),
          "resumed_offloading": all(r["resumed"] for r in rows),
          "phases": rows, "split": args.split, "preset": args.preset,
          "targets": {"correct": "all", "errors": 0, "hangs": 0, "worst_ms": 2000}})
    return 0


def inject(phase: str, procs: Procs, args: argparse.Namespace) -> None:
    if phase == "handheld_killed":
        procs.kill(procs.handheld)
    elif phase == "handheld_stopped":
        assert procs.handheld is not None
        os.kill(procs.handheld.pid, signal.SIGSTOP)
    elif phase == "radio_killed":
        procs.kill(procs.radio)
    elif phase == "chunk_faults":  # a radio that drops, duplicates, corrupts and reorders
        procs.kill(procs.handheld)
        procs.kill(procs.radio)
        procs.start_radio(*(f"fault_{k}={args.chunk_fault_rate}"
                            for k in ("drop", "duplicate", "corrupt", "reorder")))
        procs.start_handheld()


def heal(phase: str, procs: Procs) -> None:
    if phase == "handheld_killed":
        procs.start_handheld()
    elif phase == "handheld_stopped":
        assert procs.handheld is not None
        os.kill(procs.handheld.pid, signal.SIGCONT)
    elif phase in ("radio_killed", "chunk_faults"):
        procs.kill(procs.handheld)  # its host lost the radio too: a fresh process
        procs.kill(procs.radio)
        procs.start_radio()
        procs.start_handheld()


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bundle", required=True, help="bundle directory (coinf split)")
    parser.add_argument("--split", default="c006", help="candidate to offload (default c006)")
    parser.add_argument("--preset", default="ble5-2m", help="radio preset")
    parser.add_argument("--inferences", type=argtypes.positive_int, default=1000)
    parser.add_argument("--timeout", type=argtypes.seconds, default=1.5,
                        help="per-inference timeout (s)")
    parser.add_argument("--fault-s", type=argtypes.seconds, default=10.0,
                        help="each fault lasts at least this long (s)")
    parser.add_argument("--chunk-fault-rate", type=argtypes.number(0, 1, hi_open=True),
                        default=0.02,
                        help="chunk_faults phase: probability of each fault per data chunk")
    parser.add_argument("--hang-s", type=argtypes.seconds, default=10.0,
                        help="an inference longer than "
                        "this counts as a hang")
    parser.add_argument("--json", action="store_true", help="(always JSON)")
    parser.set_defaults(func=run)
