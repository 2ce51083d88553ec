"""``coinf bench attack``: attackers against real daemons, links and sessions; what each got.

Every attacker is an entry of :data:`ATTACKERS` (``@attacker(name, link, help)`` on an ``async
def f(arena) -> Outcome``), run against a fresh :class:`Arena`: a real
:class:`~coinf.handheld.daemon.HandheldDaemon` serving ``--bundle`` behind a TLS listener on
127.0.0.1, the helper's and the wearable's TLS stores (paired with each other) and a bench
directory for more. While an attacker runs, a paired device (the wearable's identity, from
127.0.0.1) tries to get through every ``--probe-ms``: a fresh connection, HELLO, a PROBE.

Per attacker (goal: all four 0):

* ``served``: requests of the attacker's a device answered (HELLO_ACK, STATUS, PROFILE, RESULT);
* ``tensors_read``: tensors of the wearable's that reached the attacker (activations);
* ``results_accepted``: results of the attacker's a wearable took as its output;
* ``lockout_s``: the longest time the paired device could not get through (from the start of
  its first failed attempt to the start of its next successful one).

Attackers here: ``unauthenticated_tcp`` (plain TCP, TLS without a certificate, TLS with a
certificate nobody paired; each sends HELLO, STATUS, PROFILE and a REQUEST),
``squatter`` (another device on the helper's address while it is down, with a key of its own;
a wearable Session runs frames against it), ``connection_flood`` (connections stalling in the
TLS handshake, as fast as they are taken, from three other addresses) and
``connection_flood_same_address`` (the same from the paired device's own address); then
``tampered_tail``, ``replayed_result`` and the BLE attackers (``ble_*``) of
:mod:`coinf.cli.bench.attack_peers`. Add one with ``@attacker``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ssl
import struct
import tempfile
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coinf.cli import argtypes
from coinf.cli.bench import emit

AttackFn = Callable[["Arena"], Awaitable["Outcome"]]


@dataclass
class Outcome:
    """What one attacker got (module docstring); ``detail``: counters that explain it."""

    served: int = 0
    #: None: does not apply (a paired helper reads what it is sent by design)
    tensors_read: int | None = 0
    results_accepted: int = 0
    lockout_s: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Attacker:
    name: str
    link: str  # "tcp" or "ble"
    help: str
    run: AttackFn


ATTACKERS: dict[str, Attacker] = {}


def attacker(name: str, link: str, help_text: str) -> Callable[[AttackFn], AttackFn]:
    """Register ``async def f(arena) -> Outcome`` as the attacker ``name``."""
    def register(fn: AttackFn) -> AttackFn:
        ATTACKERS[name] = Attacker(name, link, help_text, fn)
        return fn
    return register


class Arena:
    """A paired helper and wearable on 127.0.0.1 (module docstring), for one attacker."""

    def __init__(self, bundle: Any, root: Path, probe_s: float, duration_s: float) -> None:
        from coinf.ble_protocol.tls_store import TlsStore

        self.bundle, self.root = bundle, root
        self.probe_s, self.duration_s = probe_s, duration_s
        self.helper_store = TlsStore(root / "helper")
        self.wearable_store = TlsStore(root / "wearable")
        for a, b in ((self.helper_store, self.wearable_store),
                     (self.wearable_store, self.helper_store)):
            a.pin("peer", b.certificate_der())
        self.daemon: Any = None
        self.listener: Any = None
        self.address = ""
        self._stack = contextlib.AsyncExitStack()

    def store(self, name: str, *, trusts: Any = None) -> Any:
        """Another device's store (its own key), trusting ``trusts``' certificate if given."""
        from coinf.ble_protocol.tls_store import TlsStore

        store = TlsStore(self.root / name)
        store.ensure_identity()
        if trusts is not None:
            store.pin("victim", trusts.certificate_der())
        return store

    async def __aenter__(self) -> Arena:
        from coinf.ble_protocol.listen import open_listener
        from coinf.handheld.daemon import HandheldDaemon

        self.daemon = await self._stack.enter_async_context(HandheldDaemon(self.bundle))
        self.listener = await self._stack.enter_async_context(
            open_listener("tcp:127.0.0.1:0", tls=self.helper_store))
        self.address = self.listener.address
        self.daemon.spawn(self.daemon.serve_listener(self.listener))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def paired_attempt(self, timeout: float) -> bool:
        """One paired device's try: a fresh TLS link, HELLO, PROBE."""
        from coinf.ble_protocol.loopback import connect_socket
        from coinf.ble_protocol.messages import PROTOCOL_VERSION, MsgType, encode_json
        from coinf.ble_protocol.rpc import RpcClient
        from coinf.errors import CoinfError

        rpc = None
        try:
            async with asyncio.timeout(timeout):
                rpc = RpcClient(await connect_socket(self.address, timeout,
                                                     tls=self.wearable_store))
                hello = {"protocol": PROTOCOL_VERSION, "bundle": self.bundle.identity}
                await rpc.request(MsgType.HELLO, encode_json(hello), timeout)
                await rpc.request(MsgType.PROBE, b"paired", timeout)
            return True
        except (CoinfError, TimeoutError, OSError):
            return False
        finally:
            if rpc is not None:
                with contextlib.suppress(Exception):
                    await rpc.close()

    async def watch(self, stop: asyncio.Event) -> float:
        """The paired device tries every ``probe_s`` until ``stop``: the lockout (s)."""
        worst, failing_since = 0.0, None
        while not stop.is_set():
            t0 = time.monotonic()
            ok = await self.paired_attempt(max(1.0, 10 * self.probe_s))
            if ok:
                if failing_since is not None:
                    worst = max(worst, t0 - failing_since)
                failing_since = None
            elif failing_since is None:
                failing_since = t0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.probe_s)
        if failing_since is not None:
            worst = max(worst, time.monotonic() - failing_since)
        return worst

    async def under_watch(self, attack: Awaitable[Outcome]) -> Outcome:
        """Run ``attack`` while the paired device keeps trying; its lockout goes in."""
        stop = asyncio.Event()
        watcher = asyncio.ensure_future(self.watch(stop))
        try:
            outcome = await attack
        finally:
            stop.set()
            lockout = await watcher
        outcome.lockout_s = round(lockout, 3)
        return outcome


