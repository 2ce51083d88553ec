"""In-context node timings: onnxruntime's profiler inside whole models, mapped back to the
original graph's nodes.

A slice runs fully optimised (``ORT_ENABLE_ALL``): onnxruntime fuses Conv + BatchNormalization +
activation into one NCHWc Conv named ``<last output>_nchwc``, a Gemm + activation into
``fused <gemm>``, a MatMul + Add into ``<matmul>/MatMulAddFusion``, and inserts layout
conversions (``ReorderInput``/``ReorderOutput``) that belong to no original node.
:func:`attribute` maps every kernel back to the *anchor* node it computes (the Conv, Gemm or
MatMul the followers were folded into); kernels of no original node are reported apart, so the
per-run constant can absorb them.

:func:`kernel_times` runs the profiler (``sess_options.enable_profiling``) at any optimisation
level; ``basic`` keeps every node's name (no fusion), ``all`` is what a Session really runs.
:func:`model_features` gives every anchor's features and kernel group, and
:func:`incontext_node_times` evaluates a profile's trained slice predictor on them (what the
planner uses; training it is ``coinf.research``'s).
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from coinf.device.features import (
    FREE_OPS,
    FUSABLE_ACTIVATIONS,
    NodeFeatures,
    node_features,
)
from coinf.device.slicepred import SlicePredictor, group_of
from onnx import helper, numpy_helper

#: kernels onnxruntime adds for the NCHWc layout; they belong to no original node
LAYOUT_OPS = ("ReorderInput", "ReorderOutput")
_SUFFIX = "_kernel_time"


@dataclass(frozen=True)
class Profiled:
    """One model's in-context timings (ms, medians over the timed runs)."""

    #: per original (anchor) node: the kernels attributed to it, summed per run
    nodes: dict[str, float]
    #: kernels of no original node (layout reorders, reshape helpers), summed per run
    unattributed_ms: float
    #: kernels per run (what the executor dispatches)
    kernels: int
    #: median wall time of one ``run`` (profiling on) and the sum of its kernels
    run_ms: float
    kernel_sum_ms: float


def _session(model: onnx.ModelProto | str | Path, level: str, threads: int, prefix: str) -> Any:
    import onnxruntime as ort
    from coinf.device.sweep import session_options

    opts = session_options(threads, level)
    opts.enable_profiling = True
    opts.profile_file_prefix = prefix
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])


def trimmed_mean(values: list[float], cut: float = 0.2) -> float:
    """Mean of the middle values (``cut`` dropped at each end). The profiler reports whole
    microseconds, so a median of a 2-5 us kernel is off by up to one microsecond (20-50 %); the
    mean of the middle runs resolves fractions and still ignores interrupted runs."""
    v = sorted(values)
    k = int(len(v) * cut)
    mid = v[k:len(v) - k] or v
    return sum(mid) / len(mid)


def kernel_times(model: onnx.ModelProto | str | Path, level: str = "all", threads: int = 1,
                 warmup: int = 3, repeats: int = 15,
                 ) -> tuple[dict[str, float], dict[str, str], float]:
    """Per-kernel time (ms: a kernel run several times per run is summed per run, then
    :func:`trimmed_mean` over runs), each kernel's op, and the median run time (ms), from
    onnxruntime's profiler."""
    from coinf.device.sweep import random_feeds

    with tempfile.TemporaryDirectory() as tmp:
        sess = _session(model, level, threads, os.path.join(tmp, "prof"))
        feeds = random_feeds(sess)
        for _ in range(warmup + repeats):
            sess.run(None, feeds)
        events = json.loads(Path(sess.end_profiling()).read_text())
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("cat") == "Session" and e.get("name") == "model_run")[warmup:]
    per_run: list[dict[str, float]] = [{} for _ in runs]
    ops: dict[str, str] = {}
    starts = [a for a, _ in runs]
    for e in events:
        name = str(e.get("name", ""))
        if e.get("cat") != "Node" or not name.endswith(_SUFFIX):
            continue
        ts = e["ts"]
        # the run holding this event: the last start <= ts
        lo, hi = 0, len(starts)
        while lo < hi:
            mid = (lo + hi) // 2
            if starts[mid] <= ts:
                lo = mid + 1
            else:
                hi = mid
        i = lo - 1
        if i < 0 or ts > runs[i][1]:
            continue
        key = name[: -len(_SUFFIX)]
        per_run[i][key] = per_run[i].get(key, 0.0) + e["dur"] / 1000.0
        ops[key] = str(e.get("args", {}).get("op_name", ""))
    names = sorted({k for r in per_run for k in r})
    med = {k: trimmed_mean([r.get(k, 0.0) for r in per_run]) for k in names}
    run_ms = statistics.median([(b - a) / 1000.0 for a, b in runs]) if runs else 0.0
    return med, ops, run_ms


