"""``coinf bench hostile --bundle B``: what a hostile peer costs in memory.

Two scenarios, each against a real process of the library:

* ``result``: a handheld-like peer (the real daemon, in another process) answers every request
  with a ``--mib`` MiB RESULT. The wearable (a :class:`~coinf.Session` in this process, split at
  ``--split``) must refuse it from its header and finish the inference itself, correctly. Reported:
  the growth of this process's peak RSS (Linux VmHWM, reset after a warm-up) and tracemalloc's
  peak, over ``--runs`` inferences 0.6 s apart (the Session's backoff capped at 0.5 s, so each
  one meets the peer again; ``refused_from_header`` counts those refused at the frame header).
* ``slow_connections``: ``--connections`` clients, each from its own loopback address
  (127.0.0.2, ...), complete the HELLO with a ``coinf handheld`` process, then send a REQUEST
  frame declaring the largest frame it accepts (its bundle's ``request_bound``), as fast as
  they can for ``--burst-s``, then a byte now and then (slowloris). Reported: the helper's peak
  RSS growth over its warm RSS, how many attackers it dropped, and when a real wearable,
  trying every 0.5 s from 127.0.0.1, was served.

The helper listens on ``tcp+insecure:`` (``--insecure-plaintext``): plain TCP is the worst
case, what a paired device gone bad could do inside TLS (an unpaired one is refused at the
TLS handshake: ``bench attack``).

Goal (issue 41): each at most 16 MiB extra.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from coinf.cli import argtypes
from coinf.cli.bench import emit, options, progress, stop_processes

MIB = 1 << 20
GOAL_MIB = 16.0

PEER = """
import asyncio, sys
import numpy as np
from coinf.ble_protocol.loopback import serve_socket
from coinf.ble_protocol.request import HopStats, encode_result
from coinf.ble_protocol.tensors import encode_tensors
from coinf.bundle import Bundle
from coinf.handheld.daemon import HandheldDaemon, Reply

