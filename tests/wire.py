"""Wire payloads for tests: the REQUEST a wearable sends for a split, the RESULT a handheld
returns (``ble_protocol.request``)."""

from __future__ import annotations

from typing import Any

from coinf.ble_protocol.request import (
    HopStats,
    Request,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)


def tail_request(bundle: Any, cid: str, blob: bytes, gamma: int = 0) -> bytes:
    """A REQUEST for ``cid``'s tail in ``bundle`` (up to its last cut)."""
    return encode_request(Request.split(cid, bundle.candidates[-1].id, gamma), blob)


def result_payload(compute_us: int, blob: bytes, request: bytes | None = None) -> bytes:
    """A one-hop RESULT (answering ``request``'s nonce when given)."""
    nonce = decode_request(request)[0].nonce if request is not None else 0
    return encode_result([HopStats(compute_us)], blob, nonce)


def result_blob(payload: bytes) -> memoryview:
    """The tensor map of a one-hop RESULT."""
    return decode_result(payload, 1)[1]
