"""``coinf bench fleet``: N emulated wearables stream frames of a real model to one tail
service (``coinf serve``, batches on an engine) and, side by side, to one ``coinf handheld``
daemon each, on this machine.

Each wearable is a real client of the wire (TLS on tcp:, HELLO with the bundle identity, one
REQUEST per frame, the RESULT's nonce and tensors checked): it sends a frame every 1/rate s
(open loop, random phase) without waiting for the previous one. The frames are the head outputs
of the trained ``digitnet`` on held-out digits, computed once up front, so the wearables cost
this process little. Reported per N and side: throughput, p50/p99 latency (send to RESULT),
server CPU seconds per frame (every process of the service or of the daemons, Ray's included),
frames answered, refused (BUSY), failed and lost (no reply in time), and whether every result
matched the tail run locally (and its accuracy against the labels). ``--kill-replica`` runs the
service once more at the largest N and kills one engine replica halfway.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from coinf.cli import argtypes
from coinf.cli.bench import emit, options, progress, stop_processes


def register(parser: argparse.ArgumentParser) -> None:
    options.add_bundle(parser,
                       default_text="the trained digitnet, split into a temporary directory")
    parser.add_argument("--cut", default="c005", help="the candidate the wearables offload at "
                        "(default %(default)s: digitnet's first pooling, 32 kB raw)")
    parser.add_argument("--wearables", type=counts, default=[1, 4, 16, 64],
                        metavar="N,N", help="numbers of wearables (default 1,4,16,64)")
    parser.add_argument("--rate", type=argtypes.number(0.1, 1000), default=5.0,
                        help="frames per second per wearable (default %(default)s)")
    parser.add_argument("--seconds", type=argtypes.number(1, 3600), default=20.0,
                        help="measured seconds per run (default %(default)s)")
    parser.add_argument("--engine", default="ray", help="the service's engine (coinf serve "
                        "--engine; default %(default)s)")
    parser.add_argument("--replicas", default="2:2", help="the service's --replicas "
                        "(default %(default)s)")
    parser.add_argument("--max-batch", type=argtypes.integer(1, 1024), default=32,
                        help="the service's --max-batch (default %(default)s)")
    parser.add_argument("--max-wait-ms", type=argtypes.number(0, 1000), default=20.0,
                        help="the service's --max-wait-ms (default %(default)s)")
    parser.add_argument("--sides", default="service,daemons",
                        help="what to measure: service, daemons or both (default %(default)s)")
    parser.add_argument("--daemon-threads", type=argtypes.threads_or_auto, default=0,
                        help="the daemons' --threads (default 0: onnxruntime's own, as a "
                        "user starts them; 1: one thread each, no thread pool)")
    parser.add_argument("--flood", type=argtypes.number(0, 100000), default=0.0, metavar="FPS",
                        help="then run the service at the largest N once more with one more "
                        "wearable sending FPS frames a second: the others' figures beside it")
    parser.add_argument("--kill-replica", action="store_true",
                        help="then run the service at the largest N and kill one replica "
                        "halfway: every frame must still be answered once")
    options.add_png(parser, "frames per CPU-second and p99 against the wearables")
    parser.set_defaults(func=run)


def counts(text: str) -> list[int]:
    """``1,4,16,64``: numbers of wearables, each 1..1024."""
    try:
        out = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,4,16, got {text!r}") from None
    if not out or not all(1 <= v <= 1024 for v in out):
        raise argparse.ArgumentTypeError(f"expected numbers 1..1024 like 1,4,16, got {text!r}")
    return out


@dataclass
class Tally:
    """What the wearables of one run saw."""

    sent: int = 0
    answered: int = 0
    correct: int = 0  # RESULT equal to the local tail's output (float tolerance)
    right: int = 0  # argmax equal to the label
    busy: int = 0
    failed: int = 0
    lost: int = 0
    duplicated: int = 0  # replies to no request waiting (a second reply to a frame)
    latencies: list[float] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        for k in ("sent", "answered", "correct", "right", "busy", "failed", "lost", "duplicated"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        self.latencies += other.latencies


@dataclass
class Workload:
    """The frames (REQUEST tensor blobs of real head outputs), the local tail's outputs and
    the labels."""

    bundle: Any
    cut: str
    blobs: list[bytes]
    expected: list[np.ndarray]
    labels: list[int]


def workload(bundle: Any, cut: str, count: int = 64) -> Workload:
    """Head outputs of ``count`` held-out digits at ``cut``, and the tail's local outputs."""
    from coinf.ble_protocol.tensors import encode_tensors
    from coinf.device.runtime import SliceRunner
    from coinf.errors import UserError
    from coinf.models.digits import digits_data

    cand = next((c for c in bundle.candidates if c.id == cut), None)
    if cand is None or cand.is_wearable_only:
        raise UserError(f"--cut {cut}: expected one of the bundle's offloading candidates "
                        f"({bundle.candidates[0].id}..{bundle.candidates[-2].id})")
    (inp,) = bundle.inputs
    size = int(inp.shape[-1])
    data = digits_data(size=size)
    runner = SliceRunner(bundle)
    blobs, expected = [], []
    for x in data.x_test[:count]:
        feeds = {inp.name: x[None].astype(np.float32)}
        if cand.head.file is not None:
            feeds, _ = runner.run_slice(cand, "head", feeds)
        blobs.append(encode_tensors(feeds))
        out, _ = runner.run_slice(cand, "tail", feeds)
        expected.append(next(iter(out.values())))
    return Workload(bundle, cut, blobs, expected, [int(y) for y in data.y_test[:count]])


