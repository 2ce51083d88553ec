"""Slice-latency prediction learnt from in-context timings (nn-Meter's idea: predict the kernels
that really run, not single layers): the trained model as a device profile stores it, and its
evaluation. Training it is research (``coinf.research.slicetrain``, run by ``coinf profile
--train``); predicting needs numpy only.

A slice's time at ``ORT_ENABLE_ALL`` is modelled as

    slice_ms = scale * sum(anchor node times) + c0 + c_kernel * kernels + c_io * boundary MB
               + c_reorder * reorders + c_copy * reordered Melems

* anchor node times: gradient-boosted trees (:mod:`.boosted`) over the node's sizes (MFLOPs,
  input, output and parameter elements, in log), its structure (kernel, stride, depthwise,
  channels in and out, map size, sequence length), its op and whether BN or an activation is
  fused into it; an op the trees never saw falls back to a power law per *kernel group* (the
  anchor's kind refined by what matters to its kernel, :func:`group_of`), then per kind. Nodes
  fused into an anchor and metadata ops cost nothing of their own;
* ``kernels``, ``reorders`` and the elements the reorders copy are counts of the graph
  onnxruntime really runs for the slice; the per-run constant ``c0`` and the costs per kernel,
  per MB entering and leaving the slice, per reorder and per reordered element are fitted on
  measured slice times.

The planner sums :meth:`SlicePredictor.node_times` per part
(:func:`coinf.device.incontext.incontext_node_times`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from coinf.device.boosted import Boosted
from coinf.device.features import FREE_OPS, KINDS, LINEAR_FEATURES, OP_CODE, NodeFeatures
from coinf.device.predict import Linear

FORMAT = "coinf-slice-predictor"
VERSION = 3
KIND_CODE = {k: i for i, k in enumerate(KINDS)}


def group_of(f: NodeFeatures, followers: Sequence[str] = ()) -> str:
    """The kernel group of an anchor node: ``conv:k``, ``conv:pw``, ``conv:dw`` (``+sum`` with a
    residual Add folded in), ``gemm:<op>``, else ``<kind>:<op>``; ``+fused`` when something is
    folded into a convolution or Gemm."""
    fused = "+fused" if followers else ""
    if f.kind == "conv":
        kernel, depthwise = f.tree[1], f.tree[3]
        shape = "dw" if depthwise else ("pw" if kernel <= 1 else "k")
        residual = "+sum" if "Add" in followers else ""  # a residual Add folded in
        return f"conv:{shape}{residual}{fused}"
    if f.kind == "gemm":
        return f"gemm:{f.op_type}{fused}"
    return f"{f.kind}:{f.op_type}"


def node_vector(f: NodeFeatures, group: str) -> list[float]:
    """A node's inputs to the boosted trees: log sizes, structure, op and fusion."""
    lin = [math.log(max(v, 0.0) + 1e-6) for v in f.linear]
    t = f.tree
    return [*lin, t[1], t[2], t[3], math.log1p(t[4]), math.log1p(t[5]), math.log1p(t[6]),
            math.log1p(t[7]), float(KIND_CODE.get(f.kind, -1)), OP_CODE.get(f.op_type, -1.0),
            1.0 if group.endswith("+fused") else 0.0, 1.0 if "+sum" in group else 0.0]


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


_PROBE = NodeFeatures("probe", "Relu", "activation", (0.0,) * 8, (0.0,) * 4, 0.0)