huge = encode_result([HopStats(1000)],
                     encode_tensors({"y": np.zeros(int(sys.argv[3]) * 2**20 // 4, np.float32)}))

class Hostile(HandheldDaemon):  # the real daemon, but every RESULT is huge
    def run(self, request, blob, cancel=None):
        return Reply(huge, "hostile", 0.001)

async def main():
    await serve_socket("unix:" + sys.argv[2], Hostile(Bundle.load(sys.argv[1])).serve)
    print("serving", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def register(parser: argparse.ArgumentParser) -> None:
    options.add_bundle(parser, required=True)
    options.add_split(parser, default_text="the bundle's first")
    parser.add_argument("--mib", type=argtypes.integer(1, 1024), default=60,
                        help="result: the hostile RESULT's size in MiB (default 60)")
    parser.add_argument("--runs", type=argtypes.positive_int, default=3,
                        help="result: inferences against the hostile peer (default 3)")
    parser.add_argument("--connections", type=argtypes.integer(1, 200), default=16,
                        help="slow_connections: attackers (default 16)")
    parser.add_argument("--burst-s", type=argtypes.seconds, default=2.0,
                        help="slow_connections: each attacker sends at full speed this long")
    parser.add_argument("--attack-s", type=argtypes.seconds, default=20.0,
                        help="slow_connections: how long the attack is watched (default 20 s)")
    parser.add_argument("--scenarios", nargs="+", choices=["result", "slow_connections"],
                        default=["result", "slow_connections"])
    options.add_json(parser)
    parser.set_defaults(func=run)


def _kb(pid: int | str, field: str) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"no {field} in /proc/{pid}/status")


def _reset_peak(pid: int | str) -> int:
    """Reset the process's VmHWM to its RSS; return that RSS in bytes."""
    with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as f:
        f.write("5")
    return _kb(pid, "VmRSS") * 1024


def _feeds(bundle: Any) -> dict[str, Any]:
    from coinf.cli.sample import random_feeds

    return random_feeds(bundle.inputs, seed=0)


def _result(args: argparse.Namespace, bundle: Any, split: str, tmp: Path) -> dict[str, Any]:
    import numpy as np

    from coinf import LinkOptions, PlacementOptions, Session, SessionOptions

    sock = tmp / "hostile.sock"
    peer = subprocess.Popen([sys.executable, "-c", PEER, str(bundle.root), str(sock),
                             str(args.mib)], stdout=subprocess.PIPE, text=True)
    try:
        assert peer.stdout is not None
        if "serving" not in peer.stdout.readline():
            raise RuntimeError("the hostile peer did not start")
        feeds = _feeds(bundle)
        alone = SessionOptions(placement=PlacementOptions(split="wearable-only"))
        with Session(bundle.root, alone) as s:
            reference = s.run(None, feeds)
        # retry after 0.5 s (the first backoff) at most: every run below meets the peer again
        opts = SessionOptions(placement=PlacementOptions(split=split),
                              link=LinkOptions(transport=f"unix:{sock}", max_backoff_s=0.5))
        correct, local, met_peer, fallbacks = 0, 0, 0, set()
        with Session(bundle.root, opts) as s:
            s.connect()
            s.run(None, feeds)  # warm: slices open, one refusal seen
            base = _reset_peak("self")
            tracemalloc.start()
            try:
                for _ in range(args.runs):
                    time.sleep(0.6)
                    out = s.run(None, feeds)
                    stats = s.last_run
                    correct += all(np.allclose(a, b, rtol=1e-4, atol=1e-5)
                                   for a, b in zip(out, reference, strict=True))
                    local += bool(stats is not None and stats.local)
                    fallback = (stats.fallback or "") if stats is not None else ""
                    met_peer += "declares" in fallback  # refused from the frame's header
                    if fallback:
                        fallbacks.add(fallback[:160])
                traced = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        growth = _kb("self", "VmHWM") * 1024 - base
    finally:
        stop_processes([peer])
    return {"scenario": "result", "hostile_result_mib": args.mib, "runs": args.runs,
            "correct": correct, "finished_locally": local, "refused_from_header": met_peer,
            "fallback": sorted(fallbacks),
            "peak_rss_growth_mib": round(growth / MIB, 2),
            "tracemalloc_peak_mib": round(traced / MIB, 3),
            "goal_mib": GOAL_MIB, "met": (growth / MIB <= GOAL_MIB and correct == args.runs
                    and met_peer == args.runs)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _attacker(port: int, source: str, identity: str, burst_s: float, stop: asyncio.Event,
                    declared: int, counts: dict[str, int]) -> None:
    from coinf.ble_protocol.loopback import SocketLink, frame_header
    from coinf.ble_protocol.messages import PROTOCOL_VERSION, Message, MsgType, encode_json

    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                       local_addr=(source, 0))
    except OSError:
        counts["refused"] += 1
        return
    link = SocketLink(reader, writer, name=source)
    try:
        hello = {"protocol": PROTOCOL_VERSION, "bundle": identity, "role": "wearable",
                 "capabilities": ["raw", "packed"]}
        await link.send(Message(MsgType.HELLO, 1, encode_json(hello)))
        async with asyncio.timeout(10):
            await link.receive()
        counts["handshaken"] += 1
        writer.write(frame_header(MsgType.REQUEST, 2, declared))
        block = bytes(256 * 1024)
        end = time.monotonic() + burst_s
        sent = 0
        while time.monotonic() < end and sent + len(block) < declared and not stop.is_set():
            writer.write(block)
            await writer.drain()
            sent += len(block)
        counts["bytes"] += sent
        while not stop.is_set():  # then a byte now and then
            writer.write(b"\0")
            await writer.drain()
            await asyncio.sleep(0.05)
            if reader.at_eof():
                break
    except Exception:  # any end of an attacker counts (refused, reset, timed out)
        pass
    finally:
        if writer.is_closing() or reader.at_eof():
            counts["dropped"] += 1
        writer.close()


async def _attack(args: argparse.Namespace, bundle: Any, split: str, port: int, pid: int
                  ) -> dict[str, Any]:
    from coinf import AsyncSession, LinkOptions, PlacementOptions, SessionOptions

    feeds = _feeds(bundle)
    opts = SessionOptions(placement=PlacementOptions(split=split),
                          link=LinkOptions(transport=f"tcp+insecure:127.0.0.1:{port}", timeout=5,
                                           fallback=False,
                                           transport_options={"allow_insecure": True}))
    async with AsyncSession(bundle.root, opts) as warm:  # the helper's warm RSS
        await warm.run(None, feeds)
    base = _reset_peak(pid)
    stop = asyncio.Event()
    counts = {"refused": 0, "handshaken": 0, "dropped": 0, "bytes": 0}
    from coinf.handheld.daemon import request_bound

    declared = request_bound(bundle)  # the largest frame the helper accepts (coinf handheld)
    t0 = time.monotonic()
    tasks = [asyncio.ensure_future(_attacker(port, f"127.0.0.{2 + i}", bundle.identity,
                                             args.burst_s, stop, declared, counts))
             for i in range(args.connections)]
    served_at = None
    peak = base
    while time.monotonic() - t0 < args.attack_s:
        await asyncio.sleep(0.5)
        peak = max(peak, _kb(pid, "VmHWM") * 1024)
        if served_at is None:
            with contextlib.suppress(Exception):
                async with AsyncSession(bundle.root, opts) as s:
                    await s.run(None, feeds)
                    if s.last_run is not None and not s.last_run.local:
                        served_at = time.monotonic() - t0
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    peak = max(peak, _kb(pid, "VmHWM") * 1024)
    growth = (peak - base) / MIB
    return {"scenario": "slow_connections", "connections": args.connections,
            "handshaken": counts["handshaken"], "refused": counts["refused"],
            "dropped_by_helper": counts["dropped"],
            "bytes_sent_mib": round(counts["bytes"] / MIB, 1),
            "helper_warm_rss_mib": round(base / MIB, 1), "peak_rss_growth_mib": round(growth, 2),
            "real_client_served_after_s": None if served_at is None else round(served_at, 2),
            "goal_mib": GOAL_MIB, "met": growth <= GOAL_MIB and served_at is not None}


def _slow(args: argparse.Namespace, bundle: Any, split: str) -> dict[str, Any]:
    port = _free_port()
    helper = subprocess.Popen(
        [sys.executable, "-m", "coinf", "handheld", "--bundle", str(bundle.root), "--listen",
         f"tcp+insecure:127.0.0.1:{port}", "--insecure-plaintext", "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert helper.stdout is not None
        line = helper.stdout.readline()
        if "serving" not in line:
            raise RuntimeError(f"the helper did not start: {line.strip()!r}")
        return asyncio.run(_attack(args, bundle, split, port, helper.pid))
    finally:
        stop_processes([helper])


def run(args: argparse.Namespace) -> int:
    import tempfile

    from coinf.bundle import Bundle
    from coinf.errors import UserError

    if not Path("/proc/self/clear_refs").exists():
        raise UserError("bench hostile measures peak RSS through /proc (Linux only)")
    bundle = Bundle.load(args.bundle)
    ids = [c.id for c in bundle.candidates]
    split = args.split or (ids[0] if ids else None)
    if split not in ids:
        raise UserError(f"--split: no candidate {split!r} in {bundle.root}; it has "
                        f"{', '.join(ids[:8]) or 'none'}")
    out: dict[str, Any] = {"bundle": str(bundle.root), "split": split, "scenarios": []}
    with tempfile.TemporaryDirectory(prefix="coinf-hostile-") as tmp:
        for name in args.scenarios:
            progress(f"scenario {name}")
            if name == "result":
                row = _result(args, bundle, split, Path(tmp))
            else:
                row = _slow(args, bundle, split)
            progress(f"  {row}")
            out["scenarios"].append(row)
    out["met"] = all(r["met"] for r in out["scenarios"])
    emit(out)
    return 0
