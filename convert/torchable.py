"""An ONNX tail made convertible by onnx2torch, exactly (issue 50; docs/BOTTLENECK.md).

`coinf compress` trains through the bundle's tail in torch (convert/bottleneck_train.py), and
onnx2torch 1.5.15 refuses constructs that tf2onnx (TFLite, Keras), paddle2onnx and torch.onnx
emit, or translates a few of them wrongly without a word. :func:`normalise` rewrites them on
the statically shaped slice into equivalent explicit forms; :func:`to_torch` converts the
result and, when onnx2torch still refuses a node, raises one line naming it
(:class:`~coinf.errors.ModelError`, worded to follow "tail": ``node 'n' (Op): ...``);
:func:`verify` compares torch with onnxruntime and names the first node whose output differs.
The rewrites themselves are in :mod:`~coinf.convert.torchable_ops` (and Resize's tables in
:mod:`~coinf.convert.torchable_resize`). Only :func:`normalise` (for the converter registry),
:func:`load_onnx2torch`, :func:`to_torch` and :func:`verify` import torch, inside.
"""

from __future__ import annotations

import contextlib
import math
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from coinf.convert.torchable_ops import (
    REDUCE,
    REPLACED,
    STD,
    Ctx,
    attrs_of,
    copy_node,
    opset_of,
    prune,
    refuse,
    resize,
    rewrite,
)
from onnx import AttributeProto, ModelProto, NodeProto, defs, helper, numpy_helper

from coinf.errors import ModelError

#: onnx2torch registers the most converters at opset 17; 18+ tails are brought down to it
OPSET = 17
#: below this the helper nodes' forms differ (Pad, Slice inputs); older tails are upgraded
MIN_OPSET = 11
_RANDOM = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                     "Multinomial", "Bernoulli"})
#: ops whose versions after 17 (to 25) only widened their types
_WIDENED = frozenset({
    "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Constant", "ConstantOfShape", "Conv",
    "ConvTranspose", "Cos", "Cosh", "Dropout", "Elu", "Equal", "EyeLike", "Flatten",
    "GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool", "GRU", "HardSigmoid", "HardSwish",
    "Identity", "InstanceNormalization", "IsInf", "IsNaN", "LpNormalization", "LSTM", "MaxPool",
    "Reshape", "RNN", "RoiAlign", "Round", "Selu", "Shape", "Sin", "Sinh", "Size", "Softplus",
    "Softsign", "Squeeze", "Tan", "ThresholdedRelu", "Transpose", "Unsqueeze"})
#: ... or gained attributes, with the value that keeps the opset-17 meaning (others refused)
_NEUTRAL: dict[str, dict[str, Any]] = {
    "Cast": {"saturate": 1}, "CastLike": {"saturate": 1}, "AveragePool": {"dilations": 1},
    "LpPool": {"dilations": 1, "ceil_mode": 0}}


# -- shapes ------------------------------------------------------------------------------------
def infer(model: ModelProto, runtime: bool = False) -> ModelProto:
    """Shapes and types inferred afresh (with constant data propagation); with ``runtime``, the
    static shapes inference leaves out (e.g. a Reshape to a Shape) measured as well."""
    del model.graph.value_info[:]
    with contextlib.suppress(Exception):  # help, not a requirement: rewrites needing a shape say
        model = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    if runtime:
        _measure_shapes(model)
    return model


def _static(vi: onnx.ValueInfoProto) -> bool:
    tt = vi.type.tensor_type
    return tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim)


