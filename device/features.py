"""Per-node features of an ONNX graph for the latency predictors (no onnxruntime needed).

Every node maps to a *kind* (``conv``, ``gemm``, ``pool``, ``activation``, ``norm``, ``rnn``,
``eltwise``, ``memory``) plus two feature vectors:

* ``tree`` -- structural features the CoINF-style decision tree splits on (sub-type code, kernel,
  stride, depthwise flag, channels, spatial size, sequence length);
* ``linear`` -- the sizes the per-leaf linear regressions use (MFLOPs, input/output/parameter
  elements in millions).

The same function featurises the synthetic sweep and real models, so training and use agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import onnx
from onnx import helper, shape_inference

KINDS: dict[str, tuple[str, ...]] = {
    "conv": ("Conv", "ConvTranspose"),
    "gemm": ("Gemm", "MatMul"),
    "pool": ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"),
    "activation": ("Relu", "Sigmoid", "Tanh", "Clip", "HardSwish", "HardSigmoid", "LeakyRelu",
                   "Softmax", "Gelu", "Erf", "Elu", "Selu", "Softplus", "PRelu"),
    "norm": ("BatchNormalization", "LayerNormalization", "InstanceNormalization", "LRN"),
    "rnn": ("LSTM", "GRU", "RNN"),
    "eltwise": ("Add", "Mul", "Sub", "Div", "Pow", "Sqrt", "Max", "Min"),
}
OP_KIND = {op: kind for kind, ops in KINDS.items() for op in ops}
#: sub-type codes (the index of the op in its kind's tuple)
OP_CODE = {op: float(i) for ops in KINDS.values() for i, op in enumerate(ops)}
TREE_FEATURES = ("subtype", "kernel", "stride", "depthwise", "cin", "cout", "spatial", "seq")
LINEAR_FEATURES = ("mflops", "in_melems", "out_melems", "param_melems")
#: ops that cost nothing worth predicting (metadata only)
FREE_OPS = {"Shape", "Constant", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten",
            "Dropout"}


@dataclass(frozen=True)
class NodeFeatures:
    """A node's name, op, kind and feature vectors."""

    name: str
    op_type: str
    kind: str
    tree: tuple[float, ...]
    linear: tuple[float, ...]
    flops: float
    #: onnxruntime (basic/extended optimisation) folds this node into the Conv before it
    fused: bool = False


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _numel(shape: list[int] | None) -> int:
    if not shape:
        return 1 if shape == [] else 0
    return math.prod(max(d, 1) for d in shape)


