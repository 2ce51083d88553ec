"""The wire format of a pipeline stage (docs/PIPELINE.md): a REQUEST that names its route, and
the RESULT that carries every stage's timings back.

A pipeline REQUEST is an ordinary REQUEST (``encode_request``) whose candidate-id field is
``pipe:`` followed by the hops still to run, in order: ``NAME=FROM..TO`` joined by ``;``
(``pipe:h1=c002..c004;h2=c004..c008``). The first hop is the device receiving it; it runs the
slice FROM..TO on the tensors (cut FROM's crossing set) and sends cut TO's crossing tensors on
to the next hop, which it finds in its own configuration by name (the wire never gives an
address), packed as the hop's optional ``+SPEC`` says (``h1=c002..c004+q8``; default raw). The
last hop's slice ends at the last cut, so it produces the model's outputs. A FROM of the form
``CUT~gN`` (``h2=c004~g4..c008``) means the tensors are compressor gN's code at CUT (one tensor
``code``): that hop decodes it first, and the sender (the hop before, or the wearable) encodes
with gN before sending.

A pipeline RESULT payload is ``u32 compute_us`` (the sum over stages, so that ``decode_result``
still reads it), ``u8 count`` and ``count`` x ``(u32 compute_us, u32 send_us, u32 bytes)`` --
one per hop in pipeline order: its slice's compute time, the time it took to hand its tensors
to the next hop, and their size (0 for the last hop) -- followed by the result tensors.

A hop that cannot reach the next one answers ERROR DISCONNECTED with the text
``hop NAME unreachable: ...``; :func:`failed_hop` reads the name back, so the wearable can
re-plan without that device.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from coinf.ble_protocol.messages import ErrorCode, ProtocolError

PREFIX = "pipe:"
MAX_HOPS = 16
_NAME = r"[A-Za-z0-9_-]{1,32}"
_PACKING = r"q\d{1,2}|f16|f32|raw"
#: a hop's FROM may name a compressor's code at that cut: ``c004~g4`` (the hop decodes first)
_FROM = rf"{_NAME}(?:~g\d{{1,3}})?"
_HOP = re.compile(rf"^({_NAME})=({_FROM})\.\.({_NAME})(?:\+({_PACKING}))?$")
_FAILED = re.compile(rf"hop ({_NAME}) unreachable")
_STAT = struct.Struct("<III")


@dataclass(frozen=True)
class Hop:
    """One device's part of a route: run slice ``start..end`` on device ``device``."""

    device: str
    start: str
    end: str
    #: how this hop packs the tensors it sends on to the next hop ("raw": as they are)
    packing: str = "raw"

    def __str__(self) -> str:
        tail = "" if self.packing == "raw" else f"+{self.packing}"
        return f"{self.device}={self.start}..{self.end}{tail}"


@dataclass(frozen=True)
class HopStats:
    compute_us: int
    send_us: int
    nbytes: int


def valid_name(name: str) -> bool:
    return re.fullmatch(_NAME, name) is not None


def is_route(candidate_id: str) -> bool:
    return candidate_id.startswith(PREFIX)


def encode_route(hops: list[Hop] | tuple[Hop, ...]) -> str:
    if not hops or len(hops) > MAX_HOPS:
        raise ValueError(f"a route has 1..{MAX_HOPS} hops, got {len(hops)}")
    text = PREFIX + ";".join(map(str, hops))
    if not all(_HOP.match(str(h)) for h in hops):
        raise ValueError(f"bad hop in route {text!r}: names are 1-32 of [A-Za-z0-9_-]")
    return text


def decode_route(candidate_id: str) -> tuple[Hop, ...]:
    """The hops of a route from the wire; anything malformed is a :class:`ProtocolError`."""
    if not is_route(candidate_id):
        raise ProtocolError(ErrorCode.MALFORMED, "not a pipeline route")
    parts = candidate_id[len(PREFIX):].split(";")
    if not 1 <= len(parts) <= MAX_HOPS:
        raise ProtocolError(ErrorCode.MALFORMED, f"a route has 1..{MAX_HOPS} hops")
    hops = []
    for part in parts:
        m = _HOP.match(part)
        if m is None:
            raise ProtocolError(ErrorCode.MALFORMED, f"bad route hop {part[:80]!r}")
        hops.append(Hop(m.group(1), m.group(2), m.group(3), m.group(4) or "raw"))
    return tuple(hops)


def encode_stage_result(stats: list[HopStats], blob: bytes) -> bytes:
    if len(stats) > MAX_HOPS:
        raise ValueError(f"at most {MAX_HOPS} hops")
    total = min(sum(s.compute_us for s in stats), 0xFFFFFFFF)
    clamp = [tuple(min(max(int(v), 0), 0xFFFFFFFF) for v in (s.compute_us, s.send_us, s.nbytes))
             for s in stats]
    return (struct.pack("<IB", total, len(stats)) + b"".join(_STAT.pack(*c) for c in clamp)
            + blob)


def decode_stage_result(payload: bytes | memoryview, hops: int) -> tuple[list[HopStats],
                                                                          memoryview]:
    """(per-hop stats, result tensor blob); the count must be exactly ``hops``."""
    view = memoryview(payload)
    if len(view) < 5:
        raise ProtocolError(ErrorCode.TRUNCATED, "pipeline RESULT shorter than 5 bytes")
    count = view[4]
    if count != hops:
        raise ProtocolError(ErrorCode.MALFORMED,
                            f"pipeline RESULT has {count} hop records, expected {hops}")
    end = 5 + count * _STAT.size
    if len(view) < end:
        raise ProtocolError(ErrorCode.TRUNCATED, "pipeline RESULT hop records are truncated")
    stats = [HopStats(*_STAT.unpack_from(view, 5 + i * _STAT.size)) for i in range(count)]
    return stats, view[end:]


def hop_failed(device: str, why: object) -> ProtocolError:
    return ProtocolError(ErrorCode.DISCONNECTED, f"hop {device} unreachable: {why}"[:1000])


def failed_hop(exc: BaseException) -> str | None:
    """The device a pipeline error names as unreachable, if any."""
    if isinstance(exc, ProtocolError) and exc.code == ErrorCode.DISCONNECTED:
        m = _FAILED.search(exc.text)
        if m:
            return m.group(1)
    return None


__all__ = ["MAX_HOPS", "PREFIX", "Hop", "HopStats", "decode_route", "decode_stage_result",
           "encode_route", "encode_stage_result", "failed_hop", "hop_failed", "is_route",
           "valid_name"]
