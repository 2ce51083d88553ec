"""Slice-latency prediction learnt from in-context timings (nn-Meter's idea: predict the kernels
that really run, not single layers).

A slice's time at ``ORT_ENABLE_ALL`` is modelled as

    slice_ms = scale * sum(anchor node times) + c0 + c_kernel * kernels + c_io * boundary Melems

* anchor node times: one power law per *kernel group* -- the anchor's kind refined by what
  matters to its kernel (conv: depthwise / pointwise / spatial, and whether BN or an activation
  is fused into it; gemm: op; other kinds: op) -- over the sizes (MFLOPs, input, output and
  parameter elements), fitted on per-node times from onnxruntime's profiler inside whole models
  (:mod:`.incontext`); nodes fused into an anchor and metadata ops cost nothing of their own;
* the per-run constant (``c0``), a per-kernel dispatch cost and a cost per element crossing the
  slice boundary (the layout reorders onnxruntime adds there), fitted on measured slice times.

:func:`leave_one_model_out` evaluates it as the issue asks: for every model, train on all the
*other* models' timings and predict this model's slices.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from coinf.device.features import FREE_OPS, LINEAR_FEATURES, NodeFeatures
from coinf.device.predict import Linear, _fit_loglinear

FORMAT = "coinf-slice-predictor"
VERSION = 1
#: a group needs this many samples for its own power law; else its kind's, else the global one
MIN_GROUP = 6


def group_of(f: NodeFeatures, followers: Sequence[str] = ()) -> str:
    """The kernel group of an anchor node (see the module doc)."""
    fused = "+fused" if followers else ""
    if f.kind == "conv":
        kernel, depthwise = f.tree[1], f.tree[3]
        shape = "dw" if depthwise else ("pw" if kernel <= 1 else "k")
        return f"conv:{shape}{fused}"
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
    boundary_melems: float
    ms: float


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
    trained_on: list[str] = field(default_factory=list)
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
              extra: Sequence[NodeSample] = ()) -> SlicePredictor:
        """Fit the node power laws, then the slice constants on ``slices`` (``features``:
        model -> anchor name -> (features, group) for every model a slice comes from).
        ``extra``: out-of-context samples (the single-layer sweep) for ops no model has."""
        node_list = list(nodes)
        groups, ranges = cls.fit_nodes(node_list, extra)
        pred = cls(groups, trained_on=sorted({s.model for s in node_list}), ranges=ranges)
        usable = [s for s in slices if s.ms > 0]
        if len(usable) >= 4:
            sums = np.array([pred.node_sum(s.nodes, features[s.model]) for s in usable])
            a = np.column_stack([sums, np.ones(len(usable)),
                                 [s.kernels for s in usable],
                                 [s.boundary_melems for s in usable]])
            y = np.array([s.ms for s in usable])
            # relative error matters (the target is +-10%), and a few slices of another model
            # with badly predicted nodes must not drag the constants: a robust (soft-L1) fit
            # of the relative error. The per-kernel term may be negative: the profiler's own
            # cost inflates every kernel's time inside a profiled run, and a slice runs
            # without the profiler. The node laws are trusted as they are (scale 1).
            from scipy.optimize import least_squares

            def rel(c: np.ndarray) -> np.ndarray:
                return (sums + c[0] + c[1] * a[:, 2] + c[2] * a[:, 3]) / y - 1.0

            fit = least_squares(rel, np.array([0.01, 0.0, 0.0]), loss="soft_l1", f_scale=0.1,
                                bounds=([0.0, -np.inf, 0.0], [np.inf, np.inf, np.inf]))
            sol = np.array([1.0, *fit.x])
            pred.scale, pred.c0, pred.c_kernel, pred.c_io = (float(v) for v in sol)
        return pred

    # -- prediction -------------------------------------------------------------------------
    def node_ms(self, f: NodeFeatures, group: str) -> float:
        if f.op_type in FREE_OPS or f.fused:
            return 0.0
        for key in (group, group.replace("+fused", ""), group.split(":", 1)[0], "*"):
            law = self.groups.get(key)
            if law is not None:
                x = np.asarray(f.linear, dtype=np.float64)
                if key in self.ranges:
                    lo, hi = self.ranges[key]
                    x = np.clip(x, lo, hi)
                return max(law([float(v) for v in x]), 0.0)
        return 0.0

    def node_sum(self, names: Iterable[str],
                 features: Mapping[str, tuple[NodeFeatures, str]]) -> float:
        total = 0.0
        for n in names:
            fg = features.get(n)
            if fg is not None:
                total += self.node_ms(*fg)
        return total

    def node_times(self, features: Mapping[str, tuple[NodeFeatures, str]],
                   all_names: Iterable[str] = ()) -> dict[str, float]:
        """Per-node ms for a planner that sums nodes per part: every anchor carries its own
        kernel's dispatch cost (``c_kernel``), every other node (fused, metadata, constant)
        0; the per-run ``c0`` is left out (a few microseconds against a radio exchange)."""
        out = dict.fromkeys(all_names, 0.0)
        for n, (f, g) in features.items():
            out[n] = max(self.scale * self.node_ms(f, g) + self.c_kernel, 0.0)
        return out

    def slice_ms(self, names: Sequence[str], kernels: int, boundary_melems: float,
                 features: Mapping[str, tuple[NodeFeatures, str]]) -> float:
        ms = (self.scale * self.node_sum(names, features) + self.c0
              + self.c_kernel * kernels + self.c_io * boundary_melems)
        return max(ms, self.c0 if self.c0 > 0 else 1e-3)

    # -- JSON -------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "linear_features": list(LINEAR_FEATURES),
                "groups": {k: v.to_json() for k, v in self.groups.items()},
                "scale": self.scale, "c0": self.c0, "c_kernel": self.c_kernel,
                "c_io": self.c_io, "trained_on": self.trained_on,
                "ranges": {k: [lo, hi] for k, (lo, hi) in self.ranges.items()}}

    @classmethod
    def from_json(cls, obj: Any) -> SlicePredictor:
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise ValueError(f"not a coinf slice predictor (format must be {FORMAT!r})")
        if obj.get("version") != VERSION:
            raise ValueError(f"slice predictor version {obj.get('version')}; this coinf reads "
                             f"{VERSION}")
        if list(obj.get("linear_features", [])) != list(LINEAR_FEATURES):
            raise ValueError("slice predictor was trained on different features; retrain it")
        consts = [float(obj.get(k, 0.0)) for k in ("scale", "c0", "c_kernel", "c_io")]
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
        scale, c0, c_kernel, c_io = consts
        return cls(groups, scale, c0, c_kernel, c_io,
                   trained_on=[str(m) for m in obj.get("trained_on", [])], ranges=ranges)


def within(pairs: Sequence[tuple[float, float]], tol: float = 0.10) -> float:
    """Fraction of (predicted, measured) pairs with ``|pred / measured - 1| <= tol``."""
    ok = [abs(p / m - 1.0) <= tol for p, m in pairs if m > 0]
    return sum(ok) / len(ok) if ok else float("nan")


def leave_one_model_out(nodes: Sequence[NodeSample], slices: Sequence[SliceSample],
                        features: Mapping[str, Mapping[str, tuple[NodeFeatures, str]]],
                        models: Sequence[str] | None = None, extra: Sequence[NodeSample] = (),
                        ) -> dict[str, list[tuple[str, float, float]]]:
    """For each model (default: every model with slices): train on every other model's node
    and slice timings, predict this model's slices. Returns model -> [(slice, predicted,
    measured)]. A model never contributes to its own prediction."""
    out: dict[str, list[tuple[str, float, float]]] = {}
    for held in models if models is not None else sorted({s.model for s in slices}):
        train_nodes = [n for n in nodes if n.model != held]
        train_slices = [s for s in slices if s.model != held]
        pred = SlicePredictor.train(train_nodes, train_slices, features, extra)
        assert held not in pred.trained_on
        out[held] = [(s.slice, pred.slice_ms(s.nodes, s.kernels, s.boundary_melems,
                                             features[held]), s.ms)
                     for s in slices if s.model == held]
    return out

