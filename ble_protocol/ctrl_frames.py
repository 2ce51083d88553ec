"""Control frames of the coinf GATT service (docs/PROTOCOL.md §3): encoding, parsing, and the
handshake (HELLO / HELLO_ACK) every BLE link starts with. :mod:`~coinf.ble_protocol.gatt` builds
the link on them and re-exports every name."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from enum import IntEnum
from typing import Any

from coinf.ble_protocol import arq
from coinf.ble_protocol.flow import MAX_WINDOW
from coinf.ble_protocol.messages import (
    PROTOCOL_VERSION,
    ErrorCode,
    ProtocolError,
    decode_json,
)

DEFAULT_WINDOW = 128  # chunks a receiver accepts before returning credits


class Ctrl(IntEnum):
    HELLO = 1
    HELLO_ACK = 2
    CREDIT = 3
    ERROR = 4
    ABORT = 5
    PING = 6  # u32 nonce: "are you there?" (only to a peer that announced "heartbeat")
    PONG = 7  # u32 nonce of the PING it answers
    SENT = 8  # u8 type | u32 id | u32 chunks: the last chunk of that message was sent (arq)
    ACK = 9  # u8 type | u32 id: that message arrived (or was refused): do not send it again
    NACK = 10  # u8 type | u32 id | u8 n | n x (u32 start | u32 end): send these again
    SYNC = 11  # u32 chunks: the sender's chunk count (credit sync after a stall)


# --- control frames ----------------------------------------------------------------------------


def ctrl_json(kind: Ctrl, obj: dict[str, Any]) -> bytes:
    data = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    if len(data) + 1 > 512:
        raise ValueError("handshake does not fit one ATT value")
    return bytes([kind]) + data


def ctrl_credit(n: int) -> bytes:
    return bytes([Ctrl.CREDIT]) + struct.pack("<H", n)


def ctrl_error(code: ErrorCode, text: str) -> bytes:
    """A fatal control ERROR: ``u16 code | UTF-8 text``, at most 500 B (no hop byte: the
    message-level ERROR of ``messages.encode_error`` has one)."""
    return (bytes([Ctrl.ERROR]) + struct.pack("<H", int(code)) + text.encode("utf-8"))[:500]


def ctrl_ping(nonce: int, pong: bool = False) -> bytes:
    return bytes([Ctrl.PONG if pong else Ctrl.PING]) + struct.pack("<I", nonce & 0xFFFFFFFF)


def ctrl_abort(mtype: int, rid: int) -> bytes:
    return bytes([Ctrl.ABORT]) + struct.pack("<BI", mtype, rid)


def parse_ctrl(frame: bytes) -> tuple[Ctrl, Any]:
    """Decode a control frame. Raises :class:`ProtocolError` on anything malformed."""
    if not frame:
        raise ProtocolError(ErrorCode.TRUNCATED, "empty control frame")
    try:
        kind = Ctrl(frame[0])
    except ValueError:
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown control frame {frame[0]}") from None
    body = bytes(frame[1:])
    if kind in (Ctrl.HELLO, Ctrl.HELLO_ACK):
        return kind, decode_json(body, what="handshake")
    if kind == Ctrl.CREDIT:
        if len(body) != 2:
            raise ProtocolError(ErrorCode.MALFORMED, "CREDIT frame must carry exactly a u16")
        return kind, struct.unpack("<H", body)[0]
    if kind == Ctrl.ERROR:
        if len(body) < 2:
            raise ProtocolError(ErrorCode.TRUNCATED, "ERROR frame shorter than 2 bytes")
        (raw,) = struct.unpack_from("<H", body)
        try:
            code = ErrorCode(raw)
        except ValueError:
            code = ErrorCode.MALFORMED
        return kind, ProtocolError(code, "peer: " + body[2:].decode("utf-8", "replace"))
    if kind in (Ctrl.PING, Ctrl.PONG):
        if len(body) != 4:
            raise ProtocolError(ErrorCode.MALFORMED, f"{kind.name} frame must carry a u32")
        return kind, struct.unpack("<I", body)[0]
    if kind in _ARQ_PARSERS:
        return kind, _ARQ_PARSERS[kind](body)
    if len(body) != 5:
        raise ProtocolError(ErrorCode.MALFORMED, "ABORT frame must be u8 type + u32 id")
    return kind, struct.unpack("<BI", body)


_ARQ_PARSERS: dict[Ctrl, Callable[[bytes], Any]] = {
    Ctrl.SENT: arq.parse_sent, Ctrl.ACK: arq.parse_ack, Ctrl.NACK: arq.parse_nack,
    Ctrl.SYNC: arq.parse_sync}


# --- handshake ---------------------------------------------------------------------------------


def make_hello(
    bundle_identity: str,
    mtu: int,
    window: int = DEFAULT_WINDOW,
    max_message_bytes: int = 64 * 1024 * 1024,
    protocol: int = PROTOCOL_VERSION,
    role: str = "handheld",
) -> dict[str, Any]:
    return {
        "protocol": protocol,
        "bundle": bundle_identity,
        "mtu": mtu,
        "role": role,
        "capabilities": {"window": window, "max_message_bytes": max_message_bytes, "crc32": True,
                         "heartbeat": True, "ack": True},
    }


def peer_heartbeat(obj: dict[str, Any]) -> bool:
    """Whether a (checked) handshake announced that its sender answers PING with PONG."""
    caps = obj.get("capabilities")
    return isinstance(caps, dict) and caps.get("heartbeat") is True


def peer_ack(obj: dict[str, Any]) -> bool:
    """Whether a (checked) handshake announced SENT / ACK / NACK / SYNC (module ``arq``)."""
    caps = obj.get("capabilities")
    return isinstance(caps, dict) and caps.get("ack") is True


def check_hello(
    obj: dict[str, Any], bundle_identity: str, protocol: int = PROTOCOL_VERSION
) -> tuple[int, int, int]:
    """Validate a peer's handshake; returns (mtu, window, max_message_bytes)."""
    peer_version = obj.get("protocol")
    if peer_version != protocol:
        raise ProtocolError(
            ErrorCode.BAD_VERSION,
            f"peer speaks protocol {peer_version!r}, this side speaks {protocol}",
        )
    if obj.get("bundle") != bundle_identity:
        raise ProtocolError(
            ErrorCode.BUNDLE_MISMATCH,
            f"peer runs bundle {str(obj.get('bundle'))[:80]!r}, this side runs {bundle_identity!r}",
        )
    caps = obj.get("capabilities")
    mtu = obj.get("mtu")
    if not isinstance(caps, dict) or not isinstance(mtu, int) or not 23 <= mtu <= 517:
        raise ProtocolError(ErrorCode.MALFORMED, "handshake lacks a valid mtu or capabilities")
    window, limit = caps.get("window"), caps.get("max_message_bytes")
    if not isinstance(window, int) or not 1 <= window <= MAX_WINDOW:
        raise ProtocolError(ErrorCode.MALFORMED, f"handshake window {window!r} is invalid")
    if not isinstance(limit, int) or limit < 1:
        raise ProtocolError(ErrorCode.MALFORMED, f"handshake max_message_bytes {limit!r} invalid")
    return mtu, window, limit
