"""Synthetic single-layer ONNX models and their measured latency on this device.

:func:`sweep_configs` draws layer configurations (conv incl. depthwise, gemm/matmul, pooling,
activations, normalisation, LSTM/GRU, element-wise); :func:`measure_model` times one model with
onnxruntime (warm-up excluded, median of repeats, minus the empty-run overhead measured on an
Identity model so per-layer times add up). The result trains :mod:`device.predict`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from coinf.device.features import NodeFeatures, node_features
from coinf.device.ort_options import quiet_workers
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


@dataclass(frozen=True)
class Sample:
    """One measured single-layer model."""

    config: str
    features: NodeFeatures
    ms: float


def _model(nodes: list[onnx.NodeProto], x_shape: list[int],
           inits: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def _w(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32) * 0.1


Builder = Callable[[random.Random, np.random.Generator, float], tuple[str, onnx.ModelProto]]


def conv(r: random.Random, g: np.random.Generator, size: float) -> tuple[str, onnx.ModelProto]:
    depthwise = r.random() < 0.3
    k = r.choice([1, 3, 3, 5, 7]) if not depthwise else r.choice([3, 5])
    s = r.choice([1, 1, 2])
    hw = r.choice([7, 14, 28, 56, 112] if size >= 1 else [7, 14, 28])
    cin = r.choice([3, 8, 16, 32, 64, 128] if size >= 1 else [3, 8, 16, 32])
    if depthwise:  # mobile nets run depthwise convs on many channels at small sizes
        cin = r.choice([16, 32, 64, 128, 256, 512, 960] if size >= 1 else [16, 32, 64])
        hw = r.choice([7, 14, 28, 56, 112] if cin <= 128 else [7, 14, 28])
    cout = cin if depthwise else r.choice([8, 16, 32, 64, 128] if size >= 1 else [8, 16, 32])
    group = cin if depthwise else 1
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[k, k], strides=[s, s],
                            pads=[k // 2] * 4, group=group)
    cfg = f"conv k{k} s{s} {cin}->{cout} {hw}x{hw}{' dw' if depthwise else ''}"
    return cfg, _model([node], [1, cin, hw, hw],
                       {"w": _w(g, cout, cin // group, k, k), "b": _w(g, cout)})


def gemm(r: random.Random, g: np.random.Generator, size: float) -> tuple[str, onnx.ModelProto]:
    dims = [16, 64, 128, 256, 512, 1024] if size >= 1 else [16, 64, 128, 256]
    m = r.choice([1, 1, 4, 16, 64])
    k, n = r.choice(dims), r.choice(dims)
    if r.random() < 0.5:
        node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)
        return f"gemm {m}x{k}x{n}", _model([node], [m, k], {"w": _w(g, n, k), "b": _w(g, n)})
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    return f"matmul {m}x{k}x{n}", _model([node], [1, m, k], {"w": _w(g, k, n)})


def pool(r: random.Random, g: np.random.Generator, size: float) -> tuple[str, onnx.ModelProto]:
    op = r.choice(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"])
    c = r.choice([8, 16, 32, 64, 128])
    hw = r.choice([7, 14, 28, 56])
    if op.startswith("Global"):
        node = helper.make_node(op, ["x"], ["y"])
        return f"{op} {c}x{hw}x{hw}", _model([node], [1, c, hw, hw], {})
    k = r.choice([2, 3])
    s = r.choice([1, 2])
    node = helper.make_node(op, ["x"], ["y"], kernel_shape=[k, k], strides=[s, s])
    return f"{op} k{k} s{s} {c}x{hw}x{hw}", _model([node], [1, c, hw, hw], {})


def activation(r: random.Random, g: np.random.Generator,
               size: float) -> tuple[str, onnx.ModelProto]:
    op = r.choice(["Relu", "Sigmoid", "Tanh", "Clip", "HardSwish", "LeakyRelu", "Softmax"])
    c = r.choice([8, 16, 32, 64, 128])
    hw = r.choice([1, 7, 14, 28, 56])
    inits: dict[str, np.ndarray] = {}
    ins = ["x"]
    if op == "Clip":
        inits = {"lo": np.array(0.0), "hi": np.array(6.0)}
        ins = ["x", "lo", "hi"]
    attrs: dict[str, Any] = {"axis": 1} if op == "Softmax" else {}
    node = helper.make_node(op, ins, ["y"], **attrs)
    return f"{op} {c}x{hw}x{hw}", _model([node], [1, c, hw, hw], inits)


def norm(r: random.Random, g: np.random.Generator, size: float) -> tuple[str, onnx.ModelProto]:
    op = r.choice(["BatchNormalization", "LayerNormalization", "InstanceNormalization", "LRN"])
    c = r.choice([8, 16, 32, 64, 128])
    hw = r.choice([7, 14, 28, 56])
    if op == "LRN":
        size_ = r.choice([3, 5])
        node = helper.make_node(op, ["x"], ["y"], size=size_)
        return f"LRN size{size_} {c}x{hw}x{hw}", _model([node], [1, c, hw, hw], {})
    if op == "BatchNormalization":
        inits = {"s": _w(g, c) + 1, "b": _w(g, c), "m": _w(g, c), "v": np.abs(_w(g, c)) + 1}
        node = helper.make_node(op, ["x", "s", "b", "m", "v"], ["y"])
    elif op == "InstanceNormalization":
        inits = {"s": _w(g, c) + 1, "b": _w(g, c)}
        node = helper.make_node(op, ["x", "s", "b"], ["y"])
    else:
        inits = {"s": _w(g, hw) + 1, "b": _w(g, hw)}
        node = helper.make_node(op, ["x", "s", "b"], ["y"], axis=-1)
    return f"{op} {c}x{hw}x{hw}", _model([node], [1, c, hw, hw], inits)


def rnn(r: random.Random, g: np.random.Generator, size: float) -> tuple[str, onnx.ModelProto]:
    op = r.choice(["LSTM", "GRU"])
    gates = 4 if op == "LSTM" else 3
    seq = r.choice([1, 8, 25, 50])
    inp = r.choice([16, 40, 64, 128])
    hid = r.choice([32, 64, 128] if size >= 1 else [32, 64])
    node = helper.make_node(op, ["x", "w", "r", "b"], ["y"], hidden_size=hid)
    inits = {"w": _w(g, 1, gates * hid, inp), "r": _w(g, 1, gates * hid, hid),
             "b": _w(g, 1, 2 * gates * hid)}
    return f"{op} seq{seq} in{inp} h{hid}", _model([node], [seq, 1, inp], inits)


def eltwise(r: random.Random, g: np.random.Generator, size: float) -> tuple[str, onnx.ModelProto]:
    op = r.choice(["Add", "Mul"])
    c = r.choice([8, 16, 32, 64, 128])
    hw = r.choice([1, 7, 14, 28, 56])
    node = helper.make_node(op, ["x", "x"], ["y"])
    return f"{op} {c}x{hw}x{hw}", _model([node], [1, c, hw, hw], {})


#: kind -> (builder, number of configs in the default sweep)
BUILDERS: dict[str, tuple[Builder, int]] = {
    "conv": (conv, 240), "gemm": (gemm, 90), "pool": (pool, 72), "activation": (activation, 84),
    "norm": (norm, 54), "rnn": (rnn, 54), "eltwise": (eltwise, 42),
}


def sweep_configs(scale: float = 1.0, seed: int = 0,
                  kinds: tuple[str, ...] | None = None) -> Iterator[tuple[str, onnx.ModelProto]]:
    """Yield ``(config, model)``; ``scale`` multiplies the default counts (``--quick`` = 0.1)."""
    r = random.Random(seed)
    g = np.random.default_rng(seed)
    for kind, (builder, count) in BUILDERS.items():
        if kinds is not None and kind not in kinds:
            continue
        for _ in range(max(4, round(count * scale))):
            yield builder(r, g, scale)


def session_options(threads: int = 1, level: str = "all") -> Any:
    """onnxruntime options: ``threads`` intra-op threads, one inter-op, optimisation ``level``
    (``disable``, ``basic`` keeps node names, ``extended``, ``all`` fuses), quiet logs."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    opts.log_severity_level = 3
    return quiet_workers(opts)  # profiled as the slices run


