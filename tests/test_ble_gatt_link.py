"""GattLink logic (credits, per-message and fatal errors, handshake checks) with the two ends'
GATT writes wired straight to each other; the BLE stack itself is covered in test_ble_link."""

from __future__ import annotations

import asyncio
import struct

import pytest
from coinf.ble_protocol.chunks import CHUNK_HEADER, encode_chunks
from coinf.ble_protocol.gatt import (
    Ctrl,
    GattLink,
    check_hello,
    ctrl_abort,
    ctrl_credit,
    make_hello,
    parse_ctrl,
)
from coinf.ble_protocol.link import LinkClosed
from coinf.ble_protocol.messages import (
    PROTOCOL_VERSION,
    ErrorCode,
    Message,
    MsgType,
    ProtocolError,
    decode_error,
)


def wired(window: int = 4, mtu: int = 60,
          max_message_bytes: int = 10_000) -> tuple[GattLink, GattLink, list[bytes]]:
    """(wearable, handheld, log of data chunks the wearable sent): two GattLinks wired to
    each other in memory."""
    ends: dict[str, GattLink] = {}
    sent: list[bytes] = []

    def make(role: str, peer: str) -> GattLink:
        async def write_data(chunk: bytes) -> None:
            if role == "wearable":
                sent.append(chunk)
            await asyncio.sleep(0)
            ends[peer].feed_data(chunk)

        async def write_control(frame: bytes) -> None:
            await asyncio.sleep(0)
            ends[peer].feed_control(frame)

        async def disconnect() -> None:
            ends[peer].connection_lost("peer disconnected")

        return GattLink(
            role=role,
            mtu=mtu,
            peer_window=window,
            peer_max_message_bytes=max_message_bytes,
            write_data=write_data,
            write_control=write_control,
            disconnect=disconnect,
            window=window,
            max_message_bytes=max_message_bytes,
        )

    ends["wearable"] = make("wearable", "handheld")
    ends["handheld"] = make("handheld", "wearable")
    return ends["wearable"], ends["handheld"], sent


def test_credits_bound_in_flight_chunks_until_the_reader_reads() -> None:
    async def main() -> None:
        w, h, sent = wired(window=4)
        h.inbox_cap = 1  # any unread message withholds credits
        await w.send(Message(MsgType.REQUEST, 1, b"a" * 30))  # 1 chunk
        big = asyncio.ensure_future(w.send(Message(MsgType.REQUEST, 2, b"b" * 1000)))
        await asyncio.sleep(0.05)
        assert not big.done()  # blocked on credits: the handheld has not read message 1
        assert len(sent) == 4  # exactly the window, nothing more on the air
        assert (await h.receive()).payload == b"a" * 30
        await asyncio.wait_for(big, 2)
        assert (await h.receive()).payload == b"b" * 1000
        await w.close()

    asyncio.run(main())


def test_bad_message_is_reported_per_request_and_link_survives() -> None:
    async def main() -> None:
        w, h, _ = wired(window=16)
        chunks = list(encode_chunks(Message(MsgType.REQUEST, 7, b"x" * 100), 60))
        bad = bytearray(chunks[-1])
        bad[-1] ^= 1
        for c in [*chunks[:-1], bytes(bad)]:  # the handheld receives a corrupt REQUEST 7
            h.feed_data(c)
        err = await asyncio.wait_for(w.receive(), 2)  # ...and answers ERROR(BAD_CRC) for id 7
        assert err.type == MsgType.ERROR and err.request_id == 7
        assert decode_error(err.payload).code == ErrorCode.BAD_CRC
        await w.send(Message(MsgType.REQUEST, 8, b"fine"))
        assert (await h.receive()).payload == b"fine"
        # too large for the receiver: rejected from the first chunk's header
        h.feed_data(CHUNK_HEADER.pack(PROTOCOL_VERSION, int(MsgType.REQUEST), 9, 10**9, 0) + b"z")
        err = await asyncio.wait_for(w.receive(), 2)
        assert decode_error(err.payload).code == ErrorCode.TOO_LARGE
        # ABORT drops a partial message
        h.feed_data(chunks[0])
        h.feed_control(ctrl_abort(int(MsgType.REQUEST), 7))
        assert h._reasm.pending == 0
        await w.close()

    asyncio.run(main())


def test_fatal_errors_close_both_ends() -> None:
    async def main() -> None:
        w, h, _ = wired()
        h.feed_data(b"\x09" + bytes(20))  # protocol version 9
        with pytest.raises(ProtocolError) as info:
            await h.receive()
        assert info.value.code == ErrorCode.BAD_VERSION
        with pytest.raises(ProtocolError) as winfo:  # the wearable got the ERROR frame
            await asyncio.wait_for(w.receive(), 2)
        assert winfo.value.code == ErrorCode.BAD_VERSION
        with pytest.raises(ProtocolError):
            await w.send(Message(MsgType.PROBE, 1, b""))

        w2, h2, _ = wired()
        h2.connection_lost("radio gone")
        with pytest.raises(LinkClosed):
            await h2.receive()
        with pytest.raises(LinkClosed):
            await h2.send(Message(MsgType.PROBE, 1, b""))
        await w2.close()

    asyncio.run(main())


def test_control_frames_and_handshake_checks() -> None:
    assert parse_ctrl(ctrl_credit(5)) == (Ctrl.CREDIT, 5)
    for frame, code in [
        (b"", ErrorCode.TRUNCATED),
        (b"\x63", ErrorCode.UNKNOWN_TYPE),
        (b"\x03\x01", ErrorCode.MALFORMED),
        (b"\x01not json", ErrorCode.MALFORMED),
        (b"\x05" + struct.pack("<B", 1), ErrorCode.MALFORMED),
    ]:
        with pytest.raises(ProtocolError) as info:
            parse_ctrl(frame)
        assert info.value.code == code
    hello = make_hello("bundle-1", 247, window=32)
    assert check_hello(hello, "bundle-1") == (247, 32, 64 * 1024 * 1024)
    for changed, code in [
        ({"protocol": PROTOCOL_VERSION + 1}, ErrorCode.BAD_VERSION),
        ({"bundle": "other"}, ErrorCode.BUNDLE_MISMATCH),
        ({"mtu": 5}, ErrorCode.MALFORMED),
        ({"capabilities": {"window": 0, "max_message_bytes": 1}}, ErrorCode.MALFORMED),
    ]:
        with pytest.raises(ProtocolError) as info:
            check_hello({**hello, **changed}, "bundle-1")
        assert info.value.code == code
