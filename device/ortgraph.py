"""What onnxruntime really runs for a model: its optimized graph, read without running it.

At ``ORT_ENABLE_ALL`` onnxruntime fuses nodes (Conv + BatchNormalization + activation, Gemm +
activation, MatMul + Add), switches convolutions and pools to its NCHWc layout and inserts
``ReorderInput``/``ReorderOutput`` kernels where a tensor enters or leaves that layout. A
slice's fixed costs follow those kernels, not the original nodes: every kernel dispatched costs
the executor a few microseconds, and every reorder copies its tensor. Building an
``InferenceSession`` with ``optimized_model_filepath`` makes onnxruntime write the graph it
will run -- nn-Meter's "kernel detection", done by the runtime itself -- and no inference runs.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

REORDERS = ("ReorderInput", "ReorderOutput")


@dataclass(frozen=True)
class Kernels:
    """The optimized graph's kernel count, its layout reorders and the elements they copy."""

    count: int
    reorders: int
    reorder_melems: float


def optimized_graph(model: str | Path | onnx.ModelProto, threads: int = 1) -> onnx.ModelProto:
    """The graph onnxruntime runs for ``model`` at ``ORT_ENABLE_ALL`` with ``threads``."""
    import onnxruntime as ort
    from coinf.device.sweep import session_options

    opts = session_options(threads, "all")
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    with tempfile.TemporaryDirectory() as tmp:
        opts.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        opts.log_severity_level = 3  # its warning that NCHWc graphs are machine-specific
        ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])
        return onnx.load(opts.optimized_model_filepath, load_external_data=False)


def kernels(model: str | Path | onnx.ModelProto, threads: int = 1) -> Kernels:
    """:class:`Kernels` of ``model``'s optimized graph (tensor sizes from the original model's
    inferred shapes: reorders keep the original tensor names on their outer side)."""
    original = model if isinstance(model, onnx.ModelProto) else \
        onnx.load(str(model), load_external_data=False)
    return count_kernels(original, optimized_graph(model, threads))


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


__all__ = ["Kernels", "count_kernels", "kernels", "optimized_graph"]
