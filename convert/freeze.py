"""Freeze graph inputs to constants and inline the ``If`` branches that then become decided.

``coinf split MODEL --freeze sr=16000``: the input ``sr`` becomes an initializer holding that
value; every ``If`` whose condition now depends only on constants is evaluated (onnxruntime on
the constant sub-graph alone) and replaced by the nodes of its taken branch, so cuts can go
inside what was a sub-graph. Nested ``If`` nodes are resolved the same way, until none is left
that constants decide. The bundle's manifest records the frozen values (``meta["frozen"]``) and
the wearable fills them (:func:`check_frozen`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import GraphProto, ModelProto, NodeProto, helper, numpy_helper

from coinf.errors import InputError, ModelError

META_KEY = "frozen"
MAX_PASSES = 16  # nested Ifs: one level per pass


def parse_freeze(items: Iterable[str]) -> dict[str, Any]:
    """``["sr=16000", "mode=[1,0]"]`` -> ``{"sr": 16000, "mode": [1, 0]}`` (JSON values)."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        try:
            value = json.loads(text) if sep and text.strip() else None
        except json.JSONDecodeError:
            value = None
        if not name or value is None or isinstance(value, dict | str):
            raise InputError(f"--freeze {item!r}: expected NAME=VALUE with VALUE a number or a "
                             "JSON list of numbers (e.g. sr=16000 or mask=[1,0,1])")
        out[name] = value
    return out


def _as_input_array(name: str, value: Any, vi: onnx.ValueInfoProto) -> np.ndarray:
    """``value`` as an array of input ``vi``'s dtype and (where static) shape."""
    tt = vi.type.tensor_type
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
    try:
        raw = np.asarray(value)
        arr = raw.astype(dtype)
    except (TypeError, ValueError) as exc:
        raise InputError(f"--freeze {name}: {value!r} is not a {dtype} value ({exc})") from None
    if raw.dtype.kind in "fc" and dtype.kind in "iub" and not np.array_equal(arr, raw):
        raise InputError(f"--freeze {name}={value!r}: input {name!r} is {dtype}; "
                         "give an integer value")
    dims = list(tt.shape.dim) if tt.HasField("shape") else None
    if dims is not None:
        want = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                for d in dims]
        if arr.ndim != len(want) and arr.size == 1 and all(w in (1, None) for w in want):
            arr = arr.reshape([1] * len(want))  # "sr=16000" for a [1] input
        if arr.ndim != len(want) or any(w is not None and w != s
                                        for w, s in zip(want, arr.shape, strict=True)):
            shown = ["?" if w is None else w for w in want]
            raise InputError(f"--freeze {name}: value has shape {list(arr.shape)}; input "
                             f"{name!r} has shape {shown}")
    return arr