def shape_map(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Static shapes of every tensor (unknown dims become 1)."""
    try:
        inferred = shape_inference.infer_shapes(model)
    except Exception:  # shape inference is best effort; fall back to what is declared
        inferred = model
    g = inferred.graph
    shapes: dict[str, list[int]] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        tt = vi.type.tensor_type
        if tt.HasField("shape"):
            shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else 1 for d in tt.shape.dim]
    for init in g.initializer:
        shapes[init.name] = list(init.dims)
    return shapes


def node_features(model: onnx.ModelProto) -> list[NodeFeatures]:
    """Features of every node of ``model`` in graph order."""
    shapes = shape_map(model)
    inits = {i.name for i in model.graph.initializer}
    out: list[NodeFeatures] = []
    fused = fused_nodes(model)
    for k, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}_{k}"
        f = featurize(node, name, shapes, inits)
        out.append(replace(f, fused=True) if k in fused else f)
    return out


#: activations onnxruntime fuses into a preceding Conv (FusedConv)
FUSABLE_ACTIVATIONS = {"Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid"}


def fused_nodes(model: onnx.ModelProto) -> set[int]:
    """Indices of BatchNormalization / activation nodes that directly follow a Conv (through
    other fused nodes) whose output nothing else reads: onnxruntime folds them into the Conv."""
    g = model.graph
    readers: dict[str, int] = {}
    for node in g.node:
        for t in node.input:
            readers[t] = readers.get(t, 0) + 1
    outputs = {o.name for o in g.output}
    conv_out: set[str] = set()
    fused: set[int] = set()
    for k, node in enumerate(g.node):
        if node.op_type == "Conv":
            conv_out.update(node.output)
            continue
        src = node.input[0] if node.input else ""
        if src in conv_out and readers.get(src) == 1 and src not in outputs and (
                node.op_type == "BatchNormalization" or node.op_type in FUSABLE_ACTIVATIONS):
            fused.add(k)
            if node.op_type == "BatchNormalization":  # Conv+BN is still a Conv: keep going
                conv_out.update(node.output)
    return fused


def featurize(node: onnx.NodeProto, name: str, shapes: dict[str, list[int]],
              inits: set[str]) -> NodeFeatures:
    op = node.op_type
    kind = OP_KIND.get(op, "memory")
    ins = [shapes.get(i) for i in node.input if i]
    outs = [shapes.get(o) for o in node.output if o]
    x = ins[0] if ins else None
    y = outs[0] if outs else None
    in_el = sum(_numel(s) for s, n in zip(ins, [i for i in node.input if i], strict=False)
                if n not in inits)
    out_el = sum(_numel(s) for s in outs)
    param_el = sum(_numel(shapes.get(n)) for n in node.input if n and n in inits)
    sub = OP_CODE.get(op, 0.0)
    kernel = stride = depthwise = cin = cout = spatial = seq = 0.0
    flops = float(out_el)
    if kind == "conv" and x and y and len(x) >= 3:
        w = shapes.get(node.input[1], [])
        group = int(_attr(node, "group", 1))
        ks = list(_attr(node, "kernel_shape", w[2:] if len(w) > 2 else [1]))
        st = list(_attr(node, "strides", [1]))
        kernel, stride = float(max(ks)), float(max(st))
        cin, cout = float(x[1]), float(y[1])
        depthwise = 1.0 if group > 1 and group == x[1] else 0.0
        spatial = float(_numel(y[2:]))
        flops = 2.0 * cout * spatial * (cin / group) * math.prod(ks)
    elif kind == "gemm" and ins and y:
        a = x or [1]
        kdim = a[-1] if not (op == "Gemm" and _attr(node, "transA", 0)) else a[0]
        cin, cout = float(kdim), float(y[-1])
        spatial = float(_numel(y[:-1]))
        flops = 2.0 * _numel(y) * kdim
    elif kind == "pool" and x and y:
        if op.startswith("Global"):
            kernel, stride = float(_numel(x[2:])), 1.0
        else:
            ks = list(_attr(node, "kernel_shape", [1]))
            kernel = float(max(ks))
            stride = float(max(list(_attr(node, "strides", [1]))))
        cin = cout = float(x[1]) if len(x) > 1 else 1.0
        spatial = float(_numel(y[2:]))
        flops = float(_numel(y)) * (kernel if op.startswith("Global") else kernel * kernel)
    elif kind == "rnn" and x:
        hidden = int(_attr(node, "hidden_size", 1))
        gates = {"LSTM": 4, "GRU": 3}.get(op, 1)
        seq = float(x[0])
        cin, cout = float(x[-1]), float(hidden)
        bidir = _attr(node, "direction", b"forward") in (b"bidirectional", "bidirectional")
        dirs = 2 if bidir else 1
        flops = 2.0 * seq * dirs * gates * hidden * (x[-1] + hidden)
    elif kind in ("activation", "norm", "eltwise", "memory"):
        cin = float(x[1]) if x and len(x) > 1 else 1.0
        spatial = float(_numel(x[2:])) if x and len(x) > 2 else 1.0
        flops = float(max(in_el, out_el))
    tree = (sub, kernel, stride, depthwise, cin, cout, spatial, seq)
    linear = (flops / 1e6, in_el / 1e6, out_el / 1e6, param_el / 1e6)
    return NodeFeatures(name, op, kind, tree, linear, flops)

