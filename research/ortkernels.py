"""Counts of what onnxruntime really runs for a slice, read off its optimized graph
(:func:`coinf.device.ortgraph.optimized_graph`, no inference): kernels dispatched, NCHWc layout
reorders and the elements they copy -- the fixed-cost terms of the slice model the training
data (:mod:`.context_data`, :mod:`.partlabels`) records for every slice and part.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from coinf.device import ortgraph

REORDERS = ("ReorderInput", "ReorderOutput")


@dataclass(frozen=True)
class Kernels:
    """The optimized graph's kernel count, its layout reorders and the elements they copy."""

    count: int
    reorders: int
    reorder_melems: float


def kernels(model: str | Path | onnx.ModelProto, threads: int = 1) -> Kernels:
    """:class:`Kernels` of ``model``'s optimized graph (tensor sizes from the original model's
    inferred shapes: reorders keep the original tensor names on their outer side)."""
    original = model if isinstance(model, onnx.ModelProto) else \
        onnx.load(str(model), load_external_data=False)
    return count_kernels(original, ortgraph.optimized_graph(model, threads))


def count_kernels(original: onnx.ModelProto, optimized: onnx.ModelProto) -> Kernels:
    """:class:`Kernels` of ``optimized``, the graph onnxruntime made of ``original``."""
    from coinf.device.features import shape_map

    shapes = shape_map(original)

    def numel(name: str) -> int:
        shape = shapes.get(name)
        return int(np.prod([d if d and d > 0 else 1 for d in shape])) if shape else 0

    reorders, elems = 0, 0
    for n in optimized.graph.node:
        if n.op_type == "ReorderInput":
            reorders, elems = reorders + 1, elems + numel(n.input[0])
        elif n.op_type == "ReorderOutput":
            reorders, elems = reorders + 1, elems + numel(n.output[0])
    return Kernels(len(optimized.graph.node), reorders, elems / 1e6)


__all__ = ["Kernels", "count_kernels", "kernels"]
