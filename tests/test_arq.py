"""Issue 41, part 2: a lost or corrupted chunk costs a resend, not a timeout (SENT / ACK / NACK /
SYNC, ble_protocol/arq.py), both with GATT writes wired in memory and over the emulated radio's
fault injector. Every wait has a hang guard; nothing asserts how long anything took."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import pytest
from coinf.ble_protocol import arq
from coinf.ble_protocol.chunks import CHUNK_HEADER, Reassembler, encode_chunks
from coinf.ble_protocol.flow import CreditLedger
from coinf.ble_protocol.gatt import Ctrl, GattLink, parse_ctrl
from coinf.ble_protocol.messages import ErrorCode, Message, MsgType, ProtocolError

#: (direction "up" = wearable -> handheld, index of the data chunk in that direction) -> what
#: becomes of it: None drops it, else the bytes delivered instead
Fault = Callable[[str, int, bytes], bytes | None]


def wired(fault: Fault, *, ack: bool = True, window: int = 4, mtu: int = 60,
          ) -> tuple[GattLink, GattLink]:
    """(wearable, handheld) GattLinks whose GATT writes go straight to each other, every data
    chunk through ``fault``."""
    ends: dict[str, GattLink] = {}
    counts = {"up": 0, "down": 0}

    def make(role: str, peer: str, way: str) -> GattLink:
        async def write_data(chunk: bytes) -> None:
            i = counts[way]
            counts[way] += 1
            await asyncio.sleep(0)
            out = fault(way, i, chunk)
            if out is not None:
                ends[peer].feed_data(out)

        async def write_control(frame: bytes) -> None:
            await asyncio.sleep(0)
            ends[peer].feed_control(frame)

        async def disconnect() -> None:
            ends[peer].connection_lost("peer disconnected")

        return GattLink(role=role, mtu=mtu, peer_window=window, peer_max_message_bytes=1 << 20,
                        write_data=write_data, write_control=write_control,
                        disconnect=disconnect, window=window, max_message_bytes=1 << 20, ack=ack)

    ends["wearable"] = make("wearable", "handheld", "up")
    ends["handheld"] = make("handheld", "wearable", "down")
    return ends["wearable"], ends["handheld"]


def corrupt(chunk: bytes) -> bytes:
    return chunk[:-1] + bytes([chunk[-1] ^ 0x5A])


async def guarded(aw: object, what: str = "") -> object:
    return await asyncio.wait_for(aw, 10)  # type: ignore[arg-type]  # hang guard only


@pytest.mark.parametrize("kind", ["drop", "corrupt", "drop_last", "drop_only"])
def test_a_lost_or_corrupted_chunk_is_resent(kind: str) -> None:
    """Each direction loses one chunk of one message; both messages still arrive, intact, after
    exactly one NACK and one resend each. Without loss recovery they never arrive (the hang
    guard fires)."""
    payload = os.urandom(200)  # 5 chunks of 46 B at MTU 60
    n = len(list(encode_chunks(Message(MsgType.REQUEST, 1, payload), 57)))
    victim = {"drop": 2, "corrupt": 1, "drop_last": n - 1, "drop_only": 0}[kind]

    def fault(way: str, i: int, chunk: bytes) -> bytes | None:
        if i != victim:
            return chunk
        return corrupt(chunk) if kind == "corrupt" else None

    async def main() -> None:
        w, h = wired(fault, window=16)
        small = b"tiny" if kind == "drop_only" else payload  # a one-chunk message, all lost
        await w.send(Message(MsgType.REQUEST, 1, small))
        got = await guarded(h.receive())
        assert got == Message(MsgType.REQUEST, 1, small)
        await h.send(Message(MsgType.RESULT, 1, small))
        assert await guarded(w.receive()) == Message(MsgType.RESULT, 1, small)
        for sender, receiver in ((w, h), (h, w)):
            assert sender.arq.resends == 1 and receiver.arq.nacks == 1
            assert sender.arq.given_up == 0
        await w.close()
        await h.close()

    asyncio.run(main())


def test_lost_chunks_do_not_leak_credits() -> None:
    """A window of 4 and one chunk in three lost: a sender's credits would all leak away within
    a few messages; SENT's count gives them back (and a stalled sender's SYNC)."""

    def fault(way: str, i: int, chunk: bytes) -> bytes | None:
        return None if way == "up" and i % 3 == 1 else chunk

    async def main() -> None:
        w, h = wired(fault, window=4)
        for rid in range(1, 21):
            body = bytes([rid]) * 150
            await guarded(w.send(Message(MsgType.REQUEST, rid, body)))
            assert await guarded(h.receive()) == Message(MsgType.REQUEST, rid, body)
        assert w.arq.resends >= 20 and w.arq.given_up == 0
        await w.close()
        await h.close()

    asyncio.run(main())


def test_the_next_message_never_overtakes_a_sent_frame() -> None:
    """Control writes slower than data writes (a write with response waits for its answer):
    SENT still reaches the peer before the next message's chunks, so the credit sync it carries
    is exact and the sender never stalls for credits (no SYNC needed)."""

    async def main() -> None:
        w, h = wired(lambda way, i, c: c, window=4)
        fast = w._write_data

        async def slow_control(frame: bytes) -> None:
            await asyncio.sleep(0.005)
            h.feed_control(frame)

        w._write_control = slow_control  # type: ignore[method-assign]
        w._write_data = fast
        got: list[int] = []

        async def read() -> None:
            while len(got) < 30:
                got.append((await h.receive()).request_id)

        reader = asyncio.ensure_future(read())
        for rid in range(1, 31):
            await guarded(w.send(Message(MsgType.REQUEST, rid, bytes(120))))
        await guarded(reader)
        assert got == list(range(1, 31))
        assert w.arq.syncs == 0 and h._ledger.counted == w._chunks_sent
        await w.close()
        await h.close()

    asyncio.run(main())


def test_duplicates_cost_no_credit_and_a_message_lost_for_good_fails_fast() -> None:
    """Every chunk delivered twice: nothing is charged twice (the strict credit check would
    refuse the sender otherwise). A message whose chunks are always lost fails after MAX_RESENDS
    with a transient BAD_CRC for its request, not at a timeout."""

    def twice(way: str, i: int, chunk: bytes) -> bytes | None:
        return chunk

    async def main() -> None:
        w, h = wired(twice, window=2)
        original = h.feed_data

        def doubled(value: bytes) -> None:
            original(value)
            original(value)

        h.feed_data = doubled  # type: ignore[method-assign]
        for rid in range(1, 6):
            await guarded(w.send(Message(MsgType.REQUEST, rid, bytes(300))))
            assert (await guarded(h.receive())).request_id == rid
        assert h.is_open and h._ledger.outstanding >= 0
        await w.close()
        await h.close()

        w, h = wired(lambda way, i, c: None if way == "up" else c)
        await w.send(Message(MsgType.REQUEST, 9, b"never"))
        err = await guarded(w.receive())
        assert err.type == MsgType.ERROR and err.request_id == 9  # the local waiter is told
        assert w.arq.given_up == 1 and w.arq.resends == arq.MAX_RESENDS
        await w.close()
        await h.close()

    asyncio.run(main())


def test_without_the_ack_capability_nothing_changes() -> None:
    """A peer that did not announce "ack" gets no SENT frames, and a CRC failure is answered
    with an ERROR for that request, as before."""
    frames: list[bytes] = []

    async def main() -> None:
        w, h = wired(lambda way, i, c: corrupt(c) if way == "up" else c, ack=False)
        original = h.feed_control

        def spy(frame: bytes) -> None:
            frames.append(frame)
            original(frame)

        h.feed_control = spy  # type: ignore[method-assign]
        await w.send(Message(MsgType.REQUEST, 3, b"x" * 20))
        err = await guarded(w.receive())
        assert err.type == MsgType.ERROR and err.request_id == 3
        assert all(parse_ctrl(f)[0] in (Ctrl.CREDIT,) for f in frames)
        await w.close()
        await h.close()

    asyncio.run(main())


def test_loss_recovery_frames_without_ack_are_ignored() -> None:
    """SENT, ACK, NACK and SYNC on a link without "ack" on both sides are ignored (PROTOCOL.md
    §3), not a fatal MALFORMED: the link stays up and carries the next message."""

    async def main() -> None:
        w, h = wired(lambda way, i, c: c, ack=False)
        for frame in (bytes([Ctrl.SENT]) + arq.sent_body(3, 1, 5),
                      bytes([Ctrl.ACK]) + arq.ack_body(3, 1),
                      bytes([Ctrl.NACK]) + arq.nack_body(3, 1, []),
                      bytes([Ctrl.SYNC]) + (7).to_bytes(4, "little")):
            h.feed_control(frame)
        assert h.is_open
        await w.send(Message(MsgType.PROBE, 2, b"x"))
        got = await guarded(h.receive())
        assert got == Message(MsgType.PROBE, 2, b"x")
        await w.close()
        await h.close()

    asyncio.run(main())


def test_frames_and_ledger_sync() -> None:
    assert arq.parse_sent(arq.sent_body(3, 7, 2**32 + 5)) == (3, 7, 5)
    assert arq.parse_ack(arq.ack_body(4, 9)) == (4, 9)
    assert arq.parse_nack(arq.nack_body(3, 7, [(0, 10), (20, 30)])) == (3, 7, [(0, 10), (20, 30)])
    assert arq.parse_nack(arq.nack_body(3, 7, [])) == (3, 7, [])
    for bad in (b"", bytes(5), arq.ack_body(3, 7) + b"\x01" + bytes(7),
                arq.ack_body(3, 7) + b"\x01" + bytes(8)):  # truncated; a range with start >= end
        with pytest.raises(ProtocolError) as info:
            arq.parse_nack(bad)
        assert info.value.code == ErrorCode.MALFORMED
    ledger = CreditLedger(window=8, batch=4)
    for _ in range(3):
        ledger.on_chunk()
    assert ledger.sync(5) == 2  # two chunks were lost: their credits are owed back
    assert ledger.take_grant() == 5 and ledger.outstanding == 8
    assert ledger.sync(4) == 0  # an older count is ignored
    ledger.on_chunk()
    ledger.on_chunk()
    assert ledger.sync(7) == 0  # counts agree
    ledger.on_chunk()  # a chunk the last sync already counted (it was overtaken): charged twice
    ledger.on_chunk()  # the sender's 8th
    assert ledger.sync(8) == -1  # ... until the next sync takes the extra charge back
    assert ledger.owed == 3 and ledger.outstanding == 5


def test_reassembler_status_and_ranged_resend() -> None:
    msg = Message(MsgType.REQUEST, 5, bytes(range(100)))
    chunks = list(encode_chunks(msg, 30))  # 16 data bytes each, body 104 B
    r = Reassembler(remember_failed=False)
    assert r.status(3, 5) == []  # nothing held: resend it all
    for i, c in enumerate(chunks):
        if i not in (1, 4):
            r.feed(c)
    missing = r.status(3, 5)
    assert missing == [(16, 32), (64, 80)]
    again = list(encode_chunks(msg, 30, ranges=missing))
    assert [CHUNK_HEADER.unpack_from(c)[4] for c in again] == [16, 64]
    assert r.feed(again[0]) is None and r.feed(again[1]) == msg
    assert r.status(3, 5) is None  # complete
    bad = list(encode_chunks(Message(MsgType.REQUEST, 6, bytes(10)), 30))
    with pytest.raises(ProtocolError):
        r.feed(corrupt(bad[0]))
    assert r.status(3, 6) == []  # a CRC failure is not remembered: the resend is accepted
    assert r.feed(bad[0]) is not None


def test_a_faulty_radio_delivers_every_message_intact() -> None:
    """The emulated radio drops, duplicates, corrupts and reorders 3 % of the data chunks each
    (both ways); messages of up to 13 chunks still arrive byte-exact, with resends. (Before the
    injector matched protocol-2 chunks, no fault was injected and no resend happened.)"""
    from coinf.ble_protocol.radio import EmulatedRadio

    from tests.test_ble_link import connect_both, endpoints

    async def main() -> None:
        faults = {f"fault_{k}": 0.03 for k in ("drop", "duplicate", "corrupt", "reorder")}
        async with EmulatedRadio("ble5-2m", time_scale=0.2, **faults) as radio, \
                endpoints(radio) as (server, central):
            wl, hl = await connect_both(server, central)
            assert isinstance(wl, GattLink) and isinstance(hl, GattLink) and wl.ack
            for rid in range(1, 41):
                data = os.urandom(150 * rid)
                await guarded(wl.send(Message(MsgType.REQUEST, rid, data)))
                assert await guarded(hl.receive()) == Message(MsgType.REQUEST, rid, data)
                await guarded(hl.send(Message(MsgType.RESULT, rid, data[::-1])))
                assert await guarded(wl.receive()) == Message(MsgType.RESULT, rid, data[::-1])
            counts = radio.link.faults.counts
            assert min(counts.values()) > 0, counts
            assert wl.arq.resends > 0 and hl.arq.resends > 0
            assert wl.arq.given_up == hl.arq.given_up == 0

    asyncio.run(asyncio.wait_for(main(), 120))
