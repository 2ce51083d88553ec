"""The bundle's shared weight file: large initializers stored once, referenced by every slice.

Splitting a big model must not copy its weights around in memory (issue 17: a 548 MB VGG took
3.4 GB). The fast path, :func:`light_from_file`, never parses the weights: it walks the file's
protobuf wire format in a memory map, has the kernel copy the file to ``weights.bin`` and
returns a *light* model whose initializers point at their ``raw_data`` bytes inside that copy
as ONNX external data (``location``, ``offset``, ``length``; the location is the file's bare
name, so a bundle stays relocatable). Files of another shape take the parsing path:
:func:`read_model` reads the file once (hashing the same bytes), and :func:`externalize`
writes every initializer of >= :data:`MIN_BYTES` into ``weights.bin``, 64-byte aligned, in
file order, and returns the light model. Slices built from the light model share the file
without any weight byte being copied again. :func:`internalize` is the way back for small
models whose slices stay self-contained; :func:`coinf.bundle.check_locations` guards what
slices point at.
"""

from __future__ import annotations

import gc
import hashlib
import mmap
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, numpy_helper

from coinf.bundle import all_tensors, is_external

WEIGHTS_FILE = "weights.bin"
MIN_BYTES = 1024  # smaller initializers (shape constants, biases of tiny layers) stay inline
ALIGN = 64


def read_model(path: Path) -> tuple[ModelProto, str]:
    """Parse ``path`` (loading external data relative to its folder); also its sha256.

    The file's bytes are read once and freed before returning: peak memory is the file plus
    its parsed form, as for ``onnx.load``.
    """
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    model = onnx.load_model_from_string(data)
    del data
    if any(is_external(t) for t in all_tensors(model.graph)):
        onnx.external_data_helper.load_external_data_for_model(model, str(path.parent))
    return model, digest


def _payload(t: TensorProto) -> bytes:
    """The tensor's values as little-endian bytes (``raw_data`` as is: ONNX stores it LE)."""
    if t.HasField("raw_data"):
        return t.raw_data
    arr = numpy_helper.to_array(t)
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()


def externalize(model: ModelProto, weights: Path) -> tuple[ModelProto, str]:
    """Write ``model``'s large initializers to ``weights``; return a light model and the file's
    sha256 (hashed while writing: the file is never read back).

    The returned model is a fresh proto (the caller drops ``model`` so its memory goes: clearing
    fields in place would keep protobuf's arena alive). String tensors and initializers under
    :data:`MIN_BYTES` stay inline.
    """
    table: dict[str, tuple[int, int]] = {}
    digest = hashlib.sha256()
    offset = 0
    with open(weights, "wb") as f:
        for t in model.graph.initializer:
            if t.data_type == TensorProto.STRING or t.name in table or is_external(t):
                continue
            n = int(np.prod(t.dims, dtype=np.int64)) * _itemsize(t.data_type)
            if n < MIN_BYTES:
                continue
            data = _payload(t)
            pad = b"\0" * (-offset % ALIGN)
            f.write(pad)
            digest.update(pad)
            offset += len(pad)
            f.write(data)
            digest.update(data)
            table[t.name] = (offset, len(data))
            offset += len(data)
            del data
            _point(t, weights.name, *table[t.name])  # drops raw_data/float_data
    light = ModelProto()
    light.ParseFromString(model.SerializeToString())
    del model
    gc.collect()
    return light, digest.hexdigest()


def _itemsize(code: int) -> int:
    try:
        return int(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code)).itemsize)
    except Exception:
        return 1


def _point(t: TensorProto, location: str, offset: int, length: int) -> None:
    """Make ``t`` an external-data reference (keeps name, dims, type)."""
    dims, name, dtype = list(t.dims), t.name, t.data_type
    t.Clear()
    t.name, t.data_type = name, dtype
    t.dims.extend(dims)
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)),
                       ("length", str(length))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value


def internalize(model: ModelProto, base_dir: Path) -> None:
    """Load external data back into ``model`` in place (self-contained slices of small models)."""
    onnx.external_data_helper.load_external_data_for_model(model, str(base_dir))


def shared_tensors(model: ModelProto) -> int:
    """How many initializers of ``model`` live in an external file."""
    return sum(1 for t in model.graph.initializer if is_external(t))


# --- fast path: find the weights in the file's protobuf wire format, never parse them ---------
# ModelProto.graph = 7, GraphProto.initializer = 5; TensorProto: raw_data = 9, external_data = 13,
# data_location = 14, typed payloads (float_data, int32_data, string_data, int64_data,
# double_data, uint64_data) = 4, 5, 6, 7, 10, 11.
_GRAPH, _INITIALIZER, _RAW, _EXTERNAL, _LOCATION = 7, 5, 9, 13, 14
_TYPED = {4, 5, 6, 7, 10, 11}


