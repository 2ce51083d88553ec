"""Message types, payload layouts and protocol error codes (docs/PROTOCOL.md, "Messages").

All integers are little-endian. Control payloads (HELLO, STATUS) are UTF-8 JSON objects capped at
:data:`MAX_CONTROL_BYTES`; tensor payloads use :mod:`ble_protocol.tensors`.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from coinf.errors import ErrorCode, ProtocolError, RemoteError
from coinf.jsonobject import MAX_CONTROL_BYTES, MAX_JSON_DEPTH, decode_json

# ErrorCode and ProtocolError live in coinf.errors (the one exception hierarchy), decode_json in
# coinf.jsonobject (the device layer reads peers' JSON too); re-exported.
__all__ = [
    "MAX_CONTROL_BYTES", "MAX_ERROR_BYTES", "MAX_JSON_DEPTH", "MAX_PROFILE_BYTES",
    "PROTOCOL_VERSION", "ErrorCode", "Message", "MsgType", "ProtocolError", "decode_error",
    "decode_json", "encode_error", "encode_json", "parse_type", "reply_bound", "reply_type",
    "result_bound",
]

PROTOCOL_VERSION = 2
MAX_ERROR_TEXT = 1024
#: An ERROR payload: u16 code + u8 hop + at most 1024 B of UTF-8 text.
MAX_ERROR_BYTES = 3 + MAX_ERROR_TEXT
#: A PROFILE reply (the same cap as ``coinf.device.profile.MAX_PROFILE_BYTES``).
MAX_PROFILE_BYTES = 8 * 1024 * 1024


class MsgType(IntEnum):
    HELLO = 1  # wearable -> handheld: JSON {protocol, bundle, capabilities}
    HELLO_ACK = 2  # handheld -> wearable: JSON {protocol, bundle, capabilities}
    REQUEST = 3  # wearable -> handheld: candidate id + crossing tensors
    RESULT = 4  # handheld -> wearable: tail time + output tensors
    STATUS = 5  # either way: JSON device status
    PROBE = 6  # either way: opaque bytes, echoed back with the same request id
    ERROR = 7  # either way: u16 code + UTF-8 text
    CANCEL = 8  # wearable -> handheld: empty; abandon request_id
    PROFILE = 9  # request: empty; reply: the device profile, UTF-8 JSON (<= 8 MiB)


@dataclass(frozen=True, slots=True)
class Message:
    """One application message. ``request_id`` ties a RESULT/ERROR/PROBE reply to its request."""

    type: MsgType
    request_id: int
    payload: bytes = b""

    def __post_init__(self) -> None:
        if not 0 <= self.request_id <= 0xFFFFFFFF:
            raise ValueError(f"request_id {self.request_id} does not fit in u32")


def parse_type(value: int) -> MsgType:
    try:
        return MsgType(value)
    except ValueError:
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {value}") from None


# --- control payloads ------------------------------------------------------------------------


def encode_json(obj: dict[str, Any]) -> bytes:
    data = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    if len(data) > MAX_CONTROL_BYTES:
        raise ValueError(f"control payload of {len(data)} B exceeds {MAX_CONTROL_BYTES} B")
    return data


def encode_error(code: ErrorCode, text: str, hop: int | None = None) -> bytes:
    """An ERROR payload: ``u16 code, u8 hop, UTF-8 text``; ``hop`` is the index, in the
    request's route, of the hop at fault (255: not about one hop)."""
    at = 0xFF if hop is None or not 0 <= hop < 0xFF else hop
    return struct.pack("<HB", int(code), at) + text.encode("utf-8")[:MAX_ERROR_TEXT]


def decode_error(payload: bytes) -> RemoteError:
    """The peer's ERROR as an exception (a payload too short is reported as MALFORMED)."""
    if len(payload) < 3:
        return RemoteError(ErrorCode.MALFORMED, "ERROR payload shorter than 3 bytes")
    raw, at = struct.unpack_from("<HB", payload)
    try:
        code = ErrorCode(raw)
    except ValueError:
        code = ErrorCode.MALFORMED
    text = payload[3:MAX_ERROR_BYTES].decode("utf-8", errors="replace")
    return RemoteError(code, text, hop=None if at == 0xFF else at)


# --- the receiver's bound (docs/PROTOCOL.md §6.13) ------------------------------------------------

#: request type -> the type of its reply (an ERROR may answer any of them)
_REPLY_TYPE = {MsgType.HELLO: MsgType.HELLO_ACK, MsgType.REQUEST: MsgType.RESULT,
               MsgType.STATUS: MsgType.STATUS, MsgType.PROBE: MsgType.PROBE,
               MsgType.PROFILE: MsgType.PROFILE}


def reply_type(mtype: MsgType) -> MsgType | None:
    """The type of the reply a request of type ``mtype`` gets (None: not a request)."""
    return _REPLY_TYPE.get(mtype)


def reply_bound(mtype: MsgType, request_bytes: int) -> int | None:
    """The largest reply payload a request of type ``mtype`` (payload ``request_bytes``) can get:
    HELLO_ACK and STATUS :data:`MAX_CONTROL_BYTES`, PROFILE :data:`MAX_PROFILE_BYTES`, PROBE its
    own size (an echo). None for a REQUEST: its RESULT's bound comes from the model's outputs
    (:func:`result_bound`), which only the caller knows."""
    if mtype in (MsgType.HELLO, MsgType.STATUS):
        return MAX_CONTROL_BYTES
    if mtype == MsgType.PROFILE:
        return MAX_PROFILE_BYTES
    if mtype == MsgType.PROBE:
        return request_bytes
    return None


def result_bound(tensors: Iterable[tuple[str, int, int]], hops: int = 1) -> int:
    """The largest RESULT payload that can carry exactly ``tensors`` (name, ndim, data bytes)
    for a request of ``hops`` hops: the hop records (``ble_protocol.request``) + the tensor map
    (§6.1) with every tensor RAW. A PACKED output is sent only when its body is smaller than
    the raw data (§6.1), so no valid RESULT is larger."""
    total = 4 + 1 + 12 * hops + 2
    for name, ndim, nbytes in tensors:
        total += 2 + len(name.encode("utf-8")) + 5 + 2 + 4 * ndim + nbytes
    return total
