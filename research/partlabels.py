"""Node labels decomposed from unprofiled timings of a network's parts.

onnxruntime's profiler times kernels in whole microseconds and adds about one of its own to
each; two profiles of one network agree within +-10 % on only 77-80 % of its nodes (git history
of docs/BENCHMARKS.md, `bench predict`). Wall times of the network's *parts*, run without the
profiler, repeat far better (94 % within 5 % between passes). A part is a prefix or a suffix of
the network cut where no fused group (Conv + BN + activation, Gemm + activation, MatMul + Add)
straddles the cut, so it runs the same kernels as inside the whole network. :func:`decompose`
turns part times into per-node times: least squares on every part's relative error, with the
profiler's label (less its own cost per kernel) as a weak prior, per network a constant ``c0 >=
0`` and costs per MB crossing the part's boundary, per layout reorder and per million elements
reordered (per network, or shared by all networks).

A zoo model's bundle slices (heads and tails) are parts already; synthetic networks get theirs
from :func:`time_parts`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import onnx
from coinf.device.incontext import anchors, model_features
from coinf.research.slicetrain import NodeSample, SliceSample, profiler_inflation
from onnx import helper

#: the lowest a node's time may go, as a fraction of its prior (keeps every node positive)
FLOOR = 0.05


def _names(model: onnx.ModelProto) -> list[str]:
    return [n.name or f"{n.op_type}_{k}" for k, n in enumerate(model.graph.node)]


def cut_points(model: onnx.ModelProto) -> list[int]:
    """Every ``k`` such that cutting after node ``k`` (topological order) splits no fused
    group: the nodes up to ``k`` run the same kernels alone as inside the network."""
    names = _names(model)
    index = {n: k for k, n in enumerate(names)}
    anchor = anchors(model)
    straddled: set[int] = set()
    for k, n in enumerate(names):
        a = index[anchor.get(n, n)]
        straddled.update(range(min(a, k), max(a, k)))
    return [k for k in range(len(names)) if k not in straddled]


def _nbytes(vi: onnx.ValueInfoProto) -> int:
    tt = vi.type.tensor_type
    size = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)).itemsize if tt.elem_type else 4
    return int(np.prod([d.dim_value or 1 for d in tt.shape.dim])) * size


def parts(model: onnx.ModelProto) -> list[tuple[str, tuple[str, ...], onnx.ModelProto, float]]:
    """``(name, anchors, part, boundary MB)`` of every prefix and every suffix at a
    :func:`cut_points` cut, one per distinct set of anchors (:func:`model_features`). A prefix
    outputs every tensor read after the cut; a suffix reads every tensor produced before it."""
    model = onnx.shape_inference.infer_shapes(model)
    g = model.graph
    nodes, names = list(g.node), _names(model)
    feats = model_features(model)
    vi = {v.name: v for v in [*g.value_info, *g.output, *g.input]}
    real_out = {o.name for o in g.output}
    inits = {i.name for i in g.initializer}
    cuts = cut_points(model)
    out = []

    def build(part: list[onnx.NodeProto], ins: list[onnx.ValueInfoProto],
              outs: list[onnx.ValueInfoProto], name: str) -> onnx.ModelProto:
        used = {t for n in part for t in n.input}
        graph = helper.make_graph(part, name, ins, outs,
                                  [i for i in g.initializer if i.name in used])
        m = helper.make_model(graph, opset_imports=list(model.opset_import))
        m.ir_version = model.ir_version
        return m

    prefixes: dict[tuple[str, ...], int] = {}
    suffixes: dict[tuple[str, ...], int] = {}
    for k in cuts:
        head = tuple(n for n in names[: k + 1] if n in feats)
        tail = tuple(n for n in names[k + 1:] if n in feats)
        if head:
            prefixes[head] = k
        if tail:
            suffixes[tail] = k  # the shortest suffix with these anchors
    for a, k in prefixes.items():
        later = {t for n in nodes[k + 1:] for t in n.input}
        produced = [t for n in nodes[: k + 1] for t in n.output]
        outs = [vi[t] if t in vi else helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT,
                                                                     None)
                for t in dict.fromkeys(produced) if t in later or t in real_out]
        ins = [i for i in g.input if i.name not in inits]
        mb = (sum(map(_nbytes, ins)) + sum(map(_nbytes, outs))) / 1e6
        out.append((f"prefix{k}", a, build(nodes[: k + 1], ins, outs, "prefix"), mb))
    for a, k in suffixes.items():
        part = nodes[k + 1:]
        made = {t for n in part for t in n.output}
        need = [t for n in part for t in n.input if t and t not in made and t not in inits]
        if any(t not in vi for t in need):
            continue  # an input of unknown shape: it cannot be fed
        ins = [vi[t] for t in dict.fromkeys(need)]
        mb = (sum(map(_nbytes, ins)) + sum(map(_nbytes, g.output))) / 1e6
        out.append((f"suffix{k}", a, build(part, ins, list(g.output), "suffix"), mb))
    return out


def time_parts(name: str, model: onnx.ModelProto, threads: int = 1, repeats: int = 25,
               budget_s: float = 2.0) -> list[SliceSample]:
    """Every part of ``model`` (:func:`parts`) timed without the profiler at
    ``ORT_ENABLE_ALL`` (the :data:`~coinf.device.sweep.SLICE_STAT` of at least ``repeats``
    runs filling :data:`~coinf.device.sweep.SLICE_MIN_S`, after 3 warm-up runs; at most
    ``budget_s`` each),
    with the kernels onnxruntime really runs for it."""
    import onnxruntime as ort
    from coinf.device.sweep import random_feeds, session_options, time_slice
    from coinf.research.ortkernels import count_kernels

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for part_name, a, part, mb in parts(model):
            opts = session_options(threads, "all")
            opts.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
            opts.log_severity_level = 3
            sess = ort.InferenceSession(part.SerializeToString(), opts,
                                        providers=["CPUExecutionProvider"])
            ms = time_slice(sess, random_feeds(sess), 3, repeats, budget_s)
            k = count_kernels(part, onnx.load(opts.optimized_model_filepath,
                                              load_external_data=False))
            out.append(SliceSample(name, part_name, a, k.count, mb, ms, k.reorders,
                                   k.reorder_melems))
    return out


def _terms(s: SliceSample, reorders: bool) -> list[float]:
    """A part's boundary MB, its reorder count (0 unless ``reorders``), its reordered Melems.
    Fitted per model on one model's few slices, a reorder count soaks up the time of the nodes
    it marks (the zoo's median within_10pct fell from 0.75 to 0.63 with it): only a term
    shared by many networks counts reorders."""
    return [s.boundary_melems, float(s.reorders) if reorders else 0.0, s.reorder_melems]


def decompose(slices: Sequence[SliceSample], priors: Mapping[str, Mapping[str, float]],
              weight: float, shared: bool = False, iterations: int = 30,
              ) -> dict[str, dict[str, float]]:
    """Per model of ``priors`` with timed slices: node name -> ms. Minimises, over node times
    ``x_n >= FLOOR * p_n``, the per-run constant ``c0 >= 0`` and the term costs ``g`` (per MB
    of boundary, per reorder, per million elements reordered),

        sum over slices ((sum_{n in s} x_n + c0 + g . z_s) / T_s - 1)^2
        + weight^2 * sum over nodes (x_n / p_n - 1)^2

    with ``p`` the ``priors``. ``c0`` and ``g`` are per model (``g`` without the reorder
    count, :func:`_terms`), or with ``shared`` one for all models (started from
    :func:`_joint_terms`, then block-coordinate descent: each model exactly with them fixed,
    then them). Shared, ``c0`` is pinned by every model's shortest parts: per model, on a
    network whose parts run for milliseconds, a few microseconds of it are not identifiable
    and the last node's label absorbs them (its one-node suffix is its only short part).
    Names in a slice that have no prior (fused away, free) are not unknowns."""
    from scipy.optimize import lsq_linear

    if weight <= 0:
        raise ValueError("decompose needs a prior weight > 0")
    by: dict[str, list[SliceSample]] = {}
    for s in slices:
        if s.ms > 0 and s.model in priors and priors[s.model]:
            by.setdefault(s.model, []).append(s)
    blocks = {}
    for m, ss in by.items():
        names = sorted(priors[m])
        index = {n: i for i, n in enumerate(names)}
        p = np.array([max(priors[m][n], 1e-6) for n in names])
        a = np.zeros((len(ss), len(names) + 4))
        for i, s in enumerate(ss):
            a[i, [index[n] for n in s.nodes if n in index]] = 1.0
            a[i, len(names)] = 1.0
            a[i, len(names) + 1:] = _terms(s, shared)
        a /= np.array([s.ms for s in ss])[:, None]
        blocks[m] = (names, p, a)
    # shared: g = (c0, per MB, per reorder, per Melem reordered), the unknowns per model are
    # its nodes; else every model solves its nodes, its c0 and its g
    g = _joint_terms(blocks, weight) if shared and blocks else np.zeros(4)
    g[0] = max(g[0], 0.0)
    x = {m: np.r_[p, 0.0, np.zeros(3)] for m, (_, p, _) in blocks.items()}
    for _ in range(iterations if shared and blocks else 1):
        for m, (names, p, a) in blocks.items():
            n = len(names)
            cols = n if shared else n + 4
            prior = np.zeros((n, cols))
            prior[np.arange(n), np.arange(n)] = weight / p
            rhs = np.ones(len(a)) - (a[:, n:] @ g if shared else 0.0)
            lo = np.r_[FLOOR * p, [] if shared else [0.0, -np.inf, -np.inf, -np.inf]]
            hi = np.full(cols, np.inf)
            sol = lsq_linear(np.vstack([a[:, :cols], prior]), np.r_[rhs, np.full(n, weight)],
                             bounds=(lo, hi), method="bvls").x
            x[m][:cols] = sol
        if shared and blocks:
            rows = np.vstack([a[:, len(names):] for names, _, a in blocks.values()])
            rest = np.concatenate([1.0 - a[:, :len(names)] @ x[m][:len(names)]
                                   for m, (names, _, a) in blocks.items()])
            g = lsq_linear(rows, rest, bounds=([0.0, -np.inf, -np.inf, -np.inf],
                                               np.full(4, np.inf))).x
    return {m: {n: float(v) for n, v in zip(names, x[m][:len(names)], strict=True)}
            for m, (names, _, _) in blocks.items()}


def _joint_terms(blocks: Mapping[str, tuple[list[str], np.ndarray, np.ndarray]],
                 weight: float) -> np.ndarray:
    """The shared ``(c0, term costs)`` of the joint least squares without bounds (sparse
    normal equations): alternating between the models and the shared terms alone takes
    hundreds of sweeps to get there, the bounds rarely bind."""
    from scipy.sparse import block_diag, csr_matrix, hstack, identity
    from scipy.sparse.linalg import spsolve

    own, terms, rhs = [], [], []
    for names, p, a in blocks.values():
        n = len(names)
        prior = np.zeros((n, n))
        prior[np.arange(n), np.arange(n)] = weight / p
        own.append(csr_matrix(np.vstack([a[:, :n], prior])))
        terms.append(np.vstack([a[:, n:], np.zeros((n, 4))]))
        rhs.append(np.r_[np.ones(len(a)), np.full(n, weight)])
    a_all = hstack([block_diag(own), csr_matrix(np.vstack(terms))]).tocsc()
    normal = (a_all.T @ a_all + 1e-12 * identity(a_all.shape[1])).tocsc()
    return np.asarray(spsolve(normal, a_all.T @ np.concatenate(rhs)))[-4:]


def relabel(nodes: Sequence[NodeSample], slices: Sequence[SliceSample], weight: float,
            shared: bool = False) -> list[NodeSample]:
    """``nodes`` with labels solved (:func:`decompose`) from their models' ``slices``, priors the
    profiler's labels less :func:`~coinf.research.slicetrain.profiler_inflation`; a node whose
    model has no slice keeps its prior. Every label returned is an unprofiled kernel time."""
    inflation = profiler_inflation(nodes, slices)
    priors: dict[str, dict[str, float]] = {}
    for n in nodes:
        priors.setdefault(n.model, {})[n.features.name] = max(n.ms - inflation, 0.2 * n.ms)
    solved = decompose(slices, priors, weight, shared)
    return [replace(n, ms=solved.get(n.model, priors[n.model])[n.features.name]) for n in nodes]


__all__ = ["cut_points", "decompose", "parts", "relabel", "time_parts"]
