"""Control frames over the full BLE stack (emulated radio): a PONG never waits behind the
handheld's window of data chunks. Assertions are on the order of arrivals, not on time."""

from __future__ import annotations

import asyncio
import os

from coinf.ble_protocol.ctrl_frames import ctrl_ping
from coinf.ble_protocol.gatt import GattLink
from coinf.ble_protocol.messages import Message, MsgType

from tests.test_ble_link import radio_pair

NONCE = 0xC0F1


def test_a_pong_overtakes_the_handhelds_queued_data() -> None:
    """The handheld sends a message of several windows; once its chunks flow, the wearable
    PINGs. The PONG must reach the wearable after at most a few more data chunks: the handheld
    keeps its stack's queue short, so a control frame never waits behind a window (128 chunks,
    about 3 s at the Pi's 20 kB/s) of data already handed to it."""

    async def main() -> None:
        async with radio_pair("pi-zero-2w", time_scale=0.5) as (_radio, wl, hl):
            assert isinstance(wl, GattLink) and isinstance(hl, GattLink)
            seen = {"data": 0, "ping_at": -1, "pong_at": -1}
            feed_data, feed_control = wl.feed_data, wl.feed_control
            pinged = asyncio.Event()

            def on_data(value: bytes) -> None:
                seen["data"] += 1
                if seen["data"] == 40 and seen["ping_at"] < 0:
                    seen["ping_at"] = seen["data"]
                    wl._queue_control(ctrl_ping(NONCE))
                feed_data(value)

            def on_control(value: bytes) -> None:
                if value == ctrl_ping(NONCE, pong=True) and seen["pong_at"] < 0:
                    seen["pong_at"] = seen["data"]
                    pinged.set()
                feed_control(value)

            wl.feed_data, wl.feed_control = on_data, on_control  # type: ignore[method-assign]
            payload = os.urandom(200_000)  # ~400 chunks: three windows and more
            send = asyncio.ensure_future(hl.send(Message(MsgType.PROBE, 7, payload)))
            got = await asyncio.wait_for(wl.receive(), 120)  # hang guard only
            await send
            assert got.payload == payload and pinged.is_set()
            late = seen["pong_at"] - seen["ping_at"]
            assert 0 <= late <= 32, seen  # a batch of chunks at most, never a window (128)

    asyncio.run(main())


def _pair(h_max: int) -> dict[str, GattLink]:
    """A wearable and a handheld GattLink wired back to back (the chunk layer of a BLE link)."""
    ends: dict[str, GattLink] = {}

    def make(role: str, peer: str, max_bytes: int) -> GattLink:
        async def control(frame: bytes) -> None:
            ends[peer].feed_control(frame)

        async def data(chunk: bytes) -> None:
            ends[peer].feed_data(chunk)

        async def disconnect() -> None:
            ends[peer].connection_lost("gone")

        return GattLink(role=role, mtu=100, peer_window=128, peer_max_message_bytes=1 << 20,
                        write_data=data, write_control=control, disconnect=disconnect,
                        max_message_bytes=max_bytes)

    ends["w"], ends["h"] = make("wearable", "h", 1 << 20), make("handheld", "w", h_max)
    return ends


async def _replies_until_marker(w: GattLink, h: GattLink) -> list[Message]:
    """Everything the handheld sent the wearable before a PROBE marker sent after it."""
    for _ in range(20):  # let the handheld's spawned replies queue for its send lock first
        await asyncio.sleep(0)
    await h.send(Message(MsgType.PROBE, 999, b"marker"))
    got = []
    while True:
        msg = await asyncio.wait_for(w.receive(), 10)  # hang guard only
        if msg.request_id == 999:
            return got
        got.append(msg)


def test_one_error_per_refused_message_not_per_chunk() -> None:
    """An oversized message, one with a chunk outside its body and one of an unknown type each
    draw exactly one ERROR; their other chunks are dropped silently (and still return their
    credits), and the partial message with a bad chunk never completes."""
    from coinf.ble_protocol.chunks import CHUNK_HEADER, encode_chunks
    from coinf.ble_protocol.messages import ErrorCode, decode_error

    async def main() -> None:
        ends = _pair(h_max=1000)
        w, h = ends["w"], ends["h"]
        big = list(encode_chunks(Message(MsgType.REQUEST, 5, os.urandom(5000)), w.chunk_size))
        assert len(big) > 50
        for chunk in big:
            h.feed_data(chunk)
        good = list(encode_chunks(Message(MsgType.REQUEST, 6, os.urandom(500)), w.chunk_size))
        stray = CHUNK_HEADER.pack(2, int(MsgType.REQUEST), 6, 500, 600) + b"x"  # past the body
        for chunk in [good[0], stray, *good[1:]]:
            h.feed_data(chunk)
        for offset in (0, 80, 160):
            h.feed_data(CHUNK_HEADER.pack(2, 42, 7, 240, offset) + bytes(80))
        replies = await _replies_until_marker(w, h)
        # each ERROR sent costs chunks and credits, even if the wearable ignores repeats
        assert h.stats.messages_sent == 3 + 1  # + the marker
        assert h._inbox.empty()  # message 6 was refused: its later chunks complete nothing
        print([(m.type, m.request_id) for m in replies], h._reasm.pending)
        assert [(m.type, m.request_id) for m in replies] == [
            (MsgType.ERROR, 5), (MsgType.ERROR, 6), (MsgType.ERROR, 7)]
        codes = [decode_error(m.payload).code for m in replies]
        assert codes == [ErrorCode.TOO_LARGE, ErrorCode.MALFORMED, ErrorCode.UNKNOWN_TYPE]
        assert h._reasm.pending == 0  # nothing of the refused messages is held
        assert h._ledger.outstanding + h._ledger.owed == h._ledger.window  # credits returned
        await h.send(Message(MsgType.PROBE, 8, b"still up"))
        assert (await asyncio.wait_for(w.receive(), 10)).payload == b"still up"
        for end in ends.values():
            await end.close()

    asyncio.run(main())
