"""A tiny hand-made bundle (no converter involved) for transport and Session tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from coinf import PlacementOptions, SessionOptions
from coinf.bundle import Bundle, Candidate, Part, TensorSpec, sha256_file

IN = TensorSpec("x", (1, 16), "float32", 64)
MID = TensorSpec("h", (1, 8), "float32", 32)
OUT = TensorSpec("y", (1, 4), "float32", 16)


def _model(nodes, inputs, outputs, inits, name: str) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(t.name, TensorProto.FLOAT, list(t.shape)) for t in inputs],
        [helper.make_tensor_value_info(t.name, TensorProto.FLOAT, list(t.shape)) for t in outputs],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def make_tiny_bundle(root: Path, seed: int = 0) -> Bundle:
    """x(1x16) -> MatMul -> Relu -> h(1x8) -> MatMul -> y(1x4); three candidates."""
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w2")
    n1 = helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1")
    n2 = helper.make_node("Relu", ["a"], ["h"], name="relu")
    n3 = helper.make_node("MatMul", ["h", "w2"], ["y"], name="mm2")
    root.mkdir(parents=True, exist_ok=True)
    (root / "c001").mkdir(exist_ok=True)
    files = {
        "model.onnx": _model([n1, n2, n3], [IN], [OUT], [w1, w2], "tiny"),
        "c000/tail.onnx": _model([n1, n2, n3], [IN], [OUT], [w1, w2], "tail0"),
        "c001/head.onnx": _model([n1, n2], [IN], [MID], [w1], "head1"),
        "c001/tail.onnx": _model([n3], [MID], [OUT], [w2], "tail1"),
        "c002/head.onnx": _model([n1, n2, n3], [IN], [OUT], [w1, w2], "head2"),
    }
    for rel, model in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(root / rel))
    cands = (
        Candidate("c000", "handheld-only", (IN,), Part(None, 0, 0, ()),
                  Part("c000/tail.onnx", 320, 640, ("mm1", "relu", "mm2"))),
        Candidate("c001", "relu", (MID,), Part("c001/head.onnx", 264, 512, ("mm1", "relu")),
                  Part("c001/tail.onnx", 64, 128, ("mm2",))),
        Candidate("c002", "wearable-only", (OUT,),
                  Part("c002/head.onnx", 320, 640, ("mm1", "relu", "mm2")), Part(None, 0, 0, ())),
    )
    bundle = Bundle(root, "model.onnx", sha256_file(root / "model.onnx"), (IN,), (OUT,), cands)
    bundle.save()
    return Bundle.load(root)


def reference(bundle: Bundle, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(bundle.model_path), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def fixed(split: str, packing: str = "raw", **groups: Any) -> SessionOptions:
    """Session options with the split (and packing) fixed, and any other groups as given
    (``link=LinkOptions(...)``, ``emulation=EmulationOptions(...)``)."""
    return SessionOptions(placement=PlacementOptions(split=split, packing=packing), **groups)
