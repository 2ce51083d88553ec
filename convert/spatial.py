"""Spatial tiles of conv stacks (MeDNN §III-V): which input region an output tile needs, and an
ONNX sub-graph per tile that computes exactly that tile of the whole model's feature map.

A *spatial chain* is the run of nodes from a 4-D model input through which every output pixel
depends on a bounded window of input pixels: Conv (any kernel, stride, dilation, padding,
groups), MaxPool / AveragePool, and per-pixel ops (activations, BatchNormalization, LRN, ...).
The chain stops at the first node that mixes the whole map (Flatten, Gemm, global pooling), at a
branch, or at anything else; those nodes run on one device.

For layers ``[i0, i1)`` of the chain and an output rectangle, :func:`input_region` walks the
windows backwards. Each layer needs rows ``[o0*s - p, (o1-1)*s - p + d*(k-1) + 1)``, clipped to
the map. The part clipped off at a border becomes that layer's padding in the tile's sub-graph;
inside the map there is none, so the halo rows are real neighbours' pixels. :func:`tile_model`
writes that sub-graph. Its output equals the same rectangle of the whole model's tensor, up to
float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

from coinf.convert.graph import Graph, value_info
from coinf.convert.slicer import closure, used_initializers
from onnx import GraphProto, ModelProto, NodeProto, helper

from coinf.errors import ModelError

WINDOW_OPS = {"Conv", "MaxPool", "AveragePool"}
POINTWISE_OPS = {
    "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Sigmoid", "HardSigmoid", "HardSwish",
    "Tanh", "Softplus", "Softsign", "Clip", "Erf", "Gelu", "Mish", "Identity", "Dropout",
    "BatchNormalization", "LRN", "Abs", "Neg", "Sqrt", "Exp", "Log", "Floor", "Ceil", "Cast",
}


@dataclass(frozen=True)
class Rect:
    """Rows ``[r0, r1)`` and columns ``[c0, c1)`` of a feature map."""

    r0: int
    r1: int
    c0: int
    c1: int

    @property
    def h(self) -> int:
        return self.r1 - self.r0

    @property
    def w(self) -> int:
        return self.c1 - self.c0

    @property
    def area(self) -> int:
        return max(self.h, 0) * max(self.w, 0)

    def empty(self) -> bool:
        return self.h <= 0 or self.w <= 0


@dataclass(frozen=True)
class Window:
    """A 2-D sliding window: kernel, stride, dilation and the layer's own pads (t, l, b, r)."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    pads: tuple[int, int, int, int]

    def needed(self, lo: int, hi: int, axis: int) -> tuple[int, int]:
        """Unclipped input range ``[a, b)`` that output range ``[lo, hi)`` reads along ``axis``."""
        k, s, d, p = self.kernel[axis], self.stride[axis], self.dilation[axis], self.pads[axis]
        return lo * s - p, (hi - 1) * s - p + d * (k - 1) + 1


@dataclass(frozen=True)
class Layer:
    """One node of a spatial chain with its map shapes (C, H, W) and window (None: per pixel)."""

    node: int
    op: str
    window: Window | None
    in_shape: tuple[int, int, int]
    out_shape: tuple[int, int, int]
    flops: int = 0

    def out_rect(self) -> Rect:
        return Rect(0, self.out_shape[1], 0, self.out_shape[2])


def _ints(node: NodeProto, name: str, default: list[int]) -> list[int]:
    for a in node.attribute:
        if a.name == name:
            return list(a.ints)
    return default


def _int(node: NodeProto, name: str, default: int) -> int:
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    return default


def _str(node: NodeProto, name: str, default: str) -> str:
    for a in node.attribute:
        if a.name == name:
            return a.s.decode()
    return default