def frame(mtype: int, rid: int, payload: bytes) -> bytes:
    """A socket frame (docs/PROTOCOL.md §6), as an independent peer writes it."""
    from coinf.ble_protocol.messages import PROTOCOL_VERSION

    header = struct.pack("<2sBBII", b"CF", PROTOCOL_VERSION, mtype, rid, len(payload))
    return header + payload + struct.pack("<I", zlib.crc32(payload, zlib.crc32(header)))


def attacker_requests(bundle: Any) -> list[bytes]:
    """HELLO, STATUS, PROFILE and a REQUEST for the first candidate's tail, as frames."""
    import numpy as np

    from coinf.ble_protocol.messages import PROTOCOL_VERSION, MsgType, encode_json
    from coinf.ble_protocol.request import Request, encode_request
    from coinf.ble_protocol.tensors import encode_tensors

    cand = bundle.candidates[0]
    feeds = {t.name: np.zeros(t.shape, dtype=t.dtype) for t in cand.crossing}
    request = encode_request(Request.split(cand.id, bundle.candidates[-1].id, 0),
                             encode_tensors(feeds))
    hello = encode_json({"protocol": PROTOCOL_VERSION, "bundle": bundle.identity,
                         "role": "wearable", "capabilities": ["raw"]})
    return [frame(MsgType.HELLO, 1, hello), frame(MsgType.STATUS, 2, b"{}"),
            frame(MsgType.PROFILE, 3, b""), frame(MsgType.REQUEST, 4, request)]


async def replies(reader: asyncio.StreamReader, limit_s: float = 5.0) -> int:
    """Frames that came back before the peer closed (a frame header is 12 bytes)."""
    got = b""
    try:
        async with asyncio.timeout(limit_s):
            while chunk := await reader.read(65536):
                got += chunk
    except (TimeoutError, ConnectionError, ssl.SSLError):
        pass
    count, at = 0, 0
    while at + 12 <= len(got):
        count += 1
        at += 12 + struct.unpack("<I", got[at + 8:at + 12])[0] + 4
    return count


@attacker("unauthenticated_tcp", "tcp", "a client nobody paired: plain TCP, TLS without a "
          "certificate, TLS with its own; each sends HELLO, STATUS, PROFILE, REQUEST")
async def unauthenticated_tcp(arena: Arena) -> Outcome:
    from coinf.ble_protocol.tls import client_context

    stranger = arena.store("stranger")
    bare = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    bare.check_hostname, bare.verify_mode = False, ssl.CERT_NONE
    host, port = arena.address.split(":")[1:]
    before = arena.daemon.requests

    async def attack() -> Outcome:
        outcome = Outcome()
        for kind, ctx in (("plain", None), ("tls_no_cert", bare),
                          ("tls_unpaired", client_context(stranger))):
            answered = 0
            for _ in range(3):
                try:
                    reader, writer = await asyncio.open_connection(host, int(port), ssl=ctx)
                except (OSError, ssl.SSLError):
                    continue
                for data in attacker_requests(arena.bundle):
                    writer.write(data)
                with contextlib.suppress(Exception):
                    await writer.drain()
                answered += await replies(reader)
                writer.close()
            outcome.served += answered
            outcome.detail[f"{kind}_replies"] = answered
        outcome.served += arena.daemon.requests - before
        outcome.detail["tls_refused"] = arena.listener.tls_refused
        return outcome

    return await arena.under_watch(attack())


@attacker("squatter", "tcp", "another device on the helper's address while the helper is "
          "down, with its own key; a wearable Session sends it frames")
