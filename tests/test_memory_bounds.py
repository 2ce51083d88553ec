"""The wearable's memory is bounded by what it expects (issue 41, part 4; docs/PROTOCOL.md §6.13).

Every request registers the largest reply that can be valid for it; a reply declaring more is
refused from its header (socket frame header, BLE chunk header) before anything is reassembled
or allocated, and the request fails with a transient PeerResultError, so a Session finishes the
inference locally. Measured with a daemon-like peer in another process answering a 60 MiB
RESULT: the wearable's peak allocation stays well under 1 MiB (it was ~186 MiB).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from coinf.ble_protocol.gatt import GattLink
from coinf.ble_protocol.loopback import InProcessLink, connect_socket, serve_socket
from coinf.ble_protocol.messages import (
    MAX_CONTROL_BYTES,
    MAX_PROFILE_BYTES,
    Message,
    MsgType,
    ProtocolError,
    reply_bound,
    result_bound,
)
from coinf.ble_protocol.rpc import RpcClient, serve
from coinf.ble_protocol.tensors import encode_tensors
from coinf.wearable.frame import result_bound as bundle_result_bound

from coinf.cli.bench.hostile import PEER  # the bench's hostile peer: one copy
from coinf.errors import PeerResultError
from tests.bundles import fixed, make_tiny_bundle
from tests.test_ble_gatt_link import wired
from tests.wire import result_payload

MIB = 1 << 20


# -- the bounds ---------------------------------------------------------------------------------
def test_the_result_bound_is_the_largest_valid_result(tmp_path: Path) -> None:
    bundle = make_tiny_bundle(tmp_path / "tiny")
    outputs = {t.name: np.ones(t.shape, np.dtype(t.dtype)) for t in bundle.outputs}
    largest = result_payload(0xFFFFFFFF, encode_tensors(outputs))  # every output RAW
    assert bundle_result_bound(bundle) == len(largest) == 53  # 4 B nonce, 13 B hop record
    two = {"a": np.zeros((2, 3), np.float32), "bé": np.zeros(5, np.int64)}
    assert result_bound((n, a.ndim, a.nbytes) for n, a in two.items()) == len(
        result_payload(1, encode_tensors(two)))


def test_reply_bounds_per_request_kind() -> None:
    from coinf.device.profile import MAX_PROFILE_BYTES as PROFILE_CAP

    assert MAX_PROFILE_BYTES == PROFILE_CAP
    assert reply_bound(MsgType.HELLO, 300) == reply_bound(MsgType.STATUS, 0) == MAX_CONTROL_BYTES
    assert reply_bound(MsgType.PROFILE, 0) == MAX_PROFILE_BYTES
    assert reply_bound(MsgType.PROBE, 2048) == 2048  # an echo
    assert reply_bound(MsgType.REQUEST, 10) is None  # the caller's: from the model's outputs


# -- RpcClient: the link's cap follows what is expected --------------------------------------
def test_a_link_without_per_message_limits_is_capped_at_the_largest_expected_reply() -> None:
    async def main() -> None:
        wearable, handheld = InProcessLink.pair(depth=8)
        client = RpcClient(wearable)
        assert wearable.max_message_bytes == MAX_CONTROL_BYTES  # idle: ERROR/STATUS-sized
        gate = asyncio.Event()

        async def handler(msg: Message) -> Message:
            await gate.wait()
            if msg.type == MsgType.PROBE:
                return Message(MsgType.PROBE, msg.request_id, msg.payload)
            return Message(MsgType.RESULT, msg.request_id, bytes(int(msg.payload)))

        server = asyncio.ensure_future(serve(handheld, handler, max_concurrent=4))
        probe = asyncio.ensure_future(client.request(MsgType.PROBE, bytes(9000), 5))
        big = asyncio.ensure_future(client.request(MsgType.REQUEST, b"20000", 5,
                                                   max_reply=20000))
        await asyncio.sleep(0.05)
        assert wearable.max_message_bytes == 20000  # the largest of the pending bounds
        gate.set()
        assert len((await probe).payload) == 9000 and len((await big).payload) == 20000
        assert wearable.max_message_bytes == MAX_CONTROL_BYTES
        # a reply over its bound: refused (in-process messages are whole: checked on arrival)
        with pytest.raises(PeerResultError, match="no valid reply to it exceeds 100 B") as info:
            await client.request(MsgType.REQUEST, b"101", 5, max_reply=100)
        assert info.value.transient
        assert len((await client.request(MsgType.REQUEST, b"100", 5, max_reply=100)).payload
                   ) == 100  # the link is still fine
        await client.close()
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)

    asyncio.run(main())


def test_a_late_reply_to_an_abandoned_request_is_still_accepted(tmp_path: Path) -> None:
    """A request that timed out keeps its bound until its reply comes: a socket link capped at
    what is expected must not drop the connection for a late (valid) RESULT."""

    async def main() -> None:
        async def slow_peer(link: Any) -> None:  # answers every request 0.3 s late, CANCEL or not
            while True:
                msg = await link.receive()
                if msg.type == MsgType.REQUEST:
                    await asyncio.sleep(0.3)
                    await link.send(Message(MsgType.RESULT, msg.request_id, bytes(50_000)))

        address = f"unix:{tmp_path / 's.sock'}"
        server = await serve_socket(address, slow_peer)
        link = await connect_socket(address)
        client = RpcClient(link)
        late: list[Message] = []
        client.on_unsolicited = late.append
        with pytest.raises(ProtocolError, match="no reply"):
            await client.request(MsgType.REQUEST, b"", 0.1, max_reply=50_000)
        assert link.max_message_bytes == 50_000  # still expected
        for _ in range(100):
            if late:
                break
            await asyncio.sleep(0.01)
        assert [len(m.payload) for m in late] == [50_000] and link.is_open
        assert link.max_message_bytes == MAX_CONTROL_BYTES
        reply = await client.request(MsgType.REQUEST, b"", 5, max_reply=50_000)
        assert len(reply.payload) == 50_000
        await client.close()
        server.close()

    asyncio.run(main())


# -- a Session against a hostile daemon-like peer in another process -------------------------


def test_a_60_mib_result_costs_the_wearable_almost_nothing(tmp_path: Path) -> None:
    from coinf import LinkOptions, Session

    bundle = make_tiny_bundle(tmp_path / "tiny")
    sock = tmp_path / "h.sock"
    peer = subprocess.Popen([sys.executable, "-c", PEER, str(bundle.root), str(sock), "60"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert peer.stdout is not None and peer.stdout.readline().strip() == "serving"
        x = np.ones((1, 16), np.float32)
        opts = fixed("c001", link=LinkOptions(transport=f"unix:{sock}", timeout=30))
        with Session(bundle.root, opts) as s:
            s.connect()
            tracemalloc.start()
            try:
                (y,) = s.run(None, {"x": x})
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert s.last_run is not None and s.last_run.local
            assert "no valid reply" in (s.last_run.fallback or "") or \
                "more than this client accepts" in (s.last_run.fallback or "")
        with Session(bundle.root, fixed("wearable-only")) as ref:  # in-process
            np.testing.assert_array_equal(y, ref.run(None, {"x": x})[0])
        assert peak < 1 * MIB, f"peak {peak / MIB:.1f} MiB"  # was ~186 MiB before the bound
    finally:
        peer.terminate()
        peer.wait(10)


# -- the BLE link: refused from the first chunk's header, the link stays up ----------------------
def _wired(mtu: int = 517, window: int = 128) -> tuple[GattLink, GattLink]:
    w, h, _ = wired(window, mtu, max_message_bytes=64 * MIB)
    return w, h


def test_the_ble_link_refuses_an_oversized_reply_from_its_first_chunk() -> None:
    huge = result_payload(1, encode_tensors({"y": np.zeros(4 * MIB // 4, np.float32)}))

    async def main() -> None:
        w, h = _wired()
        sizes = iter([len(huge), 40])

        async def handler(msg: Message) -> Message:
            n = next(sizes)
            return Message(MsgType.RESULT, msg.request_id, huge if n > 40 else bytes(40))

        server = asyncio.ensure_future(serve(h, handler))
        client = RpcClient(w)
        assert w.max_message_bytes == 64 * MIB  # per-message limits instead of one cap
        tracemalloc.start()
        try:
            with pytest.raises(PeerResultError, match="no valid reply to it exceeds 40 B"):
                await client.request(MsgType.REQUEST, b"\x00\x00", 30, max_reply=40)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < MIB // 4, f"peak {peak / MIB:.2f} MiB"
        assert w._reasm.pending == 0 and w.is_open
        # the rest of the refused message is dropped as it arrives; the link carries on
        reply = await client.request(MsgType.REQUEST, b"\x00\x00", 60, max_reply=40)
        assert reply.payload == bytes(40) and w._reasm.buffered_bytes == 0
        await client.close()
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
        await h.close()

    asyncio.run(main())
