"""One contract every :class:`~coinf.ble_protocol.link.Link` implementation keeps.

Each test runs against every implementation through the ``link_pair`` fixture, which gives a
factory for a connected pair ``(a, b)``: in-process queues, a unix socket, a TCP socket, the
shaped in-process radio, and the GATT link over the real BLE stacks (bumble GATT server for the
wearable, bleak on bumble for the handheld) on the emulated radio. The emulated radio is slow
(tens of kB/s), so its payloads stay small; the others also carry 1 MB.

Waits are wrapped in ``asyncio.wait_for(..., HANG_GUARD)`` so a broken implementation fails
instead of hanging the run; the limit is generous and nothing here asserts how long things take.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from coinf.ble_protocol.link import Link
from coinf.ble_protocol.loopback import InProcessLink, SocketLink, connect_socket, serve_socket
from coinf.ble_protocol.messages import Message, MsgType
from coinf.ble_protocol.shaped import Channel, ShapedLink
from coinf.ble_protocol.tls import server_context
from coinf.ble_protocol.tls_store import default_store

from coinf.errors import LinkClosed
from tests.ble_servers import HANDHELD_PAIRING, WEARABLE_PAIRING

HANG_GUARD = 10.0  # seconds; a guard against hangs, not a timing assertion
T = TypeVar("T")
PairCM = contextlib.AbstractAsyncContextManager[tuple[Link, Link]]


async def guard(aw: Awaitable[T], limit: float = HANG_GUARD) -> T:
    return await asyncio.wait_for(aw, limit)


# --- the implementations -----------------------------------------------------------------------


@contextlib.asynccontextmanager
async def inprocess_pair() -> AsyncIterator[tuple[Link, Link]]:
    a, b = InProcessLink.pair()
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


@contextlib.asynccontextmanager
async def shaped_pair() -> AsyncIterator[tuple[Link, Link]]:
    # fast enough that 1 MB takes ~20 ms of simulated air time
    a, b = ShapedLink.pair(Channel(bandwidth_bps=50e6, latency_s=0.001))
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


@contextlib.asynccontextmanager
async def throttled_pair() -> AsyncIterator[tuple[Link, Link]]:
    """Two in-process links each shaped at one end, on one shared medium, both directions
    (what `coinf bench spatial` does over sockets)."""
    from coinf.ble_protocol.throttle import ThrottledLink

    air = asyncio.Lock()
    channel = Channel(bandwidth_bps=50e6, latency_s=0.001)
    a, b = InProcessLink.pair()
    ta = ThrottledLink(a, channel, air=air, shape_receive=True)
    try:
        yield ta, b
    finally:
        await ta.close()
        await b.close()


@contextlib.asynccontextmanager
async def socket_pair(kind: str) -> AsyncIterator[tuple[Link, Link]]:
    """(client end from connect_socket, server end handed to serve_socket's callback)."""
    with tempfile.TemporaryDirectory(prefix="coinf-link-") as tmp:
        # tcp port 0: the kernel picks a free port, read back from the listening socket
        address = f"unix:{Path(tmp) / 's.sock'}" if kind == "unix" else "tcp:127.0.0.1:0"
        accepted: asyncio.Queue[SocketLink] = asyncio.Queue()
        done = asyncio.Event()

        async def on_link(link: SocketLink) -> None:
            if kind == "tcp":  # tcp: is TLS (the session's identity, tests/tls_keys.py)
                await link.start_tls(server_context(default_store()), 10)
            await accepted.put(link)
            await done.wait()  # serve_socket closes the link when this returns

        server = await serve_socket(address, on_link, tls=kind == "tcp")
        try:
            if kind == "tcp":
                port = server.sockets[0].getsockname()[1]
                address = f"tcp:127.0.0.1:{port}"
            client = await connect_socket(address)
            served = await guard(accepted.get())
            try:
                yield client, served
            finally:
                await client.close()
                await served.close()
        finally:
            done.set()
            server.close()
            await guard(server.wait_closed())


@contextlib.asynccontextmanager
async def ble_pair() -> AsyncIterator[tuple[Link, Link]]:
    """(wearable GattLink from the bumble GATT server, handheld GattLink from bleak on bumble)
    over the emulated radio. The one place that knows where the BLE pieces live."""
    from coinf.ble_protocol.central import Central
    from coinf.ble_protocol.peripheral import WearableServer
    from coinf.ble_protocol.radio import EmulatedRadio

    async with EmulatedRadio("ble5-2m", time_scale=0.2) as radio:
        wspec, hspec = radio.specs
        mtu = radio.params.att_mtu
        async with WearableServer(wspec, bundle_identity="contract", mtu=mtu,
                                  **WEARABLE_PAIRING) as server, \
                Central("C0:F1:00:00:00:01", bundle_identity="contract", hci=hspec, mtu=mtu,
                        timeout=10, **HANDHELD_PAIRING) as central:
            accept = asyncio.ensure_future(server.accept(30))
            try:
                handheld = await central.connect()
            except BaseException:
                accept.cancel()
                raise
            wearable = await guard(accept, 30)
            try:
                yield wearable, handheld
            finally:
                await guard(handheld.close())
                await guard(wearable.close())


@dataclass(frozen=True)
class Impl:
    name: str
    open: Callable[[], PairCM]
    slow: bool = False  # the emulated radio: keep payloads small
    #: a receiver that does not read eventually blocks the sender (small enough to test here)
    bounded: bool = True

    def sizes(self) -> list[int]:
        return [0, 1, 3000] if self.slow else [0, 1, 3000, 65_537, 1_000_000]


IMPLS = [
    Impl("inprocess", inprocess_pair),
    Impl("socket-unix", lambda: socket_pair("unix")),
    Impl("socket-tcp", lambda: socket_pair("tcp")),
    Impl("shaped", shaped_pair, bounded=False),  # its inboxes are unbounded
    # with a latency its sends are delivered later by tasks: the inner link's back-pressure
    # does not reach the sender (an emulation wrapper; docs/PIPELINE.md)
    Impl("throttled", throttled_pair, bounded=False),
    # credits are withheld only after ~1 MB lies unread: too slow to reach on the emulated radio
    Impl("gatt-ble", ble_pair, slow=True, bounded=False),
]


@pytest.fixture(params=IMPLS, ids=[i.name for i in IMPLS])
def link_pair(request: pytest.FixtureRequest) -> Impl:
    """One implementation; ``async with link_pair.open() as (a, b)`` connects a fresh pair inside
    the test's own event loop (links and the BLE stacks are bound to the loop they start in)."""
    impl: Impl = request.param
    if impl.name == "gatt-ble":
        pytest.importorskip("bumble")
        pytest.importorskip("bleak")
    return impl


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run one test's coroutine in a fresh event loop, with an outer hang guard."""
    asyncio.run(asyncio.wait_for(main, 120))


def payload(n: int, seed: int) -> bytes:
    """``n`` bytes that differ by position and seed (a swapped or shifted chunk shows)."""
    return bytes((i * 7 + seed * 31 + (i >> 8)) & 0xFF for i in range(n)) if n < 4096 else (
        os.urandom(n)
    )


async def _send_all(link: Link, messages: list[Message]) -> None:
    for m in messages:
        await guard(link.send(m))


async def _receive_n(link: Link, n: int) -> list[Message]:
    return [await guard(link.receive()) for _ in range(n)]


# --- the contract ------------------------------------------------------------------------------


def test_messages_arrive_in_order_and_intact_both_ways(link_pair: Impl) -> None:
    async def main() -> None:
        async with link_pair.open() as (a, b):
            assert isinstance(a.description, str) and a.description
            assert isinstance(b.description, str) and b.description
            assert a.max_message_bytes >= max(link_pair.sizes())
            assert a.is_open and b.is_open
            types = list(MsgType)
            sizes = link_pair.sizes()
            up = [
                Message(types[i % len(types)], 0xFFFFFFFF - i if i % 2 else i, payload(n, i))
                for i, n in enumerate(sizes)
            ]
            down = [
                Message(types[-1 - i % len(types)], 1000 + i, payload(n, 100 + i))
                for i, n in enumerate(reversed(sizes))
            ]
            # both directions at once: each side sends while it receives
            _, _, got_b, got_a = await asyncio.gather(
                _send_all(a, up),
                _send_all(b, down),
                _receive_n(b, len(up)),
                _receive_n(a, len(down)),
            )
            assert [(m.type, m.request_id, len(m.payload)) for m in got_b] == [
                (m.type, m.request_id, len(m.payload)) for m in up
            ]
            assert got_b == up
            assert got_a == down
            assert all(isinstance(m.payload, bytes | bytearray) for m in got_a + got_b)

    run(main())


def test_concurrent_sends_are_not_interleaved(link_pair: Impl) -> None:
    """Two tasks sending on one end at once: every message arrives whole, each task's in order."""
    per_task, size = (4, 1500) if link_pair.slow else (20, 40_000)

    async def main() -> None:
        async with link_pair.open() as (a, b):

            def msgs(tag: int) -> list[Message]:
                return [
                    Message(MsgType.REQUEST, tag * 1000 + i, bytes([tag, i]) * (size // 2))
                    for i in range(per_task)
                ]

            first, second = msgs(1), msgs(2)
            _, _, got = await asyncio.gather(
                _send_all(a, first), _send_all(a, second), _receive_n(b, 2 * per_task)
            )
            for m in got:
                tag, i = divmod(m.request_id, 1000)
                assert m.payload == bytes([tag, i]) * (size // 2), (
                    f"message {m.request_id} arrived mixed with another"
                )
            assert [m for m in got if m.request_id < 2000] == first
            assert [m for m in got if m.request_id >= 2000] == second

    run(main())


@pytest.mark.parametrize("closer", ["a", "b"])
def test_close_fails_the_peer_and_the_closed_end(link_pair: Impl, closer: str) -> None:
    async def main() -> None:
        async with link_pair.open() as pair:
            closing, other = pair if closer == "a" else pair[::-1]
            await closing.send(Message(MsgType.PROBE, 1, b"before close"))
            assert (await guard(other.receive())).payload == b"before close"
            pending = asyncio.ensure_future(other.receive())
            await asyncio.sleep(0.05)  # let the receive start waiting
            assert not pending.done()
            await guard(closing.close())
            with pytest.raises(LinkClosed):
                await guard(pending)
            assert not closing.is_open
            assert not other.is_open
            with pytest.raises(LinkClosed):
                await guard(closing.send(Message(MsgType.PROBE, 2, b"after close")))
            with pytest.raises(LinkClosed):
                await guard(closing.receive())
            with pytest.raises(LinkClosed):
                await guard(other.receive())  # later receives fail the same way

    run(main())


def test_close_with_unread_messages_still_ends_in_link_closed(link_pair: Impl) -> None:
    """The peer may or may not deliver what was sent right before close(), but what it delivers
    is in order and intact, and then its receive raises LinkClosed instead of waiting forever."""

    async def main() -> None:
        async with link_pair.open() as (a, b):
            sent = [Message(MsgType.REQUEST, i, payload(100, i)) for i in range(8)]
            await _send_all(a, sent)  # nobody reads yet: fills the in-process queue exactly
            await guard(a.close())
            got: list[Message] = []
            with pytest.raises(LinkClosed):
                while True:
                    got.append(await guard(b.receive()))
                    assert len(got) <= len(sent)
            assert got == sent[: len(got)]
            assert not b.is_open

    run(main())


def test_send_blocked_by_back_pressure_fails_when_the_peer_closes(link_pair: Impl) -> None:
    if not link_pair.bounded:
        pytest.skip(f"{link_pair.name}: no back-pressure reachable here (see IMPLS)")

    async def main() -> None:
        async with link_pair.open() as (a, b):
            blocked = None
            for i in range(256):  # at most 256 MB before giving up
                send = asyncio.ensure_future(a.send(Message(MsgType.REQUEST, i, bytes(1 << 20))))
                done, _ = await asyncio.wait([send], timeout=0.5)
                if not done:
                    blocked = send
                    break
                send.result()
            assert blocked is not None, "256 MB went out with nobody reading"
            await guard(b.close())
            with pytest.raises(LinkClosed):
                await guard(blocked)
            with pytest.raises(LinkClosed):
                await guard(a.send(Message(MsgType.REQUEST, 999, b"x")))

    run(main())


def test_close_is_idempotent(link_pair: Impl) -> None:
    async def main() -> None:
        async with link_pair.open() as (a, b):
            pending = asyncio.ensure_future(a.receive())  # a receive of the closing end
            await asyncio.sleep(0.05)
            await guard(a.close())
            with pytest.raises(LinkClosed):
                await guard(pending)
            await guard(a.close())
            await guard(b.close())  # the peer, already disconnected, closes quietly too
            await guard(b.close())
            assert not a.is_open and not b.is_open

    run(main())


def test_stats_count_messages_and_bytes_both_ways(link_pair: Impl) -> None:
    async def main() -> None:
        async with link_pair.open() as (a, b):
            up = [Message(MsgType.REQUEST, i, payload(n, i)) for i, n in enumerate([0, 10, 2000])]
            down = [Message(MsgType.RESULT, i, payload(n, i)) for i, n in enumerate([5, 0])]
            await asyncio.gather(_send_all(a, up), _receive_n(b, len(up)))
            await asyncio.gather(_send_all(b, down), _receive_n(a, len(down)))
            up_bytes, down_bytes = sum(len(m.payload) for m in up), sum(
                len(m.payload) for m in down
            )
            assert (a.stats.messages_sent, a.stats.bytes_sent) == (3, up_bytes)
            assert (b.stats.messages_received, b.stats.bytes_received) == (3, up_bytes)
            assert (b.stats.messages_sent, b.stats.bytes_sent) == (2, down_bytes)
            assert (a.stats.messages_received, a.stats.bytes_received) == (2, down_bytes)

    run(main())


def test_async_with_closes_the_link(link_pair: Impl) -> None:
    async def main() -> None:
        async with link_pair.open() as (a, b):
            async with a as entered:
                assert entered is a
                await a.send(Message(MsgType.STATUS, 7, b"{}"))
                assert (await guard(b.receive())).request_id == 7
            assert not a.is_open
            with pytest.raises(LinkClosed):
                await guard(b.receive())
            with pytest.raises(LinkClosed):
                await guard(a.send(Message(MsgType.STATUS, 8, b"{}")))

    run(main())