def _window(node: NodeProto, in_hw: tuple[int, int], out_hw: tuple[int, int],
            kernel: list[int]) -> Window | None:
    """The node's window with explicit pads, or None when tiles cannot reproduce it."""
    stride = _ints(node, "strides", [1, 1])
    dil = _ints(node, "dilations", [1, 1])
    if len(kernel) != 2 or len(stride) != 2 or len(dil) != 2:
        return None
    auto = _str(node, "auto_pad", "NOTSET")
    if auto == "NOTSET":
        pads = _ints(node, "pads", [0, 0, 0, 0])
    elif auto == "VALID":
        pads = [0, 0, 0, 0]
    else:  # SAME_UPPER / SAME_LOWER: total pad from the shapes
        total = [max((out_hw[a] - 1) * stride[a] + dil[a] * (kernel[a] - 1) + 1 - in_hw[a], 0)
                 for a in range(2)]
        small = [t // 2 for t in total]
        big = [t - t // 2 for t in total]
        before, after = (small, big) if auto == "SAME_UPPER" else (big, small)
        pads = [before[0], before[1], after[0], after[1]]
    if node.op_type in ("MaxPool", "AveragePool"):
        if _int(node, "ceil_mode", 0) and node.op_type == "AveragePool" \
                and _int(node, "count_include_pad", 0):
            return None  # ORT's count of ceil-mode overflow cells differs from explicit pads
        if node.op_type == "MaxPool" and (len(node.output) > 1 or _int(node, "storage_order", 0)):
            return None  # Indices output: positions are global
    w = Window((kernel[0], kernel[1]), (stride[0], stride[1]), (dil[0], dil[1]),
               (pads[0], pads[1], pads[2], pads[3]))
    for a in range(2):
        # every window must start inside the map: a tile can then pad with less than a kernel
        # (ceil mode can add a last window that starts in the end padding; tiles cannot)
        if (out_hw[a] - 1) * w.stride[a] - w.pads[a] >= in_hw[a] or w.pads[a] >= w.kernel[a] \
                * w.dilation[a]:
            return None
    return w


def spatial_chain(g: Graph, flops: list[int] | None = None) -> list[Layer]:
    """The longest run of spatial nodes starting at the model's 4-D input (may be empty)."""
    dyn_inputs = [t for t in g.inputs if t in g.dynamic_tensors]
    if len(dyn_inputs) != 1:
        return []
    tensor = dyn_inputs[0]
    if len(g.ttype(tensor).shape) != 4:
        return []
    chain: list[Layer] = []
    while True:
        users = g.consumers.get(tensor, [])
        if len(users) != 1 or tensor in g.outputs:
            break
        n = g.nodes[users[0]]
        proto = g.model.graph.node[n.index]
        dyn = [t for t in n.inputs if t in g.dynamic_tensors]
        if dyn != [tensor] or n.inputs[0] != tensor or n.has_subgraph:
            break
        out = n.outputs[0]
        if out not in g.types or len(g.ttype(out).shape) != 4:
            break
        ish, osh = g.ttype(tensor).shape, g.ttype(out).shape
        if ish[0] != osh[0]:
            break
        win: Window | None = None
        if n.op_type in WINDOW_OPS:
            if n.op_type == "Conv":
                wshape = g.ttype(n.inputs[1]).shape
                kernel = _ints(proto, "kernel_shape", list(wshape[2:]))
            else:
                kernel = _ints(proto, "kernel_shape", [])
            win = _window(proto, (ish[2], ish[3]), (osh[2], osh[3]), kernel)
            if win is None:
                break
        elif n.op_type not in POINTWISE_OPS or ish[2:] != osh[2:]:
            break
        if n.op_type == "Dropout" and len(n.outputs) > 1 and n.outputs[1]:
            break
        chain.append(Layer(n.index, n.op_type, win, (ish[1], ish[2], ish[3]),
                           (osh[1], osh[2], osh[3]), flops[n.index] if flops else 0))
        tensor = out
    # a chain that ends in per-pixel ops after its last window gains nothing from them: keep them
    return chain


def input_region(chain: list[Layer], i0: int, i1: int, out: Rect
                 ) -> tuple[Rect, list[tuple[int, int, int, int]], list[Rect]]:
    """For layers ``[i0, i1)`` and output ``out``: the input rect, each layer's tile pads
    (t, l, b, r) and each layer's output rect (in that layer's map coordinates)."""
    if not 0 <= i0 < i1 <= len(chain):
        raise ModelError(f"layers [{i0}, {i1}) are not inside the chain of {len(chain)}")
    last = chain[i1 - 1].out_shape
    if out.empty() or out.r0 < 0 or out.c0 < 0 or out.r1 > last[1] or out.c1 > last[2]:
        raise ModelError(f"tile {out} is not inside the {last[1]}x{last[2]} output map")
    pads: list[tuple[int, int, int, int]] = []
    outs: list[Rect] = []
    cur = out
    for layer in reversed(chain[i0:i1]):
        outs.append(cur)
        if layer.window is None:
            pads.append((0, 0, 0, 0))
            continue
        h, w = layer.in_shape[1], layer.in_shape[2]
        a0, a1 = layer.window.needed(cur.r0, cur.r1, 0)
        b0, b1 = layer.window.needed(cur.c0, cur.c1, 1)
        clipped = Rect(max(a0, 0), min(a1, h), max(b0, 0), min(b1, w))
        pads.append((clipped.r0 - a0, clipped.c0 - b0, a1 - clipped.r1, b1 - clipped.c1))
        cur = clipped
    return cur, pads[::-1], outs[::-1]


def tile_model(g: Graph, chain: list[Layer], i0: int, i1: int, out: Rect,
               name: str = "tile") -> ModelProto:
    """A model mapping the input region of ``out`` (layers ``[i0, i1)``) to that output tile."""
    region, pads, outs = input_region(chain, i0, i1, out)
    src = g.model
    first, last = g.nodes[chain[i0].node], g.nodes[chain[i1 - 1].node]
    t_in, t_out = first.inputs[0], last.outputs[0]
    idx = closure(g, [layer.node for layer in chain[i0:i1]])
    chain_nodes = {layer.node: k for k, layer in enumerate(chain[i0:i1])}
    graph = GraphProto(name=f"{src.graph.name or 'graph'}_{name}")
    for i in idx:
        proto = NodeProto()
        proto.CopyFrom(src.graph.node[i])
        k = chain_nodes.get(i)
        if k is not None and chain[i0 + k].window is not None:
            _set_pads(proto, pads[k])
        graph.node.append(proto)
    elem = g.ttype(t_in).elem
    batch = g.ttype(t_in).shape[0]
    cin = chain[i0].in_shape[0]
    graph.input.append(helper.make_tensor_value_info(t_in, elem, [batch, cin, region.h, region.w]))
    graph.output.append(helper.make_tensor_value_info(
        t_out, g.ttype(t_out).elem, [batch, chain[i1 - 1].out_shape[0], out.h, out.w]))
    for k, layer in enumerate(chain[i0:i1 - 1]):
        o = g.nodes[layer.node].outputs[0]
        graph.value_info.append(helper.make_tensor_value_info(
            o, g.ttype(o).elem, [batch, layer.out_shape[0], outs[k].h, outs[k].w]))
    graph.initializer.extend(g.initializers[t] for t in used_initializers(g, idx))
    if src.ir_version < 4:
        graph.input.extend(value_info(t, g.ttype(t)) for t in used_initializers(g, idx))
    model = helper.make_model(graph, opset_imports=list(src.opset_import), producer_name="coinf")
    model.ir_version = src.ir_version
    return model


def _set_pads(node: NodeProto, pads: tuple[int, int, int, int]) -> None:
    keep = [a for a in node.attribute if a.name not in ("pads", "auto_pad", "ceil_mode")]
    del node.attribute[:]
    node.attribute.extend(keep)
    t, left, b, r = pads
    node.attribute.append(helper.make_attribute("pads", [t, left, b, r]))

