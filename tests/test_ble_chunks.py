"""Chunk codec and credit flow control: round trips and every malformed input."""

from __future__ import annotations

import asyncio
import random
import struct

import pytest
from coinf.ble_protocol.chunks import (
    CHUNK_HEADER,
    HEADER_BYTES,
    Reassembler,
    chunk_count,
    chunk_size_for_mtu,
    encode_chunks,
)
from coinf.ble_protocol.flow import CreditGate, CreditLedger
from coinf.ble_protocol.link import LinkClosed
from coinf.ble_protocol.messages import (
    PROTOCOL_VERSION,
    ErrorCode,
    Message,
    MsgType,
    ProtocolError,
)
from hypothesis import given, settings
from hypothesis import strategies as st

types = st.sampled_from(list(MsgType))


def feed_all(r: Reassembler, chunks: list[bytes]) -> list[Message]:
    out = []
    for c in chunks:
        m = r.feed(c)
        if m is not None:
            out.append(m)
    return out


@settings(max_examples=60, deadline=None)
@given(
    payload=st.binary(max_size=3000),
    mtype=types,
    rid=st.integers(0, 0xFFFFFFFF),
    size=st.integers(HEADER_BYTES + 1, 512),
    seed=st.integers(0, 1000),
)
def test_round_trip_with_reorder_and_duplicates(payload, mtype, rid, size, seed):
    msg = Message(mtype, rid, payload)
    chunks = list(encode_chunks(msg, size))
    assert all(len(c) <= size for c in chunks)
    assert len(chunks) == chunk_count(len(payload), size)
    rng = random.Random(seed)
    shuffled = chunks + rng.sample(chunks, k=min(3, len(chunks)))  # duplicates
    rng.shuffle(shuffled)
    # the last arrival must be new for the message to complete exactly once
    r = Reassembler(max_message_bytes=4096)
    got = feed_all(r, shuffled)
    assert got == [msg]
    assert r.buffered_bytes == 0
    # late duplicates after completion are ignored, not re-opened
    assert r.feed(chunks[0]) is None and r.pending == 0


@settings(max_examples=80, deadline=None)
@given(garbage=st.binary(max_size=600))
def test_garbage_never_crashes_and_memory_is_bounded(garbage):
    r = Reassembler(max_message_bytes=10_000, budget_bytes=20_000)
    try:
        r.feed(garbage)
    except ProtocolError as exc:
        assert exc.code in {
            ErrorCode.TRUNCATED,
            ErrorCode.BAD_VERSION,
            ErrorCode.UNKNOWN_TYPE,
            ErrorCode.TOO_LARGE,
            ErrorCode.MALFORMED,
            ErrorCode.BUSY,
            ErrorCode.BAD_CRC,
        }
    assert r.buffered_bytes <= 20_000


def _chunk(version=PROTOCOL_VERSION, mtype=3, rid=1, total=10, offset=0, data=b"x") -> bytes:
    return CHUNK_HEADER.pack(version, mtype, rid, total, offset) + data


@pytest.mark.parametrize(
    ("chunk", "code"),
    [
        (b"\x01\x03\x00", ErrorCode.TRUNCATED),
        (_chunk(version=9), ErrorCode.BAD_VERSION),
        (_chunk(mtype=99), ErrorCode.UNKNOWN_TYPE),
        (_chunk(total=2**31), ErrorCode.TOO_LARGE),
        (_chunk(offset=14, data=b"x"), ErrorCode.MALFORMED),  # beyond body of 14 B
        (_chunk(data=b""), ErrorCode.MALFORMED),
    ],
)
def test_malformed_chunk_codes(chunk, code):
    r = Reassembler(max_message_bytes=1 << 20)
    with pytest.raises(ProtocolError) as info:
        r.feed(chunk)
    assert info.value.code == code
    assert r.buffered_bytes == 0  # nothing allocated for rejected chunks


