"""The typed REQUEST header and the RESULT layout (docs/PROTOCOL.md §6.9-6.11).

Every REQUEST payload starts with a header that says what to run, decoded once by the
receiver, then the tensor map (:mod:`ble_protocol.tensors`)::

    u8 kind                      1 STAGES, 2 TILE, 3 REST
    u32 nonce                    the sender's random number; the RESULT echoes it
    STAGES:  u8 count (1..16), count x hop:
                 u8 len, device name   (0..32 B of [A-Za-z0-9_-]; empty: whoever receives it)
                 u8 len, FROM cut id   (1..32 B; the tensors arriving are FROM's crossing set)
                 u8 len, TO cut id     (1..32 B; the hop runs FROM..TO; the last cut = outputs)
                 u8 gamma              (0: plain tensors; N >= 2: compressor gN's code at FROM)
                 u8 len, packing spec  (0..16 B ASCII; how this hop packs what it sends on;
                                        empty = raw; the last hop's must be empty)
    TILE:    6 x u16  I0, I1, R0, R1, C0, C1   (layers [I0, I1) of the spatial chain,
                                                output rows [R0, R1), columns [C0, C1))
    REST:    nothing                           (the layers after the spatial chain)

A split is STAGES with one hop ``FROM = its cut, TO = the last cut``; a pipeline has one hop
per device, the receiver first. Every RESULT payload is ``u32 nonce`` (its request's),
``u8 count`` (the request's hops; 1 for TILE and REST), ``count x (u32 compute_us, u32
send_us, u32 bytes)`` in hop order, then the tensor map: a reply whose nonce is not its
request's (stale, replayed, crossed) is refused, never an output. No meaning travels in
strings but names and cut ids.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from coinf.ble_protocol.messages import ErrorCode, ProtocolError
from coinf.ble_protocol.packspec import SPEC_NAMES, PackSpec

from coinf.tile import Tile

MAX_HOPS = 16
MAX_NAME = 32
MAX_SPEC = 16
#: ERROR's ``hop`` byte when the error is not about one hop of the request's route
NO_HOP = 0xFF
_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")
_TILE = struct.Struct("<6H")
_NONCE = struct.Struct("<I")
_STAT = struct.Struct("<III")
_U32 = 0xFFFFFFFF


class Kind(IntEnum):
    STAGES = 1
    TILE = 2
    REST = 3


def valid_name(name: str) -> bool:
    """A device name or cut id: 1-32 of ``[A-Za-z0-9_-]``."""
    return _NAME.fullmatch(name) is not None


def wire_packing(text: str) -> str:
    """The packing's name as the wire spells it (docs/PROTOCOL.md §6.7, "Packing names"):
    ``str(PackSpec.parse(text))``, so ``lossless`` is ``f32`` and ``Q4`` is ``q4``;
    ValueError for anything that is not a packing."""
    return str(PackSpec.parse(text))


@dataclass(frozen=True)
class Hop:
    """One device's part of a route: run slice ``start..end`` (cut ids) on ``device``."""

    start: str
    end: str
    device: str = ""
    #: the tensors arriving are compressor ``gamma``'s code at ``start`` (0: plain tensors)
    gamma: int = 0
    #: how this hop packs the tensors it sends on to the next hop ("raw": as they are)
    packing: str = "raw"

    def __post_init__(self) -> None:
        for what, text in (("FROM", self.start), ("TO", self.end)):
            if not valid_name(text):
                raise ValueError(f"hop {what} {text[:40]!r}: 1-32 of [A-Za-z0-9_-]")
        if self.device and not valid_name(self.device):
            raise ValueError(f"device name {self.device[:40]!r}: 1-32 of [A-Za-z0-9_-]")
        if not (self.gamma == 0 or 2 <= self.gamma <= 255):
            raise ValueError(f"gamma must be 0 or 2..255, got {self.gamma}")
        if not (0 < len(self.packing) <= MAX_SPEC and self.packing.isascii()):
            raise ValueError(f"packing spec {self.packing[:40]!r}: 1-{MAX_SPEC} ASCII chars")
        object.__setattr__(self, "packing", wire_packing(self.packing))  # one spelling

    def __str__(self) -> str:
        code = f"+g{self.gamma}" if self.gamma else ""
        tail = "" if self.packing == "raw" else f" packed {self.packing}"
        who = f"{self.device}: " if self.device else ""
        return f"{who}{self.start}{code}..{self.end}{tail}"


