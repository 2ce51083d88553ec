"""Wire codec, socket link, RPC and the cross-process handheld daemon."""

from __future__ import annotations

import asyncio
import struct
import time
import zlib
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from coinf.ble_protocol.link import LinkClosed
from coinf.ble_protocol.loopback import InProcessLink, SocketLink, connect_socket, parse_address
from coinf.ble_protocol.messages import (
    PROTOCOL_VERSION,
    ErrorCode,
    Message,
    MsgType,
    ProtocolError,
)
from coinf.ble_protocol.rpc import RpcClient, serve
from coinf.ble_protocol.tensors import ONNX_TO_NUMPY, decode_tensors, encode_raw, encode_tensors
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from coinf import LinkOptions, Session
from tests.bundles import fixed, make_tiny_bundle, reference
from tests.procs import handheld_daemon

DTYPES = list(ONNX_TO_NUMPY.values())


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=12),
        st.sampled_from(DTYPES).flatmap(
            lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=4, max_side=5))
        ),
        max_size=4,
    )
)
def test_tensor_map_round_trip(tensors):
    out = decode_tensors(encode_tensors(tensors))
    assert list(out) == list(tensors)
    for name, arr in tensors.items():
        assert out[name].dtype == arr.dtype and out[name].shape == arr.shape
        np.testing.assert_array_equal(out[name], arr)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_garbage_tensor_maps_raise_protocol_errors(blob):
    try:
        decode_tensors(blob, max_bytes=1 << 16)
    except ProtocolError as exc:
        assert exc.code in {ErrorCode.TRUNCATED, ErrorCode.MALFORMED, ErrorCode.TOO_LARGE}


def test_oversized_declared_tensor_rejected_before_allocation():
    # 8 dims of 2**31 float32 each: absurd size, tiny message
    body = struct.pack("<BB8I", 1, 8, *([2**31] * 8))
    blob = struct.pack("<H", 1) + struct.pack("<H", 1) + b"x" + struct.pack("<BI", 0, len(body))
    with pytest.raises(ProtocolError) as info:
        decode_tensors(blob + body)
    assert info.value.code == ErrorCode.TOO_LARGE


def test_truncated_and_trailing_bytes():
    good = encode_tensors({"a": np.arange(6, dtype=np.float32)})
    for cut in range(len(good)):
        with pytest.raises(ProtocolError):
            decode_tensors(good[:cut])
    with pytest.raises(ProtocolError, match="trailing"):
        decode_tensors(good + b"\0")
    assert encode_raw(np.float32(3.0))[:2] == b"\x01\x00"


def test_address_parsing():
    assert parse_address("unix:/tmp/a.sock") == ("unix", "/tmp/a.sock")
    assert parse_address("tcp:127.0.0.1:99") == ("tcp", ("127.0.0.1", 99))
    for bad in ["", "unix:", "tcp:host", "tcp::12", "udp:1.2.3.4:5", "tcp:h:port"]:
        with pytest.raises(ValueError, match="expected unix:"):
            parse_address(bad)


async def _socket_pair():
    server_links: asyncio.Queue = asyncio.Queue()
    done = asyncio.Event()

    async def on_link(link):
        await server_links.put(link)
        await done.wait()

    server = await asyncio.start_server(
        lambda r, w: on_link(SocketLink(r, w, "srv")), "127.0.0.1", 0
    )
    port = server.sockets[0].getsockname()[1]
    client = await connect_socket(f"tcp+insecure:127.0.0.1:{port}",  # a plain test server
                                  allow_insecure=True)
    srv = await server_links.get()
    return server, client, srv, done


def test_socket_frames_round_trip_and_reject_corruption():
    async def main():
        server, client, srv, done = await _socket_pair()
        payload = bytes(range(256)) * 100
        await client.send(Message(MsgType.REQUEST, 7, payload))
        got = await srv.receive()
        assert (got.type, got.request_id, got.payload) == (MsgType.REQUEST, 7, payload)
        # corrupt the CRC by writing a raw frame
        header = struct.pack("<2sBBII", b"CF", PROTOCOL_VERSION, 3, 9, 4)
        client._writer.write(header + b"abcd" + struct.pack("<I", zlib.crc32(b"x")))
        await client._writer.drain()
        with pytest.raises(ProtocolError) as info:
            await srv.receive()
        assert info.value.code == ErrorCode.BAD_CRC
        done.set()
        await client.close()
        server.close()

    asyncio.run(main())


