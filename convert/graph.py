"""Load an ONNX model and analyse its graph: resolved shapes, dynamic vs constant nodes.

:func:`load_graph` returns a :class:`Graph` whose ``model`` is a *resolved* copy of the input:
symbolic dims fixed, every node named, ``Shape``/``Size`` of statically shaped tensors folded into
``Constant`` nodes, and ``value_info`` holding a static shape for every tensor. Everything the
cutter and slicer need (producers, consumers, dynamic flags, byte sizes) is derived from it.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from coinf.convert.weights import externalize, light_from_file, read_model
from onnx import GraphProto, ModelProto, NodeProto, TensorProto, ValueInfoProto, helper

from coinf.errors import ModelError

MIN_OPSET = 9
MIN_IR = 3
SUBGRAPH_OPS = ("If", "Loop", "Scan")
#: onnxruntime's session option for the folder of external data of a model given as bytes
EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"


@dataclass(frozen=True)
class TensorType:
    """ONNX element type code and a static shape."""

    elem: int
    shape: tuple[int, ...]

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(helper.tensor_dtype_to_np_dtype(self.elem))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass
class Node:
    """One top-level node. ``inputs`` include outer-scope names captured by its sub-graphs."""

    index: int
    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    dynamic: bool = False
    has_subgraph: bool = False


@dataclass
class Graph:
    """A loaded, resolved and classified model."""

    model: ModelProto
    path: Path
    nodes: list[Node]
    inputs: list[str]
    outputs: list[str]
    initializers: dict[str, TensorProto]
    types: dict[str, TensorType]
    producer: dict[str, int]
    consumers: dict[str, list[int]]
    dynamic_tensors: set[str]
    dims: dict[str, int]
    folded: list[str] = field(default_factory=list)
    shape_source: str = "onnx"
    #: folder of the shared weight file the light ``model`` references (None: weights inline)
    weights_dir: Path | None = None
    #: sha256 of the source file's bytes, and of the weight file (when ``weights_dir`` is set)
    source_sha256: str = ""
    weights_sha256: str = ""

    @property
    def opset(self) -> int:
        return default_opset(self.model)

    @property
    def dynamic_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.dynamic]

    def ttype(self, name: str) -> TensorType:
        try:
            return self.types[name]
        except KeyError:
            raise ModelError(f"tensor {name!r} has no known static shape") from None


def default_opset(model: ModelProto) -> int:
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            return int(op.version)
    return 0


def subgraphs(node: NodeProto) -> list[GraphProto]:
    """The sub-graphs held in a node's attributes (If branches, Loop/Scan bodies)."""
    out: list[GraphProto] = []
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            out.append(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            out.extend(attr.graphs)
    return out


def captures(graph: GraphProto) -> list[str]:
    """Names a sub-graph uses but does not define (outer-scope captures), recursively, in order."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    seen: dict[str, None] = {}
    for node in graph.node:
        for name in node.input:
            if name and name not in defined:
                seen.setdefault(name)
        for sub in subgraphs(node):
            for name in captures(sub):
                if name not in defined:
                    seen.setdefault(name)
        defined.update(o for o in node.output if o)
    return list(seen)


def node_inputs(node: NodeProto) -> tuple[str, ...]:
    """Explicit non-empty inputs followed by outer-scope captures, without repeats."""
    seen: dict[str, None] = {}
    for name in node.input:
        if name:
            seen.setdefault(name)
    for sub in subgraphs(node):
        for name in captures(sub):
            seen.setdefault(name)
    return tuple(seen)


# -- loading --------------------------------------------------------------------------------
def _read(path: Path, weights: Path | None = None) -> tuple[ModelProto, str, str]:
    """The model (light when ``weights`` is given), the file's sha256 and the weight file's."""
    if not path.is_file():
        raise ModelError(f"{path}: no such model file (expected an .onnx file)")
    try:
        fast = light_from_file(path, weights) if weights is not None else None
        if fast is not None:
            model, digest, _ = fast
            weights_sha = digest  # the weight file is a byte copy of the model file
        else:
            model, digest = read_model(path)
            weights_sha = ""
            if weights is not None:
                model, weights_sha = externalize(model, weights)
    except Exception as exc:  # protobuf DecodeError, missing external data, ...
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelError(f"{path} is not a readable ONNX model: {msg}") from None
    if not model.HasField("graph") or not model.graph.node:
        raise ModelError(f"{path} is not an ONNX model (no graph nodes found)")
    return model, digest, weights_sha


def _check(model: ModelProto, path: Path, weights_dir: Path | None = None) -> None:
    if model.ir_version < MIN_IR:
        raise ModelError(f"{path}: IR version {model.ir_version} is too old (need >= {MIN_IR})")
    opset = default_opset(model)
    if opset < MIN_OPSET:
        raise ModelError(f"{path}: opset {opset} is too old (need default-domain opset >= "
                         f"{MIN_OPSET}; upgrade with onnx.version_converter)")
    try:
        if weights_dir is not None:  # a light model: its external data resolves from the folder
            probe = weights_dir / f".check-{path.stem}.onnx"
            probe.write_bytes(model.SerializeToString())
            try:
                onnx.checker.check_model(str(probe))
            finally:
                probe.unlink(missing_ok=True)
        elif model.ByteSize() < 2**31 - 1:
            onnx.checker.check_model(model)
        else:
            onnx.checker.check_model(str(path))
    except Exception as exc:
        first = str(exc).strip().splitlines()
        raise ModelError(f"{path} fails the ONNX checker: {first[0] if first else exc}") from None


def _name_nodes(graph: GraphProto) -> None:
    """Give unnamed (or duplicate-named) nodes stable generated names ``OpType_index``."""
    used = {n.name for n in graph.node if n.name}
    seen: set[str] = set()
    for i, node in enumerate(graph.node):
        if node.name and node.name not in seen:
            seen.add(node.name)
            continue
        base = f"{node.op_type}_{i}"
        name, k = base, 1
        while name in used or name in seen:
            name, k = f"{base}_{k}", k + 1
        node.name = name
        seen.add(name)
        used.add(name)


def _fix_dims(model: ModelProto, real_inputs: list[str], dims: Mapping[str, int],
              path: Path, data: Mapping[str, np.ndarray] | None = None) -> dict[str, int]:
    """Make every real graph input's shape static; returns the symbolic dims resolved.

    An axis takes, in order: ``dims["INPUT[AXIS]"]`` (one axis of one input, whatever its
    symbol: Paddle names H and W both ``?``), ``dims[SYMBOL]``, the size of that axis in
    ``data`` (representative inputs), else 1. An anonymous dim is named ``INPUT[AXIS]``."""
    used: dict[str, int] = {}
    symbols: set[str] = set()
    axes: set[str] = set()
    for vi in model.graph.input:
        if vi.name not in real_inputs:
            continue
        if not vi.type.HasField("tensor_type"):
            raise ModelError(f"{path}: input {vi.name!r} is not a tensor (sequences/maps are "
                             "not supported)")
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            raise ModelError(f"{path}: input {vi.name!r} has no shape (rank unknown); "
                             "cannot resolve it")
        sample = data_shape(data, vi.name, len(tt.shape.dim)) if data else None
        for axis, d in enumerate(tt.shape.dim):
            axis_key = f"{vi.name}[{axis}]"
            axes.add(axis_key)
            if d.HasField("dim_value") and d.dim_value > 0:
                if axis_key in dims and dims[axis_key] != d.dim_value:
                    raise ModelError(f"dim {axis_key}={dims[axis_key]}: that axis is fixed to "
                                     f"{d.dim_value} by the model")
                continue
            param = d.dim_param if d.HasField("dim_param") else ""
            symbols.add(param or axis_key)
            key = axis_key if axis_key in dims or not param else param
            default = sample[axis] if sample is not None else 1
            value = int(dims.get(key, default))
            if value <= 0:
                raise ModelError(f"dim {key}={value}: dimension values must be >= 1")
            d.Clear()
            d.dim_value = value
            used[key if key in dims or key == axis_key else param] = value
    unknown = sorted(set(dims) - symbols - axes)
    if unknown:
        names = ", ".join(sorted(symbols)) or "none"
        raise ModelError(f"unknown dim name(s) {', '.join(unknown)}; this model's symbolic "
                         f"dims are: {names} (any axis of an input: INPUT[AXIS]=V)")
    return dict(sorted(used.items()))


_AXIS_KEY = re.compile(r"^.+\[\d+\]$")


def data_shape(data: Mapping[str, np.ndarray], name: str, rank: int) -> tuple[int, ...] | None:
    """The shape of one feed of input ``name`` in representative ``data``: the array's shape
    when its rank is the input's, else its shape without the leading (samples) axis."""
    arr = data.get(name)
    if arr is None:
        return None
    shape = tuple(int(d) for d in np.shape(arr))
    if len(shape) == rank:
        return shape
    if len(shape) == rank + 1:
        return shape[1:]
    raise ModelError(f"--input-data: array {name!r} has shape {list(shape)}; input {name!r} "
                     f"has rank {rank} (give one feed, or N feeds on a new leading axis)")


def _static(vi: ValueInfoProto) -> TensorType | None:
    if not vi.type.HasField("tensor_type"):
        return None
    tt = vi.type.tensor_type
    if tt.elem_type == 0 or not tt.HasField("shape"):
        return None
    shape = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value") or d.dim_value < 0:
            return None
        shape.append(int(d.dim_value))
    return TensorType(int(tt.elem_type), tuple(shape))


def _infer(model: ModelProto) -> tuple[ModelProto, str | None]:
    """Run ONNX shape inference, strict first; returns (model, strict error or None)."""
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True,
                                                 data_prop=True), None
    except Exception as exc:
        err = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True), err
    except Exception:
        return model, err


