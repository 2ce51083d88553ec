"""Slice-latency prediction learnt from in-context timings (nn-Meter's idea: predict the kernels
that really run, not single layers).

A slice's time at ``ORT_ENABLE_ALL`` is modelled as

    slice_ms = scale * sum(anchor node times) + c0 + c_kernel * kernels + c_io * boundary MB
               + c_reorder * reorders + c_copy * reordered Melems

* anchor node times: gradient-boosted trees (:mod:`.boosted`) over the node's sizes (MFLOPs,
  input, output and parameter elements, in log), its structure (kernel, stride, depthwise,
  channels in and out, map size, sequence length), its op and whether BN or an activation is
  fused into it, fitted on per-node times inside whole models; an op the trees never saw falls
  back to a power law per *kernel group* (the anchor's kind refined by what matters to its
  kernel), then per kind. Nodes fused into an anchor and metadata ops cost nothing of their
  own. The labels start as onnxruntime's profiler's per-node times (:mod:`.incontext`); a
  ``relabel`` (:mod:`.partlabels`) replaces them by times decomposed from unprofiled timings of
  the model's slices or parts, else the profiler's own share of each kernel
  (:func:`profiler_inflation`, about a microsecond) is taken off every label;
* ``kernels``, ``reorders`` and the elements the reorders copy are read from the graph
  onnxruntime really runs for the slice (:mod:`.ortgraph`: no inference needed); the per-run
  constant ``c0``, the costs per kernel, per MB entering and leaving the slice, per reorder and
  per reordered element are fitted on measured slice times.

:func:`leave_one_model_out` evaluates it as the issue asks: for every model, train on all the
*other* models' timings and predict this model's slices.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from coinf.device.boosted import Boosted
from coinf.device.features import FREE_OPS, KINDS, LINEAR_FEATURES, OP_CODE, NodeFeatures
from coinf.device.predict import Linear, _fit_loglinear

FORMAT = "coinf-slice-predictor"
VERSION = 3
#: a group needs this many samples for its own power law; else its kind's, else the global one
MIN_GROUP = 6
#: the boosted node model's size: trees of this depth (a smaller model underfits its own
#: training labels, p10-p90 of predicted / label 0.70-1.41 at 300 trees of depth 4)
NODE_TREES, NODE_DEPTH = 1000, 6
#: ``relabel(nodes, slices)``: training nodes with labels that are unprofiled kernel times
Relabel = Callable[[list["NodeSample"], list["SliceSample"]], list["NodeSample"]]
KIND_CODE = {k: i for i, k in enumerate(KINDS)}


def group_of(f: NodeFeatures, followers: Sequence[str] = ()) -> str:
    """The kernel group of an anchor node (see the module doc)."""
    fused = "+fused" if followers else ""
    if f.kind == "conv":
        kernel, depthwise = f.tree[1], f.tree[3]
        shape = "dw" if depthwise else ("pw" if kernel <= 1 else "k")
        residual = "+sum" if "Add" in followers else ""  # a residual Add folded in
        return f"conv:{shape}{residual}{fused}"
    if f.kind == "gemm":
        return f"gemm:{f.op_type}{fused}"
    return f"{f.kind}:{f.op_type}"


@dataclass(frozen=True)
class NodeSample:
    """One anchor node timed inside its model."""

    model: str
    features: NodeFeatures
    group: str
    ms: float


@dataclass(frozen=True)
class SliceSample:
    """One measured slice: the anchors it runs, its kernel count, its boundary size, its time."""

    model: str
    slice: str
    nodes: tuple[str, ...]
    kernels: int
    boundary_melems: float  # MB entering and leaving the slice
    ms: float
    reorders: int = 0
    reorder_melems: float = 0.0  # elements copied by layout reorders (millions)


def node_vector(f: NodeFeatures, group: str) -> list[float]:
    """A node's inputs to the boosted trees: log sizes, structure, op and fusion."""
    lin = [math.log(max(v, 0.0) + 1e-6) for v in f.linear]
    t = f.tree
    return [*lin, t[1], t[2], t[3], math.log1p(t[4]), math.log1p(t[5]), math.log1p(t[6]),
            math.log1p(t[7]), float(KIND_CODE.get(f.kind, -1)), OP_CODE.get(f.op_type, -1.0),
            1.0 if group.endswith("+fused") else 0.0, 1.0 if "+sum" in group else 0.0]


