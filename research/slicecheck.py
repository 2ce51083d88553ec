"""Two reference scores for the slice model of :mod:`coinf.device.slicepred`, from cached
timings alone. They separate the error of predicting node times from the error of the labels
it learns from and of the slice model's form:

* :func:`profiled_pairs` -- each model's slices predicted from its *own* profiled node times,
  with the slice constants fitted on every *other* model's slices and profiled node times
  (:func:`profiled_constants`; ``coinf bench predict --bundle`` reports the same as
  ``own_profile_within_10pct``). It is what a node predictor that reproduced onnxruntime's
  profiler exactly would score. It is no upper bound (the profiler reports whole
  microseconds, which trees fitted over many nodes can average out), but where the predictor
  scores far below it, predicting the node times is what fails;
* :func:`additive_pairs` -- each model's slices fitted with one free, non-negative time per
  anchor and a per-run constant, on that model's own slices (in-sample). It shows how far
  any sum of per-node times explains the slices at all.
  Far below 1 (:data:`CONSISTENT_WITHIN_10PCT`, :func:`inconsistent_models`) the slice
  times themselves do not add up: they were timed on a busy machine.

If the additive score is high and the profiled one is not, the labels are what limit the
prediction: the profiler's times per node, not their prediction, not the slice model's form.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from coinf.research.slicetrain import NodeSample, SliceSample, fit_slice_constants

Pairs = list[tuple[float, float]]  # (predicted ms, measured ms) per slice


def profiled_constants(labels: Mapping[str, Mapping[str, float]],
                       slices: Sequence[SliceSample]) -> tuple[float, ...]:
    """The slice constants (:func:`~coinf.research.slicetrain.fit_slice_constants`) fitted on
    the slices of the models in ``labels`` (model -> anchor -> profiled ms) with their summed
    profiled node times in place of predicted ones."""
    use = [s for s in slices if s.model in labels and s.ms > 0]
    return fit_slice_constants(np.array([_sum(labels[s.model], s) for s in use]), use)


def _sum(labels: Mapping[str, float], s: SliceSample) -> float:
    return sum(labels.get(n, 0.0) for n in s.nodes)


def profiled_pairs(nodes: Sequence[NodeSample], slices: Sequence[SliceSample],
                   models: Sequence[str] | None = None) -> dict[str, Pairs]:
    """Per model (default: every model with slices and node times): its slices predicted from
    its own profiled node times with :func:`profiled_constants` of every other model."""
    labels: dict[str, dict[str, float]] = {}
    for n in nodes:
        labels.setdefault(n.model, {})[n.features.name] = n.ms
    names = models if models is not None else sorted({s.model for s in slices} & set(labels))
    out: dict[str, Pairs] = {}
    for held in names:
        others = {m: v for m, v in labels.items() if m != held}
        test = [s for s in slices if s.model == held and s.ms > 0]
        if held not in labels or not test or \
                sum(1 for s in slices if s.model in others and s.ms > 0) < 6:
            continue
        c = np.array(profiled_constants(others, slices))
        out[held] = [(max(float(np.dot(c, [_sum(labels[held], s), 1.0, s.kernels,
                                             s.boundary_melems, s.reorders,
                                             s.reorder_melems])), 1e-6), s.ms) for s in test]
    return out


def additive_pairs(nodes: Sequence[NodeSample], slices: Sequence[SliceSample],
                   ) -> dict[str, Pairs]:
    """Per model with node times: its slices fitted in-sample by free non-negative anchor times
    (the anchors its profile names), a non-negative per-run constant and free costs per MB at
    the boundary and per reordered Melem, minimising the relative error."""
    from scipy.optimize import lsq_linear

    out: dict[str, Pairs] = {}
    for m in sorted({n.model for n in nodes} & {s.model for s in slices}):
        test = [s for s in slices if s.model == m and s.ms > 0]
        if not test:
            continue
        names = sorted({n.features.name for n in nodes if n.model == m})
        col = {n: i for i, n in enumerate(names)}
        a = np.zeros((len(test), len(names) + 3))
        for i, s in enumerate(test):
            for n in s.nodes:
                if n in col:
                    a[i, col[n]] = 1.0
            a[i, len(names):] = (1.0, s.boundary_melems, s.reorder_melems)
        y = np.array([s.ms for s in test])
        lo = np.r_[np.zeros(len(names) + 1), -np.inf, -np.inf]
        fit = lsq_linear(a / y[:, None], np.ones(len(test)), bounds=(lo, np.inf))
        out[m] = [(float(p), s.ms) for p, s in zip(a @ fit.x, test, strict=True)]
    return out


#: a model whose slices free node times (fitted in-sample) explain less often than this within
#: +-10 % was timed on a busy machine (0.91-1.00 for every model on three caches of quiet days,
#: 0.22 for MobileNetV2 on a noisy one: git history of docs/BENCHMARKS.md, `bench predict`)
CONSISTENT_WITHIN_10PCT = 0.85


def inconsistent_models(per: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """Model -> ``additive_within_10pct`` for the models of a ``zoo_leave_one_out`` result
    whose cached slice times no additive model explains (see ``CONSISTENT_WITHIN_10PCT``)."""
    return {m: float(r["additive_within_10pct"]) for m, r in per.items()
            if r.get("additive_within_10pct") is not None
            and r["additive_within_10pct"] < CONSISTENT_WITHIN_10PCT}


#: a model whose cached slice times repeat within +-10 % (the halves of their rounds,
#: ``measurement_repeatability_within_10pct``) less often than this is scored against noise: no
#: predictor can put 0.90 of its slices within +-10 % of them. Slice accuracy is reported next
#: to that repeatability and is no target by itself; the goal is plan regret
#: (``planregret.REGRET_TARGET``)
REPEATABLE_WITHIN_10PCT = 0.90


def unrepeatable_models(per: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """Model -> ``measurement_repeatability_within_10pct`` for the models of a
    ``zoo_leave_one_out`` result whose own measurement repeats less often than
    ``REPEATABLE_WITHIN_10PCT`` (a cache without rounds names none)."""
    return {m: float(r["measurement_repeatability_within_10pct"]) for m, r in per.items()
            if r.get("measurement_repeatability_within_10pct") is not None
            and r["measurement_repeatability_within_10pct"] < REPEATABLE_WITHIN_10PCT}


__all__ = ["CONSISTENT_WITHIN_10PCT", "REPEATABLE_WITHIN_10PCT", "additive_pairs",
           "inconsistent_models", "profiled_constants", "profiled_pairs", "unrepeatable_models"]
