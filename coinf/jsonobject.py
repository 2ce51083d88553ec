"""Bounded JSON objects from anything untrusted: a peer's control payload, a profile file.

:func:`decode_json` never raises anything but :class:`coinf.errors.ProtocolError` (MALFORMED or
TOO_LARGE), so a caller handles hostile bytes in one place (docs/PROTOCOL.md, "Messages").
"""

from __future__ import annotations

import json
from typing import Any

from coinf.errors import ErrorCode, ProtocolError

#: The cap on a control payload (HELLO, STATUS): a UTF-8 JSON object of at most this many bytes.
MAX_CONTROL_BYTES = 4096
MAX_JSON_DEPTH = 32


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _depth(obj: Any, limit: int) -> int:
    """Nesting depth of a decoded JSON value, stopping past ``limit``."""
    stack, deepest = [(obj, 1)], 0
    while stack:
        item, d = stack.pop()
        if d > limit:
            return d
        deepest = max(deepest, d)
        if isinstance(item, dict):
            stack.extend((v, d + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, d + 1) for v in item)
    return deepest


def decode_json(payload: bytes | memoryview, max_bytes: int = MAX_CONTROL_BYTES,
                what: str = "control payload") -> dict[str, Any]:
    """A JSON object from the wire: at most ``max_bytes``, UTF-8, nested at most
    :data:`MAX_JSON_DEPTH` deep, no ``NaN``/``Infinity``. Anything else is a
    :class:`ProtocolError` (MALFORMED or TOO_LARGE), never another exception."""
    if len(payload) > max_bytes:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"{what} of {len(payload)} B > {max_bytes} B")
    try:
        obj = json.loads(bytes(payload).decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        text = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise ProtocolError(ErrorCode.MALFORMED, f"{what} is not JSON: {text}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(ErrorCode.MALFORMED, f"{what} must be a JSON object")
    if _depth(obj, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise ProtocolError(ErrorCode.MALFORMED, f"{what} is nested deeper than {MAX_JSON_DEPTH}")
    return obj
