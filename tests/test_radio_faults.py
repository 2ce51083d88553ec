"""The emulated radio's chunk fault injector: what it does to coinf data chunks, and that a
link over a faulty radio still never delivers a wrong message (CRC) and recovers."""

from __future__ import annotations

import struct

import pytest
from coinf.ble_protocol.chunks import CHUNK_HEADER
from coinf.ble_protocol.messages import PROTOCOL_VERSION
from coinf.ble_protocol.radio.model import ChunkFaults
from coinf.ble_protocol.radio.params import RadioError, preset


def att_pdu(value: bytes, opcode: int = 0x1B) -> bytes:
    body = bytes([opcode]) + struct.pack("<H", 0x0010) + value
    return struct.pack("<HH", len(body), 0x0004) + body


CHUNK = att_pdu(CHUNK_HEADER.pack(PROTOCOL_VERSION, 3, 7, 100, 0) + bytes(range(60)))
CONTROL = att_pdu(bytes([3, 1, 0]))  # a CREDIT control frame: never touched


def faults(**rates: float) -> ChunkFaults:
    return ChunkFaults(preset("ble5-2m", **rates))


def test_a_clean_radio_passes_everything():
    f = faults()
    assert f.apply((1, 2), CHUNK) == [CHUNK] and f.apply((1, 2), CONTROL) == [CONTROL]


@pytest.mark.parametrize(("kind", "check"), [
    ("fault_drop", lambda out: out == []),
    ("fault_duplicate", lambda out: out == [CHUNK, CHUNK]),
    ("fault_corrupt", lambda out: len(out) == 1 and out[0] != CHUNK and len(out[0]) == len(CHUNK)
     and out[0][:7 + 14] == CHUNK[:7 + 14]),  # the header stays: the CRC must catch it
])
def test_each_fault_on_chunks_only(kind, check):
    f = faults(**{kind: 1.0})
    assert check(f.apply((1, 2), CHUNK))
    assert f.apply((1, 2), CONTROL) == [CONTROL]


def test_reorder_lets_the_next_chunk_overtake():
    f = faults(fault_reorder=1.0)
    second = att_pdu(CHUNK_HEADER.pack(PROTOCOL_VERSION, 3, 7, 100, 60) + bytes(40))
    assert f.apply((1, 2), CHUNK) == []  # held
    assert f.apply((1, 2), second) == [second, CHUNK]  # overtaken, then released


def test_fault_rates_are_checked():
    with pytest.raises(RadioError, match="fault probabilities"):
        preset("ble5-2m", fault_drop=1.5)
