"""Synthetic *multi-layer* CNN/MLP models timed in context: the in-context counterpart of the
single-layer sweep (:mod:`coinf.device.sweep`).

Each model chains random blocks as real networks do -- Conv + BatchNormalization + ReLU/ReLU6,
depthwise and pointwise convolutions, residual Adds, pooling, then global pooling and Gemm
(+ReLU) layers -- so onnxruntime fuses and re-lays them out (NCHWc) exactly as it does inside
zoo models. :func:`run_context_sweep` profiles every model at ``ORT_ENABLE_ALL`` and attributes
kernel times to anchor nodes (:mod:`coinf.device.incontext`); the samples cover kernel groups that a
leave-one-model-out split of a small zoo would otherwise leave to one model alone.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from coinf.device.incontext import model_features, profile_in_context
from coinf.research.slicetrain import NodeSample
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

    def _const(self, name: str, arr: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def node(self, op: str, ins: list[str], **attrs: Any) -> str:
        name = self._name(op)
        out = f"{name}_out"
        self.nodes.append(helper.make_node(op, ins, [out], name=name, **attrs))
        return out

    def conv(self, cout: int, k: int, stride: int, group: int = 1) -> None:
        """A square convolution, then BatchNormalization (60 %) and ReLU, ReLU6 or nothing."""
        self.plain_conv(cout, k, stride, group)
        if self.r.random() < 0.6:
            self.batchnorm()
        act = self.r.choice(["Relu", "Relu", "Clip", None])
        if act == "Clip":
            self.relu6()
        elif act:
            self.x = self.node(act, [self.x])

    def plain_conv(self, cout: int, k: int, stride: int, group: int = 1) -> None:
        w = self._w(f"w{self.k}", cout, self.c // group, k, k)
        b = self._w(f"b{self.k}", cout)
        self.x = self.node("Conv", [self.x, w, b], kernel_shape=[k, k], strides=[stride] * 2,
                           pads=[k // 2] * 4, group=group)
        self.c, self.hw = cout, (self.hw + stride - 1) // stride

    def batchnorm(self) -> None:
        s, bb = self._w(f"s{self.k}", self.c, offset=1.0), self._w(f"bb{self.k}", self.c)
        m, v = self._w(f"m{self.k}", self.c), self._w(f"v{self.k}", self.c, offset=2.0)
        self.x = self.node("BatchNormalization", [self.x, s, bb, m, v])

    def relu6(self) -> None:
        lo = self._const(f"lo{self.k}", np.array(0.0, np.float32))
        hi = self._const(f"hi{self.k}", np.array(6.0, np.float32))
        self.x = self.node("Clip", [self.x, lo, hi])

    def block(self) -> None:
        r = self.r
        kind = r.choice(["conv", "conv", "dwsep", "residual", "pool", "wide", "branches", "lrn"])
        if kind == "conv":
            self.conv(r.choice([4, 8, 12, 16, 24, 32, 48, 64, 64, 96, 128, 192]),
                      r.choice([1, 3, 3, 3, 5]),
                      2 if self.hw > 8 and r.random() < 0.3 else 1)
        elif kind == "wide":  # AlexNet-style stems: large kernels and strides
            k = r.choice([5, 7, 11])
            self.conv(r.choice([16, 32, 48, 64, 96]), k,
                      r.choice([2, 4]) if self.hw >= 4 * k else 1)
        elif kind == "lrn":
            self.x = self.node("LRN", [self.x], size=r.choice([3, 5]), alpha=1e-4, beta=0.75,
                               bias=r.choice([1.0, 2.0]))
        elif kind == "branches":  # Inception-style: parallel 1x1 / kxk / pool branches, Concat
            self.branches()
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
            k = r.choice([2, 3])
            self.x = self.node(op, [self.x], kernel_shape=[k, k], strides=[2, 2],
                               pads=[k // 2 if k == 3 else 0] * 4)
            self.hw = (self.hw + 2 * (k // 2 if k == 3 else 0) - k) // 2 + 1

    def branches(self) -> None:
        r, src, c_in = self.r, self.x, self.c
        outs, total = [], 0
        for _ in range(r.randint(2, 4)):
            self.x, self.c = src, c_in
            kind = r.choice(["1x1", "kxk", "pool"])
            if kind == "pool":
                self.x = self.node(r.choice(["AveragePool", "MaxPool"]), [self.x],
                                   kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
                self.conv(r.choice([4, 8, 16, 24]), 1, 1)
            else:
                if kind == "kxk":
                    self.conv(r.choice([4, 8, 16]), 1, 1)
                self.conv(r.choice([4, 6, 8, 12, 16, 24, 32, 48]),
                          1 if kind == "1x1" else r.choice([3, 5, 7]), 1)
            outs.append(self.x)
            total += self.c
        self.x = self.node("Concat", outs, axis=1)
        self.c = total

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


def _sequence_model(b: _Builder, inputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
    graph = helper.make_graph(b.nodes, "context", inputs,
                              [helper.make_tensor_value_info(b.x, TensorProto.FLOAT, None)],
                              b.inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def random_sequence_network(seed: int) -> onnx.ModelProto:
    """One random sequence model (deterministic for a seed): token embeddings (Gather) then an
    LSTM/GRU, a TextCNN (1-D convolutions, ReduceMax, Concat) or a WaveNet-style stack of
    dilated, gated 1-D convolutions (Conv, Slice, Tanh, Sigmoid, Mul, Add), and a MatMul + Add
    or Gemm head -- the ops of the zoo's audio and text models."""
    r = random.Random(seed)
    b = _Builder(r, 1, 1)
    seq, emb, vocab = r.choice([8, 16, 32, 64, 100, 128]), r.choice([16, 32, 50, 64, 128]), \
        r.choice([500, 1000, 2000, 4000])
    kind = r.choice(["rnn", "rnn", "textcnn", "wavenet"])
    inputs = [helper.make_tensor_value_info("x", TensorProto.INT64, [1, seq])]
    if kind == "wavenet":  # features in, no embedding
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, emb, seq])]
        x = "x"
    else:
        x = b.node("Gather", [b._w("emb", vocab, emb), "x"])  # [1, seq, emb]
    if kind == "rnn":
        x = b.node("Transpose", [x], perm=[1, 0, 2])  # [seq, 1, emb]
        hid, dirs = r.choice([32, 64, 128, 256]), r.choice([1, 1, 2])
        op = r.choice(["LSTM", "GRU"])
        gates = 4 if op == "LSTM" else 3
        ins = [x, b._w(f"W{b.k}", dirs, gates * hid, emb), b._w(f"R{b.k}", dirs, gates * hid, hid),
               b._w(f"B{b.k}", dirs, 2 * gates * hid)]
        attrs: dict[str, Any] = {"hidden_size": hid,
                                 "direction": "bidirectional" if dirs == 2 else "forward"}
        if op == "GRU":
            attrs["linear_before_reset"] = 1
        name = b._name(op)
        y = f"{name}_y"
        b.nodes.append(helper.make_node(op, ins, [y], name=name, **attrs))  # [seq, dirs, 1, hid]
        shape = b._const("shape", np.array([seq, dirs * hid], np.int64))
        x = b.node("Transpose", [y], perm=[0, 2, 1, 3])
        x = b.node("Reshape", [x, shape])
        x = b.node("MatMul", [x, b._w(f"mw{b.k}", dirs * hid, r.choice([64, 256, 1000]))])
        b.x = b.node("Add", [x, b._w(f"mb{b.k}", int(b.inits[-1].dims[1]))])
        return _sequence_model(b, inputs)
    if kind == "textcnn":
        x = b.node("Transpose", [x], perm=[0, 2, 1])  # [1, emb, seq]
        pooled, width = [], 0
        for k in r.sample([2, 3, 4, 5], r.randint(1, 3)):
            c = r.choice([16, 32, 64, 100])
            y = b.node("Conv", [x, b._w(f"cw{b.k}", c, emb, k), b._w(f"cb{b.k}", c)],
                       kernel_shape=[k])
            y = b.node("Relu", [y])
            pooled.append(b.node("ReduceMax", [y], axes=[2], keepdims=0))
            width += c
        x = b.node("Concat", pooled, axis=1) if len(pooled) > 1 else pooled[0]
        b.x = b.node("Gemm", [x, b._w(f"fw{b.k}", r.choice([2, 10, 32]), width),
                              b._w(f"fb{b.k}", int(b.inits[-1].dims[0]))], transB=1)
        return _sequence_model(b, inputs)
    c = r.choice([16, 32, 64])
    x = b.node("Conv", [x, b._w(f"w{b.k}", c, emb, 1), b._w(f"b{b.k}", c)], kernel_shape=[1])
    starts, ends, axes = (b._const(f"s{b.k}", np.array([0], np.int64)),
                          b._const(f"e{b.k}", np.array([seq], np.int64)),
                          b._const(f"a{b.k}", np.array([2], np.int64)))
    for d in [1, 2, 4, 8, 16, 32][: r.randint(2, 6)]:
        h = b.node("Conv", [x, b._w(f"w{b.k}", c, c, 2), b._w(f"b{b.k}", c)], kernel_shape=[2],
                   dilations=[d], pads=[d, d])
        h = b.node("Slice", [h, starts, ends, axes])
        g = b.node("Mul", [b.node("Tanh", [h]), b.node("Sigmoid", [h])])
        g = b.node("Conv", [g, b._w(f"w{b.k}", c, c, 1), b._w(f"b{b.k}", c)], kernel_shape=[1])
        x = b.node("Add", [x, g])
    b.x = b.node("Conv", [b.node("Relu", [x]), b._w(f"w{b.k}", r.choice([10, 29, 40]), c, 1)],
                 kernel_shape=[1])
    return _sequence_model(b, inputs)


