"""``coinf bench faults``: inferences over the emulated radio while the system is hurt.

Separate processes: ``coinf radio`` (fixed ports, so it can come back), ``coinf handheld`` over
BLE, and this process as the wearable: a Session with the library's default options (only the
transport and the emulated devices' pairing are set; timeouts and backoff are what a user gets).
Scenarios, each ``--inferences`` inferences, one every ``--period-ms``:

* ``handheld_killed``: SIGKILL at a quarter, restarted after ``--fault-s``;
* ``handheld_frozen``: SIGSTOP at a quarter, SIGCONT after ``--fault-s``;
* ``radio_killed``: the radio process killed at a quarter, radio and handheld restarted after
  ``--fault-s`` (the handheld's host lost its radio too);
* ``chunk_faults``: radio and handheld restarted on a radio that drops, duplicates, corrupts and
  reorders ``--chunk-fault-rate`` of the data chunks (each), every inference under faults.

Per scenario: correct / wrong / lost (no result) / duplicated (a request the handheld ran more
than once, from its log), offloaded, worst latency, and the resume time: from the fault's heal
(the process printed its ready line; for chunk_faults, the faulty radio's) to the end of the
first offloaded inference after it; ``recovery``: what the wearable's BLE links did about lost
chunks (messages it sent again, messages it asked the handheld for again, messages failed).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from coinf.cli import argtypes
from coinf.cli.bench import emit, options, progress

SCENARIOS = ("handheld_killed", "handheld_frozen", "radio_killed", "chunk_faults")
#: after the heal, a scenario goes on (beyond its inferences) until offloading resumed, or this
RESUME_WAIT_S = 30.0


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
    """The radio and handheld processes, restartable; every handheld logs (``-v``) to its own
    file, from which :meth:`duplicates` counts requests run twice."""

    def __init__(self, bundle: Path, preset: str, port: int, logdir: Path) -> None:
        self.bundle, self.preset, self.port, self.logdir = bundle, preset, port, logdir
        self.radio: subprocess.Popen[str] | None = None
        self.handheld: subprocess.Popen[str] | None = None
        self.cmd = [sys.executable, "-m", "coinf"]
        # the emulated devices pair with a one-off passkey (a real wearable shows it)
        self.passkey = secrets.randbelow(900_000) + 100_000
        self.logs: list[Path] = []

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
        from coinf.cli.passkey import write_passkey_file

        log = self.logdir / f"handheld-{len(self.logs)}.log"
        self.logs.append(log)
        with open(log, "w") as err:
            self.handheld = subprocess.Popen(
                [*self.cmd, "handheld", "-v", "--bundle", str(self.bundle), "--transport",
                 "ble", "--hci", f"tcp-client:127.0.0.1:{self.port + 1}", "--passkey-file",
                 write_passkey_file(self.logdir, self.passkey), "--keystore",
                 str(self.logdir / "bonds" / "handheld.json")],
                stdout=subprocess.PIPE, stderr=err, text=True)
        assert self.handheld.stdout is not None
        self.handheld.stdout.readline()

    @staticmethod
    def kill(proc: subprocess.Popen[str] | None) -> None:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def restart_all(self, *settings: str) -> None:
        self.kill(self.handheld)
        self.kill(self.radio)
        self.start_radio(*settings)
        self.start_handheld()

    def stop_all(self) -> None:
        if self.handheld is not None and self.handheld.poll() is None:
            os.kill(self.handheld.pid, signal.SIGCONT)
        self.kill(self.handheld)
        self.kill(self.radio)

    def served(self) -> Counter[tuple[int, int, int]]:
        """(handheld log, link, request id) -> times the handheld ran it."""
        runs: Counter[tuple[int, int, int]] = Counter()
        for i, log in enumerate(self.logs):
            link = 0
            for line in log.read_text(errors="replace").splitlines():
                if " wearable connected over " in line:
                    link += 1
                elif m := re.search(r" request (\d+) c\d+", line):
                    runs[(i, link, int(m.group(1)))] += 1
        return runs


class Scenario:
    """The counts of one scenario."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.n = self.correct = self.wrong = self.lost = self.offloaded = 0
        self.worst_ms = 0.0
        self.latencies: list[float] = []
        self.fault_s = 0.0
        self.healed_t: float | None = None
        self.resume_s: float | None = None
        self.links: dict[int, Any] = {}  # the wearable's links used (their loss recovery)
        #: for the picture: when it started, when the fault came, and each inference as
        #: (s since the start, ms, "offloaded" | "local" | "lost")
        self.t0 = time.monotonic()
        self.injected_t: float | None = None
        self.trace: list[tuple[float, float, str]] = []

    def row(self, duplicated: int) -> dict[str, Any]:
        return {"scenario": self.name, "inferences": self.n, "correct": self.correct,
                "wrong": self.wrong, "lost": self.lost, "duplicated": duplicated,
                "offloaded": self.offloaded, "local": self.n - self.lost - self.offloaded,
                "worst_ms": round(self.worst_ms, 1),
                "median_ms": round(float(np.median(self.latencies)), 1)
                if self.latencies else None,
                "fault_s": round(self.fault_s, 2), "resumed": self.resume_s is not None,
                "resume_s": round(self.resume_s, 2) if self.resume_s is not None else None,
                "recovery": {k: sum(getattr(lk.arq, k) for lk in self.links.values())
                             for k in ("resends", "nacks", "given_up")}}