def test_socket_rejects_oversized_and_bad_version():
    async def main():
        for header, code in [
            (struct.pack("<2sBBII", b"CF", PROTOCOL_VERSION, 3, 1, 2**31), ErrorCode.TOO_LARGE),
            (struct.pack("<2sBBII", b"CF", 9, 3, 1, 0), ErrorCode.BAD_VERSION),
            (struct.pack("<2sBBII", b"XX", PROTOCOL_VERSION, 3, 1, 0), ErrorCode.MALFORMED),
        ]:
            server, client, srv, done = await _socket_pair()
            client._writer.write(header)
            await client._writer.drain()
            with pytest.raises(ProtocolError) as info:
                await srv.receive()
            assert info.value.code == code
            done.set()
            await client.close()
            server.close()

    asyncio.run(main())


def test_rpc_timeout_cancels_and_link_close_fails_pending():
    async def main():
        a, b = InProcessLink.pair()
        received = []

        async def slow(msg):
            received.append(msg.type)
            await asyncio.sleep(10)

        server = asyncio.create_task(serve(b, slow))
        client = RpcClient(a)
        with pytest.raises(ProtocolError) as info:
            await client.request(MsgType.REQUEST, b"x", timeout=0.2)
        assert info.value.code == ErrorCode.TIMEOUT
        pending = asyncio.create_task(client.request(MsgType.STATUS, b"", timeout=5))
        await asyncio.sleep(0.05)
        await b.close()
        with pytest.raises(LinkClosed):
            await pending
        await client.close()
        server.cancel()
        assert received[0] == MsgType.REQUEST

    asyncio.run(main())


def test_cross_process_session_and_daemon(tmp_path):
    bundle = make_tiny_bundle(tmp_path / "tiny")
    sock = tmp_path / "hh.sock"
    x = np.random.default_rng(3).standard_normal((1, 16)).astype(np.float32)
    opts = fixed("c001", link=LinkOptions(transport=f"unix:{sock}"))
    with handheld_daemon(bundle.root, f"unix:{sock}"), Session(bundle.root, opts) as sess:
        info = sess.connect()
        assert info["bundle"] == bundle.identity
        for split in ("c000", "c001"):
            sess.set_split(split)
            (y,) = sess.run(None, {"x": x})
            np.testing.assert_allclose(y, reference(bundle, x), rtol=1e-5, atol=1e-6)
            assert sess.last_run is not None and sess.last_run.bytes_up > 0


def test_bundle_mismatch_is_refused(tmp_path):
    ours = make_tiny_bundle(tmp_path / "a", seed=0)
    theirs = make_tiny_bundle(tmp_path / "b", seed=1)
    sock = tmp_path / "hh.sock"
    with handheld_daemon(theirs.root, f"unix:{sock}"):
        sess = Session(ours.root, fixed("c001", link=LinkOptions(transport=f"unix:{sock}")))
        with pytest.raises(ProtocolError) as info:
            sess.run(None, {"x": np.ones((1, 16), np.float32)})
        assert info.value.code == ErrorCode.BUNDLE_MISMATCH
        sess.close()


def test_daemon_rejects_wrong_crossing_tensors(tmp_path):
    from coinf.ble_protocol.messages import PROTOCOL_VERSION, encode_json

    from tests.wire import tail_request

    bundle = make_tiny_bundle(tmp_path / "t")
    sock = tmp_path / "hh.sock"

    async def main():
        link = await connect_socket(f"unix:{sock}")
        client = RpcClient(link)
        hello = {"protocol": PROTOCOL_VERSION, "bundle": bundle.identity}
        await client.request(MsgType.HELLO, encode_json(hello), 5)
        bad = tail_request(bundle, "c001", encode_tensors({"h": np.ones((1, 7), np.float32)}))
        with pytest.raises(ProtocolError, match=r"expects float32\[1, 8\]") as info:
            await client.request(MsgType.REQUEST, bad, 5)
        assert info.value.code == ErrorCode.MALFORMED
        # more bytes than the candidate's crossing tensors take: refused before allocation
        big = tail_request(bundle, "c001", encode_tensors({"h": np.ones((1, 9), np.float32)}))
        with pytest.raises(ProtocolError) as info:
            await client.request(MsgType.REQUEST, big, 5)
        assert info.value.code == ErrorCode.TOO_LARGE
        unknown = tail_request(bundle, "c777", encode_tensors({}))
        with pytest.raises(ProtocolError) as info:
            await client.request(MsgType.REQUEST, unknown, 5)
        assert info.value.code == ErrorCode.UNKNOWN_CANDIDATE
        probe = await client.request(MsgType.PROBE, b"ping" * 10, 5)
        assert probe.payload == b"ping" * 10
        await client.close()

    with handheld_daemon(bundle.root, f"unix:{sock}"):
        asyncio.run(main())