def _measure_shapes(model: ModelProto) -> None:
    """Shapes of the values inference left without one, from onnxruntime on two random feeds
    of the (static) inputs; a shape that differs between them depends on the data and stays
    unknown."""
    import onnxruntime as ort

    g = model.graph
    known = {v.name for v in [*g.value_info, *g.input, *g.output] if _static(v)}
    missing = [o for n in g.node for o in n.output if o and o not in known]
    inits = {t.name for t in g.initializer}
    feeds = [i for i in g.input if i.name not in inits]
    if not missing or not all(_static(i) for i in feeds):
        return
    probe = ModelProto()
    probe.CopyFrom(model)
    outs = {o.name for o in g.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=o) for o in missing if o not in outs)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.log_severity_level = 1, 3
    runs = []
    try:
        sess = ort.InferenceSession(probe.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
        for seed in (0, 1):
            rng, feed = np.random.default_rng(seed), {}
            for i in feeds:
                dt = np.dtype(helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
                shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
                feed[i.name] = rng.standard_normal(shape).astype(dt) if dt.kind == "f" \
                    else np.zeros(shape, dt)  # zeros: valid indices
            runs.append(sess.run(missing, feed))
    except Exception:  # onnxruntime cannot run it on these: the shapes stay unknown
        return
    for name, a, b in zip(missing, *runs, strict=True):
        if name not in outs and a.shape == b.shape:
            elem = helper.np_dtype_to_tensor_dtype(a.dtype)
            stale = [v for v in g.value_info if v.name == name]
            for v in stale:
                g.value_info.remove(v)
            g.value_info.append(helper.make_tensor_value_info(name, elem, a.shape))


def outputs_apart(model: ModelProto) -> None:
    """Each graph output made by its own single-output node (an Identity where needed):
    onnx2torch returns a node's whole result for an output it makes, so one output of a TopK or
    Split came back as the tuple, and two outputs of one node as one."""
    g = model.graph
    made_by = {o: n for n in g.node for o in n.output}
    seen: set[int] = set()
    taken = {o for n in g.node for o in n.output} | {i.name for i in g.input} | \
        {t.name for t in g.initializer}
    for out in g.output:
        node = made_by.get(out.name)
        if node is None or (len(node.output) == 1 and id(node) not in seen):
            if node is not None:  # (None: an input or initializer handed out, left as it is)
                seen.add(id(node))
            continue
        inner, i = f"{out.name}/value", 0
        while inner in taken:
            i += 1
            inner = f"{out.name}/value_{i}"
        taken.add(inner)
        for n in g.node:
            n.input[:] = [inner if x == out.name else x for x in n.input]
            n.output[:] = [inner if x == out.name else x for x in n.output]
        g.node.append(helper.make_node("Identity", [inner], [out.name],
                                       name=f"{out.name}/output"))


# -- constants ----------------------------------------------------------------------------------
def _constants(model: ModelProto) -> None:
    """Constant nodes -> initializers (onnx2torch takes weights only as initializers)."""
    outputs = {o.name for o in model.graph.output}
    keep = []
    for node in model.graph.node:
        value = None
        if node.op_type == "Constant" and node.domain in STD and node.output[0] not in outputs:
            a = attrs_of(node)
            if "value" in a:
                value = numpy_helper.to_array(a["value"])
            elif "value_float" in a or "value_floats" in a:
                value = np.array(a.get("value_float", a.get("value_floats")), np.float32)
            elif "value_int" in a or "value_ints" in a:
                value = np.array(a.get("value_int", a.get("value_ints")), np.int64)
        if value is None or value.dtype.kind not in "biuf":
            keep.append(node)
        else:
            model.graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
    del model.graph.node[:]
    model.graph.node.extend(keep)


def _fold(model: ModelProto) -> None:
    """Evaluate (onnxruntime) the nodes that depend on initializers only, e.g. a weight's Cast
    from float16, DequantizeLinear or Transpose. Shape subgraphs are left alone: folding them
    would bake the batch size 1 of the slices into the tail."""
    import onnxruntime as ort

    g = model.graph
    known = {t.name for t in g.initializer}  # listed as inputs too (IR < 4): weights all the same
    outputs = {o.name for o in g.output}
    fold = []
    for node in g.node:
        if (node.domain in STD and node.op_type not in _RANDOM and node.input
                and not any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS)
                            for a in node.attribute)
                and all(i == "" or i in known for i in node.input)
                and not set(node.output) & outputs):
            fold.append(node)
            known.update(o for o in node.output if o)
    if not fold:
        return
    folded = {id(n) for n in fold}
    rest = [n for n in g.node if id(n) not in folded]
    needed = list(dict.fromkeys(i for n in rest for i in n.input
                                if any(i in f.output for f in fold)))
    infos = {v.name: v for v in g.value_info}
    if not all(n in infos for n in needed):
        return
    sub = helper.make_graph(fold, "fold", [], [infos[n] for n in needed], list(g.initializer))
    sub_model = helper.make_model(sub, opset_imports=list(model.opset_import),
                                  ir_version=model.ir_version)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.log_severity_level = 1, 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        values = ort.InferenceSession(sub_model.SerializeToString(), opts,
                                      providers=["CPUExecutionProvider"]).run(needed, {})
    except Exception:  # leave them; onnx2torch may still take them as nodes
        return
    del g.node[:]
    g.node.extend(rest)
    g.initializer.extend(numpy_helper.from_array(np.asarray(v), n)
                         for n, v in zip(needed, values, strict=True))
    prune(model)


