"""Adapter: an ONNX graph's nodes and tensors as a :class:`~wearable.planner.mincut.Dag`.

A small dependency walk of its own (the converter owns the full graph analysis): initializers
and constants are not tensors that travel; graph inputs are produced by the wearable (``None``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from coinf.device.features import shape_map
from coinf.wearable.planner.mincut import Dag

_ITEMSIZE: dict[int, int] = {
    onnx.TensorProto.FLOAT: 4, onnx.TensorProto.FLOAT16: 2, onnx.TensorProto.DOUBLE: 8,
    onnx.TensorProto.INT64: 8, onnx.TensorProto.INT32: 4, onnx.TensorProto.INT8: 1,
             onnx.TensorProto.UINT8: 1, onnx.TensorProto.BOOL: 1}


def node_names(model: onnx.ModelProto) -> list[str]:
    """Node names as the planner uses them (``op_index`` for unnamed nodes)."""
    return [n.name or f"{n.op_type}_{k}" for k, n in enumerate(model.graph.node)]


def dag_from_onnx(model: onnx.ModelProto, wearable_ms: Mapping[str, float],
                  handheld_ms: Mapping[str, float]) -> Dag:
    """Build a Dag; nodes missing from the cost maps cost 0 on that side."""
    g = model.graph
    shapes = shape_map(model)
    dtypes: dict[str, int] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        dtypes[vi.name] = int(vi.type.tensor_type.elem_type)
    inits = {i.name for i in g.initializer}
    names = node_names(model)
    producer: dict[str, str | None] = {i.name: None for i in g.input if i.name not in inits}
    consumers: dict[str, list[str]] = {}
    dag = Dag()
    for name, node in zip(names, g.node, strict=True):
        dag.add_node(name, wearable_ms.get(name, 0.0), handheld_ms.get(name, 0.0))
        for t in node.input:
            if t and t in producer:
                consumers.setdefault(t, [])
                if name not in consumers[t]:
                    consumers[t].append(name)
        for t in node.output:
            if t:
                producer[t] = name
    outputs = {o.name for o in g.output}
    for t, p in producer.items():
        size = int(np.prod(shapes.get(t, [1]) or [1])) * _ITEMSIZE.get(dtypes.get(t, 1), 4)
        dag.add_tensor(t, p, consumers.get(t, []), size, t in outputs)
    return dag
