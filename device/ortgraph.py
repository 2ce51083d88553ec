"""What onnxruntime really runs for a model: its optimized graph, read without running it.

At ``ORT_ENABLE_ALL`` onnxruntime fuses nodes (Conv + BatchNormalization + activation, Gemm +
activation, MatMul + Add), switches convolutions and pools to its NCHWc layout and inserts
``ReorderInput``/``ReorderOutput`` kernels where a tensor enters or leaves that layout. A
slice's fixed costs follow those kernels, not the original nodes: every kernel dispatched costs
the executor a few microseconds, and every reorder copies its tensor (the research package
counts them, ``coinf.research.ortkernels``). Building an ``InferenceSession`` with
``optimized_model_filepath`` makes onnxruntime write the graph it will run -- nn-Meter's
"kernel detection", done by the runtime itself -- and no inference runs. The runtime reads it
for the residual Adds a convolution absorbs (:func:`coinf.device.incontext.sum_fused`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import onnx


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


__all__ = ["optimized_graph"]