# -- opsets -------------------------------------------------------------------------------------
def _since(op: str, opset: int) -> int | None:
    try:
        return int(defs.get_schema(op, opset, "").since_version)
    except Exception:
        return None


def _unconverted(model: ModelProto, opset: int | None = None) -> list[NodeProto]:
    """Nodes onnx2torch has no converter for at ``opset`` (default: the model's), leaving out
    those a rewrite replaces."""
    load_onnx2torch()
    from onnx2torch.node_converters.registry import get_converter

    opset, out = opset or opset_of(model), []
    for node in model.graph.node:
        if node.op_type in REPLACED and node.domain in STD:
            continue
        try:
            get_converter(node.op_type, opset, node.domain or "")
        except NotImplementedError:
            out.append(node)
    return out


def _upgrade(model: ModelProto) -> ModelProto:
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, OPSET)
    except Exception as exc:
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"is at opset {opset_of(model)}, older than onnx2torch converts, and "
                         f"onnx's version converter cannot raise it to {OPSET}: {first}") from None


def _downgrade(model: ModelProto) -> ModelProto:
    """Opset 18+ -> 17 by hand (onnx's converter has no Split or Pad adapter down to 17)."""
    ctx = Ctx(model)
    out: list[NodeProto] = []
    for node in model.graph.node:
        since = _since(node.op_type, ctx.opset) if node.domain in STD else None
        if since is None or since <= OPSET:
            out.append(node)
            continue
        ctx.nodes, ctx.prefix = [], node.name or node.output[0]
        down = _DOWN.get(node.op_type)
        if down is not None:
            down(ctx, node)
        elif node.op_type in _WIDENED or node.op_type in _NEUTRAL:
            a = attrs_of(node)
            for key, neutral in _NEUTRAL.get(node.op_type, {}).items():
                if key in a and any(v != neutral for v in np.atleast_1d(a[key])):
                    raise refuse(node, f"{key}={a[key]} (opset {since}) has no opset-{OPSET} "
                                       f"form onnx2torch converts")
            ctx.nodes.append(copy_node(node, drop=list(_NEUTRAL.get(node.op_type, {}))))
        else:
            raise refuse(node, f"{node.op_type} of opset {since} has no opset-{OPSET} form "
                               f"coinf knows to be the same")
        out.extend(ctx.nodes)
    del model.graph.node[:]
    model.graph.node.extend(out)
    model.graph.initializer.extend(ctx.inits)
    for o in model.opset_import:
        if o.domain in STD:
            o.version = OPSET
    model.ir_version = min(model.ir_version, 8)
    return model


