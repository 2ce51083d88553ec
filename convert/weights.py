"""The bundle's shared weight file: large initializers stored once, referenced by every slice.

Splitting a big model must not copy its weights around in memory (issue 17: a 548 MB VGG took
3.4 GB). :func:`read_model` reads a model file once (hashing the same bytes), and
:func:`externalize` streams every initializer of >= :data:`MIN_BYTES` into one file, 64-byte
aligned, in file order, and returns a *light* copy of the model whose initializers point at it
as ONNX external data (``location``, ``offset``, ``length``; the location is the file's bare
name, so a bundle stays relocatable). Slices built from the light model share the file without
any weight byte being copied again. :func:`internalize` is the way back for small models whose
slices stay self-contained.
"""

from __future__ import annotations

import gc
import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import GraphProto, ModelProto, TensorProto, numpy_helper

from coinf.errors import BundleError

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
    if any(_is_external(t) for t in all_tensors(model.graph)):
        onnx.external_data_helper.load_external_data_for_model(model, str(path.parent))
    return model, digest


def _is_external(t: TensorProto) -> bool:
    return t.HasField("data_location") and t.data_location == TensorProto.EXTERNAL


def all_tensors(graph: GraphProto) -> Iterator[TensorProto]:
    """Every TensorProto of a graph: initializers, sparse ones, node attributes, sub-graphs."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from all_tensors(attr.g)
            for sub in attr.graphs:
                yield from all_tensors(sub)


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
            if t.data_type == TensorProto.STRING or t.name in table or _is_external(t):
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


def check_locations(model: ModelProto, path: Path) -> None:
    """Refuse a slice whose external data lies outside its own folder.

    A manifest's paths are checked by :func:`convert.bundle.inside`; an ONNX file can name its
    own weight files too, so a hostile bundle could make onnxruntime read ``/etc/...`` or
    ``../other``. Only bare or nested relative names inside the slice's folder pass.
    """
    root = path.parent.resolve()
    for t in all_tensors(model.graph):
        if not _is_external(t):
            continue
        loc = next((e.value for e in t.external_data if e.key == "location"), "")
        rel = Path(loc)
        if not loc or rel.is_absolute() or not (root / rel).resolve().is_relative_to(root):
            raise BundleError(f"bundle file {path}: tensor {t.name!r} names external data "
                              f"{loc!r} outside the bundle's folder")


def shared_tensors(model: ModelProto) -> int:
    """How many initializers of ``model`` live in an external file."""
    return sum(1 for t in model.graph.initializer if _is_external(t))
