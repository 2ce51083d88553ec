"""Graph rewrites behind :mod:`coinf.convert.torchable`: each takes one node of a statically
shaped ONNX graph at opset 11..17 and emits an equivalent form that onnx2torch 1.5.15 converts
to the same function (or leaves the node alone); :class:`Ctx` holds the shapes, types and
constants they read and the nodes and initializers they add.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from coinf.convert.torchable_resize import resize_plan
from onnx import ModelProto, NodeProto, helper, numpy_helper

from coinf.errors import ModelError

STD = ("", "ai.onnx")
REDUCE = frozenset({"ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax",
                    "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSumSquare"})
_SELU = (1.67326319217681884765625, 1.05070102214813232421875)
_FLOAT_LIMITS = {np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)}


def label(node: NodeProto) -> str:
    """How an error names a node: ``node 'name' (Op)``."""
    name = node.name or f"<unnamed, output {node.output[0] if node.output else '?'}>"
    return f"node {name!r} ({node.op_type})"


def refuse(node: NodeProto, what: str) -> ModelError:
    """The one-line error for a node: ``node 'name' (Op): what``."""
    return ModelError(f"{label(node)}: {what}".replace("\n", " "))


def attrs_of(node: NodeProto) -> dict[str, Any]:
    """A node's attributes as Python values (strings decoded)."""
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def copy_node(node: NodeProto, drop: Sequence[str] = (), inputs: Sequence[str] | None = None,
              **attrs: Any) -> NodeProto:
    """``node`` with ``drop`` attributes removed and ``attrs`` set."""
    kept = {k: v for k, v in attrs_of(node).items() if k not in drop and k not in attrs}
    return helper.make_node(node.op_type, list(node.input if inputs is None else inputs),
                            list(node.output), name=node.name, domain=node.domain,
                            **kept, **attrs)


def opset_of(model: ModelProto) -> int:
    """The model's opset of the default ONNX domain."""
    return max((o.version for o in model.opset_import if o.domain in STD), default=1)


class Ctx:
    """The graph being rewritten: static shapes, element types, constants, fresh names, and
    the nodes the current rewrite emits."""

    def __init__(self, model: ModelProto) -> None:
        g = model.graph
        self.opset = opset_of(model)
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.types: dict[str, int] = {}
        self.ranks: dict[str, int] = {}
        for vi in [*g.input, *g.value_info, *g.output]:
            tt = vi.type.tensor_type
            if tt.elem_type:
                self.types[vi.name] = tt.elem_type
            if tt.HasField("shape"):
                self.ranks[vi.name] = len(tt.shape.dim)
                if all(d.HasField("dim_value") for d in tt.shape.dim):
                    self.shapes[vi.name] = tuple(d.dim_value for d in tt.shape.dim)
        # an initializer also listed as an input (IR < 4) is a weight too, as onnx2torch has it
        self.consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        feeds = {i.name for i in g.input} - set(self.consts)
        for t in g.initializer:
            self.types[t.name] = t.data_type
            self.shapes[t.name] = tuple(t.dims)
            self.ranks[t.name] = len(t.dims)
        self.used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
        self.taken = {n.name for n in g.node} | {o for n in g.node for o in n.output} | \
            set(self.types) | feeds
        self.inits: list[onnx.TensorProto] = []
        self.nodes: list[NodeProto] = []
        self.prefix = "tq"

    def fresh(self, hint: str) -> str:
        name, i = hint, 0
        while name in self.taken:
            i += 1
            name = f"{hint}_{i}"
        self.taken.add(name)
        return name

    def const(self, value: Any, hint: str = "c") -> str:
        arr = np.asarray(value)
        name = self.fresh(f"{self.prefix}/{hint}")
        self.inits.append(numpy_helper.from_array(arr, name))
        self.consts[name] = arr
        return name

    def emit(self, op: str, inputs: Sequence[str], out: str | None = None, **attrs: Any) -> str:
        out = out or self.fresh(f"{self.prefix}/{op}")
        self.nodes.append(helper.make_node(op, list(inputs), [out],
                                           name=self.fresh(f"{self.prefix}/{op}"), **attrs))
        return out

    def np_type(self, name: str) -> np.dtype:
        return np.dtype(helper.tensor_dtype_to_np_dtype(self.types.get(name, 1)))

    def pad(self, x: str, begin: Sequence[int], end: Sequence[int], value: float = 0.0) -> str:
        """Constant-pad the spatial axes (after N, C) of ``x``."""
        pads = np.array([0, 0, *begin, 0, 0, *end], np.int64)
        return self.emit("Pad", [x, self.const(pads, "pads"),
                                 self.const(np.array(value, self.np_type(x)), "value")])

    def reduce(self, op: str, x: str, axes: Sequence[int], out: str | None = None,
               keepdims: int = 1) -> str:
        if self.opset >= 18 or (op == "ReduceSum" and self.opset >= 13):
            return self.emit(op, [x, self.const(np.array(axes, np.int64), "axes")], out,
                             keepdims=keepdims)
        return self.emit(op, [x], out, axes=list(axes), keepdims=keepdims)

    def shape(self, node: NodeProto, name: str, why: str) -> tuple[int, ...]:
        if name not in self.shapes:
            raise refuse(node, f"{why} needs the static shape of {name!r}, which shape "
                               f"inference did not give")
        return self.shapes[name]