def random_feed(model: ModelProto, types: Mapping[str, TensorType], inputs: Iterable[str],
                seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs: floats ~ N(0,1); ints in 0..min(vocab-1, 100) when a Gather tells the
    vocabulary size (or the model records ``coinf.zoo.input_high`` metadata: ids < high),
    else 0..9; bools at random."""
    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in model.graph.initializer}
    vocab: dict[str, int] = {}
    for prop in model.metadata_props:
        if prop.key == "coinf.zoo.input_high":
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                vocab.update({str(k): int(v) for k, v in json.loads(prop.value).items()})
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[0] in inits:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            dims = list(inits[node.input[0]].dims)
            if dims and -len(dims) <= axis < len(dims):
                v = int(dims[axis])
                vocab[node.input[1]] = min(vocab.get(node.input[1], v), v)
    feed: dict[str, np.ndarray] = {}
    for name in inputs:
        t = types[name]
        dt = t.dtype
        if dt.kind == "f":
            feed[name] = rng.standard_normal(t.shape).astype(dt)
        elif dt.kind in "iu":
            hi = min(vocab[name] - 1, 100) if name in vocab else 9
            feed[name] = rng.integers(0, max(hi, 0) + 1, size=t.shape).astype(dt)
        elif dt.kind == "b":
            feed[name] = rng.integers(0, 2, size=t.shape).astype(bool)
        else:
            raise ModelError(f"input {name!r} has dtype {dt} which coinf cannot feed")
    return feed


def ort_session(model: ModelProto, threads: int = 1, weights_dir: Path | None = None) -> Any:
    """An onnxruntime session with graph optimisations off (exact, op-by-op results).

    ``weights_dir``: the folder external data of ``model`` is read from (a light model)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if weights_dir is not None:
        opts.add_session_config_entry(EXTERNAL_FOLDER_KEY, str(weights_dir))
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def sample_feed(model: ModelProto, types: Mapping[str, TensorType], inputs: list[str],
                data: Mapping[str, np.ndarray] | None, seed: int = 0,
                index: int = 0) -> dict[str, np.ndarray]:
    """Feed ``index`` of representative ``data`` (one feed, or N on a new leading axis) for the
    inputs it has, seeded random values (:func:`random_feed`) for the others."""
    feed = random_feed(model, types, inputs, seed=seed)
    for name in inputs:
        if not data or name not in data:
            continue
        t = types[name]
        arr = np.asarray(data[name])
        if arr.shape != t.shape:
            diff = [a for a in range(arr.ndim) if arr.ndim == len(t.shape)
                    and arr.shape[a] != t.shape[a]]
            if arr.ndim == len(t.shape) + 1 and arr.shape[1:] == t.shape:
                arr = arr[min(index, len(arr) - 1)]
            elif len(diff) == 1 and t.shape[diff[0]] == 1:  # N feeds along a batch axis of 1
                k = min(index, arr.shape[diff[0]] - 1)
                arr = np.take(arr, [k], axis=diff[0])
            else:
                raise ModelError(f"--input-data: array {name!r} has shape {list(arr.shape)}; "
                                 f"input {name!r} is {list(t.shape)} (one feed, N of them on a "
                                 "new leading axis, or N along an axis of size 1)")
        if arr.dtype.kind not in "fiub":
            raise ModelError(f"--input-data: array {name!r} has dtype {arr.dtype}; expected "
                             "numbers")
        feed[name] = np.array(arr, dtype=t.dtype, order="C")  # 0-d stays 0-d
    return feed


def _ort_shapes(model: ModelProto, names: list[str], types: dict[str, TensorType],
                inputs: list[str], data: Mapping[str, np.ndarray] | None = None,
                weights_dir: Path | None = None) -> dict[str, TensorType]:
    """Learn static shapes by running the model once with ``names`` exposed as outputs."""
    probe = ModelProto()
    probe.CopyFrom(model)
    have = {o.name for o in probe.graph.output}
    for n in names:
        if n not in have:
            probe.graph.output.append(ValueInfoProto(name=n))
    sess = ort_session(probe, weights_dir=weights_dir)
    out_names = [o.name for o in sess.get_outputs()]
    values = sess.run(out_names, sample_feed(model, types, inputs, data))
    found: dict[str, TensorType] = {}
    for n, v in zip(out_names, values, strict=True):
        if not isinstance(v, np.ndarray):  # sequences/maps: not a tensor that can cross
            continue
        arr = v
        try:
            elem = int(helper.np_dtype_to_tensor_dtype(arr.dtype))
        except Exception:
            continue
        found[n] = TensorType(elem, tuple(int(d) for d in arr.shape))
    return found


def _fold_shapes(graph: GraphProto, types: dict[str, TensorType]) -> list[str]:
    """Replace Shape/Size of statically shaped tensors by Constant nodes (same name/output)."""
    folded: list[str] = []
    for i, node in enumerate(graph.node):
        if node.op_type not in ("Shape", "Size") or node.domain not in ("", "ai.onnx"):
            continue
        src = types.get(node.input[0])
        if src is None:
            continue
        if node.op_type == "Shape":
            attrs = {a.name: a.i for a in node.attribute}
            rank = len(src.shape)
            start = attrs.get("start", 0)
            end = attrs.get("end", rank)
            start = min(max(start + rank if start < 0 else start, 0), rank)
            end = min(max(end + rank if end < 0 else end, 0), rank)
            value = np.array(src.shape[start:end], dtype=np.int64)
        else:
            value = np.array(src.numel, dtype=np.int64)
        const = helper.make_node("Constant", [], [node.output[0]], name=node.name,
                                 value=onnx.numpy_helper.from_array(value, node.output[0]))
        graph.node[i].CopyFrom(const)
        types[node.output[0]] = TensorType(TensorProto.INT64, tuple(value.shape))
        folded.append(node.name)
    return folded


def load_graph(model_path: str | Path, dims: Mapping[str, int] | None = None, *,
               prepare: Callable[[ModelProto], None] | None = None,
               input_data: Mapping[str, np.ndarray] | None = None,
               weights: Path | None = None) -> Graph:
    """Load, check, resolve and classify a model. Raises :class:`ModelError` naming the problem.

    ``prepare`` edits the checked model first (``--freeze``: :mod:`convert.freeze`);
    ``input_data`` holds representative inputs (one feed, or N stacked on a new leading axis)
    that size symbolic dims and feed the trial run that learns shapes. With ``weights`` (a file
    path), initializers of >= 1 kB are stored there once and the graph's model references them
    as external data (:mod:`convert.weights`): usually the file is streamed there as is and its
    weights are never parsed; nothing later copies weight bytes.
    """
    path = Path(model_path)
    model, digest, weights_sha = _read(path, weights)
    weights_dir = None if weights is None else weights.parent
    _check(model, path, weights_dir)
    dims = dict(dims or {})
    if prepare is not None:
        prepare(model)
    g = model.graph
    init_names = {t.name for t in g.initializer}
    inputs = [vi.name for vi in g.input if vi.name not in init_names]
    if len(set(inputs)) != len(inputs):
        raise ModelError(f"{path}: duplicate graph input names")
    outputs = [vi.name for vi in g.output]
    _name_nodes(g)
    used_dims = _fix_dims(model, inputs, dims, path, input_data)
    # Old-style models list initializers as inputs: keep them only where IR < 4 requires it.
    if model.ir_version >= 4:
        keep = [vi for vi in g.input if vi.name not in init_names]
        del g.input[:]
        g.input.extend(keep)
    del g.value_info[:]
    for vi in g.output:
        if vi.type.HasField("tensor_type"):
            vi.type.tensor_type.ClearField("shape")

    inferred, strict_err = _infer(model)
    types = _static_types(inferred, g)
    missing = [o for n in g.node for o in n.output if o and o not in types]
    source = "onnx"
    if missing:
        source = "onnxruntime"
        try:
            types.update(_ort_shapes(model, missing, types, inputs, input_data, weights_dir))
        except ModelError:
            raise
        except Exception as exc:
            why = strict_err or str(exc).strip().splitlines()[0]
            raise ModelError(f"{path}: cannot resolve the shape of tensor {missing[0]!r} "
                             f"(shape inference and a trial onnxruntime run both failed: {why})"
                             ) from None
    folded = _fold_shapes(g, types)
    nodes, producer, consumers, dynamic_tensors = _classify(g, inputs)
    defined = set(inputs) | init_names | set(producer)
    for n in nodes:
        for x in n.inputs:
            if x not in defined:
                raise ModelError(f"{path}: node {n.name!r} uses undefined tensor {x!r}")
    for o in outputs:
        if o not in defined:
            raise ModelError(f"{path}: graph output {o!r} is not produced by any node")
    for tname in sorted(dynamic_tensors):
        if tname not in types:
            raise ModelError(f"{path}: cannot resolve the static shape of dynamic tensor {tname!r}"
                             " (tensors only: sequence/map values are not supported)"
                             + (f" ({strict_err})" if strict_err else ""))

    # Write the resolved shapes back so slices and the bundled model carry them.
    _annotate(model, types, inputs, outputs, init_names)
    return Graph(model=model, path=path, nodes=nodes, inputs=inputs, outputs=outputs,
                 initializers={t.name: t for t in g.initializer}, types=types,
                 producer=producer, consumers=consumers, dynamic_tensors=dynamic_tensors,
                 dims=used_dims, folded=folded, shape_source=source, weights_dir=weights_dir,
                 source_sha256=digest, weights_sha256=weights_sha)


def _static_types(inferred: ModelProto, g: GraphProto) -> dict[str, TensorType]:
    """The static types shape inference found (``inferred``), and those of ``g``'s
    initializers."""
    types: dict[str, TensorType] = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        t = _static(vi)
        if t is not None:
            types[vi.name] = t
    for t in g.initializer:
        types[t.name] = TensorType(int(t.data_type), tuple(int(d) for d in t.dims))
    return types


def _classify(g: GraphProto, inputs: list[str]
              ) -> tuple[list[Node], dict[str, int], dict[str, list[int]], set[str]]:
    """``g``'s nodes with their dynamic flags (dynamic = transitively depends on a real graph
    input), each tensor's producer and consumers, and the dynamic tensors."""
    nodes: list[Node] = []
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = {}
    dynamic_tensors: set[str] = set(inputs)
    for i, pn in enumerate(g.node):
        ins = node_inputs(pn)
        outs = tuple(o for o in pn.output if o)
        node = Node(i, pn.name, pn.op_type, ins, outs, has_subgraph=bool(subgraphs(pn)))
        node.dynamic = any(x in dynamic_tensors for x in ins)
        if node.dynamic:
            dynamic_tensors.update(outs)
        for x in ins:
            consumers.setdefault(x, [])
            if not consumers[x] or consumers[x][-1] != i:
                consumers[x].append(i)
        for o in outs:
            producer[o] = i
        nodes.append(node)
    return nodes, producer, consumers, dynamic_tensors


def value_info(name: str, t: TensorType) -> ValueInfoProto:
    return helper.make_tensor_value_info(name, t.elem, list(t.shape))


def _annotate(model: ModelProto, types: Mapping[str, TensorType], inputs: list[str],
              outputs: list[str], init_names: set[str]) -> None:
    g = model.graph
    for vi in g.output:
        if vi.name in types:
            vi.CopyFrom(value_info(vi.name, types[vi.name]))
    skip = set(inputs) | set(outputs) | init_names
    del g.value_info[:]
    for node in g.node:
        for o in node.output:
            if o and o not in skip and o in types:
                g.value_info.append(value_info(o, types[o]))
                skip.add(o)