def random_network(seed: int) -> onnx.ModelProto:
    """One random chain of blocks (deterministic for a seed)."""
    r = random.Random(seed)
    c, hw = r.choice([1, 3, 8, 16]), r.choice([16, 32, 48, 64, 96, 128])
    b = _Builder(r, c, hw)
    for _ in range(r.randint(3, 8)):
        b.block()
    b.head()
    return b.model(c, hw)


def plain_network(seed: int) -> onnx.ModelProto:
    """A small LeNet/VGG-style stack (deterministic for a seed): 3x3/5x5 convolutions of 4-256
    channels (not only multiples of 8) with ReLU or Tanh, 2x2 max or average pools, on 1 or 3
    channels of 8-64 pixels, then 1-3 Gemm layers."""
    r = random.Random(seed)
    c_in, hw = r.choice([1, 1, 3]), r.choice([8, 12, 16, 28, 32, 32, 48, 64])
    b = _Builder(r, c_in, hw)
    act = r.choice(["Relu", "Relu", "Tanh"])
    pad = r.random() < 0.5
    width = float(r.choice([4, 6, 8, 16, 32]))
    while b.hw >= 4 and len(b.nodes) < 30:
        for _ in range(r.choice([1, 1, 2])):
            k = r.choice([3, 5]) if b.hw > 6 else 3
            if not pad and b.hw <= k:
                break
            p = k // 2 if pad else 0
            w, bias = b._w(f"w{b.k}", int(width), b.c, k, k), b._w(f"b{b.k}", int(width))
            b.x = b.node("Conv", [b.x, w, bias], kernel_shape=[k, k], strides=[1, 1],
                         pads=[p] * 4)
            b.c, b.hw = int(width), b.hw + 2 * p - k + 1
            b.x = b.node(act, [b.x])
        if b.hw < 4:
            break
        b.x = b.node(r.choice(["MaxPool", "MaxPool", "AveragePool"]), [b.x],
                     kernel_shape=[2, 2], strides=[2, 2])
        b.hw //= 2
        width = min(width * r.choice([1.5, 2, 2.5]), 256)
    b.x = b.node("Flatten", [b.x])
    _gemm_chain(b, b.c * b.hw * b.hw, r.randint(1, 3), act, [16, 32, 64, 84, 120, 128, 256, 512],
                [2, 10, 100])
    return b.model(c_in, hw)