@dataclass(frozen=True)
class Request:
    """What a REQUEST asks for. Build with :meth:`split`, :meth:`route`, :meth:`for_tile` or
    :data:`REST`."""

    kind: Kind
    hops: tuple[Hop, ...] = ()
    tile: Tile | None = field(default=None)
    #: the sender's random number for this request; its RESULT must carry the same
    nonce: int = 0

    @classmethod
    def split(cls, cut: str, last: str, gamma: int = 0, nonce: int = 0) -> Request:
        """The tail of ``cut`` (up to the model's ``last`` cut) on the receiver."""
        return cls(Kind.STAGES, (Hop(cut, last, gamma=gamma),), nonce=nonce)

    @classmethod
    def route(cls, hops: Sequence[Hop], nonce: int = 0) -> Request:
        if not 1 <= len(hops) <= MAX_HOPS:
            raise ValueError(f"a route has 1..{MAX_HOPS} hops, got {len(hops)}")
        return cls(Kind.STAGES, tuple(hops), nonce=nonce)

    @classmethod
    def for_tile(cls, tile: Tile, nonce: int = 0) -> Request:
        return cls(Kind.TILE, tile=tile, nonce=nonce)

    @property
    def stats_count(self) -> int:
        """How many hop records its RESULT carries."""
        return len(self.hops) if self.kind == Kind.STAGES else 1

    def __str__(self) -> str:
        if self.kind == Kind.STAGES:
            return "; ".join(map(str, self.hops))
        return str(self.tile) if self.kind == Kind.TILE else "rest of the spatial chain"


REST = Request(Kind.REST)


def new_nonce() -> int:
    """A fresh random u32 for one request."""
    return secrets.randbits(32)


def with_nonce(payload: bytes, nonce: int) -> bytes:
    """``payload`` (an encoded REQUEST) with its nonce replaced: a header encoded once serves
    every request of its plan."""
    return payload[:1] + _NONCE.pack(nonce & 0xFFFFFFFF) + payload[1 + _NONCE.size:]


def _put(text: str, limit: int) -> bytes:
    raw = text.encode("ascii")
    if len(raw) > limit:
        raise ValueError(f"{text[:40]!r} is longer than {limit} bytes")
    return bytes([len(raw)]) + raw


def encode_request(request: Request, tensors_blob: bytes) -> bytes:
    """A REQUEST payload: the header, then the tensor map."""
    head = bytes([request.kind]) + _NONCE.pack(request.nonce & 0xFFFFFFFF)
    if request.kind == Kind.STAGES:
        if not 1 <= len(request.hops) <= MAX_HOPS:
            raise ValueError(f"a route has 1..{MAX_HOPS} hops, got {len(request.hops)}")
        head += bytes([len(request.hops)])
        for hop in request.hops:
            spec = "" if hop.packing == "raw" else hop.packing
            head += (_put(hop.device, MAX_NAME) + _put(hop.start, MAX_NAME)
                     + _put(hop.end, MAX_NAME) + bytes([hop.gamma]) + _put(spec, MAX_SPEC))
    elif request.kind == Kind.TILE:
        t = request.tile
        if t is None:
            raise ValueError("a TILE request needs its tile")
        head += _TILE.pack(t.i0, t.i1, t.r0, t.r1, t.c0, t.c1)
    return head + tensors_blob


class _Reader:
    def __init__(self, data: memoryview) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int, what: str) -> memoryview:
        if self.pos + n > len(self.data):
            raise ProtocolError(ErrorCode.TRUNCATED, f"REQUEST header ends inside {what}")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def byte(self, what: str) -> int:
        return self.take(1, what)[0]

    def text(self, what: str, limit: int, allow_empty: bool = False) -> str:
        n = self.byte(what)
        if n > limit or (n == 0 and not allow_empty):
            raise ProtocolError(ErrorCode.MALFORMED, f"REQUEST {what} length {n} is invalid")
        raw = bytes(self.take(n, what))
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError:
            raise ProtocolError(ErrorCode.MALFORMED, f"REQUEST {what} is not ASCII") from None
        if what == "packing spec":
            if text and not _is_wire_packing(text):
                raise ProtocolError(ErrorCode.MALFORMED, f"REQUEST packing spec {text!r} is "
                                    f"not a packing name ({SPEC_NAMES})")
        elif text and not valid_name(text):
            raise ProtocolError(ErrorCode.MALFORMED, f"REQUEST {what} {text!r} is not a name")
        return text


def _is_wire_packing(text: str) -> bool:
    """Whether ``text`` is a packing name exactly as the wire spells it."""
    try:
        return wire_packing(text) == text
    except ValueError:
        return False


#: headers decoded lately, without their nonce: (kind, bytes after the nonce) -> request. A
#: stream sends the same header every frame; a match is the same bytes, so the same request.
_RECENT: dict[tuple[int, bytes], Request] = {}


def decode_request(payload: bytes | memoryview) -> tuple[Request, memoryview]:
    """(header, tensor blob) of a REQUEST from the wire; anything malformed is a
    :class:`ProtocolError` (TRUNCATED, MALFORMED), never another exception."""
    view = memoryview(payload)
    for (kind, body), known in tuple(_RECENT.items()):  # a copy: other threads may add
        end = 5 + len(body)
        if len(view) >= end and view[0] == kind and view[5:end] == body:
            nonce = int.from_bytes(view[1:5], "little")
            return dataclasses.replace(known, nonce=nonce), view[end:]
    request, blob = _decode_request(view)
    if len(_RECENT) >= 8:
        _RECENT.pop(next(iter(_RECENT)))
    _RECENT[(view[0], bytes(view[5:len(view) - len(blob)]))] = request
    return request, blob