def prune(model: ModelProto) -> None:
    """Drop the initializers no node or output reads."""
    g = model.graph
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)


# -- rewrites -------------------------------------------------------------------
def _same_pads(ctx: Ctx, node: NodeProto, a: dict[str, Any], kernel: Sequence[int]
               ) -> list[int]:
    """Explicit pads for ``auto_pad``: SAME_UPPER puts the odd pad at the end, SAME_LOWER at the
    beginning (as onnxruntime does)."""
    mode = a["auto_pad"]
    n = len(kernel)
    if mode == "VALID":
        return [0] * 2 * n
    if mode not in ("SAME_UPPER", "SAME_LOWER"):
        raise refuse(node, f"auto_pad {mode!r} is not an ONNX value")
    spatial = ctx.shape(node, node.input[0], f"auto_pad {mode}")[2:]
    strides, dil = a.get("strides", [1] * n), a.get("dilations", [1] * n)
    begin, end = [], []
    for length, k, s, d in zip(spatial, kernel, strides, dil, strict=True):
        total = max(0, (-(-length // s) - 1) * s + (k - 1) * d + 1 - length)
        lo = total // 2 if mode == "SAME_UPPER" else total - total // 2
        begin.append(lo)
        end.append(total - lo)
    return begin + end


def _conv(ctx: Ctx, node: NodeProto) -> bool:
    a = attrs_of(node)
    if a.get("auto_pad", "NOTSET") == "NOTSET":
        return False
    kernel = a.get("kernel_shape") or ctx.shape(node, node.input[1], "auto_pad")[2:]
    ctx.nodes.append(copy_node(node, ("auto_pad",), pads=_same_pads(ctx, node, a, kernel)))
    return True


def _pool(ctx: Ctx, node: NodeProto) -> bool:
    a = attrs_of(node)
    kernel = list(a["kernel_shape"])
    n = len(kernel)
    pads = list(a.get("pads", [0] * 2 * n))
    changed = a.get("auto_pad", "NOTSET") != "NOTSET"
    if changed:
        pads = _same_pads(ctx, node, a, kernel)
    drop = ["auto_pad"]
    if node.op_type == "LpPool":
        _lp_pool(ctx, node, a, pads)
        return True
    if node.op_type == "MaxPool" and a.get("storage_order", 0) and \
            (len(node.output) < 2 or node.output[1] not in ctx.used):
        drop.append("storage_order")  # only the indices depend on it
        changed = True
    if a.get("ceil_mode", 0) or (node.op_type == "AveragePool" and pads[:n] != pads[n:]):
        _pool_explicit(ctx, node, a, pads, a.get("auto_pad", "NOTSET").startswith("SAME"))
        return True
    if changed:
        ctx.nodes.append(copy_node(node, drop, pads=pads))
    return changed


def _pool_explicit(ctx: Ctx, node: NodeProto, a: dict[str, Any], pads: list[int],
                   same: bool) -> None:
    """A Pad to exactly the windows of the output, the pool without pads or ceil_mode, and for
    averages a constant factor kernel size / elements counted per output (torch pools take
    symmetric pads only). The output length is onnxruntime's: with ceil_mode a last window
    starting in the end padding is dropped (shape inference keeps it); SAME ignores it."""
    kernel, n = list(a["kernel_shape"]), len(a["kernel_shape"])
    strides, dil = a.get("strides", [1] * n), a.get("dilations", [1] * n)
    spatial = ctx.shape(node, node.input[0], "asymmetric pads or ceil_mode")[2:]
    lo, out = pads[:n], []
    for length, k, s, d, b, e in zip(spatial, kernel, strides, dil, lo, pads[n:], strict=True):
        span = length + b + e - (k - 1) * d - 1
        if same:
            out.append(-(-length // s))
        elif a.get("ceil_mode", 0):
            o = -(-span // s) + 1
            out.append(o - 1 if (o - 1) * s >= length + b else o)
        else:
            out.append(span // s + 1)
    hi = [(o - 1) * s + (k - 1) * d + 1 - length - b for o, s, k, d, length, b
          in zip(out, strides, kernel, dil, spatial, lo, strict=True)]
    is_max = node.op_type == "MaxPool"
    x = ctx.pad(node.input[0], lo, hi, -np.inf if is_max else 0.0)
    keep = {"kernel_shape": kernel, "strides": strides}
    if is_max:
        ctx.emit("MaxPool", [x], node.output[0], **keep, dilations=dil)
        return
    counts, include = [], a.get("count_include_pad", 0)
    for length, k, s, b, e, o in zip(spatial, kernel, strides, lo, pads[n:], out, strict=True):
        starts = np.arange(o) * s - b
        first, last = (-b, length + e) if include else (0, length)
        counts.append(np.minimum(starts + k, last) - np.maximum(starts, first))
    valid = functools.reduce(np.multiply.outer, counts)
    if np.all(valid == np.prod(kernel)):
        ctx.emit("AveragePool", [x], node.output[0], **keep)
        return
    factor = (np.prod(kernel) / valid).astype(ctx.np_type(node.input[0]))
    y = ctx.emit("AveragePool", [x], **keep)
    ctx.emit("Mul", [y, ctx.const(factor.reshape(1, 1, *factor.shape), "count")], node.output[0])


def _lp_pool(ctx: Ctx, node: NodeProto, a: dict[str, Any], pads: list[int]) -> None:
    """(sum |x|^p over the window)^(1/p) as AveragePool x kernel size (onnx2torch has no
    LpPool); the zero pads add nothing to the sum."""
    kernel, n = list(a["kernel_shape"]), len(a["kernel_shape"])
    p, dt = int(a.get("p", 2)), ctx.np_type(node.input[0])
    x = ctx.pad(node.input[0], pads[:n], pads[n:]) if any(pads) else node.input[0]
    powed = ctx.emit("Mul", [x, x]) if p == 2 else \
        ctx.emit("Pow", [ctx.emit("Abs", [x]), ctx.const(dt.type(p))])
    avg = ctx.emit("AveragePool", [powed], kernel_shape=kernel,
                   strides=a.get("strides", [1] * n))
    total = ctx.emit("Mul", [avg, ctx.const(dt.type(np.prod(kernel)))])
    if p == 2:
        ctx.emit("Sqrt", [total], node.output[0])
    else:
        ctx.emit("Pow", [total, ctx.const(dt.type(1 / p))], node.output[0])


def _global_pool(ctx: Ctx, node: NodeProto) -> bool:
    rank = ctx.ranks.get(node.input[0])
    if rank is None:
        raise refuse(node, "needs the rank of its input, which shape inference did not give")
    axes, x = list(range(2, rank)), node.input[0]
    if node.op_type == "GlobalMaxPool":
        ctx.reduce("ReduceMax", x, axes, node.output[0])
        return True
    p = int(attrs_of(node).get("p", 2))
    if p in (1, 2):
        ctx.reduce(f"ReduceL{p}", x, axes, node.output[0])
        return True
    dt = ctx.np_type(x)
    s = ctx.reduce("ReduceSum", ctx.emit("Pow", [ctx.emit("Abs", [x]), ctx.const(dt.type(p))]),
                   axes)
    ctx.emit("Pow", [s, ctx.const(dt.type(1 / p))], node.output[0])
    return True


def _conv_transpose(ctx: Ctx, node: NodeProto) -> bool:
    """auto_pad / output_shape -> pads as onnxruntime computes them (SAME_UPPER: the odd one
    at the end; never below 0, where shape inference expects stride x input); asymmetric pads
    -> the unpadded output, then a Slice (torch takes symmetric pads only)."""
    a = attrs_of(node)
    mode, target = a.get("auto_pad", "NOTSET"), a.get("output_shape")
    wshape = ctx.shape(node, node.input[1], "ConvTranspose")
    kernel = list(a.get("kernel_shape") or wshape[2:])
    n = len(kernel)
    pads = list(a.get("pads", [0] * 2 * n))
    if mode == "NOTSET" and not target and pads[:n] == pads[n:]:
        return False
    spatial = ctx.shape(node, node.input[0], "ConvTranspose")[2:]
    strides, dil = a.get("strides", [1] * n), a.get("dilations", [1] * n)
    extra = list(a.get("output_padding", [0] * n))
    heads, outs, tails = [], [], []
    for i in range(n):
        full = strides[i] * (spatial[i] - 1) + (kernel[i] - 1) * dil[i] + 1 + extra[i]
        if target or mode in ("SAME_UPPER", "SAME_LOWER"):
            want = int(target[-n + i]) if target else spatial[i] * strides[i]
            total = full - want if target else max(0, full - want)  # as onnxruntime clamps
            head = total // 2 if mode == "SAME_UPPER" else total - total // 2
        else:
            head, total = (0, 0) if mode == "VALID" else (pads[i], pads[i] + pads[n + i])
        if total < 0:
            raise refuse(node, f"output size {full - total} exceeds the full transposed "
                               f"convolution ({full}) on spatial axis {i}")
        heads.append(head)
        tails.append(total - head)
        outs.append(full - total)
    drop = ("auto_pad", "output_shape", "pads", "output_padding")
    if heads == tails:
        ctx.nodes.append(copy_node(node, drop, pads=heads + tails, output_padding=extra))
        return True
    y = ctx.fresh(f"{ctx.prefix}/full")
    ctx.nodes.append(helper.make_node(
        "ConvTranspose", list(node.input), [y], name=ctx.fresh(f"{ctx.prefix}/unpadded"),
        **{k: v for k, v in a.items() if k not in drop}, output_padding=extra))
    ctx.emit("Slice", [y, ctx.const(np.array(heads, np.int64), "starts"),
                       ctx.const(np.array(heads, np.int64) + outs, "ends"),
                       ctx.const(np.arange(2, 2 + n, dtype=np.int64), "axes")], node.output[0])
    return True


def resize(ctx: Ctx, node: NodeProto, force: bool = False) -> bool:
    """A Resize torch's interpolate does not reproduce -> per-axis Gather (nearest) or MatMul
    by the interpolation matrix (linear, cubic), exact for every ONNX mode (torchable_resize)."""
    x, y = node.input[0], node.output[0]
    if x not in ctx.shapes or y not in ctx.shapes:
        return False
    const = [ctx.consts.get(i) if i else None for i in [*node.input[1:], "", "", ""]][:3]
    if any(i and c is None for i, c in zip(node.input[1:4], const, strict=False)):
        return False  # roi, scales or sizes computed at run time: leave it to onnx2torch
    try:
        plan = resize_plan(attrs_of(node), ctx.shapes[x], ctx.shapes[y], const[0], const[1],
                           force)
    except ValueError as exc:
        raise refuse(node, str(exc)) from None
    if plan is None:
        return False
    dt, rank, cur = ctx.np_type(x), len(ctx.shapes[x]), x
    for ax, kind, table in plan.steps:
        if kind == "gather":
            cur = ctx.emit("Gather", [cur, ctx.const(table.astype(np.int64), "idx")], axis=ax)
        elif ax >= rank - 2:
            m = ctx.const(table.astype(dt).T if ax == rank - 1 else table.astype(dt), "interp")
            cur = ctx.emit("MatMul", [cur, m] if ax == rank - 1 else [m, cur])
        else:
            perm = list(range(rank))
            perm[ax], perm[-1] = perm[-1], perm[ax]
            t = ctx.emit("Transpose", [cur], perm=perm)
            t = ctx.emit("MatMul", [t, ctx.const(table.astype(dt).T, "interp")])
            cur = ctx.emit("Transpose", [t], perm=perm)
    if plan.inside is not None and plan.outside is not None:  # tf_crop_and_resize's outside
        cur = ctx.emit("Mul", [cur, ctx.const(plan.inside.astype(dt), "inside")])
        cur = ctx.emit("Add", [cur, ctx.const(plan.outside.astype(dt), "outside")])
    ctx.emit("Identity", [cur], y)
    return True


def _compare_or_equal(ctx: Ctx, node: NodeProto) -> bool:
    if ctx.opset < 16:  # onnx2torch has the opset-12 versions
        return False
    strict = ctx.emit("Greater" if node.op_type == "GreaterOrEqual" else "Less", node.input)
    ctx.emit("Or", [strict, ctx.emit("Equal", node.input)], node.output[0])
    return True


def _clip(ctx: Ctx, node: NodeProto) -> bool:
    if ctx.opset < 11 or len(node.input) < 2:
        return False
    bounds = list(node.input[1:3]) + [""] * (3 - len(node.input))
    integer = ctx.np_type(node.input[0]).kind in "iu"  # onnx2torch's Clip returns floats
    if not integer and all(not b or b in ctx.consts for b in bounds):
        if all(bounds) or not any(bounds):
            return False
        dt = ctx.np_type(node.input[0])  # onnx2torch reads an empty bound as run-time data
        lim = np.finfo(dt) if dt in _FLOAT_LIMITS else np.iinfo(dt)
        fill = [b or ctx.const(np.array(v, dt), "bound") for b, v in
                zip(bounds, (-np.inf if dt.kind == "f" else lim.min,
                             np.inf if dt.kind == "f" else lim.max), strict=True)]
        ctx.nodes.append(copy_node(node, inputs=[node.input[0], *fill]))
        return True
    cur = node.input[0]  # run-time or integer bounds: Max then Min, as Clip defines them
    if bounds[0]:
        cur = ctx.emit("Max", [cur, bounds[0]], None if bounds[1] else node.output[0])
    if bounds[1]:
        ctx.emit("Min", [cur, bounds[1]], node.output[0])
    return True


def _space_depth(ctx: Ctx, node: NodeProto) -> bool:
    a = attrs_of(node)
    b = int(a["blocksize"])
    if node.op_type == "DepthToSpace" and a.get("mode", "DCR") == "CRD":
        return False
    _, c, h, w = ctx.shape(node, node.input[0], node.op_type)
    if node.op_type == "DepthToSpace":  # DCR, as TensorFlow lays it out
        first, perm, last = [-1, b, b, c // (b * b), h, w], [0, 3, 4, 1, 5, 2], \
            [-1, c // (b * b), h * b, w * b]
    else:
        first, perm, last = [-1, c, h // b, b, w // b, b], [0, 3, 5, 1, 2, 4], \
            [-1, c * b * b, h // b, w // b]
    t = ctx.emit("Reshape", [node.input[0], ctx.const(np.array(first, np.int64), "shape")])
    t = ctx.emit("Transpose", [t], perm=perm)
    ctx.emit("Reshape", [t, ctx.const(np.array(last, np.int64), "shape")], node.output[0])
    return True


def _drop_outputs(ctx: Ctx, node: NodeProto) -> bool:
    """Dropout -> Identity; BatchNormalization / LayerNormalization / MaxPool without the
    extra outputs nobody reads (onnx2torch maps one output)."""
    if len(node.output) > 1 and any(o in ctx.used for o in node.output[1:]):
        return False
    if node.op_type == "Dropout":
        ctx.emit("Identity", [node.input[0]], node.output[0])
        return True
    if len(node.output) < 2:
        return node.op_type == "MaxPool" and _pool(ctx, node)
    trimmed = copy_node(node)
    del trimmed.output[1:]
    if node.op_type == "MaxPool":
        _pool(ctx, trimmed)  # may rewrite it further (auto_pad); else keep the trimmed node
        if not ctx.nodes:
            ctx.nodes.append(trimmed)
        return True
    ctx.nodes.append(trimmed)
    return True


def _selu(ctx: Ctx, node: NodeProto) -> bool:
    a = attrs_of(node)
    alpha, gamma = a.get("alpha", _SELU[0]), a.get("gamma", _SELU[1])
    if np.isclose(alpha, _SELU[0]) and np.isclose(gamma, _SELU[1]):  # what onnx2torch takes
        return False
    e = ctx.emit("Elu", [node.input[0]], alpha=float(alpha))
    ctx.emit("Mul", [e, ctx.const(ctx.np_type(node.input[0]).type(gamma))], node.output[0])
    return True


def _cast_like(ctx: Ctx, node: NodeProto) -> bool:
    if node.input[1] not in ctx.types:
        raise refuse(node, "the element type of its target is unknown")
    ctx.emit("Cast", [node.input[0]], node.output[0], to=ctx.types[node.input[1]])
    return True


def _size(ctx: Ctx, node: NodeProto) -> bool:  # Shape and ReduceProd stay batch-agnostic
    ctx.reduce("ReduceProd", ctx.emit("Shape", [node.input[0]]), [0], node.output[0], 0)
    return True


def _cumsum(ctx: Ctx, node: NodeProto) -> bool:
    if "reverse" in attrs_of(node):
        return False
    ctx.nodes.append(copy_node(node, reverse=0))  # onnx2torch's default is reverse=1
    return True


def _reduce_axes(ctx: Ctx, node: NodeProto) -> bool:
    """Negative axes -> positive: onnx2torch shifts sorted negative axes wrongly when it
    reduces them one by one (ReduceMax/Min/Prod, keepdims=0)."""
    axes, rank = attrs_of(node).get("axes"), ctx.ranks.get(node.input[0])
    if not axes or rank is None or min(axes) >= 0:
        return False
    ctx.nodes.append(copy_node(node, axes=sorted(a % rank for a in axes)))
    return True


def _prelu(ctx: Ctx, node: NodeProto) -> bool:
    """A slope whose first dim equals the channels but broadcasts onto a later axis (ONNX
    aligns trailing dims) -> the full-rank slope; onnx2torch would apply it per channel."""
    slope, shape = ctx.consts.get(node.input[1]), ctx.shapes.get(node.input[0])
    if slope is None or shape is None or slope.ndim >= len(shape) or slope.size == 1:
        return False
    if not (len(shape) > 1 and slope.shape[0] == shape[1] and all(d == 1 for d in slope.shape[1:])
            and len(shape) - slope.ndim != 1):
        return False
    full = slope.reshape((1,) * (len(shape) - slope.ndim) + slope.shape)
    ctx.nodes.append(copy_node(node, inputs=[node.input[0], ctx.const(full, "slope")]))
    return True


def _reshape(ctx: Ctx, node: NodeProto) -> bool:
    target = ctx.consts.get(node.input[1])
    if not attrs_of(node).get("allowzero", 0) or target is None or 0 in target:
        return False
    ctx.nodes.append(copy_node(node, ("allowzero",)))  # no 0 in it: allowzero is moot
    return True


REWRITES: dict[str, Callable[[Ctx, NodeProto], bool]] = {
    "Conv": _conv, "ConvTranspose": _conv_transpose, "AveragePool": _pool, "LpPool": _pool,
    "MaxPool": _drop_outputs, "GlobalMaxPool": _global_pool, "GlobalLpPool": _global_pool,
    "Resize": resize, "GreaterOrEqual": _compare_or_equal, "LessOrEqual": _compare_or_equal,
    "Clip": _clip, "DepthToSpace": _space_depth, "SpaceToDepth": _space_depth,
    "Dropout": _drop_outputs, "BatchNormalization": _drop_outputs,
    "LayerNormalization": _drop_outputs, "Selu": _selu, "CastLike": _cast_like, "Size": _size,
    "CumSum": _cumsum, "PRelu": _prelu, "Reshape": _reshape,
    **dict.fromkeys(REDUCE, _reduce_axes),
}
#: ops onnx2torch has no converter for that a rewrite replaces by others
REPLACED = frozenset({"GlobalMaxPool", "GlobalLpPool", "LpPool", "GreaterOrEqual",
                       "LessOrEqual", "SpaceToDepth", "CastLike", "Size"})


def rewrite(model: ModelProto) -> None:
    """Apply :data:`REWRITES` to every node of ``model`` (shapes inferred), in place."""
    ctx = Ctx(model)
    out: list[NodeProto] = []
    for node in model.graph.node:
        ctx.nodes, ctx.prefix = [], node.name or node.output[0]
        fn = REWRITES.get(node.op_type) if node.domain in STD else None
        if fn is not None and fn(ctx, node):
            out.extend(ctx.nodes)
        else:
            out.append(node)
    del model.graph.node[:]
    model.graph.node.extend(out)
    model.graph.initializer.extend(ctx.inits)
    prune(model)
