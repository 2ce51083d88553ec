"""A tiny hand-made split bundle for the planner's tests (the real maker is `coinf split`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, utils

from coinf.bundle import Bundle, Candidate, Part, TensorSpec, sha256_file


def _w(*shape: int) -> np.ndarray:
    return (np.random.default_rng(len(shape)).standard_normal(shape) * 0.1).astype(np.float32)


def make_model(path: Path, hw: int = 32) -> onnx.ModelProto:
    """x[1,3,hw,hw] -conv1-> a -relu1-> b -conv2(s2)-> c -gap-> d -flatten-> e -fc-> y[1,10]."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["a"], "conv1", kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["b"], "relu1"),
        helper.make_node("Conv", ["b", "w2", "b2"], ["c"], "conv2", kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["c"], ["d"], "gap"),
        helper.make_node("Flatten", ["d"], ["e"], "flatten"),
        helper.make_node("Gemm", ["e", "wf", "bf"], ["y"], "fc", transB=1),
    ]
    inits = {"w1": _w(16, 3, 3, 3), "b1": _w(16), "w2": _w(32, 16, 3, 3), "b2": _w(32),
             "wf": _w(10, 32), "bf": _w(10)}
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model)
    onnx.save(model, str(path))
    return model


def make_bundle(root: Path, hw: int = 32) -> Bundle:
    """handheld-only, c001 (after relu1), c002 (after gap), wearable-only."""
    root.mkdir(parents=True, exist_ok=True)
    model = make_model(root / "model.onnx", hw)
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
              for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]}
    order = ["conv1", "relu1", "conv2", "gap", "flatten", "fc"]
    flops = {"conv1": 2 * 16 * hw * hw * 27, "relu1": 16 * hw * hw,
             "conv2": 2 * 32 * (hw // 2) ** 2 * 144, "gap": 32 * (hw // 2) ** 2,
             "flatten": 0, "fc": 2 * 320}

    def spec(name: str) -> TensorSpec:
        shape = tuple(shapes[name])
        return TensorSpec(name, shape, "float32", int(np.prod(shape)) * 4)

    def part(nodes: list[str], file: str | None) -> Part:
        return Part(file, sum(flops[n] for n in nodes), 0, tuple(nodes))

    cands = [Candidate("c000", "handheld-only", (spec("x"),), part([], None),
                       part(order, "model.onnx"))]
    for i, (tensor, k) in enumerate((("b", 2), ("d", 4)), start=1):
        cid = f"c{i:03d}"
        (root / cid).mkdir(exist_ok=True)
        utils.extract_model(str(root / "model.onnx"), str(root / cid / "head.onnx"), ["x"],
                            [tensor])
        utils.extract_model(str(root / "model.onnx"), str(root / cid / "tail.onnx"), [tensor],
                            ["y"])
        cands.append(Candidate(cid, f"after {order[k - 1]}", (spec(tensor),),
                               part(order[:k], f"{cid}/head.onnx"),
                               part(order[k:], f"{cid}/tail.onnx")))
    cands.append(Candidate("c003", "wearable-only", (spec("y"),), part(order, "model.onnx"),
                           part([], None)))
    b = Bundle(root, "model.onnx", sha256_file(root / "model.onnx"), (spec("x"),), (spec("y"),),
               tuple(cands))
    b.save()
    return Bundle.load(root)


def make_skip_model(path: Path, hw: int = 16) -> onnx.ModelProto:
    """A residual block: x -conv1-> a -relu-> b -conv2-> c; add(b, c) -> d -gap-> e -fc-> y.

    ``b`` has two consumers, so a cut after ``conv2`` must send ``b`` and ``c``.
    """
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["a"], "conv1", kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["b"], "relu"),
        helper.make_node("Conv", ["b", "w2", "b2"], ["c"], "conv2", kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["b", "c"], ["d"], "add"),
        helper.make_node("GlobalAveragePool", ["d"], ["e"], "gap"),
        helper.make_node("Flatten", ["e"], ["f"], "flatten"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], "fc", transB=1),
    ]
    inits = {"w1": _w(8, 3, 3, 3), "b1": _w(8), "w2": _w(8, 8, 3, 3), "b2": _w(8),
             "wf": _w(4, 8), "bf": _w(4)}
    graph = helper.make_graph(
        nodes, "skip", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model)
    onnx.save(model, str(path))
    return model