def run(args: argparse.Namespace) -> int:
    import onnxruntime as ort

    from coinf import LinkOptions, PlacementOptions, RunOptions, Session, SessionOptions
    from coinf.bundle import Bundle
    from coinf.cli.sample import bundle_feeds

    options.check_png(args.png)
    bundle = Bundle.load(args.bundle)
    bundle.candidate(args.split)  # a wrong id is a usage error before anything starts
    feeds = [bundle_feeds(bundle, seed) for seed in range(16)]
    ref = ort.InferenceSession(str(bundle.model_path), providers=["CPUExecutionProvider"])
    want = [ref.run(None, f) for f in feeds]
    faulty = [f"fault_{k}={args.chunk_fault_rate}"
              for k in ("drop", "duplicate", "corrupt", "reorder")]
    rows: list[dict[str, Any]] = []
    done: list[Scenario] = []
    with tempfile.TemporaryDirectory(prefix="coinf-faults-") as logdir:
        procs = Procs(bundle.root, args.preset, _free_port_pair(), Path(logdir))
        procs.start_radio()
        procs.start_handheld()
        try:
            # the library's defaults, only the transport and the emulated pairing set
            pairing = {"passkey": procs.passkey, "pairing_window_s": math.inf}
            link = LinkOptions(transport=f"ble:{procs.wearable_hci}", transport_options=pairing)
            opts = SessionOptions(placement=PlacementOptions(split=args.split), link=link)
            with Session(bundle, opts) as sess:
                sess.connect()
                counter = [0]

                def one(sc: Scenario, tag: str) -> None:
                    k = counter[0] % len(feeds)
                    counter[0] += 1
                    sc.n += 1
                    t0 = time.perf_counter()
                    try:
                        outs = sess.run(None, feeds[k], RunOptions(tag=tag))
                    except Exception as exc:  # counted (lost), the benchmark goes on
                        sc.lost += 1
                        sc.trace.append((time.monotonic() - sc.t0,
                                         (time.perf_counter() - t0) * 1e3, "lost"))
                        progress(f"  lost: {type(exc).__name__}: {exc}")
                        return
                    ms = (time.perf_counter() - t0) * 1e3
                    sc.latencies.append(ms)
                    sc.worst_ms = max(sc.worst_ms, ms)
                    ok = all(np.allclose(o, w, rtol=1e-4, atol=1e-5)
                             for o, w in zip(outs, want[k], strict=True))
                    sc.correct += ok
                    sc.wrong += not ok
                    stats = sess.last_run
                    link = sess.link
                    if link is not None and hasattr(link, "arq"):
                        sc.links[id(link)] = link
                    offloaded = stats is not None and not stats.local
                    sc.trace.append((time.monotonic() - sc.t0, ms,
                                     "offloaded" if offloaded else "local"))
                    if offloaded:
                        sc.offloaded += 1
                        if sc.healed_t is not None and sc.resume_s is None:
                            sc.resume_s = time.monotonic() - sc.healed_t

                for name in args.scenarios:
                    before = procs.served()
                    sc = scenario(name, args, procs, faulty, one)
                    after = procs.served()
                    dup = sum(c - 1 for key, c in after.items() if c > 1 and before[key] < c)
                    rows.append(sc.row(dup))
                    done.append(sc)
                    progress(f"  {rows[-1]}")
        finally:
            procs.stop_all()
    if args.png:
        from coinf.cli.bench.faults_chart import plot_faults

        plot_faults(done, args.png, f"{bundle.root.name} at {args.split}, {args.preset}, "
                    f"one inference every {args.period_ms:g} ms, library defaults")
    emit(_report(rows, args))
    return 0