def _gemm_chain(b: _Builder, width: int, layers: int, act: str, hidden: list[int],
                outputs: list[int]) -> None:
    for i in range(layers):
        out = b.r.choice(hidden) if i < layers - 1 else b.r.choice(outputs)
        b.x = b.node("Gemm", [b.x, b._w(f"fw{b.k}", out, width), b._w(f"fb{b.k}", out)],
                     transB=1)
        if i < layers - 1:
            if act == "Clip":
                lo, hi = b._const(f"lo{b.k}", np.array(-1.0, np.float32)), \
                    b._const(f"hi{b.k}", np.array(1.0, np.float32))
                b.x = b.node("Clip", [b.x, lo, hi])
            else:
                b.x = b.node(act, [b.x])
        width = out


def embedding_mlp(seed: int) -> onnx.ModelProto:
    """A small SENNA-style window classifier (deterministic for a seed): one or two token
    embeddings (Gather) over a window of 3-11 tokens, Concat, Flatten, then 2-3 Gemm layers
    with a hard tanh (Clip), Tanh, ReLU or Sigmoid between them."""
    r = random.Random(seed)
    b = _Builder(r, 1, 1)
    window = r.choice([3, 5, 7, 11])
    dims = [r.choice([16, 32, 50, 64])] + ([r.choice([2, 5, 8])] if r.random() < 0.6 else [])
    vocab = r.choice([500, 3000, 10000])
    inputs, embedded = [], []
    for j, d in enumerate(dims):
        inputs.append(helper.make_tensor_value_info(f"tokens{j}", TensorProto.INT64, [1, window]))
        table = b._w(f"emb{j}", vocab if j == 0 else 10, d)
        embedded.append(b.node("Gather", [table, f"tokens{j}"]))
    b.x = embedded[0] if len(embedded) == 1 else b.node("Concat", embedded, axis=2)
    b.x = b.node("Flatten", [b.x], axis=1)
    _gemm_chain(b, window * sum(dims), r.randint(2, 3), r.choice(["Clip", "Tanh", "Relu",
                                                                   "Sigmoid"]),
                [32, 64, 100, 150, 200, 300, 500], [2, 10, 45, 100])
    return _sequence_model(b, inputs)