class _AirWatch:
    """Stands in for ``asyncio`` in :mod:`coinf.ble_protocol.shaped`: records the airtime
    sleeps (and how many overlap) and the latency each delivery is scheduled after."""

    def __init__(self) -> None:
        self.airtimes: list[float] = []
        self.latencies: list[float] = []
        self.on_air = self.most_on_air = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, seconds: float) -> None:
        self.airtimes.append(seconds)
        self.on_air += 1
        self.most_on_air = max(self.most_on_air, self.on_air)
        try:
            await asyncio.sleep(seconds)
        finally:
            self.on_air -= 1

    def get_running_loop(self) -> Any:
        loop = asyncio.get_running_loop()

        def call_later(delay: float, *args: Any) -> Any:
            self.latencies.append(delay)
            return loop.call_later(delay, *args)

        return SimpleNamespace(call_later=call_later)


def test_shaped_link_delivers_in_order_no_faster_than_its_bandwidth(monkeypatch):
    from coinf.ble_protocol import shaped
    from coinf.ble_protocol.shaped import Channel, ShapedLink

    watch = _AirWatch()
    monkeypatch.setattr(shaped, "asyncio", watch)

    async def main():
        a, b = ShapedLink.pair(Channel(bandwidth_bps=100_000, latency_s=0.01, overhead_bytes=0))
        async def send(link: ShapedLink) -> None:
            for i in range(5):
                await link.send(Message(MsgType.REQUEST, i, bytes(2000)))

        # both ends send at once: they share the one medium
        sending = asyncio.gather(send(a), send(b))
        got_b = [await asyncio.wait_for(b.receive(), 10) for _ in range(5)]
        got_a = [await asyncio.wait_for(a.receive(), 10) for _ in range(5)]
        await sending
        assert [m.request_id for m in got_b] == [m.request_id for m in got_a] == list(range(5))
        # each message holds the air for its airtime, one at a time, then arrives after the
        # latency: never faster than the bandwidth
        assert watch.airtimes == [pytest.approx(2000 / 100_000)] * 10
        assert watch.most_on_air == 1
        assert watch.latencies == [pytest.approx(0.01)] * 10
        await a.close()
        with pytest.raises(LinkClosed):
            await b.receive()

    asyncio.run(main())


def test_session_over_shaped_channel(tmp_path):
    from coinf.ble_protocol.shaped import Channel

    bundle = make_tiny_bundle(tmp_path / "t")
    x = np.ones((1, 16), np.float32)
    opts = fixed("c000", link=LinkOptions(transport=Channel(50_000, 0.005)))
    with Session(bundle, opts) as sess:
        (y,) = sess.run(None, {"x": x})
        np.testing.assert_allclose(y, reference(bundle, x), rtol=1e-5, atol=1e-6)
        assert sess.last_run is not None
        # 64 B of tensor + headers at 50 kB/s plus 5 ms latency each way
        assert sess.last_run.transfer_ms + sess.last_run.return_ms >= 10.0


def test_nothing_is_lost_when_the_handheld_goes_away(tmp_path):
    bundle = make_tiny_bundle(tmp_path / "t")
    address = f"unix:{tmp_path / 'hh.sock'}"
    x = np.random.default_rng(9).standard_normal((1, 16)).astype(np.float32)
    ref = reference(bundle, x)
    sess = Session(bundle.root, fixed("c001", link=LinkOptions(transport=address, timeout=5,
                                                               max_backoff_s=0.5)))
    with handheld_daemon(bundle.root, address):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, rtol=1e-5, atol=1e-6)
        assert sess.last_run is not None and not sess.last_run.local
    # daemon gone: the inference completes on the wearable, and says so
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    assert sess.last_run is not None and sess.last_run.local
    assert "handheld unavailable" in (sess.last_run.fallback or "")
    assert sess.offline is not None
    # frames of a stream are not lost either
    results = list(sess.stream([{"x": x}] * 3))
    assert all(r.error is None and r.stats is not None and r.stats.local for r in results)
    # the handheld comes back: after the backoff the session offloads again
    with handheld_daemon(bundle.root, address):
        time.sleep(0.6)
        (y,) = sess.run(None, {"x": x})
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
        assert sess.last_run is not None and not sess.last_run.local
        assert sess.offline is None
    sess.close()