def _loglinear(x: np.ndarray, y: np.ndarray) -> Linear:
    """Power law ``ms = exp(b) * prod((x + eps)^a)`` by ridge least squares in log space."""
    return _fit_loglinear(x, y, ridge_weight=1e-2)


@dataclass
class SlicePredictor:
    """Per-group node power laws plus the slice-level constants (all times in ms)."""

    groups: dict[str, Linear]
    scale: float = 1.0
    c0: float = 0.0
    c_kernel: float = 0.0
    c_io: float = 0.0
    c_reorder: float = 0.0
    c_copy: float = 0.0
    #: what the profiler adds to a kernel (ms), taken off every node label before fitting
    profiler_ms: float = 0.0
    #: the boosted node model and the ops it was trained on (others use ``groups``)
    boosted: Boosted | None = None
    boosted_ops: frozenset[str] = frozenset()
    trained_on: list[str] = field(default_factory=list)
    _memo: dict[int, tuple[Any, dict[str, float]]] = field(default_factory=dict, repr=False,
                                                           compare=False)
    #: per group, the size range it was fitted on: inputs are clipped into it, so a power law
    #: never extrapolates far (a wide exponent on a tiny feature would explode)
    ranges: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)

    # -- training ---------------------------------------------------------------------------
    @classmethod
    def fit_nodes(cls, samples: Iterable[NodeSample],
                  extra: Iterable[NodeSample] = (),
                  ) -> tuple[dict[str, Linear], dict[str, tuple[list[float], list[float]]]]:
        """One power law per group with enough samples, per kind, and ``*`` for everything;
        ``extra`` samples only fill groups and kinds the in-context samples lack."""
        ss = [s for s in samples if s.ms > 0]
        if not ss:
            raise ValueError("no in-context node timings to train on")
        out, ranges = cls._fit_groups(ss, with_global=True)
        more, more_ranges = cls._fit_groups([s for s in extra if s.ms > 0], False)
        for key, law in more.items():
            if key not in out:
                out[key], ranges[key] = law, more_ranges[key]
        return out, ranges

    @staticmethod
    def _fit_groups(ss: list[NodeSample], with_global: bool,
                    ) -> tuple[dict[str, Linear], dict[str, tuple[list[float], list[float]]]]:
        by: dict[str, list[NodeSample]] = {}
        for s in ss:
            by.setdefault(s.group, []).append(s)
            by.setdefault(s.group.split(":", 1)[0], []).append(s)
            if with_global:
                by.setdefault("*", []).append(s)
        out, ranges = {}, {}
        for key, group in by.items():
            if len(group) >= MIN_GROUP or key == "*":
                x = np.array([s.features.linear for s in group], dtype=np.float64)
                out[key] = _loglinear(x, np.array([s.ms for s in group]))
                ranges[key] = ([float(v) for v in x.min(axis=0)],
                               [float(v) for v in x.max(axis=0)])
        return out, ranges

    @classmethod
    def train(cls, nodes: Iterable[NodeSample], slices: Sequence[SliceSample],
              features: Mapping[str, Mapping[str, tuple[NodeFeatures, str]]],
              extra: Sequence[NodeSample] = (), boosted: bool = True,
              relabel: Relabel | None = None) -> SlicePredictor:
        """Fit the node models, then the slice constants on ``slices`` (``features``:
        model -> anchor name -> (features, group) for every model a slice comes from).
        ``extra``: out-of-context samples (the single-layer sweep) for ops no model has.
        ``boosted=False`` keeps the power laws alone (no scikit-learn needed). ``relabel``
        replaces the profiler's labels by unprofiled kernel times (:mod:`.partlabels`); without
        it the profiler's own cost (:func:`profiler_inflation`) is taken off every label."""
        node_list = [n for n in nodes if n.ms > 0]
        inflation = profiler_inflation(node_list, slices)
        if relabel is not None:
            node_list = [n for n in relabel(node_list, list(slices)) if n.ms > 0]
        elif inflation > 0:  # labels as a kernel costs without the profiler around it
            node_list = [replace(n, ms=max(n.ms - inflation, 0.2 * n.ms)) for n in node_list]
        groups, ranges = cls.fit_nodes(node_list, extra)
        pred = cls(groups, trained_on=sorted({s.model for s in node_list}), ranges=ranges)
        pred.profiler_ms = inflation
        if boosted and len(node_list) >= 50:
            x = np.array([node_vector(n.features, n.group) for n in node_list])
            pred.boosted = Boosted.fit(x, np.log(np.array([n.ms for n in node_list])),
                                       trees=NODE_TREES, depth=NODE_DEPTH)
            pred.boosted_ops = frozenset(n.features.op_type for n in node_list)
        usable = [s for s in slices if s.ms > 0]
        if len(usable) >= 6:
            sums = np.array([pred.node_sum(s.nodes, features[s.model]) for s in usable])
            (pred.scale, pred.c0, pred.c_kernel, pred.c_io, pred.c_reorder,
             pred.c_copy) = fit_slice_constants(sums, usable)
        return pred

    # -- prediction -------------------------------------------------------------------------
    def node_ms(self, f: NodeFeatures, group: str) -> float:
        if f.op_type in FREE_OPS or f.fused:
            return 0.0
        if self._tree_nodes(f) and self.boosted is not None:
            return float(np.exp(self.boosted([node_vector(f, group)])[0]))
        return self.law_ms(f, group)

    def _tree_nodes(self, f: NodeFeatures) -> bool:
        return self.boosted is not None and f.op_type in self.boosted_ops

    def law_ms(self, f: NodeFeatures, group: str) -> float:
        """The power law's time for a node (its group's law, else its kind's, else the
        global one): the fallback for ops the boosted trees never saw."""
        for key in (group, group.replace("+fused", ""), group.split(":", 1)[0], "*"):
            law = self.groups.get(key)
            if law is not None:
                x = np.asarray(f.linear, dtype=np.float64)
                if key in self.ranges:
                    lo, hi = self.ranges[key]
                    x = np.clip(x, lo, hi)
                return max(law([float(v) for v in x]), 0.0)
        return 0.0

    def model_nodes(self, features: Mapping[str, tuple[NodeFeatures, str]]) -> dict[str, float]:
        """:meth:`node_ms` of every anchor in ``features`` (one batched call to the trees;
        remembered per features object, which is kept alive with its result)."""
        key = id(features)
        hit = self._memo.get(key)
        if hit is not None and hit[0] is features:
            return hit[1]
        out: dict[str, float] = {}
        batch = [(n, f, g) for n, (f, g) in features.items()
                 if f.op_type not in FREE_OPS and not f.fused]
        trees = [(n, f, g) for n, f, g in batch if self._tree_nodes(f)]
        if trees and self.boosted is not None:
            ms = np.exp(self.boosted([node_vector(f, g) for _, f, g in trees]))
            out.update((n, float(v)) for (n, _, _), v in zip(trees, ms, strict=True))
        for n, f, g in batch:
            if n not in out:
                out[n] = self.node_ms(f, g)
        self._memo[key] = (features, out)
        return out

    def node_sum(self, names: Iterable[str],
                 features: Mapping[str, tuple[NodeFeatures, str]]) -> float:
        times = self.model_nodes(features)
        return sum(times.get(n, 0.0) for n in names)

    def node_times(self, features: Mapping[str, tuple[NodeFeatures, str]],
                   all_names: Iterable[str] = ()) -> dict[str, float]:
        """Per-node ms for a planner that sums nodes per part: every anchor carries its own
        kernel's dispatch cost (``c_kernel``), every other node (fused, metadata, constant)
        0; the per-run ``c0`` is left out (a few microseconds against a radio exchange)."""
        out = dict.fromkeys(all_names, 0.0)
        times = self.model_nodes(features)
        for n in features:
            out[n] = max(self.scale * times.get(n, 0.0) + self.c_kernel, 0.0)
        return out

    def slice_ms(self, names: Sequence[str], kernels: int, boundary_melems: float,
                 features: Mapping[str, tuple[NodeFeatures, str]], reorders: int = 0,
                 reorder_melems: float = 0.0) -> float:
        """A slice of the anchors ``names`` whose optimized graph runs ``kernels`` kernels,
        ``reorders`` of them layout reorders copying ``reorder_melems`` million elements, with
        ``boundary_melems`` MB entering and leaving it."""
        ms = (self.scale * self.node_sum(names, features) + self.c0
              + self.c_kernel * kernels + self.c_io * boundary_melems
              + self.c_reorder * reorders + self.c_copy * reorder_melems)
        return max(ms, self.c0 if self.c0 > 0 else 1e-3)

    # -- JSON -------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "linear_features": list(LINEAR_FEATURES),
                "groups": {k: v.to_json() for k, v in self.groups.items()},
                "scale": self.scale, "c0": self.c0, "c_kernel": self.c_kernel,
                "c_io": self.c_io, "c_reorder": self.c_reorder, "c_copy": self.c_copy,
                "profiler_ms": self.profiler_ms,
                "trained_on": self.trained_on,
                "boosted": self.boosted.to_json() if self.boosted else None,
                "boosted_ops": sorted(self.boosted_ops),
                "ranges": {k: [lo, hi] for k, (lo, hi) in self.ranges.items()}}

    @classmethod
    def from_json(cls, obj: Any) -> SlicePredictor:
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise ValueError(f"not a coinf slice predictor (format must be {FORMAT!r})")
        if obj.get("version") != VERSION:
            raise ValueError(f"slice predictor version {obj.get('version')}; this coinf reads "
                             f"{VERSION} (re-run `coinf profile --train`)")
        if list(obj.get("linear_features", [])) != list(LINEAR_FEATURES):
            raise ValueError("slice predictor was trained on different features; retrain it")
        consts = [float(obj.get(k, 0.0))
                  for k in ("scale", "c0", "c_kernel", "c_io", "c_reorder", "c_copy")]
        if not all(math.isfinite(c) for c in consts) or consts[0] <= 0:
            raise ValueError("slice predictor constants must be finite, scale > 0")
        groups = {str(k): Linear.from_json(v) for k, v in obj["groups"].items()}
        if "*" not in groups:
            raise ValueError("slice predictor has no global ('*') node model")
        ranges = {}
        for k, (lo, hi) in obj.get("ranges", {}).items():
            if len(lo) != len(LINEAR_FEATURES) or len(hi) != len(LINEAR_FEATURES):
                raise ValueError(f"slice predictor range of {k!r} has the wrong length")
            ranges[str(k)] = ([float(v) for v in lo], [float(v) for v in hi])
        scale, c0, c_kernel, c_io, c_reorder, c_copy = consts
        boosted = Boosted.from_json(obj["boosted"]) if obj.get("boosted") else None
        if boosted is not None and boosted.features != len(node_vector(_PROBE, "")):
            raise ValueError("slice predictor's trees take other node features; retrain it")
        profiler_ms = float(obj.get("profiler_ms", 0.0))
        if not (math.isfinite(profiler_ms) and profiler_ms >= 0):
            raise ValueError("slice predictor's profiler_ms must be finite and >= 0")
        return cls(groups, scale, c0, c_kernel, c_io, c_reorder, c_copy, profiler_ms, boosted,
                   frozenset(str(o) for o in obj.get("boosted_ops", [])),
                   trained_on=[str(m) for m in obj.get("trained_on", [])], ranges=ranges)