def make_session(model: onnx.ModelProto | bytes | str, threads: int = 1,
                 level: str = "all") -> object:
    """An onnxruntime CPU session (``level``: ``basic`` keeps node names, ``all`` fuses)."""
    import onnxruntime as ort

    opts = session_options(threads, level)
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])


def random_feeds(sess: object) -> dict[str, np.ndarray]:
    """Random inputs matching a session's declared inputs (unknown dims = 1)."""
    feeds: dict[str, np.ndarray] = {}
    g = np.random.default_rng(0)
    types = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32,
             "tensor(uint8)": np.uint8, "tensor(int8)": np.int8, "tensor(float16)": np.float16,
             "tensor(bool)": np.bool_}
    for i in sess.get_inputs():  # type: ignore[attr-defined]
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in i.shape]
        dtype = types.get(i.type, np.float32)
        feeds[i.name] = (g.standard_normal(shape) if dtype in (np.float32, np.float16)
                         else np.zeros(shape)).astype(dtype)
    return feeds


#: a timed slice or part runs for at least this long (thousands of runs of a 10 µs slice): a
#: median over 25 runs spans a quarter of a millisecond there. In one run, timed both ways side
#: by side, LeNet's slices repeated within 10 % between rounds for 0.75 of them with 25 runs and
#: 0.94 with 1000 (git history of docs/BENCHMARKS.md, `bench predict`). Training labels and the
#: slices they predict are timed the same way: a tiny slice runs faster in a long window.
SLICE_MIN_S = 0.03

