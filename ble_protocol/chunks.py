"""Chunk framing for links whose unit is one small ATT value (docs/PROTOCOL.md, "Data chunks").

A :class:`~ble_protocol.messages.Message` is sent as a *body* -- its payload followed by a CRC32
trailer -- cut into chunks. Every chunk carries a 14-byte header (all little-endian)::

    u8 version | u8 type | u32 request_id | u32 total_length | u32 offset | data...

``total_length`` is the payload length (the body is ``total_length + 4`` bytes); ``offset`` is the
byte offset of ``data`` inside the body. The trailer is ``crc32(version, type, request_id,
total_length as packed above, payload)``. Because every chunk repeats the header, any chunk can
open a reassembly: the receiver checks the declared length against its limits *before* allocating
anything, then places chunks by offset, so duplicates and reordering are harmless.
"""

from __future__ import annotations

import bisect
import struct
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from coinf.ble_protocol.messages import (
    PROTOCOL_VERSION,
    ErrorCode,
    Message,
    ProtocolError,
    parse_type,
)

CHUNK_HEADER = struct.Struct("<BBIII")
HEADER_BYTES = CHUNK_HEADER.size  # 14
CRC_BYTES = 4
#: ATT values longer than 512 B are invalid; servers silently drop longer writes.
MAX_ATT_VALUE = 512
MIN_CHUNK_BYTES = HEADER_BYTES + 1


def chunk_size_for_mtu(mtu: int) -> int:
    """Largest chunk (header + data) that fits one ATT notification/write for ``mtu``."""
    if mtu < 23:
        raise ValueError(f"ATT MTU {mtu} is below the BLE minimum of 23")
    return min(mtu - 3, MAX_ATT_VALUE)


def _crc(version: int, mtype: int, rid: int, total: int, payload: bytes | memoryview) -> int:
    return zlib.crc32(payload, zlib.crc32(struct.pack("<BBII", version, mtype, rid, total)))


def encode_chunks(
    message: Message, chunk_size: int, version: int = PROTOCOL_VERSION,
    ranges: list[tuple[int, int]] | None = None,
) -> Iterator[bytes]:
    """Yield the chunks of ``message``; each is at most ``chunk_size`` bytes (header included).
    ``ranges``: only the chunks overlapping these ``[start, end)`` body ranges (a resend after
    a NACK; None or empty: every chunk)."""
    if chunk_size < MIN_CHUNK_BYTES or chunk_size > MAX_ATT_VALUE:
        raise ValueError(f"chunk size {chunk_size} outside [{MIN_CHUNK_BYTES}, {MAX_ATT_VALUE}]")
    payload = message.payload
    total = len(payload)
    if total > 0xFFFFFFFF - CRC_BYTES:
        raise ValueError(f"message of {total} B does not fit the u32 length field")
    crc = _crc(version, int(message.type), message.request_id, total, payload)
    body_len = total + CRC_BYTES
    step = chunk_size - HEADER_BYTES
    trailer = struct.pack("<I", crc)
    view = memoryview(payload)
    for offset in range(0, body_len, step):
        end = min(offset + step, body_len)
        if ranges and not any(offset < e and s < end for s, e in ranges):
            continue
        header = CHUNK_HEADER.pack(version, int(message.type), message.request_id, total, offset)
        if end <= total:
            data = bytes(view[offset:end])
        elif offset >= total:
            data = trailer[offset - total : end - total]
        else:
            data = bytes(view[offset:total]) + trailer[: end - total]
        yield header + data


