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
:mod:`coinf.cli.bench.attack_peers`; the ``identity_copy_*`` attackers of
:mod:`coinf.cli.bench.attack_keys`; the pairing attackers of
:mod:`coinf.cli.bench.attack_pairing` (rotating-address flood, failed-pairing injection,
tracking) and :mod:`coinf.cli.bench.attack_wifi` (Wi-Fi responder hold), which add ``pair_s``:
the time a new device took to pair during the attack. Add one with ``@attacker`` in a module
imported here.
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
from pathlib import Path
from typing import Any

from coinf.cli import argtypes
from coinf.cli.bench import (  # each attack_* module registers its attackers on import
    attack_keys,  # noqa: F401
    attack_pairing,  # noqa: F401
    attack_peers,  # noqa: F401
    attack_wifi,  # noqa: F401
    emit,
    options,
)
from coinf.cli.bench.attack_arena import ATTACKERS, Arena, Outcome, attacker


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
    options.add_bundle(parser, required=True)
    parser.add_argument("--attackers", nargs="*", choices=sorted(ATTACKERS), metavar="NAME",
                        help=f"only these (default all: {', '.join(ATTACKERS)})")
    parser.add_argument("--duration-s", type=argtypes.seconds, default=5.0,
                        help="how long each flood lasts (default %(default)g)")
    parser.add_argument("--radios", type=argtypes.integer(1, 8), default=1,
                        help="radios of the BLE pairing attackers (default %(default)s; each "
                        "holds one connection to the wearable at a time)")
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
                    arena.radios = args.radios
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
          "radios": args.radios,
          "probe_ms": args.probe_ms, "attackers": results, "worst": worst,
          "goal_met": all(v == 0 for v in worst.values())})
    return 0


__all__ = ["ATTACKERS", "Arena", "Outcome", "attacker", "register", "run"]