#: the statistic a slice's or part's time is: its fastest run. On a shared machine another
#: tenant only ever adds time, in bursts of tens to hundreds of milliseconds; the median of a
#: 30 ms window takes them in and did not repeat (slices timed twice in six interleaved rounds
#: agreed within 10 % for a mean 0.43 of a zoo model's slices), the fastest run did (0.94), as
#: ``timeit``'s documentation advises (git history of docs/BENCHMARKS.md, `bench predict`). On a
#: device of its own (a wearable) the two are close.
SLICE_STAT = "min"


_STATS: dict[str, Callable[[Sequence[float]], Any]] = {"median": np.median, "min": min}


def _statistic(stat: str) -> Callable[[Sequence[float]], Any]:
    try:
        return _STATS[stat]
    except KeyError:
        raise ValueError(f"stat must be 'median' or 'min', got {stat!r}") from None


def summarize(times: Sequence[float], stat: str = "median") -> float:
    """``stat`` (``median`` or ``min``) of ``times``."""
    return float(_statistic(stat)(times))


def time_session(sess: object, feeds: dict[str, np.ndarray], warmup: int = 2,
                 repeats: int = 5, budget_s: float = 0.5, min_s: float = 0.0,
                 stat: str = "median") -> float:
    """Wall time (ms) of ``sess.run`` after ``warmup`` runs, the ``stat`` of its runs
    (:func:`summarize`): at least ``repeats`` runs and, for a fast session, as many more as
    fill ``min_s`` seconds (a median over 25 runs of a 10 µs slice spans a quarter of a
    millisecond and does not repeat within 10 %); stops early past ``budget_s`` once it has
    3 runs."""
    pick = _statistic(stat)  # a bad stat fails before the runs
    for _ in range(warmup):
        sess.run(None, feeds)  # type: ignore[attr-defined]
    times = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        sess.run(None, feeds)  # type: ignore[attr-defined]
        t1 = time.perf_counter()
        times.append((t1 - t0) * 1000.0)
        elapsed = t1 - start
        if (len(times) >= repeats and elapsed >= min_s) or (elapsed > budget_s
                                                            and len(times) >= 3):
            break
    return float(pick(times))


def time_slice(sess: object, feeds: dict[str, np.ndarray], warmup: int = 3,
               repeats: int = 25, budget_s: float = 2.0) -> float:
    """A slice's or part's time (ms): :func:`time_session` filling :data:`SLICE_MIN_S`, its
    :data:`SLICE_STAT`. The zoo's slices, the synthetic parts that label the in-context
    predictor and the slices a profile measures for the planner are all timed by this."""
    return time_session(sess, feeds, warmup, repeats, budget_s, SLICE_MIN_S, SLICE_STAT)


def run_overhead_ms(threads: int = 1, repeats: int = 50) -> float:
    """The cost of an (almost) empty ``run`` call: an Identity model."""
    node = helper.make_node("Identity", ["x"], ["y"])
    sess = make_session(_model([node], [1, 4], {}), threads)
    return time_session(sess, {"x": np.zeros((1, 4), np.float32)}, 5, repeats)


def measure_model(model: onnx.ModelProto, threads: int = 1, repeats: int = 5,
                  overhead_ms: float = 0.0) -> float:
    sess = make_session(model, threads)
    return max(time_session(sess, random_feeds(sess), 2, repeats) - overhead_ms, 0.0)


def run_sweep(scale: float = 1.0, seed: int = 0, threads: int = 1, repeats: int = 5,
              progress: Callable[[str], None] | None = None) -> tuple[list[Sample], float]:
    """Measure every synthetic layer; returns the samples and the run overhead subtracted."""
    overhead = run_overhead_ms(threads)
    samples = []
    configs = list(sweep_configs(scale, seed))
    for i, (cfg, model) in enumerate(configs):
        feats = node_features(model)[0]
        ms = measure_model(model, threads, repeats, overhead)
        samples.append(Sample(cfg, feats, ms))
        if progress and (i % 20 == 0 or i == len(configs) - 1):
            progress(f"sweep {i + 1}/{len(configs)}: {cfg}: {ms:.3f} ms")
    return samples, overhead