def test_oversized_rejected_before_allocation():
    r = Reassembler(max_message_bytes=1000, budget_bytes=1500)
    with pytest.raises(ProtocolError) as info:
        r.feed(_chunk(total=1001))
    assert info.value.code == ErrorCode.TOO_LARGE
    r.feed(_chunk(rid=1, total=900))
    with pytest.raises(ProtocolError) as info:
        r.feed(_chunk(rid=2, total=900))  # would exceed the 1500 B budget
    assert info.value.code == ErrorCode.BUSY
    assert r.reserved_bytes == 904  # the budget counts declared sizes ...
    assert r.buffered_bytes < 100  # ... but only the bytes that arrived are held


def test_a_small_chunk_declaring_a_huge_message_holds_only_its_bytes():
    r = Reassembler(max_message_bytes=64 * 1024 * 1024)
    chunk = _chunk(rid=3, total=64 * 1024 * 1024 - 8)
    r.feed(chunk)
    assert r.pending == 1
    assert r.buffered_bytes <= len(chunk)


def test_bad_crc_and_inconsistent_length():
    msg = Message(MsgType.REQUEST, 7, b"hello world" * 10)
    chunks = list(encode_chunks(msg, 40))
    bad = bytearray(chunks[1])
    bad[-1] ^= 0xFF
    r = Reassembler()
    with pytest.raises(ProtocolError) as info:
        feed_all(r, [chunks[0], bytes(bad), *chunks[2:]])
    assert info.value.code == ErrorCode.BAD_CRC
    assert info.value.request_id == 7
    r2 = Reassembler()
    r2.feed(chunks[0])
    version, mtype, rid, total, offset = CHUNK_HEADER.unpack_from(chunks[1])
    liar = CHUNK_HEADER.pack(version, mtype, rid, total + 1, offset) + chunks[1][HEADER_BYTES:]
    with pytest.raises(ProtocolError) as info:
        r2.feed(liar)
    assert info.value.code == ErrorCode.MALFORMED
    assert r2.buffered_bytes == 0


def test_timeout_and_cancel_free_memory():
    now = [0.0]
    r = Reassembler(timeout_s=5.0, clock=lambda: now[0])
    chunks = list(encode_chunks(Message(MsgType.RESULT, 3, bytes(1000)), 100))
    r.feed(chunks[0])
    chunks2 = list(encode_chunks(Message(MsgType.REQUEST, 4, bytes(1000)), 100))
    r.feed(chunks2[0])
    assert r.cancel(4) == 1
    now[0] = 6.0
    assert r.expire() == [3]
    assert r.buffered_bytes == 0 and r.pending == 0


def test_too_many_concurrent_messages():
    r = Reassembler(max_partial=2)
    r.feed(_chunk(rid=1))
    r.feed(_chunk(rid=2))
    with pytest.raises(ProtocolError) as info:
        r.feed(_chunk(rid=3))
    assert info.value.code == ErrorCode.BUSY


def test_chunk_size_for_mtu():
    assert chunk_size_for_mtu(23) == 20
    assert chunk_size_for_mtu(247) == 244
    assert chunk_size_for_mtu(517) == 512
    with pytest.raises(ValueError):
        chunk_size_for_mtu(22)
    with pytest.raises(ValueError):
        list(encode_chunks(Message(MsgType.PROBE, 1, b"x"), 513))


def test_credit_gate_blocks_and_ledger_batches():
    async def main() -> None:
        gate = CreditGate(2)
        await gate.acquire()
        await gate.acquire()
        waiter = asyncio.ensure_future(gate.acquire())
        await asyncio.sleep(0)
        assert not waiter.done()  # no credit: the sender waits
        gate.grant(1)
        await asyncio.wait_for(waiter, 1)
        blocked = asyncio.ensure_future(gate.acquire())
        await asyncio.sleep(0)
        gate.close(LinkClosed("gone"))
        with pytest.raises(LinkClosed):
            await blocked

    asyncio.run(main())
    ledger = CreditLedger(window=8, batch=4)
    for _ in range(3):
        ledger.on_chunk()
    assert ledger.take_grant() == 0
    ledger.on_chunk()
    assert ledger.take_grant(allowed=False) == 0
    assert ledger.take_grant() == 4
    for _ in range(8):
        ledger.on_chunk()
    with pytest.raises(ProtocolError):
        ledger.on_chunk()  # a 9th chunk without credit
    assert struct.calcsize("<BBIII") == HEADER_BYTES