def anchors(model: onnx.ModelProto) -> dict[str, str]:
    """Node name -> the anchor it is fused into at ``ORT_ENABLE_ALL`` (itself if none): a
    BatchNormalization or fusable activation whose input only a Conv/Gemm chain produces."""
    g = model.graph
    names = [n.name or f"{n.op_type}_{k}" for k, n in enumerate(g.node)]
    producer: dict[str, int] = {}
    readers: dict[str, int] = {}
    for k, n in enumerate(g.node):
        for o in n.output:
            producer[o] = k
        for t in n.input:
            readers[t] = readers.get(t, 0) + 1
    outputs = {o.name for o in g.output}
    inits = {i.name for i in g.initializer}
    anchor = list(range(len(g.node)))
    for k, n in enumerate(g.node):
        if n.op_type == "Add" and len(n.input) == 2:  # MatMul + bias -> Gemm (MatMulAddFusion)
            src = next((t for t in n.input if t not in inits), "")
            p = producer.get(src)
            if p is not None and g.node[p].op_type == "MatMul" and readers.get(src) == 1 \
                    and any(t in inits for t in n.input):
                anchor[k] = anchor[p]
            continue
        if n.op_type != "BatchNormalization" and n.op_type not in FUSABLE_ACTIVATIONS:
            continue
        src = n.input[0] if n.input else ""
        p = producer.get(src)
        if p is None or readers.get(src) != 1 or src in outputs:
            continue
        root = anchor[p]
        if g.node[root].op_type in ("Conv", "Gemm") and (
                n.op_type != "BatchNormalization" or g.node[root].op_type == "Conv"):
            anchor[k] = root
    return {names[k]: names[a] for k, a in enumerate(anchor)}


def attribute(model: onnx.ModelProto, kernels: dict[str, float],
              ops: dict[str, str]) -> tuple[dict[str, float], float]:
    """Map kernel names to original node names (see the module doc); returns per-node ms and
    the ms of kernels that belong to no node."""
    g = model.graph
    names = {n.name or f"{n.op_type}_{k}" for k, n in enumerate(g.node)}
    producer = {o: (n.name or f"{n.op_type}_{k}") for k, n in enumerate(g.node) for o in n.output}
    anchor = anchors(model)
    nodes: dict[str, float] = {}
    other = 0.0
    for k, ms in kernels.items():
        node: str | None = None
        if k in names:
            node = k
        elif k.endswith("_nchwc") and k[: -len("_nchwc")] in producer:
            node = producer[k[: -len("_nchwc")]]
        elif k.startswith("fused ") and k[len("fused "):] in names:
            node = k[len("fused "):]
        elif "/" in k and k.rsplit("/", 1)[0] in names:
            node = k.rsplit("/", 1)[0]  # e.g. <MatMul>/MatMulAddFusion
        if node is None or ops.get(k) in LAYOUT_OPS:
            other += ms
            continue
        a = anchor.get(node, node)
        nodes[a] = nodes.get(a, 0.0) + ms
    return nodes, other


def profile_in_context(model_path: str | Path, level: str = "all", threads: int = 1,
                       warmup: int = 3, repeats: int = 15) -> Profiled:
    """:func:`kernel_times` of a whole model, attributed to its nodes."""
    model = onnx.load(str(model_path))
    kern, ops, run_ms = kernel_times(model_path, level, threads, warmup, repeats)
    nodes, other = attribute(model, kern, ops)
    return Profiled(nodes, other, len(kern), run_ms, sum(kern.values()))


def fused_followers(model: onnx.ModelProto, anchor: Mapping[str, str] | None = None,
                    ) -> dict[str, tuple[str, ...]]:
    """Anchor name -> op types of the nodes fused into it (``("BatchNormalization", "Relu")``),
    from ``anchor`` (node -> the anchor it runs in; default :func:`anchors`)."""
    out: dict[str, list[str]] = {}
    ops = {n.name or f"{n.op_type}_{k}": n.op_type for k, n in enumerate(model.graph.node)}
    for node, a in (anchors(model) if anchor is None else anchor).items():
        if node != a:
            out.setdefault(a, []).append(ops[node])
    return {k: tuple(v) for k, v in out.items()}


def dynamic_names(model: onnx.ModelProto) -> set[str]:
    """Names of nodes that depend on a real graph input (the others are constant-folded)."""
    g = model.graph
    inits = {i.name for i in g.initializer}
    live = {i.name for i in g.input if i.name not in inits}
    out = set()
    for k, n in enumerate(g.node):
        if any(t in live for t in n.input if t):
            live.update(n.output)
            out.add(n.name or f"{n.op_type}_{k}")
    return out