def _whole_runs(nodes: Sequence[NodeSample], slices: Sequence[SliceSample],
                ) -> dict[str, tuple[float, SliceSample]]:
    """Per model with node samples and a slice of all of them (the whole model): its profiled
    node times summed, and that slice."""
    sums: dict[str, float] = {}
    names: dict[str, set[str]] = {}
    for n in nodes:
        sums[n.model] = sums.get(n.model, 0.0) + n.ms
        names.setdefault(n.model, set()).add(n.features.name)
    by: dict[str, list[SliceSample]] = {}
    for s in slices:
        if s.model in names and s.ms > 0 and s.kernels > 0 and names[s.model] <= set(s.nodes):
            by.setdefault(s.model, []).append(s)
    return {m: (sums[m], max(whole, key=lambda s: len(s.nodes))) for m, whole in by.items()}


def profiler_surplus(nodes: Sequence[NodeSample], slices: Sequence[SliceSample],
                     ) -> dict[str, float]:
    """Per model with node samples and a slice of all of them (the whole model): its profiled
    node times summed minus the whole model's unprofiled time, per kernel (ms) -- what the
    profiler adds to each kernel it times."""
    return {m: (total - w.ms) / w.kernels for m, (total, w) in _whole_runs(nodes, slices).items()}


def profiler_inflation(nodes: Sequence[NodeSample], slices: Sequence[SliceSample]) -> float:
    """How much the profiler adds to each kernel's time (ms): the median over models of
    :func:`profiler_surplus`, each model weighted by its kernels per ms of run (a model's
    surplus is a difference of two run times spread over its kernels: on a long run with few
    kernels, run-to-run drift swamps it); 0 when no model has one. The profiler wraps every
    kernel in timestamps (about a microsecond here): on 2 µs kernels that is half the label."""
    runs = _whole_runs(nodes, slices)
    if not runs:
        return 0.0
    pairs = sorted(((total - w.ms) / w.kernels, w.kernels / w.ms) for total, w in runs.values())
    cum = np.cumsum([wt for _, wt in pairs])
    median = pairs[int(np.searchsorted(cum, cum[-1] / 2))][0]
    return max(float(median), 0.0)