def _down_reduce(ctx: Ctx, node: NodeProto) -> None:
    a = attrs_of(node)
    axes = None
    if len(node.input) > 1 and node.input[1]:
        axes = ctx.consts.get(node.input[1])
        if axes is None:
            raise refuse(node, "its axes are computed at run time; onnx2torch takes them "
                               "only as constants")
    if (axes is None or axes.size == 0) and a.get("noop_with_empty_axes", 0):
        ctx.emit("Identity", [node.input[0]], node.output[0])
        return
    extra = {"axes": [int(v) for v in axes]} if axes is not None and axes.size else {}
    ctx.nodes.append(copy_node(node, ("noop_with_empty_axes", "axes"), [node.input[0]], **extra))


def _down_split(ctx: Ctx, node: NodeProto) -> None:
    a = attrs_of(node)
    if "num_outputs" in a and (len(node.input) < 2 or not node.input[1]):
        axis = a.get("axis", 0)
        length = ctx.shape(node, node.input[0], "num_outputs")[axis]
        n = int(a["num_outputs"])
        chunk = -(-length // n)
        sizes = [chunk] * (n - 1) + [length - chunk * (n - 1)]
        inputs = [node.input[0], ctx.const(np.array(sizes, np.int64), "split")]
        ctx.nodes.append(copy_node(node, ("num_outputs",), inputs))
    else:
        ctx.nodes.append(copy_node(node, ("num_outputs",)))


def _down_pad(ctx: Ctx, node: NodeProto) -> None:
    a = attrs_of(node)
    if a.get("mode", "constant") == "wrap":
        raise refuse(node, "mode 'wrap' (opset 19) has no form onnx2torch converts")
    inputs = list(node.input[:3])
    if len(node.input) > 3 and node.input[3]:
        pads, axes = ctx.consts.get(node.input[1]), ctx.consts.get(node.input[3])
        rank = ctx.ranks.get(node.input[0])
        if pads is None or axes is None or rank is None:
            raise refuse(node, "its pads or axes are computed at run time")
        full = np.zeros(2 * rank, np.int64)
        for i, ax in enumerate(int(v) % rank for v in axes):
            full[ax], full[rank + ax] = pads[i], pads[len(axes) + i]
        inputs[1] = ctx.const(full, "pads")
    ctx.nodes.append(copy_node(node, inputs=inputs))


def _down_resize(ctx: Ctx, node: NodeProto) -> None:
    a = attrs_of(node)
    if a.get("antialias", 0) or a.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise refuse(node, "antialias or keep_aspect_ratio_policy (opset 18) has no form "
                           "onnx2torch converts")
    if "axes" in a or a.get("coordinate_transformation_mode") == "half_pixel_symmetric":
        if not resize(ctx, node, force=True):
            raise refuse(node, "its axes or half_pixel_symmetric need static shapes and "
                               "constant scales")
        return
    ctx.nodes.append(copy_node(node, ("antialias", "keep_aspect_ratio_policy")))


def _down_gelu(ctx: Ctx, node: NodeProto) -> None:
    x, dt = node.input[0], ctx.np_type(node.input[0])
    if attrs_of(node).get("approximate", "none") == "tanh":
        cube = ctx.emit("Mul", [ctx.emit("Mul", [x, x]), x])
        inner = ctx.emit("Add", [x, ctx.emit("Mul", [cube, ctx.const(dt.type(0.044715))])])
        t = ctx.emit("Tanh", [ctx.emit("Mul", [inner, ctx.const(dt.type(math.sqrt(2 / math.pi)))])])
    else:
        t = ctx.emit("Erf", [ctx.emit("Div", [x, ctx.const(dt.type(math.sqrt(2.0)))])])
    half = ctx.emit("Mul", [x, ctx.const(dt.type(0.5))])
    ctx.emit("Mul", [half, ctx.emit("Add", [t, ctx.const(dt.type(1.0))])], node.output[0])


def _down_mish(ctx: Ctx, node: NodeProto) -> None:
    t = ctx.emit("Tanh", [ctx.emit("Softplus", [node.input[0]])])
    ctx.emit("Mul", [node.input[0], t], node.output[0])


_DOWN: dict[str, Callable[[Ctx, NodeProto], None]] = {
    **dict.fromkeys(REDUCE, _down_reduce), "Split": _down_split, "Pad": _down_pad,
    "Resize": _down_resize, "Gelu": _down_gelu, "Mish": _down_mish,
}


# -- the pipeline -------------------------------------------------------------------------------
def normalise(model: ModelProto) -> ModelProto:
    """A copy of ``model`` that onnx2torch converts to the same function: see the module
    docstring and docs/BOTTLENECK.md. Raises :class:`ModelError` naming the node for what it
    cannot make exact."""
    m = ModelProto()
    m.CopyFrom(model)
    for node in m.graph.node:
        if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute):
            raise refuse(node, "control flow (a subgraph) has no converter in onnx2torch")
        if node.domain not in STD:
            raise refuse(node, f"custom domain {node.domain!r} has no converter in onnx2torch")
    m = infer(m)
    _constants(m)
    _fold(m)
    opset = opset_of(m)
    if opset > OPSET:
        m = _downgrade(infer(m, runtime=True))
    elif opset < MIN_OPSET:
        m = _upgrade(m)
    elif opset < OPSET and len(_unconverted(m)) > len(_unconverted(m, OPSET)):
        with contextlib.suppress(ModelError):  # else the node is named at conversion
            m = _upgrade(m)
    m = infer(m)
    _constants(m)
    _fold(m)
    m = infer(m, runtime=True)
    rewrite(m)
    outputs_apart(m)
    return infer(m, runtime=True)