def freeze_inputs(model: ModelProto, values: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Turn the named graph inputs into initializers (in place); returns the frozen arrays.

    Then resolves every ``If`` that constants decide (:func:`inline_constant_ifs`)."""
    g = model.graph
    inits = {t.name for t in g.initializer}
    real = {vi.name: vi for vi in g.input if vi.name not in inits}
    unknown = sorted(set(values) - set(real))
    if unknown:
        raise InputError(f"--freeze: {', '.join(unknown)} is not a model input; the inputs "
                         f"are {', '.join(real) or 'none'}")
    if len(values) >= len(real) and real:
        raise InputError("--freeze: every model input would be frozen; nothing would depend "
                         "on the input and there would be nothing to split")
    frozen: dict[str, np.ndarray] = {}
    for name, value in values.items():
        frozen[name] = _as_input_array(name, value, real[name])
    keep = [vi for vi in g.input if vi.name not in frozen]
    del g.input[:]
    g.input.extend(keep)
    for name, arr in frozen.items():
        g.initializer.append(numpy_helper.from_array(arr, name))
    inline_constant_ifs(model)
    return frozen


# -- If resolution -------------------------------------------------------------------------------
def _constant_names(g: GraphProto, dynamic_inputs: set[str]) -> tuple[set[str], list[int]]:
    """Tensors that depend only on initializers/Constants, and the indices of their nodes."""
    from coinf.convert.graph import node_inputs

    const = {t.name for t in g.initializer} - dynamic_inputs
    nodes: list[int] = []
    for i, node in enumerate(g.node):
        ins = node_inputs(node)
        if all(x in const for x in ins) and node.op_type not in _NONDETERMINISTIC:
            const.update(o for o in node.output if o)
            nodes.append(i)
    return const, nodes


_NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                               "RandomUniformLike", "Multinomial", "Bernoulli"})


def _evaluate(model: ModelProto, nodes: list[int], names: list[str]) -> list[np.ndarray]:
    """Values of constant tensors ``names``: onnxruntime on the constant nodes alone."""
    from coinf.convert.graph import ort_session

    g = model.graph
    used = {x for i in nodes for x in _all_inputs(g.node[i])}
    probe = helper.make_graph(
        [g.node[i] for i in nodes], "coinf_freeze_probe", [],
        [helper.make_empty_tensor_value_info(n) for n in names],
        initializer=[t for t in g.initializer if t.name in used or t.name in names])
    pm = helper.make_model(probe, opset_imports=list(model.opset_import))
    pm.ir_version = model.ir_version
    pm.functions.extend(model.functions)
    try:
        sess = ort_session(pm)
        return [np.asarray(v) for v in sess.run(names, {})]
    except Exception as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"cannot evaluate the condition of an If after freezing: {why}"
                         ) from None


def _all_inputs(node: NodeProto) -> list[str]:
    from coinf.convert.graph import node_inputs

    return list(node_inputs(node))


def _used_names(g: GraphProto, skip: int = -1) -> set[str]:
    """Every tensor and node name of ``g`` and its sub-graphs (but node ``skip``'s)."""
    names = {vi.name for vi in g.input} | {t.name for t in g.initializer}
    names |= {vi.name for vi in g.output}
    for k, node in enumerate(g.node):
        if k == skip:
            names.update(node.output)
            continue
        names.update(node.input)
        names.update(node.output)
        names.add(node.name)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                names |= _used_names(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    names |= _used_names(sub)
    return names


def _rename_in(graph: GraphProto, mapping: Mapping[str, str]) -> None:
    """Rename tensors throughout ``graph`` and its sub-graphs (captured names included)."""
    for node in graph.node:
        for k, x in enumerate(node.input):
            if x in mapping:
                node.input[k] = mapping[x]
        for k, x in enumerate(node.output):
            if x in mapping:
                node.output[k] = mapping[x]
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _rename_in(attr.g, mapping)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    _rename_in(sub, mapping)
    for vi in graph.output:
        if vi.name in mapping:
            vi.name = mapping[vi.name]


def _inline(g: GraphProto, index: int, branch: GraphProto, prefix: str) -> None:
    """Replace node ``index`` (an If) by ``branch``'s nodes; names local to the branch that
    collide with names outside get ``prefix``."""
    node = g.node[index]
    taken = GraphProto()
    taken.CopyFrom(branch)
    outer = _used_names(g, skip=index)
    local: set[str] = {t.name for t in taken.initializer}
    for n in taken.node:
        local.update(o for o in n.output if o)
    mapping: dict[str, str] = {}
    for name in sorted(local):
        if name in outer:
            new, k = f"{prefix}{name}", 1
            while new in outer or new in local:
                new, k = f"{prefix}{k}_{name}", k + 1
            mapping[name] = new
    _rename_in(taken, mapping)
    for t in taken.initializer:
        t.name = mapping.get(t.name, t.name)
        g.initializer.append(t)
    used_node_names = {n.name for n in g.node if n.name}
    new_nodes: list[NodeProto] = []
    for n in taken.node:
        if n.name:
            name, k = f"{node.name}/{n.name}" if node.name else n.name, 1
            while name in used_node_names:
                name, k = f"{node.name}/{n.name}_{k}", k + 1
            n.name = name
            used_node_names.add(name)
        new_nodes.append(n)
    for src, dst in zip(taken.output, node.output, strict=True):
        if dst:
            new_nodes.append(helper.make_node("Identity", [src.name], [dst],
                                              name=f"{node.name or 'If'}/out_{dst}"))
    rest = list(g.node[index + 1:])
    del g.node[index:]
    g.node.extend(new_nodes)
    g.node.extend(rest)


def inline_constant_ifs(model: ModelProto) -> int:
    """Inline every top-level ``If`` whose condition constants decide; returns how many."""
    g = model.graph
    inits = {t.name for t in g.initializer}
    dynamic = {vi.name for vi in g.input if vi.name not in inits}
    done = 0
    for _ in range(MAX_PASSES):
        const, const_nodes = _constant_names(g, dynamic)
        todo = [i for i, n in enumerate(g.node)
                if n.op_type == "If" and n.domain in ("", "ai.onnx") and n.input[0] in const]
        if not todo:
            return done
        i = todo[0]
        node = g.node[i]
        needed = [k for k in const_nodes if k < i]
        (cond,) = _evaluate(model, needed, [node.input[0]])
        if cond.size != 1:
            raise ModelError(f"If node {node.name!r}: condition has {cond.size} values")
        attr = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
        branch = next(a.g for a in node.attribute if a.name == attr)
        _inline(g, i, branch, prefix=f"{node.name or 'If'}__")
        done += 1
    return done


# -- the wearable's side --------------------------------------------------------------------------
def frozen_values(meta: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The frozen inputs a manifest records (``meta["frozen"]``), as arrays."""
    raw = meta.get(META_KEY) or {}
    out: dict[str, np.ndarray] = {}
    if isinstance(raw, dict):
        for name, spec in raw.items():
            if isinstance(spec, dict) and "value" in spec:
                out[str(name)] = np.asarray(spec["value"], dtype=str(spec.get("dtype", "float32")))
    return out


def manifest_entry(frozen: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """What ``meta["frozen"]`` holds: value (JSON), dtype and shape of every frozen input."""
    return {name: {"value": arr.tolist(), "dtype": arr.dtype.name, "shape": list(arr.shape)}
            for name, arr in frozen.items()}


def check_frozen(frozen: Mapping[str, np.ndarray], name: str, value: Any) -> None:
    """A caller may pass a frozen input only with its frozen value; anything else is refused."""
    want = frozen[name]
    try:
        got = np.asarray(value)
        same = got.size == want.size and np.array_equal(got.reshape(want.shape), want)
    except (TypeError, ValueError):
        same = False
    if not same:
        shown = np.asarray(value).tolist() if np.asarray(value).size <= 8 else "an array"
        raise InputError(f"input {name!r} was frozen to {want.tolist()} when the bundle was "
                         f"made (coinf split --freeze {name}=...); this run passes {shown}. "
                         f"Omit it, pass {want.tolist()}, or split again with the new value")


def without_frozen(meta: Mapping[str, Any], feed: Mapping[str, Any]) -> dict[str, Any]:
    """``feed`` minus the frozen inputs, each checked to hold its frozen value (the bundle's
    slices hold it as a constant: the caller may omit it)."""
    frozen = frozen_values(meta)
    for name in frozen:
        if name in feed:
            check_frozen(frozen, name, feed[name])
    return {k: v for k, v in feed.items() if k not in frozen}