def chunk_count(payload_bytes: int, chunk_size: int) -> int:
    step = chunk_size - HEADER_BYTES
    return -(-(payload_bytes + CRC_BYTES) // step)


@dataclass
class _Partial:
    """A message being reassembled. Only the chunks received are held (``pieces``); the body
    is allocated once, when the last byte has arrived."""

    mtype: int
    total: int
    started: float
    last: float  # when new data last arrived
    pieces: list[tuple[int, bytes]] = field(default_factory=list)
    intervals: list[tuple[int, int]] = field(default_factory=list)  # disjoint, sorted [start,end)
    received: int = 0
    held: int = 0  # bytes held in pieces (duplicates are not kept)

    def add(self, offset: int, data: bytes | memoryview) -> bool:
        """Place ``data``; returns False if it was entirely a duplicate."""
        end = offset + len(data)
        starts = [s for s, _ in self.intervals]
        i = bisect.bisect_right(starts, offset) - 1
        if i >= 0 and self.intervals[i][0] <= offset and end <= self.intervals[i][1]:
            return False
        piece = bytes(data)
        self.pieces.append((offset, piece))
        self.held += len(piece)
        # merge [offset, end) into the interval list
        lo, hi = offset, end
        j = max(i, 0)
        while j < len(self.intervals) and self.intervals[j][1] < lo:
            j += 1
        k = j
        while k < len(self.intervals) and self.intervals[k][0] <= hi:
            lo = min(lo, self.intervals[k][0])
            hi = max(hi, self.intervals[k][1])
            k += 1
        removed = sum(e - s for s, e in self.intervals[j:k])
        self.intervals[j:k] = [(lo, hi)]
        self.received += (hi - lo) - removed
        return True

    def body(self, size: int) -> bytearray:
        """The whole body (every byte has arrived)."""
        out = bytearray(size)
        for offset, piece in self.pieces:
            out[offset:offset + len(piece)] = piece
        return out


@dataclass
class ReassemblyStats:
    duplicates: int = 0
    completed: int = 0
    expired: int = 0
    dropped: int = 0


class Reassembler:
    """Rebuilds messages from chunks under a memory budget.

    ``feed`` raises :class:`ProtocolError` with a documented code for every malformed chunk:
    TRUNCATED (shorter than the header), BAD_VERSION, UNKNOWN_TYPE, TOO_LARGE (declared length
    over ``max_message_bytes``), BUSY (the budget or the number of concurrent messages would be
    exceeded), MALFORMED (offset/length inconsistent with an earlier chunk) and BAD_CRC.
    The exception carries ``request_id`` (or None) so the link can answer the sender.
    """

    def __init__(
        self,
        max_message_bytes: int = 64 * 1024 * 1024,
        budget_bytes: int | None = None,
        max_partial: int = 8,
        timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        min_rate_bps: float = 1000.0,
        version: int = PROTOCOL_VERSION,
        remember_failed: bool = True,
    ) -> None:
        self.max_message_bytes = max_message_bytes
        #: keep a message that failed its CRC among the recent ones (its later chunks are then
        #: ignored); False where the sender resends it after a NACK (module arq)
        self.remember_failed = remember_failed
        self.budget_bytes = budget_bytes if budget_bytes is not None else max_message_bytes + 64
        self.max_partial = max_partial
        self.timeout_s = timeout_s
        self.min_rate_bps = min_rate_bps
        self.clock = clock
        self.version = version
        self._partials: dict[tuple[int, int], _Partial] = {}
        self._recent: OrderedDict[tuple[int, int], None] = OrderedDict()
        self.stats = ReassemblyStats()

    @property
    def buffered_bytes(self) -> int:
        """Bytes currently held for incomplete messages (only what was received)."""
        return sum(p.held for p in self._partials.values())

    @property
    def reserved_bytes(self) -> int:
        """Declared sizes of the incomplete messages, counted against the budget."""
        return sum(p.total + CRC_BYTES for p in self._partials.values())

    @property
    def pending(self) -> int:
        return len(self._partials)

    def _fail(self, code: ErrorCode, text: str, rid: int | None) -> ProtocolError:
        return ProtocolError(code, text, request_id=rid)

    def feed(self, chunk: bytes | memoryview) -> Message | None:
        """Consume one chunk; return the completed message, if this chunk finished one."""
        if len(chunk) < HEADER_BYTES:
            raise self._fail(
                ErrorCode.TRUNCATED, f"chunk of {len(chunk)} B is shorter than the header", None
            )
        version, mtype, rid, total, offset = CHUNK_HEADER.unpack_from(chunk)
        if version != self.version:
            raise self._fail(
                ErrorCode.BAD_VERSION,
                f"chunk has protocol version {version}, expected {self.version}",
                None,
            )
        try:
            parse_type(mtype)
        except ProtocolError as exc:
            raise self._fail(exc.code, exc.text, rid) from None
        data = memoryview(chunk)[HEADER_BYTES:]
        key = (mtype, rid)
        if key in self._recent:
            self.stats.duplicates += 1
            return None
        if total > self.max_message_bytes:
            raise self._fail(
                ErrorCode.TOO_LARGE,
                f"message {rid} declares {total} B, limit is {self.max_message_bytes} B",
                rid,
            )
        body_len = total + CRC_BYTES
        if not data or offset + len(data) > body_len:
            if self._partials.pop(key, None) is not None:  # the message is refused whole
                self.stats.dropped += 1
            raise self._fail(
                ErrorCode.MALFORMED,
                f"chunk [{offset}, {offset + len(data)}) outside message {rid} of {body_len} B",
                rid,
            )
        part = self._partials.get(key)
        if part is None:
            if len(self._partials) >= self.max_partial:
                raise self._fail(
                    ErrorCode.BUSY, f"more than {self.max_partial} messages in reassembly", rid
                )
            reserved = self.reserved_bytes
            if reserved + body_len > self.budget_bytes:
                raise self._fail(
                    ErrorCode.BUSY,
                    f"message {rid} of {total} B exceeds the reassembly budget "
                    f"({reserved} of {self.budget_bytes} B reserved)",
                    rid,
                )
            now = self.clock()
            part = _Partial(mtype, total, now, now)
            self._partials[key] = part
        elif part.total != total:
            del self._partials[key]
            raise self._fail(
                ErrorCode.MALFORMED,
                f"message {rid} declared {part.total} B, then {total} B",
                rid,
            )
        if not part.add(offset, data):
            self.stats.duplicates += 1
            return None
        part.last = self.clock()
        if part.received < body_len:
            return None
        del self._partials[key]
        body = part.body(body_len)
        payload = bytes(body[:total])
        (crc,) = struct.unpack_from("<I", body, total)
        if _crc(version, mtype, rid, total, payload) != crc:
            if self.remember_failed:
                self._remember(key)
            raise self._fail(ErrorCode.BAD_CRC, f"message {rid} failed its CRC32 check", rid)
        self._remember(key)
        self.stats.completed += 1
        return Message(parse_type(mtype), rid, payload)

    def _remember(self, key: tuple[int, int]) -> None:
        self._recent[key] = None
        while len(self._recent) > 64:
            self._recent.popitem(last=False)

    def status(self, mtype: int, rid: int) -> list[tuple[int, int]] | None:
        """What is known of message (``mtype``, ``rid``): None if it completed (one of the
        recent ones), else the body ranges still missing (all of it when nothing is held)."""
        key = (mtype, rid)
        if key in self._recent:
            return None
        part = self._partials.get(key)
        if part is None:
            return []
        out, at = [], 0
        for start, end in part.intervals:
            if start > at:
                out.append((at, start))
            at = max(at, end)
        if at < part.total + CRC_BYTES:
            out.append((at, part.total + CRC_BYTES))
        return out

    def cancel(self, request_id: int) -> int:
        """Drop partial messages with ``request_id``; returns how many were dropped."""
        keys = [k for k in self._partials if k[1] == request_id]
        for k in keys:
            del self._partials[k]
        self.stats.dropped += len(keys)
        return len(keys)

    def deadline(self, body_bytes: int) -> float:
        """Longest a message of ``body_bytes`` may take in all: ``timeout_s`` plus its size at
        ``min_rate_bps`` (1 kB/s: a 602 kB image gets 632 s, a 4 kB tensor 34 s)."""
        return self.timeout_s + body_bytes / self.min_rate_bps

    def expire(self, now: float | None = None) -> list[int]:
        """Drop partial messages that stalled (no new data for ``timeout_s``) or outlived
        :meth:`deadline`; returns their request ids. A large message that keeps arriving is
        never cut at a fixed age: the timeout scales with its size."""
        return [rid for _, rid in self.expire_keys(now)]

    def expire_keys(self, now: float | None = None) -> list[tuple[int, int]]:
        """:meth:`expire`, returning the (type, request id) of each message dropped."""
        now = self.clock() if now is None else now
        old = [k for k, p in self._partials.items()
               if now - p.last > self.timeout_s
               or now - p.started > self.deadline(p.total + CRC_BYTES)]
        for k in old:
            del self._partials[k]
        self.stats.expired += len(old)
        return old

    def drop(self, mtype: int, rid: int) -> bool:
        """Drop the partial message (``mtype``, ``rid``), if any (it was refused)."""
        if self._partials.pop((mtype, rid), None) is None:
            return False
        self.stats.dropped += 1
        return True
