"""Per-node costs: FLOPs and MACs, parameter bytes, output bytes (from resolved static shapes).

Conventions (docs/BUNDLE.md): one multiply-accumulate = 2 FLOPs; bias adds, activations and
elementwise ops count one FLOP per output element (a few per element for Softmax/normalisation);
data movement (Reshape, Transpose, Concat, Gather, Slice, ...) and Constant nodes cost 0.
Nodes with sub-graphs (If/Loop/Scan) cost 0: their trip counts are not static.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import onnx
from coinf.convert.graph import Graph, TensorType
from onnx import NodeProto

ELEMENTWISE = {
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Abs", "Neg", "Sqrt",
    "Reciprocal", "Exp", "Log", "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu",
    "ThresholdedRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Softplus", "Softsign",
    "Clip", "Erf", "Gelu",
    "Mish", "Sin", "Cos", "Floor", "Ceil", "Round", "Sign", "Equal", "Less", "Greater",
    "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Not", "Where", "Mod", "BitShift",
    "Dropout", "Cast",
}
SOFTMAX = {"Softmax", "LogSoftmax", "Hardmax"}
REDUCE_PREFIX = "Reduce"
POOL = {"MaxPool", "AveragePool", "LpPool"}
GLOBAL_POOL = {"GlobalMaxPool", "GlobalAveragePool", "GlobalLpPool"}


@dataclass(frozen=True)
class NodeCost:
    """The cost of one node."""

    flops: int
    macs: int
    param_bytes: int
    output_bytes: int


def _attr(node: NodeProto, name: str, default: Any) -> Any:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _numel(t: TensorType | None) -> int:
    return t.numel if t is not None else 0


def _macs_flops(node: NodeProto, g: Graph) -> tuple[int, int]:
    """(MACs, FLOPs) for one node; unknown shapes count 0."""
    op = node.op_type
    ins = [g.types.get(x) if x else None for x in node.input]
    outs = [g.types.get(x) if x else None for x in node.output]
    out = outs[0] if outs else None
    n_out = _numel(out)
    x = ins[0] if ins else None
    if op in ("Conv", "ConvInteger", "QLinearConv"):
        w = ins[3] if op == "QLinearConv" and len(ins) > 3 else (ins[1] if len(ins) > 1 else None)
        if w is None or out is None:
            return 0, 0
        macs = n_out * math.prod(w.shape[1:])  # Cin/group * prod(kernel) per output element
        bias = n_out if (op == "Conv" and len(ins) > 2 and ins[2] is not None) else 0
        return macs, 2 * macs + bias
    if op == "ConvTranspose":
        w = ins[1] if len(ins) > 1 else None
        if w is None or x is None or out is None:
            return 0, 0
        # weight (Cin, Cout/group, k...): every input element scatters into Cout/group * k cells
        macs = _numel(x) * math.prod(w.shape[1:])
        bias = n_out if len(ins) > 2 and ins[2] is not None else 0
        return macs, 2 * macs + bias
    if op == "Gemm":
        a = ins[0]
        if a is None or out is None or len(a.shape) != 2:
            return 0, 0
        k = a.shape[0] if _attr(node, "transA", 0) else a.shape[1]
        macs = n_out * k
        bias = n_out if len(ins) > 2 and ins[2] is not None else 0
        return macs, 2 * macs + bias
    if op in ("MatMul", "MatMulInteger", "QLinearMatMul"):
        a = ins[0]
        if a is None or out is None or not a.shape:
            return 0, 0
        macs = n_out * a.shape[-1]
        return macs, 2 * macs
    if op in ("LSTM", "GRU", "RNN"):
        w = ins[1] if len(ins) > 1 else None
        r = ins[2] if len(ins) > 2 else None
        if x is None or w is None or r is None or len(x.shape) != 3:
            return 0, 0
        layout = _attr(node, "layout", 0)
        seq, batch = (x.shape[1], x.shape[0]) if layout else (x.shape[0], x.shape[1])
        dirs, gates_hidden, inp = w.shape
        hidden = r.shape[2]
        macs = seq * batch * dirs * gates_hidden * (inp + hidden)
        gates = gates_hidden // max(hidden, 1)
        # gate nonlinearities + cell/state updates: ~ (gates + 3) ops per hidden unit and step
        extra = seq * batch * dirs * hidden * (gates + 3)
        return macs, 2 * macs + extra
    if op in POOL:
        k = _attr(node, "kernel_shape", [])
        return 0, n_out * max(math.prod(k), 1)
    if op in GLOBAL_POOL:
        return 0, _numel(x)
    if op == "BatchNormalization":
        return 0, 2 * n_out
    if op in ("LayerNormalization", "InstanceNormalization", "GroupNormalization",
              "LpNormalization", "MeanVarianceNormalization"):
        return 0, 5 * n_out
    if op in SOFTMAX:
        return 0, 3 * n_out
    if op.startswith(REDUCE_PREFIX) or op in ("ArgMax", "ArgMin"):
        return 0, _numel(x)
    if op in ELEMENTWISE:
        return 0, n_out
    return 0, 0


def node_cost(g: Graph, index: int) -> NodeCost:
    """FLOPs/MACs, bytes of initializers consumed directly, bytes of outputs."""
    proto = g.model.graph.node[index]
    node = g.nodes[index]
    macs, flops = (0, 0) if node.has_subgraph else _macs_flops(proto, g)
    params = sum(tensor_bytes(g.initializers[x]) for x in node.inputs if x in g.initializers)
    if proto.op_type == "Constant":
        params += sum(tensor_bytes(a.t) for a in proto.attribute if a.name == "value")
    out_bytes = sum(g.types[o].nbytes for o in node.outputs if o in g.types)
    return NodeCost(int(flops), int(macs), int(params), int(out_bytes))


def tensor_bytes(t: onnx.TensorProto) -> int:
    """Bytes of an initializer's values (also for external data not yet loaded)."""
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except Exception:
        itemsize = 1
    return math.prod(t.dims) * itemsize


def all_costs(g: Graph) -> list[NodeCost]:
    return [node_cost(g, i) for i in range(len(g.nodes))]
