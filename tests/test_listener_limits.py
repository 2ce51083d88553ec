"""Slots and deadlines of the socket listeners (issue 41): handshake and idle timeouts, the
per-frame rate floor (slowloris, a peer that does not read), the connection caps and the
per-address limit. Real sockets on 127.0.0.1 only; short limits through the options; every wait
is bounded and the assertions are on states and counters, never on durations."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import struct
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from coinf.ble_protocol.link import Link, LinkClosed
from coinf.ble_protocol.listen import open_listener
from coinf.ble_protocol.loopback import SocketLink
from coinf.ble_protocol.loopback import connect_socket as _connect_socket
from coinf.ble_protocol.messages import (
    PROTOCOL_VERSION,
    ErrorCode,
    Message,
    MsgType,
    ProtocolError,
)
from coinf.ble_protocol.rpc import RpcClient
from coinf.ble_protocol.rpc import serve as rpc_serve
from coinf.ble_protocol.socket_listener import SocketListener
from coinf.handheld.daemon import HandheldDaemon

from coinf.errors import InputError
from tests.bundles import make_tiny_bundle, reference
from tests.test_listen import infer

MiB = 1024 * 1024
Raw = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def frame(mtype: MsgType, rid: int, payload: bytes = b"", declared: int | None = None) -> bytes:
    """One socket frame (docs/PROTOCOL.md §6); ``declared`` lies about the payload length (the
    header alone is returned then)."""
    length = len(payload) if declared is None else declared
    header = struct.pack("<2sBBII", b"CF", PROTOCOL_VERSION, int(mtype), rid, length)
    if declared is not None:
        return header
    return header + payload + struct.pack("<I", zlib.crc32(payload, zlib.crc32(header)))


async def handler(msg: Message) -> Message:
    """A minimal handheld: HELLO -> HELLO_ACK, anything else echoed as a RESULT."""
    if msg.type == MsgType.HELLO:
        return Message(MsgType.HELLO_ACK, msg.request_id, b"{}")
    return Message(MsgType.RESULT, msg.request_id, msg.payload)


async def connect_socket(address: str, timeout: float = 10.0) -> SocketLink:
    """A client link; plain TCP allowed (these tests write frames by hand)."""
    return await _connect_socket(address, timeout, allow_insecure=True)


@contextlib.asynccontextmanager
async def listening(spec: str = "tcp+insecure:127.0.0.1:0", *,
                    serve: Callable[[Link], Awaitable[Any]] | None = None,
                    **options: Any) -> AsyncIterator[SocketListener]:
    """A socket listener (plain TCP: these tests write frames by hand; TLS: test_tls.py); with
    ``serve``, every link it yields is served by it in a task."""
    if spec.startswith("tcp+insecure:"):
        options.setdefault("allow_insecure", True)
    async with open_listener(spec, **options) as listener:
        assert isinstance(listener, SocketListener)
        tasks: set[asyncio.Task[Any]] = set()

        async def loop() -> None:
            async for link in listener:
                tasks.add(asyncio.ensure_future(serve(link)))  # type: ignore[misc]

        runner = asyncio.ensure_future(loop()) if serve is not None else None
        try:
            yield listener
        finally:
            if runner is not None:
                runner.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, *(t for t in [runner] if t), return_exceptions=True)


async def simple(link: Link) -> None:
    try:
        await rpc_serve(link, handler)
    finally:
        await link.close()


async def raw(listener: SocketListener) -> Raw:
    host, port = listener.address.split(":")[1:]
    return await asyncio.open_connection(host, int(port))


async def closed_by_peer(conn: Raw) -> bool:
    """True once the listener closed this raw connection (EOF or reset), within 10 s."""
    reader = conn[0]
    try:
        while await asyncio.wait_for(reader.read(65536), 10):
            pass
    except ConnectionError:
        pass
    return True


async def until(check: Callable[[], bool], what: str) -> None:
    """Wait (at most 10 s) until ``check()``."""
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


async def hello(client: RpcClient) -> None:
    reply = await client.request(MsgType.HELLO, b"{}", 10)
    assert reply.type == MsgType.HELLO_ACK


async def raw_hello(conn: Raw) -> None:
    reader, writer = conn
    writer.write(frame(MsgType.HELLO, 1, b"{}"))
    await writer.drain()
    header = await asyncio.wait_for(reader.readexactly(12), 10)
    assert header[3] == MsgType.HELLO_ACK
    await asyncio.wait_for(reader.readexactly(struct.unpack("<I", header[8:])[0] + 4), 10)


def close_all(*conns: Raw) -> None:
    for _reader, writer in conns:
        writer.close()


def test_socket_listener_options_are_checked() -> None:
    listener = open_listener("tcp:127.0.0.1:0")
    assert isinstance(listener, SocketListener)
    assert (listener.max_links, listener.max_links_per_peer) == (16, 4)
    assert (listener.handshake_timeout, listener.idle_timeout, listener.frame_timeout) == (
        5.0, 120.0, 10.0)
    for bad in [{"max_links_per_peer": 0}, {"max_links": 2.5}, {"idle_timeout": 0},
                {"handshake_timeout": -1}, {"frame_timeout": "10"}, {"min_rate_bps": -1},
                {"max_message_bytes": 0}, {"handshake_max_bytes": True}]:
        with pytest.raises(InputError, match=next(iter(bad))):
            open_listener("tcp:127.0.0.1:0", **bad)
    with pytest.raises(InputError, match="idle_timeout"):  # the message lists what it takes
        open_listener("unix:/tmp/x.sock", colour="red")
    off = open_listener("tcp:127.0.0.1:0", handshake_timeout=None, idle_timeout=None,
                        frame_timeout=None)
    assert isinstance(off, SocketListener) and off.idle_timeout is None


def test_a_connection_without_a_handshake_is_closed() -> None:
    async def main() -> None:
        async with listening(serve=simple, handshake_timeout=0.3) as listener:
            silent = await raw(listener)
            talking = await raw(listener)  # speaks, but never the HELLO
            talking[1].write(frame(MsgType.PROBE, 7, b"hi"))
            greeted = RpcClient(await connect_socket(listener.address))
            await hello(greeted)
            assert await closed_by_peer(silent) and await closed_by_peer(talking)
            assert listener.handshake_timeouts == 2
            # the one that completed its HELLO is still served
            assert (await greeted.request(MsgType.PROBE, b"x", 10)).payload == b"x"
            assert listener.open_links == 1 and listener.idle_timeouts == 0
            await greeted.close()
            close_all(silent, talking)

    asyncio.run(main())


def test_an_idle_link_is_closed_unless_a_request_waits_for_its_reply() -> None:
    async def main() -> None:
        async with listening(idle_timeout=0.3) as listener:
            client = await connect_socket(listener.address)
            link = await asyncio.wait_for(listener.accept(), 10)
            await client.send(Message(MsgType.HELLO, 1, b"{}"))
            await link.send(Message(MsgType.HELLO_ACK, (await link.receive()).request_id, b""))
            await client.receive()
            await client.send(Message(MsgType.REQUEST, 2, b"slow tail"))
            request = await asyncio.wait_for(link.receive(), 10)
            await asyncio.sleep(1.2)  # four idle limits with the request unanswered
            assert link.is_open and listener.idle_timeouts == 0
            await link.send(Message(MsgType.RESULT, request.request_id, b"done"))
            assert (await asyncio.wait_for(client.receive(), 10)).payload == b"done"
            with pytest.raises(LinkClosed):  # then silence: closed
                await asyncio.wait_for(client.receive(), 10)
            await until(lambda: listener.idle_timeouts == 1 and listener.open_links == 0,
                        "the idle link closed")
            await client.close()

    asyncio.run(main())


def test_a_wearable_is_served_while_idle_connections_hold_every_slot(tmp_path) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")
    x = np.random.default_rng(7).standard_normal((1, 16)).astype(np.float32)

    async def main() -> None:
        async with HandheldDaemon(bundle) as daemon, listening(
                serve=daemon.serve, max_links=4, max_links_per_peer=4,
                handshake_timeout=60) as listener:
            idle = [await raw(listener) for _ in range(4)]
            await until(lambda: listener.open_links == 4, "four idle connections held")
            wearable = RpcClient(await connect_socket(listener.address))
            y = await infer(wearable, bundle, x)  # HELLO, then a REQUEST
            np.testing.assert_allclose(y, reference(bundle, x), rtol=1e-5, atol=1e-6)
            # it took the place of the oldest idle one; the others are still open
            assert await closed_by_peer(idle[0])
            assert listener.evicted == 1 and listener.refused == 0
            assert not any(r.at_eof() for r, _w in idle[1:]) and listener.open_links == 4
            # another idle one replaces the next oldest idle one, never the handshaken link
            idle.append(await raw(listener))
            assert await closed_by_peer(idle[1])
            assert listener.evicted == 2 and listener.open_links == 4
            y = await infer(wearable, bundle, x)
            np.testing.assert_allclose(y, reference(bundle, x), rtol=1e-5, atol=1e-6)
            await wearable.close()
            close_all(*idle)

    asyncio.run(main())


def test_one_address_gets_at_most_its_share_of_links() -> None:
    async def main() -> None:
        async with listening(serve=simple, max_links_per_peer=2, max_links=16) as listener:
            first, second = [RpcClient(await connect_socket(listener.address)) for _ in "ab"]
            for client in (first, second):
                await hello(client)
            third = await raw(listener)  # both links of 127.0.0.1 are handshaken: refused
            assert await closed_by_peer(third)
            assert listener.refused_peer == 1 and listener.evicted == 0
            for client in (first, second):  # still served
                assert (await client.request(MsgType.PROBE, b"ok", 10)).payload == b"ok"
                await client.close()
            close_all(third)

    asyncio.run(main())


def test_a_unix_listener_has_no_per_address_limit(tmp_path) -> None:
    async def main() -> None:
        async with listening(f"unix:{tmp_path / 'h.sock'}", serve=simple,
                             max_links_per_peer=1) as listener:
            clients = [RpcClient(await connect_socket(listener.address)) for _ in range(3)]
            for client in clients:
                await hello(client)
            assert listener.open_links == 3 and listener.refused_peer == 0
            for client in clients:
                await client.close()

    asyncio.run(main())


def test_a_slowloris_frame_is_dropped_and_its_memory_released() -> None:
    async def main() -> None:
        async with listening(serve=simple, frame_timeout=0.5, min_rate_bps=4 * MiB) as listener:
            conn = await raw(listener)
            await raw_hello(conn)
            gc.collect()
            base = tracemalloc.get_traced_memory()[0]
            writer = conn[1]
            writer.write(frame(MsgType.REQUEST, 2, declared=8 * MiB))
            writer.write(bytes(3 * MiB))  # fast, then a byte now and then
            await writer.drain()
            await until(lambda: listener.buffered >= 3 * MiB, "3 MiB of the frame arrived")
            held = tracemalloc.get_traced_memory()[0] - base
            assert held >= 3 * MiB  # what arrived is held while the frame keeps its pace ...

            async def trickle() -> None:
                with contextlib.suppress(ConnectionError, RuntimeError):
                    while True:
                        await asyncio.sleep(0.05)
                        writer.write(b"\0")
                        await writer.drain()

            trickling = asyncio.ensure_future(trickle())
            assert await closed_by_peer(conn)  # ... it fell below the floor: dropped
            trickling.cancel()
            await asyncio.gather(trickling, return_exceptions=True)
            await until(lambda: listener.slow_frames == 1 and listener.open_links == 0,
                        "the slow frame counted")
            assert listener.buffered == 0
            gc.collect()
            assert tracemalloc.get_traced_memory()[0] - base < MiB  # and released
            close_all(conn)

    tracemalloc.start()
    try:
        asyncio.run(main())
    finally:
        tracemalloc.stop()


def test_a_declared_length_is_neither_allocated_nor_trusted() -> None:
    async def main() -> None:
        async with listening(serve=simple, max_message_bytes=16 * MiB,
                             handshake_max_bytes=4096) as listener:
            # before the handshake: at most handshake_max_bytes
            early = await raw(listener)
            early[1].write(frame(MsgType.HELLO, 1, declared=8192))
            assert await closed_by_peer(early)
            # after it: a frame declaring 15 MiB holds what came, not what it declared
            conn = await raw(listener)
            await raw_hello(conn)
            gc.collect()
            base = tracemalloc.get_traced_memory()[0]
            conn[1].write(frame(MsgType.REQUEST, 2, declared=15 * MiB) + bytes(10))
            await until(lambda: listener.buffered == 10, "10 bytes of the frame arrived")
            assert tracemalloc.get_traced_memory()[0] - base < MiB
            # over max_message_bytes: refused at the header
            big = await raw(listener)
            await raw_hello(big)
            big[1].write(frame(MsgType.REQUEST, 2, declared=16 * MiB + 1))
            assert await closed_by_peer(big)
            assert not conn[0].at_eof() and listener.open_links == 1
            close_all(early, conn, big)

    tracemalloc.start()
    try:
        asyncio.run(main())
    finally:
        tracemalloc.stop()


def test_a_peer_that_does_not_read_is_dropped() -> None:
    async def main() -> None:
        async with listening(handshake_timeout=None, frame_timeout=0.3,
                             min_rate_bps=16 * MiB) as listener:
            conn = await raw(listener)  # never reads
            link = await asyncio.wait_for(listener.accept(), 10)
            with pytest.raises(ProtocolError) as info:
                await asyncio.wait_for(link.send(Message(MsgType.RESULT, 1, bytes(64 * MiB))),
                                       30)
            assert info.value.code == ErrorCode.TIMEOUT and not link.is_open
            await link.close()
            await until(lambda: listener.slow_frames == 1 and listener.open_links == 0,
                        "the stuck send counted")
            close_all(conn)

    asyncio.run(main())


def test_a_controller_that_never_answers_its_reset_is_an_adapter_error() -> None:
    """The handheld's bumble host bounds its wait for the controller (issue 41): a "controller"
    on 127.0.0.1 that takes the HCI transport but never answers."""
    from bleak.exc import BleakError
    from coinf.ble_protocol.bleak_bumble import BumbleHost
    from coinf.ble_protocol.central import Central

    from coinf.errors import AdapterError

    async def main() -> None:
        mute: list[asyncio.StreamWriter] = []

        async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            mute.append(writer)
            with contextlib.suppress(ConnectionError):
                while await reader.read(4096):
                    pass

        server = await asyncio.start_server(swallow, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            host = BumbleHost(f"tcp-client:127.0.0.1:{port}", timeout=0.3)
            with pytest.raises(BleakError, match="did not answer its reset"):
                await asyncio.wait_for(host.open(), 10)
            assert not host.is_open
            central = Central(bundle_identity="b", hci=f"tcp-client:127.0.0.1:{port}",
                              timeout=0.3)
            with pytest.raises(AdapterError, match="did not answer its reset"):
                await asyncio.wait_for(central.open(), 10)
            await central.aclose()
            assert len(mute) == 2  # both really reached the "controller"
        finally:
            for writer in mute:
                writer.close()
            server.close()
            await server.wait_closed()

    asyncio.run(main())


def test_frames_under_way_share_the_listeners_byte_budget() -> None:
    """Three peers each start a 1 MiB frame against a 2.5 MiB budget: two are read, the third
    reads nothing until one of them is done, and what is held never exceeds the budget (each
    link alone would hold its whole frame: 3 MiB)."""

    async def main() -> None:
        async with listening(serve=simple, max_buffered_bytes=5 * MiB // 2,
                             max_message_bytes=2 * MiB) as listener:
            conns = [await raw(listener) for _ in range(3)]
            for conn in conns:
                await raw_hello(conn)
            payload = bytes(MiB)
            whole = frame(MsgType.REQUEST, 2, payload)
            for conn in conns:  # header and most of the body, all but the last 8 bytes
                conn[1].write(whole[:-8])
            await until(lambda: listener.budget.held == 2 * (MiB + 4) and
                        listener.budget.waits == 1, "two frames in the budget, one waiting")
            await until(lambda: listener.buffered >= 2 * MiB - 16, "two frames read")
            await asyncio.sleep(0.2)  # the third stays unread while there is no room
            assert listener.buffered <= 2 * MiB + 8 and listener.budget.peak <= 5 * MiB // 2
            for conn in conns:  # finish all three: the third is then read and answered
                conn[1].write(whole[-8:])
            for reader, _ in conns:
                header = await asyncio.wait_for(reader.readexactly(12), 10)
                assert header[3] == MsgType.RESULT
                body = await asyncio.wait_for(reader.readexactly(MiB + 4), 10)
                assert body[:-4] == payload
            assert listener.budget.held == 0 and listener.budget.peak <= 5 * MiB // 2
            close_all(*conns)

    asyncio.run(main())


def test_a_frame_larger_than_the_budget_passes_alone() -> None:
    async def main() -> None:
        async with listening(serve=simple, max_buffered_bytes=MiB // 2) as listener:
            conn = await raw(listener)
            await raw_hello(conn)
            payload = bytes(MiB)
            conn[1].write(frame(MsgType.REQUEST, 2, payload))
            header = await asyncio.wait_for(conn[0].readexactly(12), 10)
            assert header[3] == MsgType.RESULT
            assert (await asyncio.wait_for(conn[0].readexactly(MiB + 4), 10))[:-4] == payload
            assert listener.budget.held == 0
            close_all(conn)

    asyncio.run(main())


def test_coinf_handheld_accepts_no_frame_beyond_its_bundles_largest_request(
        tmp_path: Path) -> None:
    """A peer that has completed the HELLO still cannot make ``coinf handheld`` buffer more
    than its bundle can need (request_bound), where the protocol-wide cap is 64 MiB."""
    from coinf.handheld.daemon import request_bound

    from coinf.bundle import Bundle
    from tests.procs import handheld_daemon

    bundle = make_tiny_bundle(tmp_path / "tiny")
    bound = request_bound(Bundle.load(bundle.root))
    assert bound < MiB
    sock = tmp_path / "h.sock"

    async def attempt(declared: int, wait_s: float) -> bool:
        """True if the helper closed the link on the header alone (within ``wait_s``)."""
        conn = await asyncio.open_unix_connection(str(sock))
        await raw_hello_to(conn, bundle.identity)
        conn[1].write(frame(MsgType.REQUEST, 2, declared=declared))
        await conn[1].drain()
        try:
            data = await asyncio.wait_for(conn[0].read(1), wait_s)
            closed = data == b""
        except TimeoutError:
            closed = False  # still waiting for the rest of the frame
        except ConnectionError:
            closed = True
        close_all(conn)
        return closed

    with handheld_daemon(bundle.root, f"unix:{sock}"):
        assert asyncio.run(attempt(bound + 1, 10.0))  # closed, however loaded the machine
        assert not asyncio.run(attempt(bound, 1.0))  # a slow helper only keeps it open longer


async def raw_hello_to(conn: Raw, identity: str) -> None:
    """A wearable's HELLO to a real daemon, answered with HELLO_ACK."""
    import json

    reader, writer = conn
    body = json.dumps({"protocol": PROTOCOL_VERSION, "bundle": identity, "role": "wearable",
                       "capabilities": ["raw", "packed"]}).encode()
    writer.write(frame(MsgType.HELLO, 1, body))
    await writer.drain()
    header = await asyncio.wait_for(reader.readexactly(12), 10)
    assert header[3] == MsgType.HELLO_ACK
    await asyncio.wait_for(reader.readexactly(struct.unpack("<I", header[8:])[0] + 4), 10)
