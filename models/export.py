"""Deterministic ONNX export of a zoo module and its check against onnxruntime (imports torch)."""

from __future__ import annotations

import io
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import onnx
import torch
from torch import nn

if TYPE_CHECKING:
    from coinf.models.inputs import InputSpec

OPSET = 17
ATOL = 1e-4
RTOL = 1e-4


def export_onnx(
    model: nn.Module,
    inputs: Sequence[InputSpec],
    outputs: Sequence[str],
    *,
    keep_batchnorm: bool,
    doc: str,
    metadata: Mapping[str, str],
) -> bytes:
    """Serialized ONNX (opset 17, batch 1, static shapes) of ``model`` in eval mode.

    Uses the TorchScript exporter: same module and weights give the same bytes, and node names
    follow module paths. ``keep_batchnorm`` turns off constant folding so BatchNormalization nodes
    stay visible (as in ONNX Model Zoo CNNs) instead of being folded into the convolutions.
    """
    model.eval()
    rng = np.random.default_rng(0)
    sample = tuple(torch.from_numpy(spec.sample(rng)) for spec in inputs)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            sample,
            buf,  # type: ignore[arg-type]
            opset_version=OPSET,
            dynamo=False,
            input_names=[s.name for s in inputs],
            output_names=list(outputs),
            do_constant_folding=not keep_batchnorm,
            training=torch.onnx.TrainingMode.EVAL,
        )
    proto = onnx.load_from_string(buf.getvalue())
    proto.doc_string = doc
    for key, value in sorted(metadata.items()):
        prop = proto.metadata_props.add()
        prop.key, prop.value = key, value
    onnx.checker.check_model(proto)
    return proto.SerializeToString()


def max_abs_error(
    model: nn.Module, onnx_bytes: bytes, inputs: Sequence[InputSpec], trials: int = 2
) -> float:
    """Largest |torch - onnxruntime| over ``trials`` seeded random feeds; raise if off."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(onnx_bytes, opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    worst = 0.0
    for _ in range(trials):
        feed = {spec.name: spec.sample(rng) for spec in inputs}
        with torch.no_grad():
            ref = model(*(torch.from_numpy(feed[s.name]) for s in inputs))
        refs = [ref] if isinstance(ref, torch.Tensor) else list(ref)
        got = sess.run(None, feed)
        for want, have in zip(refs, got, strict=True):
            want_np = want.numpy()
            np.testing.assert_allclose(have, want_np, rtol=RTOL, atol=ATOL)
            worst = max(worst, float(np.max(np.abs(have - want_np))))
    return worst