def fit_slice_constants(node_sums: np.ndarray, slices: Sequence[SliceSample],
                        ) -> tuple[float, ...]:
    """``(scale, c0, c_kernel, c_io, c_reorder, c_copy)`` of the slice model for slices whose
    node times sum to ``node_sums``. Relative error matters (the target is +-10%), and a few
    slices of another model with badly predicted nodes must not drag the constants: a robust
    (soft-L1) fit of the relative error. Each model's slices weigh ``1 / sqrt(its slice
    count)``: the constants must carry to an unseen model, and a model cut into 126 slices
    would otherwise set them for one cut into 14 (equal weight per model lets the few slices of
    the smallest models set them instead). The per-kernel term may be negative: the
    profiler's own cost inflates every kernel's time inside a profiled run, and a slice runs
    without it."""
    from scipy.optimize import least_squares

    a = np.column_stack([np.ones(len(slices)), [s.kernels for s in slices],
                         [s.boundary_melems for s in slices], [s.reorders for s in slices],
                         [s.reorder_melems for s in slices]])
    y = np.array([s.ms for s in slices])
    count = Counter(s.model for s in slices)
    w = np.array([count[s.model] ** -0.5 for s in slices])
    w /= w.mean()

    def rel(c: np.ndarray) -> np.ndarray:
        return w * ((c[0] * node_sums + a @ c[1:]) / y - 1.0)

    fit = least_squares(rel, np.array([1.0, 0.01, 0.0, 0.0, 0.0, 0.0]), loss="soft_l1",
                        f_scale=0.1, bounds=([0.2, 0.0, -np.inf, -np.inf, -np.inf, -np.inf],
                                             [5.0, np.inf, np.inf, np.inf, np.inf, np.inf]))
    return tuple(float(v) for v in fit.x)