def load_onnx2torch() -> Any:
    """onnx2torch, importable without torchvision: it needs torchvision only to run the
    NonMaxSuppression and RoiAlign converters, and the PyPI torchvision wheel does not load with
    the CPU torch. A stand-in that refuses those two ops is put in place when torchvision is
    missing."""
    try:
        import torchvision  # noqa: F401
    except Exception:  # missing, or the CUDA wheel that fails to load with the CPU torch
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]

        def refuse_op(*_: Any, **__: Any) -> Any:
            raise NotImplementedError("this tail uses NonMaxSuppression/RoiAlign, which "
                                      "onnx2torch runs with torchvision (not installed)")

        stub = types.ModuleType("torchvision")
        ops = types.ModuleType("torchvision.ops")
        ops.nms = ops.roi_align = ops.box_convert = refuse_op  # type: ignore[attr-defined]
        stub.ops = ops  # type: ignore[attr-defined]
        sys.modules["torchvision"] = stub
        sys.modules["torchvision.ops"] = ops
    import onnx2torch

    return onnx2torch


def _reason(exc: BaseException, op: str, opset: int) -> str:
    text = " ".join(str(exc).split())
    if isinstance(exc, NotImplementedError) and text.startswith("Converter is not implemented"):
        return f"onnx2torch has no converter for {op} at opset {opset}"
    if isinstance(exc, KeyError):
        return f"onnx2torch takes its input {exc.args[0]!r} only as a constant (an initializer)"
    return f"onnx2torch: {text or type(exc).__name__}"


def to_torch(model: ModelProto) -> tuple[Any, ModelProto]:
    """The normalised ``model`` as a torch ``fx.GraphModule`` in eval mode (each module
    carries its ONNX node's ``onnx_mapping``), and that normalised model. A node onnx2torch
    refuses is one :class:`ModelError` line."""
    norm = normalise(model)
    o2t = load_onnx2torch()
    try:
        return o2t.convert(norm, attach_onnx_mapping=True).eval(), norm
    except Exception as exc:
        raise _blame(norm, exc) from None


