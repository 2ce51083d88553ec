"""Packing the tensors that cross the cut: input-specific quantization + bit shuffling + LZ4.

This is the DynO CNN-ISPM pipeline (docs/PACKING.md). A packed tensor is self-describing::

    offset size  field
    0      3     magic  b"CP2" (format version 2)
    3      1     codec  (RAW 0, LOSSLESS 1, HALF 2, QUANT 3, CONST 4)
    4      1     flags  (bit 0: payload is one LZ4 block; other bits must be 0)
    5      1     bits   (QUANT: 1..16; HALF: 16; otherwise 0)
    6      1     dtype  (ONNX TensorProto code of the tensor as it was and will be again)
    7      1     ndim   (<= 8)
    8      ...   dims   ndim unsigned LEB128 varints (<= 2**32 - 1, minimal encoding)
    ...    16|8|0 QUANT: scale f64, offset f64 (the tensor's minimum); CONST: value f64; else none
    ...          payload: the rest of the body

The payload's uncompressed size follows from codec, bits and shape, so it is not sent; a
4-D quantized tensor has a 28-B header. Every byte counts at 20 kB/s: a fully connected cut's
tensor packs into a few dozen bytes.

All integers and floats are little-endian. Payloads before LZ4 are *bit planes*: the tensor's
elements (padded with zeros to a multiple of 8) are bit-transposed exactly as the ``bitshuffle``
library does for one block (row ``8*j + k`` holds bit ``k`` of byte ``j`` of every element, LSB
first). QUANT keeps only the ``bits`` low planes of the quantized levels, so a 3-bit tensor takes
3 bits per value before LZ4. When LZ4 does not shrink a payload it travels uncompressed (flag 0).

Codecs:

* QUANT (``q``, 1..16 bits): ``level = round((x - min) / step)``, ``step = (max - min) /
  (2**bits - 1)``; min/max are taken from this very tensor for this very input (ISQuant).
  Decoding gives ``min + level * step``, within :func:`quantization_bound` of the input.
* HALF (``f16``): float16 values; lossy beyond float16 precision (11 significant bits).
* LOSSLESS (``f32``): the tensor's own bytes, bit-shuffled, LZ4. Exact for every dtype.
* RAW (``raw``): the tensor's own bytes, nothing else.
* CONST: a float tensor whose min equals max under ``q``: only the value travels.
* QUANTZ (``qz``) and ANS (``ans``, 1..8 bits): QUANT's levels in a zstd frame
  (:mod:`ble_protocol.codecs`) or rANS-coded under calibrated priors (:mod:`ble_protocol.priors`).

Non-float tensors (ints, bools, token ids) always travel LOSSLESS whatever the spec; float
tensors holding NaN or infinity fall back to LOSSLESS under ``q``, and to LOSSLESS under ``f16``
when a finite value would overflow float16.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass

import lz4.block
import numpy as np
from coinf.ble_protocol import codecs, latent, media, priors
from coinf.ble_protocol.bitplanes import bit_planes, from_bit_planes
from coinf.ble_protocol.dtypes import MAX_NDIM, NUMPY_TO_ONNX, ONNX_TO_NUMPY
from coinf.ble_protocol.messages import ErrorCode, ProtocolError
from coinf.ble_protocol.packspec import LOSSLESS_SPEC, MAX_BITS, PackSpec

MAGIC = b"CP2"
HEADER = struct.Struct("<3sBBBBB")
HEADER_SIZE = HEADER.size  # 8, then the dims (1-5 B each) and the codec's parameters
PARAMS = struct.Struct("<dd")  # QUANT: scale, offset
_F32_TINY = float(np.finfo(np.float32).tiny)  # float32's smallest normal number
VALUE = struct.Struct("<d")  # CONST: the value
MAX_DIM = 0xFFFFFFFF
#: LZ4 high-compression level for quantized payloads. They are at most bits/32 of the float32
#: input, so HC costs about a nanosecond per input byte and saves ~5-10% on the radio.
LZ4_HC_LEVEL = 4

RAW, LOSSLESS, HALF, QUANT, CONST = 0, 1, 2, 3, 4
QUANTZ = 5  # quantized levels in one zstd frame (ble_protocol/codecs.py)
ANS = 11  # quantized levels, rANS under calibrated priors (ble_protocol/priors.py)
LATENT = latent.LATENT  # 12: a learned code's integers, rANS under its own table (latent.py)
CODEC_NAMES = {RAW: "raw", LOSSLESS: "lossless", HALF: "half", QUANT: "quant", CONST: "const",
               QUANTZ: "quantz", ANS: "ans", LATENT: "latent",
               **media.NAMES}  # JPEG 6 .. FLAC 10
FLAG_LZ4 = 1
FLAG_ZSTD = 2  # QUANTZ only: the payload is one magicless zstd frame
#: zstd cannot expand a frame more than this (an RLE block: 4 B -> 128 KiB); a header claiming
#: more is inconsistent and is refused before decompressing
ZSTD_MAX_RATIO = 32768
# LZ4 cannot expand data by more than 255x per input byte (a match emits at most 255 bytes per
# length byte); a header claiming more is inconsistent and is refused before decompressing.
LZ4_MAX_RATIO = 255
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
FLOAT_CODES = {1, 10, 11}  # float32, float16, float64



def quantization_bound(
    scale: float, peak: float = 0.0, dtype: np.dtype | type = np.float32
) -> float:
    """Largest ``|x - unpack(pack(x))|`` for a QUANT tensor of step ``scale``: half a step plus
    the rounding of ``dtype`` arithmetic on values up to ``peak = max|x|``, and one subnormal
    unit of ``dtype`` near zero."""
    info = np.finfo(np.dtype(dtype))
    # the last term: the result is rounded to the dtype, whose subnormals are evenly spaced
    return 0.5 * scale + 8.0 * float(info.eps) * (abs(peak) + scale) + float(
        info.smallest_subnormal)


# --- packing ---------------------------------------------------------------------------------


def _onnx_code(dtype: np.dtype) -> int:
    code = NUMPY_TO_ONNX.get(np.dtype(dtype).newbyteorder("<"))
    if code is None:
        raise ValueError(f"dtype {dtype} cannot be packed; use a numeric or bool tensor")
    return code


def _pad8(flat: np.ndarray) -> np.ndarray:
    rem = (-flat.size) % 8
    if rem:
        flat = np.concatenate([flat, np.zeros(rem, dtype=flat.dtype)])
    return flat


def _flat_planes(flat: np.ndarray) -> memoryview:
    return bit_planes(_pad8(flat)).reshape(-1).data


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _header(codec: int, flags: int, bits: int, code: int, shape: tuple[int, ...],
            scale: float, offset: float) -> bytes:
    head = HEADER.pack(MAGIC, codec, flags, bits, code, len(shape))
    dims = b"".join(_varint(d) for d in shape)
    if codec in (QUANT, QUANTZ, ANS):
        return head + dims + PARAMS.pack(scale, offset)
    if codec == CONST:
        return head + dims + VALUE.pack(offset)
    return head + dims


def _finish(codec: int, bits: int, code: int, shape: tuple[int, ...], scale: float,
            offset: float, payload: bytes | memoryview, compress: bool = True) -> bytes:
    raw_size = memoryview(payload).nbytes
    flags = 0
    if compress and raw_size:
        if codec == QUANT:
            packed = lz4.block.compress(payload, mode="high_compression",
                                        compression=LZ4_HC_LEVEL, store_size=False)
        else:
            packed = lz4.block.compress(payload, store_size=False)
        if len(packed) < raw_size:
            payload, flags = packed, FLAG_LZ4
    return _header(codec, flags, bits, code, shape, scale, offset) + bytes(payload)


def _quantize(flat: np.ndarray, bits: int, lo: float, span: float) -> np.ndarray:
    """Levels ``round((x - lo) * (2**bits-1) / span)`` as uint8/uint16, in one fused pass."""
    levels = (1 << bits) - 1
    work: type[np.floating] = np.float64
    if flat.dtype.itemsize <= 4 and span < 1e37 and levels / span < 1e37:
        work = np.float32
    tmp = np.subtract(flat, work(lo), dtype=work)
    tmp *= work(levels / span)
    tmp += work(0.5)
    np.minimum(tmp, work(levels), out=tmp)  # guards rounding right at the top level
    return tmp.astype(np.uint8 if bits <= 8 else np.uint16)


def _finish_z(bits: int, code: int, shape: tuple[int, ...], scale: float, offset: float,
              q: np.ndarray) -> bytes:
    """QUANTZ body: the levels (uint8, or uint16 LE) in a zstd frame, or plain if that is not
    smaller."""
    payload = np.ascontiguousarray(q, dtype=q.dtype.newbyteorder("<")).view(np.uint8).data
    packed = codecs.compress_levels(payload)
    flags = FLAG_ZSTD if len(packed) < payload.nbytes else 0
    body = packed if flags else bytes(payload)
    return _header(QUANTZ, flags, bits, code, shape, scale, offset) + body


def pack(array: np.ndarray, spec: PackSpec | str = LOSSLESS_SPEC, *, zstd: bool = True) -> bytes:
    """Pack one tensor into a self-describing body (see the module docstring). ``zstd``: the
    receiver decodes zstd (else ``qz`` and ``ans``'s fallback pack QUANT)."""
    if not isinstance(spec, PackSpec):
        spec = PackSpec.parse(spec)
    arr = np.asarray(array)
    if arr.ndim > MAX_NDIM:
        raise ValueError(f"tensor has {arr.ndim} dims; at most {MAX_NDIM} can be packed")
    if any(d > MAX_DIM for d in arr.shape):
        raise ValueError(f"tensor dimension too large for the wire: {arr.shape}")
    code = _onnx_code(arr.dtype)
    le = ONNX_TO_NUMPY[code]
    flat = np.ascontiguousarray(arr.reshape(-1)).astype(le, copy=False)
    shape = tuple(int(d) for d in arr.shape)
    codec = spec.codec
    if code not in FLOAT_CODES and codec != "raw":
        codec = "f32"  # non-float tensors always travel losslessly
    if codec == "raw":
        return _finish(RAW, 0, code, shape, 0.0, 0.0, flat.view(np.uint8).data, compress=False)
    if codec == "latent":  # a learned code, exactly, under its compressor's table
        if spec.priors is None:
            raise ValueError("the latent packing needs its compressor's table (priors=)")
        return _header(LATENT, 0, 0, code, shape, 0.0, 0.0) + latent.encode(arr, spec.priors)
    if codec in media.WIRE:
        media.require(codec)
        if media.applies(codec, shape) and flat.size and bool(np.isfinite(flat).all()):
            params, payload = media.encode(codec, spec.quality, flat.reshape(shape),
                                           spec.ranges)
            # the header's quality field: a lossless WebP body carries 100 (PROTOCOL.md §6.7)
            bits = spec.quality if spec.quality is not None else \
                media.LOSSLESS_QUALITY if codec == "webp" else spec.sample_bits
            return HEADER.pack(MAGIC, media.WIRE[codec], 0, bits, code, len(shape)) + b"".join(
                _varint(d) for d in shape) + params + payload
        codec = "f32"  # not image- or audio-like, or not finite: exact instead
    if codec in ("q", "qz", "ans") and flat.size:
        assert spec.bits is not None
        lo, hi = float(flat.min()), float(flat.max())
        if math.isfinite(lo) and math.isfinite(hi):
            if lo == hi:
                return _header(CONST, 0, 0, code, shape, 0.0, lo)
            span = hi - lo
            bits = spec.bits
            levels = (1 << bits) - 1
            scale = span / levels
            # the decoder accepts only a finite, positive step whose top level stays finite
            if not (math.isfinite(span) and scale > 0 and math.isfinite(levels / span)
                    and math.isfinite(lo + scale * levels)):
                return _finish(LOSSLESS, 0, code, shape, 0.0, 0.0, _flat_planes(flat))
            q = _quantize(flat, bits, lo, span)
            ans = priors.encode_levels(q, shape, bits, spec.priors, scale, lo) \
                if codec == "ans" else None
            if ans is not None:
                return _header(ANS, 0, bits, code, shape, scale, lo) + ans
            if codec in ("qz", "ans") and codecs.AVAILABLE and zstd:
                return _finish_z(bits, code, shape, scale, lo, q)
            planes = bit_planes(_pad8(q))[:bits].reshape(-1)
            return _finish(QUANT, bits, code, shape, span / ((1 << bits) - 1), lo, planes.data)
        codec = "f32"  # NaN/inf: nothing sensible to quantize
    elif codec in ("q", "qz", "ans"):
        codec = "f32"  # empty tensor
    if codec == "f16":
        with np.errstate(over="ignore"):
            half = flat.astype("<f2")
        if np.array_equal(np.isfinite(half), np.isfinite(flat)):
            return _finish(HALF, 16, code, shape, 0.0, 0.0, _flat_planes(half))
        # a finite value overflows float16: keep it exact instead
    return _finish(LOSSLESS, 0, code, shape, 0.0, 0.0, _flat_planes(flat))


def pack_tensors(
    tensors: Mapping[str, np.ndarray], spec: PackSpec | str = LOSSLESS_SPEC
) -> dict[str, bytes]:
    """Pack every tensor of a map with one spec, ready for
    ``encode_tensors({}, packed=pack_tensors(...))``. The wearable packs the crossing tensors
    with the planned spec; the handheld packs results with the default (lossless)."""
    spec = spec if isinstance(spec, PackSpec) else PackSpec.parse(spec)
    return {name: pack(arr, spec) for name, arr in tensors.items()}


def packed_size(array: np.ndarray, spec: PackSpec | str = LOSSLESS_SPEC) -> int:
    """Bytes of ``pack(array, spec)`` (header included)."""
    return len(pack(array, spec))


# --- unpacking -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PackedHeader:
    """A validated header: what :func:`unpack` will produce and from how many bytes."""

    codec: int
    flags: int
    bits: int
    dtype: np.dtype
    shape: tuple[int, ...]
    scale: float
    offset: float
    raw_size: int
    packed_size: int
    payload_offset: int
    params: bytes = b""  # a standard codec's parameters (media.py)

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize


def _bad(text: str) -> ProtocolError:
    return ProtocolError(ErrorCode.MALFORMED, f"packed tensor: {text}")


def _read_dims(mv: memoryview, pos: int, ndim: int) -> tuple[tuple[int, ...], int]:
    """``ndim`` minimal LEB128 varints from ``pos``; each <= MAX_DIM (5 bytes at most)."""
    dims = []
    for _ in range(ndim):
        value = shift = 0
        for k in range(5):
            if pos >= len(mv):
                raise ProtocolError(ErrorCode.TRUNCATED,
                                    "packed tensor header cut short in its dims")
            byte = mv[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                if byte == 0 and k > 0:
                    raise _bad("dimension varint is not minimally encoded")
                break
        else:
            raise _bad("dimension varint longer than 5 bytes")
        if value > MAX_DIM:
            raise _bad(f"dimension {value} exceeds {MAX_DIM}")
        dims.append(value)
    return tuple(dims), pos


def read_header(data: bytes | memoryview, max_bytes: int = DEFAULT_MAX_BYTES) -> PackedHeader:
    """Parse and validate a packed header against itself, the body length and ``max_bytes``."""
    mv = memoryview(data)
    if len(mv) < HEADER_SIZE:
        raise ProtocolError(ErrorCode.TRUNCATED,
                            f"packed tensor of {len(mv)} B is shorter than its header")
    magic, codec, flags, bits, code, ndim = HEADER.unpack_from(mv)
    if magic != MAGIC:
        raise _bad(f"bad magic {bytes(magic)!r}; expected {MAGIC!r}")
    if codec not in CODEC_NAMES:
        raise _bad(f"unknown codec {codec}")
    if flags & ~(FLAG_ZSTD if codec == QUANTZ else 0 if codec in media.NAMES or codec in (
            ANS, LATENT) else FLAG_LZ4):
        raise _bad(f"unknown flags 0x{flags:02x} for codec {CODEC_NAMES[codec]}")
    dtype = ONNX_TO_NUMPY.get(code)
    if dtype is None:
        raise _bad(f"unknown dtype code {code}")
    if ndim > MAX_NDIM:
        raise _bad(f"{ndim} dims; at most {MAX_NDIM}")
    shape, start = _read_dims(mv, HEADER_SIZE, ndim)
    scale, offset, start = _read_params(mv, codec, start)
    count = math.prod(shape)
    nbytes = count * dtype.itemsize
    if nbytes > max_bytes:
        raise ProtocolError(ErrorCode.TOO_LARGE,
                            f"packed tensor {shape} {dtype} of {nbytes} B exceeds {max_bytes} B")
    if codec in media.NAMES:
        return _media_header(mv, codec, bits, code, dtype, shape, start)
    n8 = (count + 7) // 8  # bytes per bit plane
    is_float = code in FLOAT_CODES
    if codec in (QUANT, QUANTZ, ANS):
        top = priors.MAX_BITS if codec == ANS else MAX_BITS
        if not is_float or not 1 <= bits <= top or (codec == ANS and count == 0):
            raise _bad(f"quantized tensor of {dtype} {list(shape)}, {bits} bits (1..{top})")
        if not (math.isfinite(scale) and scale > 0 and math.isfinite(offset)):
            raise _bad(f"scale {scale} / offset {offset} must be finite with scale > 0")
        if not math.isfinite(offset + scale * ((1 << bits) - 1)):
            raise _bad("top quantization level overflows")
        raw_size = bits * n8 if codec == QUANT else count * (1 if bits <= 8 else 2)
    elif codec == HALF:
        if not is_float or bits != 16:
            raise _bad(f"half codec needs a float dtype and bits 16, got {dtype}, {bits}")
        raw_size = 16 * n8
    elif codec == LATENT:
        if not is_float or bits or count == 0:
            raise _bad(f"latent code of {dtype} {list(shape)}, bits {bits}: expected a "
                       f"non-empty float tensor and bits 0")
        raw_size = len(mv) - start  # an entropy stream (latent.py checks it)
    elif codec == CONST:
        if not is_float or bits or not math.isfinite(offset):
            raise _bad("constant tensor needs a float dtype, bits 0 and a finite value")
        with np.errstate(over="ignore"):
            representable = float(np.array(offset).astype(dtype)) == offset
        if not representable:
            raise _bad(f"constant {offset} is not representable as {dtype}")
        raw_size = 0
    else:
        if bits:
            raise _bad(f"{CODEC_NAMES[codec]} codec carries no bits")
        raw_size = nbytes if codec == RAW else 8 * dtype.itemsize * n8
    if codec in (RAW, CONST) and flags:
        raise _bad(f"{CODEC_NAMES[codec]} payload cannot be compressed")
    psize = len(mv) - start
    if codec == ANS:  # an entropy stream (ble_protocol/entropy.py checks it)
        raw_size = psize
    _check_payload_size(codec, flags, raw_size, psize)
    return PackedHeader(codec, flags, bits, dtype, shape, scale, offset, raw_size, psize, start)


def _read_params(mv: memoryview, codec: int, start: int) -> tuple[float, float, int]:
    """The codec's parameters at ``start`` (QUANT, QUANTZ, ANS: scale and offset; CONST: the
    value, as the offset; others: none, 0.0) and where the payload starts after them."""
    params = PARAMS if codec in (QUANT, QUANTZ, ANS) else VALUE if codec == CONST else None
    if params is None:
        return 0.0, 0.0, start
    if len(mv) < start + params.size:
        raise ProtocolError(ErrorCode.TRUNCATED, "packed tensor header cut short")
    if codec == CONST:
        (offset,) = VALUE.unpack_from(mv, start)
        return 0.0, offset, start + params.size
    scale, offset = PARAMS.unpack_from(mv, start)
    return scale, offset, start + params.size


def _check_payload_size(codec: int, flags: int, raw_size: int, psize: int) -> None:
    """A payload of ``psize`` B must hold ``raw_size`` B: exactly when sent plain, within the
    most zstd or LZ4 can expand when compressed."""
    if codec == QUANTZ and flags & FLAG_ZSTD:
        if psize == 0 or raw_size == 0 or raw_size > ZSTD_MAX_RATIO * psize:
            raise _bad(f"{psize} B of zstd cannot hold {raw_size} B")
    elif flags & FLAG_LZ4:
        if psize == 0 or raw_size > LZ4_MAX_RATIO * psize:
            raise _bad(f"{psize} B of LZ4 cannot hold {raw_size} B")
    elif psize < raw_size:
        raise ProtocolError(ErrorCode.TRUNCATED, f"packed payload has {psize} B of {raw_size} B")
    elif psize > raw_size:
        raise _bad(f"{psize - raw_size} trailing bytes after the payload")


def _media_header(mv: memoryview, codec: int, bits: int, code: int, dtype: np.dtype,
                  shape: tuple[int, ...], start: int) -> PackedHeader:
    """The rest of a standard codec's header: its parameters, checked (media.py)."""
    name = media.NAMES[codec]
    size = media.params_size(codec, shape)
    if code not in FLOAT_CODES or size is None:
        raise _bad(f"{name} needs a float {'image' if name in media.IMAGE else 'waveform'}-like "
                   f"tensor; got {dtype} {list(shape)}")
    want = (1, 100) if name in media.QUALITY else (8, 8) if name in media.IMAGE else (16, 16)
    if not want[0] <= bits <= want[1]:
        raise _bad(f"{name} with bits/quality {bits}; expected {want[0]}..{want[1]}")
    if len(mv) < start + size:
        raise ProtocolError(ErrorCode.TRUNCATED, "packed tensor header cut short")
    params = bytes(mv[start:start + size])
    media.check_params(codec, params)
    start += size
    if len(mv) == start:
        raise ProtocolError(ErrorCode.TRUNCATED, f"packed {name} tensor has no payload")
    return PackedHeader(codec, 0, bits, dtype, shape, 0.0, 0.0, 0, len(mv) - start, start,
                        params)


def unpack(data: bytes | memoryview, max_bytes: int = DEFAULT_MAX_BYTES,
           book: priors.Book | None = None) -> np.ndarray:
    """Decode a packed body; :class:`ProtocolError` (MALFORMED/TRUNCATED/TOO_LARGE) on anything
    inconsistent. The result never holds more than the header's shape, nor ``max_bytes``.
    ``book``: the ``ans`` tables to use (key -> table) instead of the loaded bundles'."""
    h = read_header(data, max_bytes)
    out_dtype = h.dtype.newbyteorder("=")
    payload = memoryview(data)[h.payload_offset:]
    if h.codec == CONST:
        return np.full(h.shape, h.offset, dtype=out_dtype)
    if h.codec in media.NAMES:
        return media.decode(h.codec, h.params, payload, h.shape, h.dtype)
    if h.codec == QUANTZ and h.flags & FLAG_ZSTD:
        try:
            buf = codecs.decompress_levels(payload, h.raw_size)
        except codecs.CodecUnavailable:
            raise ProtocolError(ErrorCode.MALFORMED, "packed tensor uses zstd (codec quantz), "
                                "which this side cannot decode: pip install zstandard") from None
        except ValueError as exc:
            raise _bad(str(exc)) from None
    elif h.codec == ANS:
        buf = priors.decode_levels(payload, h.shape, h.bits, h.scale, h.offset, book).tobytes()
    elif h.codec == LATENT:
        return latent.decode(payload, h.shape).astype(out_dtype, copy=False)
    elif h.flags & FLAG_LZ4:
        try:
            buf = lz4.block.decompress(payload, uncompressed_size=h.raw_size)
        except lz4.block.LZ4BlockError as exc:
            raise _bad(f"LZ4 payload does not decompress: {exc}") from None
        if len(buf) != h.raw_size:
            raise _bad(f"LZ4 payload gave {len(buf)} B, header says {h.raw_size} B")
    else:
        buf = bytes(payload)
    count = h.count
    if count == 0:
        try:  # numpy refuses some zero-element shapes (e.g. a 0 next to huge dims)
            return np.zeros(h.shape, dtype=out_dtype)
        except ValueError as exc:
            raise _bad(f"shape {list(h.shape)} is not a valid empty tensor: {exc}") from None
    if h.codec == RAW:
        return np.frombuffer(buf, dtype=h.dtype).astype(out_dtype).reshape(h.shape)
    n8 = (count + 7) // 8
    if h.codec in (QUANT, QUANTZ, ANS):
        level_dtype = np.dtype(np.uint8 if h.bits <= 8 else "<u2")
        if h.codec != QUANT:
            levels = np.frombuffer(buf, dtype=level_dtype)
            if int(levels.max()) > (1 << h.bits) - 1:
                raise _bad(f"a level exceeds {h.bits} bits")
        else:
            planes = np.frombuffer(buf, dtype=np.uint8).reshape(-1, n8)
            full = np.zeros((8 * level_dtype.itemsize, n8), dtype=np.uint8)
            full[: h.bits] = planes
            levels = from_bit_planes(full, level_dtype)[:count]
        top = abs(h.offset) + h.scale * ((1 << h.bits) - 1)
        # float32 arithmetic would overflow, or round a subnormal step (flushing it to 0 below
        # half a unit) and multiply that error by the level
        wide = out_dtype == np.float64 or top > 1e37 or h.scale < _F32_TINY
        work = np.float64 if wide else np.float32
        vals = levels.astype(work)
        np.multiply(vals, work(h.scale), out=vals)
        np.add(vals, work(h.offset), out=vals)
        if wide and out_dtype != np.float64:  # round-off at the edge of the dtype's range
            limit = float(np.finfo(out_dtype).max)
            np.clip(vals, -limit, limit, out=vals)
        return vals.astype(out_dtype, copy=False).reshape(h.shape)
    planes = np.frombuffer(buf, dtype=np.uint8).reshape(-1, n8)
    if h.codec == HALF:
        half = from_bit_planes(planes, np.dtype("<f2"))[:count]
        return half.astype(out_dtype).reshape(h.shape)
    values = from_bit_planes(planes, h.dtype)[:count]
    return values.astype(out_dtype).reshape(h.shape)  # LOSSLESS: a fresh, writable copy


def describe(data: bytes | memoryview) -> dict[str, object]:
    """A header as a dict (for logs and ``coinf`` diagnostics)."""
    h = read_header(data)
    return {"codec": CODEC_NAMES[h.codec], "bits": h.bits, "dtype": str(h.dtype),
            "shape": list(h.shape), "scale": h.scale, "offset": h.offset,
            "raw_size": h.raw_size, "packed_size": h.packed_size,
            "lz4": h.codec != QUANTZ and bool(h.flags & FLAG_LZ4),
            "zstd": h.codec == QUANTZ and bool(h.flags & FLAG_ZSTD)}