async def squatter(arena: Arena) -> Outcome:
    from coinf.ble_protocol.listen import open_listener
    from coinf.cli.sample import bundle_feeds
    from coinf.handheld.daemon import HandheldDaemon
    from coinf.wearable.options import LinkOptions, PlacementOptions, SessionOptions
    from coinf.wearable.session import AsyncSession

    evil = arena.store("squatter", trusts=arena.wearable_store)  # it would serve the wearable
    address = arena.address
    await arena.listener.aclose()  # the real helper is down; the squatter takes its port
    outcome = Outcome()
    cid = arena.bundle.candidates[len(arena.bundle.candidates) // 2].id
    crossing = len(arena.bundle.candidate(cid).crossing)
    opts = SessionOptions(placement=PlacementOptions(split=cid), link=LinkOptions(
        transport=address, timeout=5.0, transport_options={"tls": arena.wearable_store}))
    frames = max(4, int(arena.duration_s / 0.25))
    local, why = 0, ""
    # a real daemon serving the same bundle: it would read every activation and answer
    async with HandheldDaemon(arena.bundle) as fake, \
            open_listener(address, tls=evil) as fake_listener:
        fake.spawn(fake.serve_listener(fake_listener))
        async with AsyncSession(arena.bundle, opts) as sess:
            for i in range(frames):
                await sess.run(None, bundle_feeds(arena.bundle, i))
                run = sess.last_run
                if run is not None and run.local:
                    local += 1
                    why = run.fallback or why
                else:
                    outcome.results_accepted += 1
        outcome.served = fake.requests
        outcome.tensors_read = fake.requests * crossing
        outcome.detail = {"frames": frames, "finished_locally": local,
                          "squatter_connections": fake.connections, "why": why[:200]}
    return outcome


async def _flood(arena: Arena, sources: list[str]) -> Outcome:
    host, port = arena.address.split(":")[1:]
    opened = 0
    conns: list[asyncio.StreamWriter] = []
    deadline = time.monotonic() + arena.duration_s

    async def attack() -> Outcome:
        nonlocal opened
        while time.monotonic() < deadline:
            src = sources[opened % len(sources)]
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(
                    host, int(port), local_addr=(src, 0)), 2.0)
            except (OSError, TimeoutError):
                await asyncio.sleep(0.01)
                continue
            writer.write(b"\x16\x03\x01\x02\x00\x01")  # half a ClientHello, then silence
            conns.append(writer)
            opened += 1
            if len(conns) > 200:  # the attacker's own descriptors
                conns.pop(0).close()
            await asyncio.sleep(0)
        lst = arena.listener
        return Outcome(detail={"connections": opened, "tls_timeouts": lst.tls_timeouts,
                               "evicted": lst.evicted, "refused": lst.refused,
                               "refused_peer": lst.refused_peer,
                               "rate_per_s": round(opened / arena.duration_s)})

    try:
        return await arena.under_watch(attack())
    finally:
        for writer in conns:
            writer.close()


@attacker("connection_flood", "tcp", "connections stalling in the TLS handshake, opened as "
          "fast as taken, from three other addresses")
async def connection_flood(arena: Arena) -> Outcome:
    return await _flood(arena, ["127.0.0.2", "127.0.0.3", "127.0.0.4"])


@attacker("connection_flood_same_address", "tcp", "the same flood from the paired device's "
          "own address (a device behind the same NAT)")
async def connection_flood_same_address(arena: Arena) -> Outcome:
    return await _flood(arena, ["127.0.0.1"])


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bundle", required=True,
                        help="bundle directory (coinf split) the helper serves")
    parser.add_argument("--attackers", nargs="*", choices=sorted(ATTACKERS), metavar="NAME",
                        help=f"only these (default all: {', '.join(ATTACKERS)})")
    parser.add_argument("--duration-s", type=argtypes.seconds, default=5.0,
                        help="how long each flood lasts (default %(default)g)")
    parser.add_argument("--probe-ms", type=argtypes.milliseconds, default=100.0,
                        help="how often the paired device tries to get through (default "
                        "%(default)g)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from coinf.bundle import Bundle

    bundle = Bundle.load(args.bundle)
    names = args.attackers or list(ATTACKERS)

    async def main() -> dict[str, Any]:
        results: dict[str, Any] = {}
        for name in names:
            with tempfile.TemporaryDirectory(prefix="coinf-attack-") as tmp:
                async with Arena(bundle, Path(tmp) / "tls", args.probe_ms / 1000,
                                 args.duration_s) as arena:
                    out = await ATTACKERS[name].run(arena)
            results[name] = {"link": ATTACKERS[name].link, "served": out.served,
                             "tensors_read": out.tensors_read,
                             "results_accepted": out.results_accepted,
                             "lockout_s": out.lockout_s, **out.detail}
        return results

    results = asyncio.run(main())
    worst = {k: max((r[k] for r in results.values() if r[k] is not None), default=0)
             for k in ("served", "tensors_read", "results_accepted", "lockout_s")}
    emit({"bench": "attack", "bundle": bundle.identity, "duration_s": args.duration_s,
          "probe_ms": args.probe_ms, "attackers": results, "worst": worst,
          "goal_met": all(v == 0 for v in worst.values())})
    return 0


from coinf.cli.bench import attack_peers  # noqa: E402,F401  (registers its attackers)