def gated_network(seed: int) -> onnx.ModelProto:
    """A WaveNet-style audio stack (deterministic for a seed): a 1x1 input convolution over
    8-64 features of 32-256 steps (optionally then Tanh), 2-8 gated layers -- a dilated
    kernel-2 or -3 1-D convolution shared by filter and gate or one each, cropped by Slice,
    tanh x sigmoid, a 1x1 residual convolution and Add, and optionally a 1x1 skip convolution
    summed over the layers -- then ReLU and a 1x1 output convolution."""
    r = random.Random(seed)
    b = _Builder(r, 1, 1)
    feats, seq, c = r.choice([8, 13, 20, 40, 64]), r.choice([32, 50, 100, 128, 200, 256]), \
        r.choice([16, 24, 32, 48, 64])
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, feats, seq])]

    def pointwise(src: str, cin: int, cout: int, bias: bool = True) -> str:
        ins = [src, b._w(f"w{b.k}", cout, cin, 1)] + ([b._w(f"b{b.k}", cout)] if bias else [])
        return b.node("Conv", ins, kernel_shape=[1])

    x = pointwise("x", feats, c)
    if r.random() < 0.5:
        x = b.node("Tanh", [x])
    k, split, skip = r.choice([2, 2, 3]), r.random() < 0.6, r.random() < 0.6
    cycle, layers = r.randint(3, 6), r.randint(2, 8)
    starts, ends, axes = (b._const(f"s{b.k}", np.array([0], np.int64)),
                          b._const(f"e{b.k}", np.array([seq], np.int64)),
                          b._const(f"a{b.k}", np.array([2], np.int64)))
    total = ""

    def dilated(src: str, d: int) -> str:
        h = b.node("Conv", [src, b._w(f"w{b.k}", c, c, k), b._w(f"b{b.k}", c)],
                   kernel_shape=[k], dilations=[d], pads=[d * (k - 1)] * 2)
        return b.node("Slice", [h, starts, ends, axes])

    for i in range(layers):
        d = 2 ** (i % cycle)
        f = dilated(x, d)
        g = dilated(x, d) if split else f
        z = b.node("Mul", [b.node("Tanh", [f]), b.node("Sigmoid", [g])])
        res = pointwise(z, c, c)
        if skip:
            sk = pointwise(z, c, c)
            total = b.node("Add", [total, sk]) if total else sk
        x = b.node("Add", [x, res])
    out = b.node("Relu", [total or x])
    b.x = pointwise(out, c, r.choice([10, 29, 40]), bias=False)
    return _sequence_model(b, inputs)


#: channel widths of :func:`inverted_network`'s stages
_INVERTED_WIDTHS = (8, 12, 16, 24, 32, 48, 64, 96, 128, 160)


def _bn_conv(b: _Builder, cout: int, k: int, stride: int, group: int = 1,
             relu6: bool = True) -> None:
    """Conv + BatchNormalization (+ ReLU6): the layer MobileNets are made of."""
    b.plain_conv(cout, k, stride, group)
    b.batchnorm()
    if relu6:
        b.relu6()


