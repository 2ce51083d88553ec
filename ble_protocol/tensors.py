"""Tensors on the wire: explicit dtype + shape + raw bytes. Never pickle.

A *tensor map* is::

    u16 count
    count x { u16 name_len, name (UTF-8), u8 codec, u32 body_len, body }

codec 0 (RAW) body: ``u8 dtype, u8 ndim, ndim x u32 dim, data`` where ``data`` is exactly
``prod(dims) * itemsize`` bytes, C order, little-endian. ``dtype`` uses ONNX TensorProto codes.
codec 1 (PACKED) body: a self-describing packed tensor (:mod:`ble_protocol.packing`).

Decoding bounds-checks every length against the bytes present and against ``max_bytes`` before
allocating anything.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

import numpy as np
from coinf.ble_protocol.dtypes import MAX_NDIM, NUMPY_TO_ONNX, ONNX_TO_NUMPY
from coinf.ble_protocol.messages import ErrorCode, ProtocolError

CODEC_RAW = 0
CODEC_PACKED = 1

MAX_TENSORS = 1024
MAX_NAME_BYTES = 512
DEFAULT_MAX_BYTES = 256 * 1024 * 1024


def dtype_code(dtype: np.dtype) -> int:
    code = NUMPY_TO_ONNX.get(np.dtype(dtype).newbyteorder("<"))
    if code is None:
        raise ValueError(f"dtype {dtype} cannot travel on the wire")
    return code


def encode_raw(array: np.ndarray) -> bytes:
    """Encode one tensor as a RAW body."""
    arr = np.asarray(array)  # (np.ascontiguousarray would turn a 0-d tensor into 1-d)
    code = dtype_code(arr.dtype)
    if arr.ndim > MAX_NDIM:
        raise ValueError(f"tensor has {arr.ndim} dims; at most {MAX_NDIM} travel")
    le = arr.astype(ONNX_TO_NUMPY[code], copy=False)
    head = struct.pack(f"<BB{arr.ndim}I", code, arr.ndim, *arr.shape)
    return head + le.tobytes()


def decode_raw(body: memoryview | bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> np.ndarray:
    """Decode a RAW body; every length is checked before allocation."""
    mv = memoryview(body)
    if len(mv) < 2:
        raise ProtocolError(ErrorCode.TRUNCATED, "raw tensor shorter than its 2-byte header")
    code, ndim = mv[0], mv[1]
    dtype = ONNX_TO_NUMPY.get(code)
    if dtype is None:
        raise ProtocolError(ErrorCode.MALFORMED, f"unknown dtype code {code}")
    if ndim > MAX_NDIM:
        raise ProtocolError(ErrorCode.MALFORMED, f"tensor has {ndim} dims; at most {MAX_NDIM}")
    if len(mv) < 2 + 4 * ndim:
        raise ProtocolError(ErrorCode.TRUNCATED, "raw tensor header cut short")
    shape = struct.unpack_from(f"<{ndim}I", mv, 2)
    count = 1
    for d in shape:
        count *= d
    nbytes = count * dtype.itemsize
    if nbytes > max_bytes:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"tensor of {nbytes} B exceeds {max_bytes} B")
    data = mv[2 + 4 * ndim :]
    if len(data) != nbytes:
        raise ProtocolError(
            ErrorCode.MALFORMED,
            f"tensor {tuple(shape)} {dtype} needs {nbytes} B, body has {len(data)} B",
        )
    try:
        arr = np.frombuffer(data, dtype=dtype).reshape(shape)
    except ValueError as exc:  # numpy refuses some empty shapes (a 0 next to huge dims)
        raise ProtocolError(ErrorCode.MALFORMED,
                            f"shape {list(shape)} is not valid: {exc}") from None
    return arr.astype(dtype.newbyteorder("="))


def encode_tensors(
    tensors: Mapping[str, np.ndarray], packed: Mapping[str, bytes] | None = None
) -> bytes:
    """Encode a tensor map. ``packed`` maps names to already-packed bodies (codec PACKED)."""
    packed = packed or {}
    names = list(tensors) + [n for n in packed if n not in tensors]
    if len(names) > MAX_TENSORS:
        raise ValueError(f"{len(names)} tensors; at most {MAX_TENSORS} per message")
    parts = [struct.pack("<H", len(names))]
    for name in names:
        raw_name = name.encode("utf-8")
        if len(raw_name) > MAX_NAME_BYTES:
            raise ValueError(f"tensor name longer than {MAX_NAME_BYTES} bytes: {name[:40]}...")
        if name in packed:
            codec, body = CODEC_PACKED, packed[name]
        else:
            codec, body = CODEC_RAW, encode_raw(tensors[name])
        parts.append(struct.pack("<H", len(raw_name)) + raw_name)
        parts.append(struct.pack("<BI", codec, len(body)))
        parts.append(body)
    return b"".join(parts)


def decode_tensors(
    blob: memoryview | bytes, max_bytes: int = DEFAULT_MAX_BYTES
) -> dict[str, np.ndarray]:
    """Decode a tensor map, rejecting anything inconsistent with :class:`ProtocolError`."""
    mv = memoryview(blob)
    if len(mv) < 2:
        raise ProtocolError(ErrorCode.TRUNCATED, "tensor map shorter than its count")
    (count,) = struct.unpack_from("<H", mv)
    if count > MAX_TENSORS:
        raise ProtocolError(ErrorCode.MALFORMED, f"{count} tensors; at most {MAX_TENSORS}")
    pos, out, budget = 2, {}, max_bytes
    for _ in range(count):
        if pos + 2 > len(mv):
            raise ProtocolError(ErrorCode.TRUNCATED, "tensor map cut short in a name length")
        (nlen,) = struct.unpack_from("<H", mv, pos)
        pos += 2
        if nlen > MAX_NAME_BYTES or pos + nlen + 5 > len(mv):
            raise ProtocolError(ErrorCode.TRUNCATED, "tensor map cut short in a name")
        try:
            name = bytes(mv[pos : pos + nlen]).decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(ErrorCode.MALFORMED, "tensor name is not UTF-8") from None
        pos += nlen
        codec, blen = struct.unpack_from("<BI", mv, pos)
        pos += 5
        if pos + blen > len(mv):
            raise ProtocolError(ErrorCode.TRUNCATED, f"tensor {name!r} body cut short")
        if name in out:
            raise ProtocolError(ErrorCode.MALFORMED, f"tensor {name!r} appears twice")
        body = mv[pos : pos + blen]
        pos += blen
        if codec == CODEC_RAW:
            arr = decode_raw(body, budget)
        elif codec == CODEC_PACKED:
            from coinf.ble_protocol import packing  # the packing codec is optional on the wire

            arr = packing.unpack(bytes(body), max_bytes=budget)
        else:
            raise ProtocolError(ErrorCode.MALFORMED, f"tensor {name!r} has unknown codec {codec}")
        budget -= arr.nbytes
        out[name] = arr
    if pos != len(mv):
        raise ProtocolError(ErrorCode.MALFORMED, f"{len(mv) - pos} trailing bytes after tensors")
    return out