_PROBE = NodeFeatures("probe", "Relu", "activation", (0.0,) * 8, (0.0,) * 4, 0.0)


def within(pairs: Sequence[tuple[float, float]], tol: float = 0.10) -> float:
    """Fraction of (predicted, measured) pairs with ``|pred / measured - 1| <= tol``."""
    ok = [abs(p / m - 1.0) <= tol for p, m in pairs if m > 0]
    return sum(ok) / len(ok) if ok else float("nan")


def leave_one_model_out(nodes: Sequence[NodeSample], slices: Sequence[SliceSample],
                        features: Mapping[str, Mapping[str, tuple[NodeFeatures, str]]],
                        models: Sequence[str] | None = None, extra: Sequence[NodeSample] = (),
                        relabel: Relabel | None = None,
                        progress: Callable[[str], None] | None = None,
                        ) -> dict[str, list[tuple[str, float, float]]]:
    """For each model (default: every model with slices): train on every other model's node
    and slice timings (``relabel`` as in :meth:`SlicePredictor.train`), predict this model's
    slices. Returns model -> [(slice, predicted, measured)]. A model never contributes to its
    own prediction. ``progress`` hears of each model before its predictor is trained."""
    out: dict[str, list[tuple[str, float, float]]] = {}
    held_out = list(models) if models is not None else sorted({s.model for s in slices})
    for i, held in enumerate(held_out, 1):
        if progress:
            progress(f"leave one model out {i}/{len(held_out)}: training without {held}")
        train_nodes = [n for n in nodes if n.model != held]
        train_slices = [s for s in slices if s.model != held]
        pred = SlicePredictor.train(train_nodes, train_slices, features, extra,
                                    relabel=relabel)
        assert held not in pred.trained_on
        out[held] = [(s.slice, pred.slice_ms(s.nodes, s.kernels, s.boundary_melems,
                                             features[held], s.reorders, s.reorder_melems),
                      s.ms)
                     for s in slices if s.model == held]
    return out