def _decode_request(payload: memoryview) -> tuple[Request, memoryview]:
    rd = _Reader(payload)
    raw_kind = rd.byte("kind")
    try:
        kind = Kind(raw_kind)
    except ValueError:
        raise ProtocolError(ErrorCode.MALFORMED, f"REQUEST kind {raw_kind} is unknown") from None
    (nonce,) = _NONCE.unpack(rd.take(_NONCE.size, "nonce"))
    if kind == Kind.TILE:
        vals = _TILE.unpack(rd.take(_TILE.size, "tile"))
        i0, i1, r0, r1, c0, c1 = vals
        if not (i0 < i1 and r0 < r1 and c0 < c1):
            raise ProtocolError(ErrorCode.MALFORMED, f"REQUEST tile {vals} is empty")
        request = Request.for_tile(Tile(*vals), nonce)
    elif kind == Kind.REST:
        request = Request(Kind.REST, nonce=nonce)
    else:
        count = rd.byte("hop count")
        if not 1 <= count <= MAX_HOPS:
            raise ProtocolError(ErrorCode.MALFORMED, f"REQUEST has {count} hops, 1..{MAX_HOPS}")
        hops = []
        for _ in range(count):
            device = rd.text("device name", MAX_NAME, allow_empty=True)
            start = rd.text("FROM cut", MAX_NAME)
            end = rd.text("TO cut", MAX_NAME)
            gamma = rd.byte("gamma")
            spec = rd.text("packing spec", MAX_SPEC, allow_empty=True) or "raw"
            if gamma == 1:
                raise ProtocolError(ErrorCode.MALFORMED, "REQUEST gamma 1 is invalid (0 or >= 2)")
            hops.append(Hop(start, end, device, gamma, spec))
        if hops[-1].packing != "raw":
            raise ProtocolError(ErrorCode.MALFORMED, "the last hop sends no tensors to pack")
        request = Request(Kind.STAGES, tuple(hops), nonce=nonce)
    return request, rd.data[rd.pos:]


# --- RESULT ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class HopStats:
    """One hop's record in a RESULT: its compute, its hand-off to the next hop, bytes sent."""

    compute_us: int
    send_us: int = 0
    nbytes: int = 0


def result_overhead(count: int) -> int:
    """Bytes of a RESULT before its tensor map."""
    return _NONCE.size + 1 + _STAT.size * count


def encode_result(stats: Sequence[HopStats], tensors_blob: bytes, nonce: int = 0) -> bytes:
    """A RESULT answering the request whose nonce is ``nonce``."""
    if not 1 <= len(stats) <= MAX_HOPS:
        raise ValueError(f"a RESULT has 1..{MAX_HOPS} hop records, got {len(stats)}")
    body = b"".join(_STAT.pack(*(min(max(int(v), 0), _U32)
                                 for v in (s.compute_us, s.send_us, s.nbytes))) for s in stats)
    return _NONCE.pack(nonce & 0xFFFFFFFF) + bytes([len(stats)]) + body + tensors_blob


def decode_result(payload: bytes | memoryview, count: int,
                  nonce: int | None = None) -> tuple[list[HopStats], memoryview]:
    """(hop records, tensor blob) of a RESULT; it must carry exactly ``count`` records and,
    given ``nonce``, answer the request that carried it (else a stale, replayed or crossed
    reply: MALFORMED)."""
    view = memoryview(payload)
    if len(view) < _NONCE.size + 1:
        raise ProtocolError(ErrorCode.TRUNCATED, "RESULT shorter than its nonce and count")
    (got,) = _NONCE.unpack_from(view)
    if nonce is not None and got != nonce & 0xFFFFFFFF:
        raise ProtocolError(ErrorCode.MALFORMED, "RESULT answers another request (its nonce "
                            "is not this request's)")
    n = view[_NONCE.size]
    if n != count:
        raise ProtocolError(ErrorCode.MALFORMED, f"RESULT has {n} hop records, expected {count}")
    end = result_overhead(count)
    if len(view) < end:
        raise ProtocolError(ErrorCode.TRUNCATED, "RESULT hop records are truncated")
    base = _NONCE.size + 1
    stats = [HopStats(*_STAT.unpack_from(view, base + i * _STAT.size)) for i in range(count)]
    return stats, view[end:]


__all__ = ["MAX_HOPS", "NO_HOP", "REST", "Hop", "HopStats", "Kind", "Request", "Tile",
           "decode_request", "decode_result", "encode_request", "encode_result", "new_nonce",
           "result_overhead", "valid_name", "with_nonce"]
