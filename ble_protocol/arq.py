"""Loss recovery for chunked messages: SENT, ACK, NACK and SYNC control frames (docs/PROTOCOL.md
§4, "Loss and resend"; §5, "Credit sync").

Used only between peers whose handshakes both announced ``"ack": true``. After the last chunk
of a message the sender writes ``SENT(type, id, chunks)`` on the control characteristic, behind
the chunks on the same ATT bearer. When the receiver reads it, every chunk of that message sent
before it has arrived, unless one was lost: the receiver answers ``ACK`` (the message is
complete, or was refused and must not be sent again) or ``NACK`` with the byte ranges of the
body it lacks (none: all of it, e.g. after a CRC failure). The sender keeps each message until
its ACK and, on a NACK, sends again the chunks covering those ranges, then SENT again; after
:data:`MAX_RESENDS` resends the message fails (ERROR BAD_CRC for its request id). No timer is
involved: a lost chunk costs one round trip and the resent chunks, not a timeout.

``chunks`` in SENT (and in SYNC, written by a sender that waited :data:`CREDIT_STALL_S` for a
credit) is the number of data chunks the sender has written on this link so far, modulo 2**32:
the receiver sets its credit count to it, so credits of lost chunks come back (§5).
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from dataclasses import dataclass

from coinf.ble_protocol.messages import ErrorCode, Message, ProtocolError

#: resends of one message before it fails
MAX_RESENDS = 8
#: messages kept for resending, per link (the oldest is forgotten first)
UNACKED_KEPT = 32
#: a receiver that reads SENT for an incomplete message waits this long before its NACK (a
#: stack that delivers control and data on separate queues may hand over the SENT first)
ACK_GRACE_S = 0.05
#: a sender that waited this long for a credit writes SYNC
CREDIT_STALL_S = 0.5
#: byte ranges in one NACK (the rest are asked for after the next SENT)
MAX_NACK_RANGES = 32

_SENT = struct.Struct("<BII")
_KEY = struct.Struct("<BI")
_RANGE = struct.Struct("<II")
_SYNC = struct.Struct("<I")

Key = tuple[int, int]  # (message type, request id)
Range = tuple[int, int]  # [start, end) inside a message body


def sent_body(mtype: int, rid: int, chunks: int) -> bytes:
    return _SENT.pack(mtype, rid, chunks & 0xFFFFFFFF)


def ack_body(mtype: int, rid: int) -> bytes:
    return _KEY.pack(mtype, rid)


def nack_body(mtype: int, rid: int, missing: list[Range]) -> bytes:
    ranges = missing[:MAX_NACK_RANGES]
    return _KEY.pack(mtype, rid) + bytes([len(ranges)]) + b"".join(
        _RANGE.pack(s, e) for s, e in ranges)


def sync_body(chunks: int) -> bytes:
    return _SYNC.pack(chunks & 0xFFFFFFFF)


def parse_sent(body: bytes) -> tuple[int, int, int]:
    if len(body) != _SENT.size:
        raise ProtocolError(ErrorCode.MALFORMED, "SENT frame must be u8 type + u32 id + u32 chunks")
    mtype, rid, chunks = _SENT.unpack(body)
    return int(mtype), int(rid), int(chunks)


def parse_ack(body: bytes) -> Key:
    if len(body) != _KEY.size:
        raise ProtocolError(ErrorCode.MALFORMED, "ACK frame must be u8 type + u32 id")
    mtype, rid = _KEY.unpack(body)
    return int(mtype), int(rid)


def parse_nack(body: bytes) -> tuple[int, int, list[Range]]:
    if len(body) < _KEY.size + 1:
        raise ProtocolError(ErrorCode.MALFORMED, "NACK frame shorter than 6 bytes")
    mtype, rid = _KEY.unpack_from(body)
    n = body[_KEY.size]
    if n > MAX_NACK_RANGES or len(body) != _KEY.size + 1 + n * _RANGE.size:
        raise ProtocolError(ErrorCode.MALFORMED, f"NACK frame with {n} ranges has "
                            f"{len(body)} bytes")
    ranges = [_RANGE.unpack_from(body, _KEY.size + 1 + i * _RANGE.size) for i in range(n)]
    if any(not s < e for s, e in ranges):
        raise ProtocolError(ErrorCode.MALFORMED, "NACK range with start >= end")
    return int(mtype), int(rid), [(int(s), int(e)) for s, e in ranges]


def parse_sync(body: bytes) -> int:
    if len(body) != _SYNC.size:
        raise ProtocolError(ErrorCode.MALFORMED, "SYNC frame must carry a u32")
    return int(_SYNC.unpack(body)[0])


@dataclass
class ArqStats:
    """What loss recovery did on one link (tests and benchmarks read these)."""

    acks: int = 0  # ACK frames sent
    nacks: int = 0  # NACK frames sent
    resends: int = 0  # messages (partly) sent again after a NACK
    resent_chunks: int = 0
    given_up: int = 0  # messages failed after MAX_RESENDS
    syncs: int = 0  # SYNC frames sent (credit stalls)


@dataclass
class _Held:
    message: Message
    resends: int = 0


class Outbox:
    """The sender's messages awaiting ACK (the newest :data:`UNACKED_KEPT`)."""

    def __init__(self, kept: int = UNACKED_KEPT, max_resends: int = MAX_RESENDS) -> None:
        self.kept, self.max_resends = kept, max_resends
        self._held: OrderedDict[Key, _Held] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, message: Message) -> None:
        key = (int(message.type), message.request_id)
        entry = self._held.pop(key, None) or _Held(message)
        self._held[key] = entry
        while len(self._held) > self.kept:
            self._held.popitem(last=False)

    def ack(self, key: Key) -> None:
        self._held.pop(key, None)

    def nack(self, key: Key) -> tuple[Message | None, bool]:
        """(the message to send again, or None; True if it has failed for good)."""
        entry = self._held.get(key)
        if entry is None:
            return None, False  # acknowledged, forgotten or never sent: nothing to do
        if entry.resends >= self.max_resends:
            del self._held[key]
            return None, True
        entry.resends += 1
        return entry.message, False

    def clear(self) -> None:
        self._held.clear()


__all__ = ["ACK_GRACE_S", "CREDIT_STALL_S", "MAX_NACK_RANGES", "MAX_RESENDS", "UNACKED_KEPT",
           "ArqStats", "Outbox", "ack_body", "nack_body", "parse_ack", "parse_nack", "parse_sent",
           "parse_sync", "sent_body", "sync_body"]