def _report(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The result: the scenarios' rows, their totals and the settings."""
    total = {k: sum(r[k] for r in rows) for k in ("inferences", "correct", "wrong", "lost",
                                                   "duplicated", "offloaded")}
    if args.png:
        total["png"] = args.png
    return {**total, "worst_ms": max((r["worst_ms"] for r in rows), default=0.0),
            "resumed_every_time": all(r["resumed"] for r in rows),
            "worst_resume_s": max((r["resume_s"] or math.inf for r in rows), default=None),
            "scenarios": rows, "inferences_per_scenario": args.inferences,
            "period_ms": args.period_ms, "fault_s": args.fault_s,
            "chunk_fault_rate": args.chunk_fault_rate, "split": args.split, "preset": args.preset,
            "session_options": "library defaults (LinkOptions: timeout 30 s, max_backoff_s 30 s, "
                               "reconnect_timeout 3 s)",
            "targets": {"correct": "all", "lost": 0, "duplicated": 0, "worst_ms": 2000,
                        "resumed_every_time": True, "resume_s": 2.0}}


def scenario(name: str, args: argparse.Namespace, procs: Procs, faulty: list[str],
             one: Any) -> Scenario:
    """Run one scenario: ``args.inferences`` paced inferences, the fault injected at a quarter
    (chunk_faults: before the first), healed after ``--fault-s``."""
    sc = Scenario(name)
    period = args.period_ms / 1e3
    progress(f"scenario {name}: {args.inferences} inferences")
    fault_at = args.inferences // 4
    injected_t: float | None = None
    if name == "chunk_faults":
        procs.restart_all(*faulty)
        injected_t = sc.healed_t = time.monotonic()  # resumed on the faulty radio
        sc.t0 = sc.injected_t = injected_t
    i = 0
    while True:
        now = time.monotonic()
        if injected_t is None and i == fault_at:
            inject(name, procs)
            injected_t = sc.injected_t = now
        elif sc.healed_t is None and injected_t is not None and now - injected_t >= args.fault_s:
            heal(name, procs)
            sc.fault_s = time.monotonic() - injected_t
            sc.healed_t = time.monotonic()
        done_waiting = sc.resume_s is not None or (
            sc.healed_t is not None and now - sc.healed_t > RESUME_WAIT_S)
        if i >= args.inferences and sc.healed_t is not None and done_waiting:
            break
        i += 1
        t0 = time.monotonic()
        one(sc, name)
        time.sleep(max(0.0, t0 + period - time.monotonic()))
    if name == "chunk_faults":
        procs.restart_all()  # a clean radio for whatever comes next
    return sc


def inject(name: str, procs: Procs) -> None:
    if name == "handheld_killed":
        procs.kill(procs.handheld)
    elif name == "handheld_frozen":
        assert procs.handheld is not None
        os.kill(procs.handheld.pid, signal.SIGSTOP)
    elif name == "radio_killed":
        procs.kill(procs.radio)


def heal(name: str, procs: Procs) -> None:
    if name == "handheld_killed":
        procs.start_handheld()
    elif name == "handheld_frozen":
        assert procs.handheld is not None
        os.kill(procs.handheld.pid, signal.SIGCONT)
    elif name == "radio_killed":
        procs.restart_all()


def register(parser: argparse.ArgumentParser) -> None:
    options.add_bundle(parser, required=True)
    options.add_split(parser, "c004")
    options.add_preset(parser)
    parser.add_argument("--inferences", type=argtypes.positive_int, default=1000,
                        help="inferences per scenario (default 1000)")
    parser.add_argument("--period-ms", type=argtypes.number(1, 60_000), default=100.0,
                        help="one inference every this many ms at most (default 100)")
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS),
                        metavar="NAME", help=f"a subset of {', '.join(SCENARIOS)}")
    parser.add_argument("--fault-s", type=argtypes.seconds, default=10.0,
                        help="each kill or freeze lasts this long (s)")
    parser.add_argument("--chunk-fault-rate", type=argtypes.number(0, 1, hi_open=True),
                        default=0.02,
                        help="chunk_faults: probability of each fault (drop, duplicate, corrupt, "
                        "reorder) per data chunk")
    options.add_png(parser, "every inference's latency over time, the fault shaded, per scenario")
    options.add_json(parser)
    parser.set_defaults(func=run)