def _blame(model: ModelProto, exc: Exception) -> ModelError:
    """Convert node by node to name the one onnx2torch refuses."""
    from onnx2torch.node_converters.registry import get_converter
    from onnx2torch.onnx_graph import OnnxGraph

    opset = opset_of(model)
    graph = OnnxGraph(model.graph)
    for proto, node in zip(model.graph.node, graph.nodes.values(), strict=True):
        try:
            get_converter(node.operation_type, opset, node.domain or "")(node, graph)
        except Exception as err:
            return refuse(proto, _reason(err, proto.op_type, opset))
    return ModelError(f"is refused by onnx2torch, at no single node: {_reason(exc, '?', opset)}")


def _close(got: np.ndarray, ref: np.ndarray, tol: float) -> bool:
    if got.shape != ref.shape:
        return False
    if ref.dtype.kind != "f":
        return bool(np.array_equal(got, ref))
    fin = np.isfinite(ref)
    if not np.array_equal(fin, np.isfinite(got)) or \
            not np.array_equal(got[~fin], ref[~fin], equal_nan=True):
        return False
    if not fin.any():
        return True
    scale = float(np.abs(ref[fin]).max())
    return float(np.abs(got[fin].astype(np.float64) - ref[fin]).max()) <= tol * (scale + tol)


def verify(net: Any, norm: ModelProto, x: np.ndarray, tol: float = 1e-3) -> None:
    """Run ``net`` and ``norm`` (both from :func:`to_torch`), the latter in onnxruntime, on
    ``x`` (the one input); when an output differs by more than ``tol`` of its largest
    magnitude, raise :class:`ModelError` naming the first node whose output differs."""
    import onnxruntime as ort
    import torch

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    inits = {t.name for t in norm.graph.initializer}
    feed = next(i.name for i in norm.graph.input if i.name not in inits)
    refs = ort.InferenceSession(norm.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"]).run(None, {feed: x})
    seen: dict[str, np.ndarray] = {}

    by_output = {o: node for node in norm.graph.node for o in node.output}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            mapping = getattr(self.module.get_submodule(n.target), "onnx_mapping", None) \
                if n.op == "call_module" else None
            try:
                out = super().run_node(n)
            except Exception as exc:  # a translation torch cannot run: name the ONNX node
                node = next((by_output[o] for o in getattr(mapping, "outputs", ())
                             if o in by_output), None)
                why = f"torch cannot run onnx2torch's translation ({type(exc).__name__}: " \
                      f"{str(exc).splitlines()[0] if str(exc) else ''})"
                if node is None:
                    raise ModelError(why) from None
                raise refuse(node, why) from None
            if mapping is not None:
                vals = out if isinstance(out, list | tuple) else [out]
                for name, v in zip(mapping.outputs, vals, strict=False):
                    if isinstance(v, torch.Tensor):
                        seen[name] = v.detach().numpy()
            return out

    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Using a non-tuple sequence")  # onnx2torch
        out = Recorder(net).run(torch.from_numpy(np.ascontiguousarray(x)))
    outs = [o.detach().numpy() for o in (out if isinstance(out, list | tuple) else [out])]
    if len(outs) == len(refs) and all(_close(g, r, tol) for g, r in zip(outs, refs, strict=True)):
        return
    probe = ModelProto()
    probe.CopyFrom(norm)
    have = {o.name for o in probe.graph.output}
    probe.graph.output.extend(v for v in norm.graph.value_info
                              if v.name in seen and v.name not in have)
    names = [o.name for o in probe.graph.output]
    mids = dict(zip(names, ort.InferenceSession(probe.SerializeToString(), opts,
                                                providers=["CPUExecutionProvider"]).run(
        names, {feed: x}), strict=True))
    for node in norm.graph.node:
        for o in node.output:
            if o in seen and o in mids and not _close(seen[o], mids[o], tol):
                raise refuse(node, "onnx2torch's translation gives other values than "
                                   "onnxruntime (a construct coinf does not normalise)")
    raise ModelError("gives other outputs in torch than in onnxruntime, and no single node's "
                     "output shows where")