class _Unfit(Exception):
    """The file is not of the simple shape the fast path handles; take the parsing path."""


def _varint(buf: memoryview | bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise _Unfit("bad varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _fields(buf: memoryview, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """The fields of the message in ``buf[start:end]`` as ``(number, tag start, value start,
    value end)``; a length-delimited value starts after its length prefix."""
    pos = start
    while pos < end:
        tag_start = pos
        tag, pos = _varint(buf, pos)
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            _, nxt = _varint(buf, pos)
        elif wire == 1:
            nxt = pos + 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            nxt = pos + length
        elif wire == 5:
            nxt = pos + 4
        else:  # groups (3, 4) do not occur in ONNX
            raise _Unfit(f"wire type {wire}")
        if nxt > end:
            raise _Unfit("field runs past its message")
        yield field, tag_start, pos, nxt
        pos = nxt


def _key(field: int, wire: int) -> bytes:
    return _enc(field << 3 | wire)


def _enc(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _ld(field: int, payload: bytes) -> bytes:
    return _key(field, 2) + _enc(len(payload)) + payload


def _light_tensor(buf: memoryview, start: int, end: int, base: int, location: str
                  ) -> tuple[bytes, bool]:
    """A TensorProto's bytes with its raw_data replaced by an external reference into the
    source file (at ``base`` + the payload's offset); ``(bytes, shared?)``."""
    raw: tuple[int, int] | None = None
    keep = bytearray()
    typed = 0
    for field, tag_start, value, nxt in _fields(buf, start, end):
        if field in (_EXTERNAL, _LOCATION):
            raise _Unfit("already external")
        if field == _RAW:
            if raw is not None:
                raise _Unfit("raw_data twice")
            raw = (value, nxt)
            continue
        if field in _TYPED:
            typed += nxt - value
        keep += buf[tag_start:nxt]
    if raw is None or raw[1] - raw[0] < MIN_BYTES:
        if typed >= MIN_BYTES:
            raise _Unfit("weights in typed fields")  # the parsing path converts those
        return bytes(buf[start:end]), False
    for k, v in (("location", location), ("offset", str(base + raw[0])),
                 ("length", str(raw[1] - raw[0]))):
        keep += _ld(_EXTERNAL, _ld(1, k.encode()) + _ld(2, v.encode()))
    keep += _key(_LOCATION, 0) + _enc(TensorProto.EXTERNAL)
    return bytes(keep), True


def light_from_file(path: Path, weights: Path) -> tuple[ModelProto, str, int] | None:
    """Fast path of :func:`read_model` + :func:`externalize`, for models whose weights are
    ``raw_data`` in the file itself (what exporters write).

    ``weights`` becomes a byte copy of ``path`` (copied by the kernel; the source's sha256 is the
    weight file's), and the returned light model points its initializers of >=
    :data:`MIN_BYTES` at their ``raw_data`` bytes inside it. The file is mapped, and only its
    message headers are read: weight bytes never enter Python memory. Returns ``(model, sha256,
    shared tensors)``, or ``None`` when the file has another shape (external or typed data,
    repeated fields): then the parsing path runs.
    """
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            return None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            buf = memoryview(mm)
            try:
                light, shared = _light_bytes(buf, size, weights.name)
            except _Unfit:
                return None
            finally:
                buf.release()
    shutil.copyfile(path, weights)  # in the kernel (sendfile): no weight byte passes through us
    digest = hashlib.sha256()
    with open(path, "rb") as src:
        for block in iter(lambda: src.read(1 << 22), b""):
            digest.update(block)
    model = ModelProto()
    try:
        model.ParseFromString(light)
    except Exception:
        weights.unlink(missing_ok=True)
        return None
    return model, digest.hexdigest(), shared


def _light_bytes(buf: memoryview, size: int, location: str) -> tuple[bytes, int]:
    out = bytearray()
    graph: tuple[int, int] | None = None
    for field, tag_start, value, nxt in _fields(buf, 0, size):
        if field == _GRAPH:
            if graph is not None:
                raise _Unfit("graph twice")
            graph = (value, nxt)
        else:
            out += buf[tag_start:nxt]
    if graph is None:
        raise _Unfit("no graph")
    g = bytearray()
    shared = 0
    for field, tag_start, value, nxt in _fields(buf, *graph):
        if field == _INITIALIZER:
            tensor, is_shared = _light_tensor(buf, value, nxt, 0, location)
            shared += is_shared
            g += _ld(_INITIALIZER, tensor)
        else:
            g += buf[tag_start:nxt]
    out += _ld(_GRAPH, bytes(g))
    return bytes(out), shared