def inverted_network(seed: int) -> onnx.ModelProto:
    """A MobileNetV2-style network (deterministic for a seed): a 3x3 stride-2 stem on 3 x 32-128
    pixels, 2-6 stages of 1-4 inverted residual blocks (1x1 expansion by 1, 4 or 6, 3x3
    depthwise, 1x1 projection, each with BatchNormalization and ReLU6 but the projection, an
    Add when the shape allows) of 8-160 channels, optionally a wide 1x1 convolution, then
    GlobalAveragePool and mostly a Gemm: early layers on large maps with few channels, which
    the mixed family has few of."""
    r = random.Random(seed)
    hw = r.choice([32, 48, 64, 96, 112, 128])
    b = _Builder(r, 3, hw)
    _bn_conv(b, r.choice([8, 16, 24, 32]), 3, 2)
    wi = r.randint(0, 3)
    for stage in range(r.randint(2, 6)):
        cout = _INVERTED_WIDTHS[min(wi, len(_INVERTED_WIDTHS) - 1)]
        t = 1 if stage == 0 and r.random() < 0.5 else r.choice([4, 6, 6])
        stride = 2 if (stage > 0 and b.hw >= 4 and r.random() < 0.75) else 1
        for i in range(r.randint(1, 4)):
            skip, cin = b.x, b.c
            if t != 1:
                _bn_conv(b, cin * t, 1, 1)
            _bn_conv(b, b.c, 3, stride if i == 0 else 1, group=b.c)
            _bn_conv(b, cout, 1, 1, relu6=False)
            if (stride == 1 or i > 0) and cin == cout:
                b.x = b.node("Add", [b.x, skip])
        wi += r.choice([1, 1, 2])
    head = r.random()
    if head < 0.7:
        _bn_conv(b, r.choice([128, 256, 512, 1280]), 1, 1)
    b.x = b.node("Flatten", [b.node("GlobalAveragePool", [b.x])])
    if head < 0.85:
        out = r.choice([10, 100, 1000])
        b.x = b.node("Gemm", [b.x, b._w(f"fw{b.k}", out, b.c), b._w(f"fb{b.k}", out)], transB=1)
    return b.model(3, hw)


#: network families: ``mixed`` (CNN chains and sequence models, the zoo's ops) and ``small``
#: (LeNet-like stacks and SENNA-like MLPs: kernels of a few microseconds on small maps and
#: channel counts the mixed family lacks), ``gated`` (WaveNet-style audio stacks,
#: :func:`gated_network`) and ``mobile`` (MobileNetV2-style, :func:`inverted_network`)
FAMILIES = ("mixed", "small", "gated", "mobile")


def network(i: int, seed: int = 0, family: str = "mixed") -> onnx.ModelProto:
    """The sweep's ``i``-th network of ``family`` (deterministic). ``mixed``: every fourth is a
    sequence model (embeddings, RNNs, 1-D convolutions), the others random chains of CNN
    blocks. ``small``: three in five :func:`plain_network`, the others :func:`embedding_mlp`.
    ``gated``: :func:`gated_network`; ``mobile``: :func:`inverted_network`."""
    if family == "small":
        return (plain_network if i % 5 < 3 else embedding_mlp)(seed * 100_003 + 9_000_000 + i)
    if family == "gated":
        return gated_network(seed * 100_003 + 19_000_000 + i)
    if family == "mobile":
        return inverted_network(seed * 100_003 + 29_000_000 + i)
    if family != "mixed":
        raise ValueError(f"unknown network family {family!r}; expected one of {FAMILIES}")
    return (random_sequence_network if i % 4 == 3 else random_network)(seed * 100_003 + i)


def model_name(i: int, family: str = "mixed") -> str:
    """The name the ``i``-th network of ``family`` trains under."""
    return f"synthetic{i}" if family == "mixed" else f"{family}{i}"


def run_context_sweep(count: int = 40, seed: int = 0, threads: int = 1, repeats: int = 10,
                      progress: Callable[[str], None] | None = None,
                      family: str = "mixed") -> list[NodeSample]:
    """Profile ``count`` random networks of ``family`` in context; one sample per anchor."""
    out: list[NodeSample] = []
    for i in range(count):
        model = network(i, seed, family)
        feats = model_features(model)
        prof = profile_in_context_model(model, threads, repeats)
        out += [NodeSample(model_name(i, family), feats[n][0], feats[n][1], ms)
                for n, ms in prof.items() if n in feats]
        if progress and (i % 10 == 0 or i == count - 1):
            progress(f"context sweep ({family}) {i + 1}/{count}: "
                     f"{len(model.graph.node)} nodes")
    return out


def profile_in_context_model(model: onnx.ModelProto, threads: int = 1,
                             repeats: int = 10) -> dict[str, float]:
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.onnx")
        onnx.save(model, path)
        return profile_in_context(path, "all", threads, 3, repeats).nodes