def sum_fused(model: onnx.ModelProto, optimized: onnx.ModelProto | None = None,
              anchor: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Add nodes onnxruntime folds into a convolution as its NCHWc *Sum* input (the
    residual joins of ResNet and MobileNetV2), and the activation after each that it folds in
    too: node name -> the anchor it runs in. Read off ``optimized``, the graph onnxruntime runs
    for ``model`` (:func:`~coinf.device.ortgraph.optimized_graph` when not given): an NCHWc
    ``Conv`` with a fourth input is named ``<tensor>_nchwc`` after the tensor its Add read, and
    its ``activation`` attribute names the activation folded after the Add. Empty on a machine
    whose onnxruntime has no NCHWc kernels, or where the channel counts rule it out (ResNet's
    12-channel first stage keeps its Adds). ``anchor``: :func:`anchors` of ``model``, if the
    caller has it."""
    from coinf.device.ortgraph import optimized_graph

    g = model.graph
    names = [n.name or f"{n.op_type}_{k}" for k, n in enumerate(g.node)]
    anchor = anchors(model) if anchor is None else anchor
    producer = {o: names[k] for k, n in enumerate(g.node) for o in n.output}
    ops = dict(zip(names, (n.op_type for n in g.node), strict=True))
    readers: dict[str, list[int]] = {}
    for k, n in enumerate(g.node):
        for t in n.input:
            readers.setdefault(t, []).append(k)
    if optimized is None:
        # building a session of the whole model costs its weights' memory again (a wearable
        # plans too): only where a join could fold, and only if this onnxruntime folds any
        conv_out = {t for t, p in producer.items() if ops[anchor.get(p, p)] == "Conv"}
        if not any(n.op_type == "Add" and conv_out.intersection(n.input) for n in g.node) \
                or not nchwc_folds_joins():
            return {}
    opt = optimized if optimized is not None else optimized_graph(model)
    out: dict[str, str] = {}
    for n in opt.graph.node:
        if n.op_type != "Conv" or not n.domain.endswith("nchwc") or len(n.input) < 4 \
                or not n.input[3] or not n.name.endswith("_nchwc"):
            continue
        src = n.name[: -len("_nchwc")]
        adds = [k for k in readers.get(src, []) if g.node[k].op_type == "Add"]
        if len(adds) != 1 or src not in producer:
            continue
        root = anchor.get(producer[src], producer[src])
        add = g.node[adds[0]]
        out[names[adds[0]]] = root
        act = next((a.s.decode() for a in n.attribute if a.name == "activation"), "")
        after = readers.get(add.output[0], []) if act else []
        if len(after) == 1 and g.node[after[0]].op_type == act:
            out[names[after[0]]] = root
    return out


@functools.cache
def nchwc_folds_joins() -> bool:
    """Whether this machine's onnxruntime folds a residual Add into an NCHWc convolution at
    all (x86 builds do; where MLAS has no NCHWc kernels nothing is folded): one tiny probe
    graph per process."""
    from coinf.device.ortgraph import optimized_graph

    channels = 16  # fills the 8- and the 16-wide NCHWc blocks
    rng = np.random.default_rng(0)
    w = [numpy_helper.from_array(rng.normal(0, 0.1, (channels, cin, 3, 3)).astype(np.float32),
                                 f"w{i}") for i, cin in enumerate((channels, channels))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "w1"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["b", "a"], ["y"])]
    shape = [1, channels, 8, 8]
    graph = helper.make_graph(
        nodes, "probe", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, shape)], w)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return "Add" not in {n.op_type for n in optimized_graph(model).graph.node}


def model_features(model: onnx.ModelProto, optimized: onnx.ModelProto | None = None,
                   ) -> dict[str, tuple[NodeFeatures, str]]:
    """Anchor features of every node that runs (dynamic, not fused into another, not metadata):
    name -> (features, kernel group). Fused followers, the Adds and activations folded into a
    convolution (:func:`sum_fused`, from ``optimized`` or the graph onnxruntime makes of
    ``model``) and constant nodes are absent."""
    anchor = anchors(model)
    runs_in = {**anchor, **sum_fused(model, optimized, anchor)}  # node -> the kernel's anchor
    followers = fused_followers(model, runs_in)
    dyn = dynamic_names(model)
    out: dict[str, tuple[NodeFeatures, str]] = {}
    for f in node_features(model):
        if f.name not in dyn or runs_in.get(f.name, f.name) != f.name or f.op_type in FREE_OPS:
            continue
        out[f.name] = (replace(f, fused=False), group_of(f, followers.get(f.name, ())))
    return out



def incontext_node_times(meta: Mapping[str, Any], model_path: str | Path,
                         ) -> dict[str, float] | None:
    """Per-node ms of ``model_path`` from the in-context predictor stored in a sweep
    predictor's ``meta["slice_model"]`` (``coinf profile --train``), None if there is none."""
    obj = meta.get("slice_model")
    if not obj:
        return None
    model = onnx.load(str(model_path))
    names = [n.name or f"{n.op_type}_{k}" for k, n in enumerate(model.graph.node)]
    return SlicePredictor.from_json(obj).node_times(model_features(model), names)
