"""Synthetic *multi-layer* CNN/MLP models timed in context: the in-context counterpart of the
single-layer sweep (:mod:`.sweep`).

Each model chains random blocks as real networks do -- Conv + BatchNormalization + ReLU/ReLU6,
depthwise and pointwise convolutions, residual Adds, pooling, then global pooling and Gemm
(+ReLU) layers -- so onnxruntime fuses and re-lays them out (NCHWc) exactly as it does inside
zoo models. :func:`run_context_sweep` profiles every model at ``ORT_ENABLE_ALL`` and attributes
kernel times to anchor nodes (:mod:`.incontext`); the samples cover kernel groups that a
leave-one-model-out split of a small zoo would otherwise leave to one model alone.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from coinf.device.incontext import model_features, profile_in_context
from coinf.device.slicepred import NodeSample
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class _Builder:
    def __init__(self, rng: random.Random, c: int, hw: int) -> None:
        self.r = rng
        self.g = np.random.default_rng(rng.randrange(1 << 30))
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.c, self.hw, self.x = c, hw, "x"
        self.k = 0

    def _name(self, op: str) -> str:
        self.k += 1
        return f"{op}_{self.k}"

    def _w(self, name: str, *shape: int, offset: float = 0.0) -> str:
        arr = (self.g.standard_normal(shape) * 0.1 + offset).astype(np.float32)
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def node(self, op: str, ins: list[str], **attrs: Any) -> str:
        name = self._name(op)
        out = f"{name}_out"
        self.nodes.append(helper.make_node(op, ins, [out], name=name, **attrs))
        return out

    def conv(self, cout: int, k: int, stride: int, group: int = 1) -> None:
        name = f"w{self.k}"
        w = self._w(name, cout, self.c // group, k, k)
        b = self._w(f"b{self.k}", cout)
        self.x = self.node("Conv", [self.x, w, b], kernel_shape=[k, k], strides=[stride] * 2,
                           pads=[k // 2] * 4, group=group)
        self.c, self.hw = cout, (self.hw + stride - 1) // stride
        if self.r.random() < 0.6:
            s, bb = self._w(f"s{self.k}", cout, offset=1.0), self._w(f"bb{self.k}", cout)
            m, v = self._w(f"m{self.k}", cout), self._w(f"v{self.k}", cout, offset=2.0)
            self.x = self.node("BatchNormalization", [self.x, s, bb, m, v])
        act = self.r.choice(["Relu", "Relu", "Clip", None])
        if act == "Clip":
            lo, hi = f"lo{self.k}", f"hi{self.k}"
            self.inits += [numpy_helper.from_array(np.array(0.0, np.float32), lo),
                           numpy_helper.from_array(np.array(6.0, np.float32), hi)]
            self.x = self.node("Clip", [self.x, lo, hi])
        elif act:
            self.x = self.node(act, [self.x])

    def block(self) -> None:
        r = self.r
        kind = r.choice(["conv", "conv", "dwsep", "residual", "pool"])
        if kind == "conv":
            self.conv(r.choice([8, 16, 32, 64, 96, 128]), r.choice([1, 3, 3, 5]),
                      2 if self.hw > 8 and r.random() < 0.3 else 1)
        elif kind == "dwsep":
            expand = self.c * r.choice([1, 2, 4, 6])
            if expand != self.c:
                self.conv(expand, 1, 1)
            self.conv(self.c, 3, 2 if self.hw > 8 and r.random() < 0.3 else 1, group=self.c)
            self.conv(r.choice([8, 16, 24, 32, 64]), 1, 1)
        elif kind == "residual":
            skip, c = self.x, self.c
            self.conv(c, 3, 1)
            self.conv(c, r.choice([1, 3]), 1)
            self.x = self.node("Add", [self.x, skip])
            if r.random() < 0.5:
                self.x = self.node("Relu", [self.x])
        elif self.hw > 4:
            op = r.choice(["MaxPool", "AveragePool"])
            self.x = self.node(op, [self.x], kernel_shape=[2, 2], strides=[2, 2])
            self.hw //= 2

    def head(self) -> None:
        self.x = self.node("GlobalAveragePool", [self.x])
        self.x = self.node("Flatten", [self.x])
        width = self.c
        for _ in range(self.r.choice([1, 2])):
            out = self.r.choice([32, 64, 128, 256])
            self.x = self.node("Gemm", [self.x, self._w(f"fw{self.k}", out, width),
                                        self._w(f"fb{self.k}", out)], transB=1)
            if self.r.random() < 0.6:
                self.x = self.node("Relu", [self.x])
            width = out

    def model(self, c_in: int, hw_in: int) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, "context",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, hw_in, hw_in])],
            [helper.make_tensor_value_info(self.x, TensorProto.FLOAT, None)], self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        m.ir_version = 8
        return onnx.shape_inference.infer_shapes(m)


def random_network(seed: int) -> onnx.ModelProto:
    """One random chain of blocks (deterministic for a seed)."""
    r = random.Random(seed)
    c, hw = r.choice([3, 8, 16]), r.choice([16, 32, 48, 64, 96])
    b = _Builder(r, c, hw)
    for _ in range(r.randint(3, 8)):
        b.block()
    b.head()
    return b.model(c, hw)


def run_context_sweep(count: int = 40, seed: int = 0, threads: int = 1, repeats: int = 10,
                      progress: Callable[[str], None] | None = None) -> list[NodeSample]:
    """Profile ``count`` random networks in context; one sample per anchor node."""
    out: list[NodeSample] = []
    for i in range(count):
        model = random_network(seed * 100_003 + i)
        feats = model_features(model)
        prof = profile_in_context_model(model, threads, repeats)
        out += [NodeSample(f"synthetic{i}", feats[n][0], feats[n][1], ms)
                for n, ms in prof.items() if n in feats]
        if progress and (i % 10 == 0 or i == count - 1):
            progress(f"context sweep {i + 1}/{count}: {len(model.graph.node)} nodes")
    return out


def profile_in_context_model(model: onnx.ModelProto, threads: int = 1,
                             repeats: int = 10) -> dict[str, float]:
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.onnx")
        onnx.save(model, path)
        return profile_in_context(path, "all", threads, 3, repeats).nodes