@contextlib.asynccontextmanager
async def greeted(address: str, work: Workload) -> AsyncIterator[Any]:
    """An RpcClient connected to ``address`` whose HELLO (``work``'s bundle) was answered."""
    from coinf.ble_protocol.messages import PROTOCOL_VERSION, MsgType, encode_json
    from coinf.ble_protocol.rpc import RpcClient
    from coinf.ble_protocol.transport import open_connector

    async with open_connector(address) as conn:
        client = RpcClient(await conn.connect(30.0))
        try:
            hello = {"protocol": PROTOCOL_VERSION, "bundle": work.bundle.identity}
            await client.request(MsgType.HELLO, encode_json(hello), 30)
            yield client
        finally:
            await client.close()


async def wearable(address: str, work: Workload, rate: float, seconds: float,
                   rng: random.Random) -> Tally:
    """One emulated wearable: HELLO, then a frame every 1/rate s for ``seconds``."""
    tally = Tally()
    async with greeted(address, work) as client:
        client.on_unsolicited = lambda _msg: _count_duplicate(tally)
        await asyncio.sleep(rng.random() / rate)  # random phase
        t0 = asyncio.get_running_loop().time()
        tasks = []
        for i in range(max(1, int(seconds * rate))):
            await asyncio.sleep(max(0.0, t0 + i / rate - asyncio.get_running_loop().time()))
            k = rng.randrange(len(work.blobs))
            tasks.append(asyncio.ensure_future(frame(client, work, k, tally)))
        await asyncio.gather(*tasks)
    return tally


def _count_duplicate(tally: Tally) -> None:
    tally.duplicated += 1


async def frame(client: Any, work: Workload, k: int, tally: Tally) -> None:
    from coinf.ble_protocol.messages import ErrorCode, MsgType
    from coinf.ble_protocol.request import Request, decode_result, encode_request, new_nonce
    from coinf.ble_protocol.tensors import decode_tensors
    from coinf.errors import LinkError, ProtocolError

    nonce = new_nonce()
    last = work.bundle.candidates[-1].id
    payload = encode_request(Request.split(work.cut, last, nonce=nonce), work.blobs[k])
    tally.sent += 1
    t0 = time.perf_counter()
    try:
        reply = await client.request(MsgType.REQUEST, payload, 30.0)
    except ProtocolError as exc:
        if exc.code == ErrorCode.BUSY:
            tally.busy += 1
        elif exc.code == ErrorCode.TIMEOUT:
            tally.lost += 1
        else:
            tally.failed += 1
        return
    except LinkError:
        tally.lost += 1
        return
    tally.latencies.append(time.perf_counter() - t0)
    tally.answered += 1
    _, blob = decode_result(reply.payload, 1, nonce)
    (got,) = decode_tensors(blob).values()
    tally.correct += bool(np.allclose(got, work.expected[k], rtol=1e-3, atol=1e-4))
    tally.right += int(np.argmax(got)) == work.labels[k]


