"""Build head and tail ONNX models for a cut (no onnx.utils.Extractor: captures are kept).

A slice is the chosen dynamic nodes plus every constant node they (transitively) need, in the
original file order, with only the initializers used, the original opset imports, IR version and
node names, and ``value_info`` for every intermediate tensor. A slice output that is also a slice
input (a graph output computed in the head, or a raw graph input the tail needs) is passed
straight through: onnxruntime accepts a graph output that is a graph input.
"""

from __future__ import annotations

from collections.abc import Iterable

from coinf.convert.cost import tensor_bytes
from coinf.convert.graph import Graph, subgraphs, value_info
from onnx import GraphProto, ModelProto, NodeProto, helper


def closure(g: Graph, dynamic_nodes: Iterable[int], tensors: Iterable[str] = ()) -> list[int]:
    """The given nodes plus the constant nodes they (or the constant ``tensors``) need, sorted
    in file (topological) order."""
    keep = set(dynamic_nodes)
    for t in tensors:
        p = g.producer.get(t)
        if p is not None and not g.nodes[p].dynamic:
            keep.add(p)
    stack = list(keep)
    while stack:
        i = stack.pop()
        for t in g.nodes[i].inputs:
            p = g.producer.get(t)
            if p is not None and p not in keep and not g.nodes[p].dynamic:
                keep.add(p)
                stack.append(p)
    return sorted(keep)


def used_initializers(g: Graph, nodes: Iterable[int]) -> list[str]:
    names: dict[str, None] = {}
    for i in nodes:
        for t in g.nodes[i].inputs:
            if t in g.initializers:
                names.setdefault(t)
    return list(names)


def _constant_bytes(node: NodeProto) -> int:
    """Bytes of a node's own weights: a Constant's value, and the initializers and Constants
    inside its sub-graphs (If branches, Loop/Scan bodies), recursively."""
    total = 0
    if node.op_type == "Constant":
        total += sum(tensor_bytes(a.t) for a in node.attribute if a.name == "value")
    for sub in subgraphs(node):
        total += sum(tensor_bytes(t) for t in sub.initializer)
        total += sum(_constant_bytes(n) for n in sub.node)
    return total


def param_bytes(g: Graph, nodes: Iterable[int]) -> int:
    """Bytes of initializers and Constant values in a slice, each counted once (outer-scope
    initializers a sub-graph captures count once too; its local weights count with its node)."""
    nodes = list(nodes)
    total = sum(tensor_bytes(g.initializers[t]) for t in used_initializers(g, nodes))
    return total + sum(_constant_bytes(g.model.graph.node[i]) for i in nodes)


def build_slice(g: Graph, dynamic_nodes: Iterable[int], inputs: Iterable[str],
                outputs: Iterable[str], name: str) -> ModelProto:
    """A self-contained model computing ``outputs`` from ``inputs`` with the given nodes."""
    src = g.model
    inputs = list(inputs)
    outputs = list(outputs)
    idx = closure(g, dynamic_nodes, [t for t in outputs if t not in inputs])
    inits = used_initializers(g, idx)
    inits += [t for t in outputs if t in g.initializers and t not in inputs and t not in inits]
    graph = GraphProto(name=f"{src.graph.name or 'graph'}_{name}")
    graph.node.extend(src.graph.node[i] for i in idx)
    graph.input.extend(value_info(t, g.ttype(t)) for t in inputs)
    graph.output.extend(value_info(t, g.ttype(t)) for t in outputs)
    graph.initializer.extend(g.initializers[t] for t in inits)
    if src.ir_version < 4:  # IR 3 requires every initializer to be a graph input too
        graph.input.extend(value_info(t, g.ttype(t)) for t in inits if t not in inputs)
    skip = set(inputs) | set(outputs) | set(inits)
    for i in idx:
        for o in g.nodes[i].outputs:
            if o not in skip and o in g.types:
                graph.value_info.append(value_info(o, g.types[o]))
                skip.add(o)
    model = helper.make_model(graph, opset_imports=list(src.opset_import),
                              producer_name="coinf", producer_version=src.producer_version)
    model.ir_version = src.ir_version
    model.functions.extend(src.functions)
    for p in src.metadata_props:
        model.metadata_props.add(key=p.key, value=p.value)
    return model