# --- the servers ---------------------------------------------------------------------------
def _start(cmd: list[str], pattern: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        found = re.search(pattern, line)
        if found:
            return proc, found.group(1)
    stop_processes([proc])
    raise RuntimeError(f"{' '.join(cmd[2:5])} did not start")


@contextlib.contextmanager
def service(args: argparse.Namespace, bundle_dir: str) -> Iterator[tuple[list[Any], list[str]]]:
    cmd = [sys.executable, "-m", "coinf", "serve", bundle_dir, "--engine", args.engine,
           "--listen", "tcp:127.0.0.1:0", "--replicas", args.replicas,
           "--max-batch", str(args.max_batch), "--max-wait-ms", str(args.max_wait_ms),
           "--max-links-per-peer", "4096"]
    proc, address = _start(cmd, r"coinf serve: serving .* on (tcp:\S+) with")
    try:
        yield [proc], [address]
    finally:
        stop_processes([proc], timeout=30)


@contextlib.contextmanager
def daemons(n: int, bundle_dir: str, threads: int) -> Iterator[tuple[list[Any], list[str]]]:
    """``n`` ``coinf handheld`` daemons as a user starts them (every default but
    ``--threads``)."""
    procs: list[subprocess.Popen[str]] = []
    addresses = []
    try:
        for _ in range(n):
            proc, address = _start([sys.executable, "-m", "coinf", "handheld", "--bundle",
                                    bundle_dir, "--listen", "tcp:127.0.0.1:0",
                                    "--threads", str(threads)],
                                   r"coinf handheld: serving .* on (tcp:\S+)")
            procs.append(proc)
            addresses.append(address)
        yield procs, addresses
    finally:
        stop_processes(procs)


def tree_cpu(procs: list[Any]) -> dict[int, tuple[str, float]]:
    """(kind, CPU seconds, user + system) of every process of ``procs`` and their descendants,
    by pid; the kind is the front process or Ray's name for it (``ray::ServeReplica``...)."""
    import psutil

    out: dict[int, tuple[str, float]] = {}
    for proc in procs:
        try:
            top = psutil.Process(proc.pid)
            for p in (top, *top.children(recursive=True)):
                with contextlib.suppress(psutil.Error):
                    t = p.cpu_times()
                    out[p.pid] = (_kind(p, top), t.user + t.system)
        except psutil.Error:
            continue
    return out


def _kind(p: Any, top: Any) -> str:
    if p.pid == top.pid:
        return "front"
    name = p.name()
    return "ray::" + name[5:].split(":")[0] if name.startswith("ray::") else name


def replicas_of(procs: list[Any]) -> list[int]:
    """The pids of the Ray Serve replicas under ``procs``."""
    import psutil

    out = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            for p in psutil.Process(proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if "ServeReplica" in " ".join(p.cmdline()) or "ServeReplica" in p.name():
                        out.append(p.pid)
    return out


async def measure(procs: list[Any], addresses: list[str], n: int, work: Workload,
                  args: argparse.Namespace, kill_at: float | None = None,
                  flood: float = 0.0, is_service: bool = True) -> dict[str, Any]:
    """``n`` wearables (spread over ``addresses``) for ``args.seconds``: the figures."""
    rng = random.Random(n)
    warm = [wearable(addresses[i % len(addresses)], work, 2.0, 1.0, random.Random(i))
            for i in range(n)]
    await asyncio.gather(*warm)  # connections, sessions and batches warm; not counted
    before = tree_cpu(procs)
    t0 = time.perf_counter()
    runs = [wearable(addresses[i % len(addresses)], work, args.rate, args.seconds,
                     random.Random(rng.random())) for i in range(n)]
    killer = asyncio.ensure_future(_kill_later(procs, kill_at)) if kill_at else None
    flooder = (asyncio.ensure_future(wearable(addresses[0], work, flood, args.seconds,
                                              random.Random(-1))) if flood else None)
    tallies = await asyncio.gather(*runs)
    flooded = await flooder if flooder is not None else None
    wall = time.perf_counter() - t0
    after = tree_cpu(procs)
    killed = await killer if killer else None
    status = await service_status(addresses[0], work) if is_service else None
    by_kind: dict[str, float] = {}
    for pid, (kind, spent) in after.items():
        by_kind[kind] = by_kind.get(kind, 0.0) + spent - before.get(pid, (kind, 0.0))[1]
    cpu = sum(by_kind.values())
    total = Tally()
    for t in tallies:
        total.add(t)
    lat = sorted(total.latencies)
    row: dict[str, Any] = {
        "wearables": n, "sent": total.sent, "answered": total.answered, "busy": total.busy,
        "failed": total.failed, "lost": total.lost, "duplicated": total.duplicated,
        "results_match": total.correct,
        "accuracy": round(total.right / max(total.answered, 1), 4),
        "fps": round(total.answered / wall, 1),
        "p50_ms": round(statistics.median(lat) * 1e3, 1) if lat else None,
        "p99_ms": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3, 1) if lat else None,
        "cpu_s": round(cpu, 2), "cpu_ms_per_frame": round(cpu / max(total.answered, 1) * 1e3, 3),
        "frames_per_cpu_s": round(total.answered / max(cpu, 1e-9), 1),
        "cpu_s_by_process": {k: round(v, 2) for k, v in sorted(by_kind.items(),
                                                                key=lambda kv: -kv[1])[:8]},
    }
    if killed is not None:
        row["killed_replica"] = killed
    if flooded is not None:  # one more wearable at ``flood`` fps: what it got
        row["flooder"] = {"rate_fps": flood, "sent": flooded.sent,
                          "answered": flooded.answered, "busy": flooded.busy}
    if status is not None:  # the service's own figures: its STATUS reply
        frames, batches = status.get("requests", 0), status.get("batches", 0)
        row["service_status"] = {"queue_ms": status.get("queue_ms"),
                                 "mean_batch": round(frames / max(batches, 1), 1),
                                 **status.get("service", {})}
    return row


async def service_status(address: str, work: Workload) -> dict[str, Any]:
    """STATUS of the service at ``address`` (after HELLO), as a wearable reads it."""
    from coinf.ble_protocol.messages import MsgType, decode_json

    async with greeted(address, work) as client:
        reply = await client.request(MsgType.STATUS, b"", 30)
        return decode_json(reply.payload, what="STATUS reply")


async def _kill_later(procs: list[Any], delay: float) -> int | None:
    await asyncio.sleep(delay)
    pids = replicas_of(procs)
    if not pids:
        return None
    os.kill(pids[0], signal.SIGKILL)
    progress(f"killed replica pid {pids[0]}")
    return pids[0]


def run(args: argparse.Namespace) -> int:
    from coinf.ble_protocol.tls_store import one_machine_env
    from coinf.bundle import Bundle
    from coinf.errors import UserError

    sides = [s for s in args.sides.split(",") if s]
    if not sides or set(sides) - {"service", "daemons"}:
        raise UserError(f"--sides {args.sides}: expected service, daemons or service,daemons")
    options.check_png(args.png)
    with tempfile.TemporaryDirectory() as tmp, one_machine_env():
        bundle_dir = args.bundle or _split_digitnet(Path(tmp))
        work = workload(Bundle.load(bundle_dir), args.cut)
        rows: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
        for n in args.wearables:
            for side in sides:
                progress(f"{side}: {n} wearables at {args.rate:g} fps for {args.seconds:g} s")
                with (service(args, bundle_dir) if side == "service"
                      else daemons(n, bundle_dir, args.daemon_threads)) as (procs, addresses):
                    rows[side].append(asyncio.run(measure(procs, addresses, n, work, args,
                                                          is_service=side == "service")))
                progress(f"  {rows[side][-1]}")
        result: dict[str, Any] = {"bench": "fleet", "model": "digitnet (trained)",
                                  "cut": args.cut, "rate_fps": args.rate,
                                  "seconds": args.seconds, "engine": args.engine,
                                  "replicas": args.replicas,
                                  "daemon_threads": args.daemon_threads, **rows}
        if "service" in rows and "daemons" in rows:
            result["ratio_frames_per_cpu_s"] = [
                round(s["frames_per_cpu_s"] / max(d["frames_per_cpu_s"], 1e-9), 2)
                for s, d in zip(rows["service"], rows["daemons"], strict=True)]
        if args.kill_replica:
            n = max(args.wearables)
            progress(f"service: {n} wearables, one replica killed after {args.seconds / 2:g} s")
            with service(args, bundle_dir) as (procs, addresses):
                result["kill"] = asyncio.run(measure(procs, addresses, n, work, args,
                                                     kill_at=args.seconds / 2))
        if args.flood:
            n = max(args.wearables)
            progress(f"service: {n} wearables and one at {args.flood:g} fps")
            with service(args, bundle_dir) as (procs, addresses):
                result["flood"] = asyncio.run(measure(procs, addresses, n, work, args,
                                                      flood=args.flood))
    if args.png:
        from coinf.cli.bench.fleet_chart import plot_fleet

        plot_fleet(result, args.png)
        result["png"] = args.png
    emit(result)
    return 0


def _split_digitnet(tmp: Path) -> str:
    from coinf.convert.split import split_model
    from coinf.models.zoo import committed_path

    split_model(committed_path("digitnet"), tmp / "digitnet")
    return str(tmp / "digitnet")
