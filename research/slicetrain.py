"""Training the in-context slice predictor (:class:`coinf.device.slicepred.SlicePredictor`)
and scoring it leave-one-model-out. The runtime only evaluates a trained predictor stored in a
device profile; everything that fits one lives here (``coinf profile --train``,
``coinf bench predict``).

Node labels start as onnxruntime's profiler's per-node times (:mod:`coinf.device.incontext`);
a ``relabel`` (:mod:`.partlabels`) replaces them by times decomposed from unprofiled timings of
the model's slices or parts, else the profiler's own share of each kernel
(:func:`profiler_inflation`, about a microsecond) is taken off every label. The node models are
fitted on those labels, then the slice constants on measured slices
(:func:`fit_slice_constants`). :func:`leave_one_model_out` evaluates it as issue 17 asked: for
every model, train on all the *other* models' timings and predict this model's slices.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from coinf.device.boosted import Boosted, Tree
from coinf.device.features import NodeFeatures
from coinf.device.predict import Linear, _fit_loglinear
from coinf.device.slicepred import SlicePredictor, node_vector

#: a group needs this many samples for its own power law; else its kind's, else the global one
MIN_GROUP = 6
#: the boosted node model's size: trees of this depth (a smaller model underfits its own
#: training labels, p10-p90 of predicted / label 0.70-1.41 at 300 trees of depth 4)
NODE_TREES, NODE_DEPTH = 1000, 6
#: ``relabel(nodes, slices)``: training nodes with labels that are unprofiled kernel times
Relabel = Callable[[list["NodeSample"], list["SliceSample"]], list["NodeSample"]]
Features = Mapping[str, Mapping[str, tuple[NodeFeatures, str]]]
Ranges = dict[str, tuple[list[float], list[float]]]


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


def fit_boosted(x: np.ndarray, log_ms: np.ndarray, trees: int = 300, depth: int = 4,
                rate: float = 0.05, seed: int = 0) -> Boosted:
    """:class:`~coinf.device.boosted.Boosted` trees fitted on ``x`` (rows of features) and
    ``log_ms`` with scikit-learn, each tree's arrays copied out of it."""
    from sklearn.ensemble import GradientBoostingRegressor

    model = GradientBoostingRegressor(n_estimators=trees, max_depth=depth,
                                      learning_rate=rate, subsample=0.8,
                                      min_samples_leaf=3, random_state=seed)
    model.fit(x, log_ms)
    out = []
    for est in model.estimators_[:, 0]:
        t = est.tree_
        out.append(Tree(np.asarray(t.children_left, dtype=np.int64),
                        np.asarray(t.children_right, dtype=np.int64),
                        np.asarray(t.feature, dtype=np.int64),
                        np.asarray(t.threshold, dtype=np.float64),
                        np.asarray(t.value[:, 0, 0], dtype=np.float64)))
    base = float(np.asarray(model.init_.predict(x[:1])).ravel()[0])
    return Boosted(base, rate, tuple(out), int(x.shape[1]))


def _loglinear(x: np.ndarray, y: np.ndarray) -> Linear:
    """Power law ``ms = exp(b) * prod((x + eps)^a)`` by ridge least squares in log space."""
    return _fit_loglinear(x, y, ridge_weight=1e-2)


def _fit_groups(ss: list[NodeSample], with_global: bool) -> tuple[dict[str, Linear], Ranges]:
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


def fit_nodes(samples: Iterable[NodeSample], extra: Iterable[NodeSample] = (),
              ) -> tuple[dict[str, Linear], Ranges]:
    """One power law per group with enough samples, per kind, and ``*`` for everything, with
    the size range each was fitted on; ``extra`` samples only fill groups and kinds the
    in-context samples lack."""
    ss = [s for s in samples if s.ms > 0]
    if not ss:
        raise ValueError("no in-context node timings to train on")
    out, ranges = _fit_groups(ss, with_global=True)
    more, more_ranges = _fit_groups([s for s in extra if s.ms > 0], False)
    for key, law in more.items():
        if key not in out:
            out[key], ranges[key] = law, more_ranges[key]
    return out, ranges


def train_slice_predictor(nodes: Iterable[NodeSample], slices: Sequence[SliceSample],
                          features: Features, extra: Sequence[NodeSample] = (),
                          boosted: bool = True, relabel: Relabel | None = None,
                          ) -> SlicePredictor:
    """Fit the node models, then the slice constants on ``slices`` (``features``: model ->
    anchor name -> (features, group) for every model a slice comes from). ``extra``:
    out-of-context samples (the single-layer sweep) for ops no model has. ``boosted=False``
    keeps the power laws alone (no scikit-learn needed). ``relabel`` replaces the profiler's
    labels by unprofiled kernel times (:mod:`.partlabels`); without it the profiler's own cost
    (:func:`profiler_inflation`) is taken off every label."""
    node_list = [n for n in nodes if n.ms > 0]
    inflation = profiler_inflation(node_list, slices)
    if relabel is not None:
        node_list = [n for n in relabel(node_list, list(slices)) if n.ms > 0]
    elif inflation > 0:  # labels as a kernel costs without the profiler around it
        node_list = [replace(n, ms=max(n.ms - inflation, 0.2 * n.ms)) for n in node_list]
    groups, ranges = fit_nodes(node_list, extra)
    pred = SlicePredictor(groups, trained_on=sorted({s.model for s in node_list}),
                          ranges=ranges)
    pred.profiler_ms = inflation
    if boosted and len(node_list) >= 50:
        x = np.array([node_vector(n.features, n.group) for n in node_list])
        pred.boosted = fit_boosted(x, np.log(np.array([n.ms for n in node_list])),
                                   trees=NODE_TREES, depth=NODE_DEPTH)
        pred.boosted_ops = frozenset(n.features.op_type for n in node_list)
    usable = [s for s in slices if s.ms > 0]
    if len(usable) >= 6:
        sums = np.array([pred.node_sum(s.nodes, features[s.model]) for s in usable])
        (pred.scale, pred.c0, pred.c_kernel, pred.c_io, pred.c_reorder,
         pred.c_copy) = fit_slice_constants(sums, usable)
    return pred


def predict_slice(pred: SlicePredictor, s: SliceSample,
                  features: Mapping[str, tuple[NodeFeatures, str]]) -> float:
    """``pred``'s time for the measured slice ``s`` (its anchors, kernels and boundary)."""
    return pred.slice_ms(s.nodes, s.kernels, s.boundary_melems, features, s.reorders,
                         s.reorder_melems)


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
    node times sum to ``node_sums``. Relative error matters (a cut is chosen by ratios of
    times), and a few slices of another model with badly predicted nodes must not drag the
    constants: a robust (soft-L1) fit of the relative error. Each model's slices weigh
    ``1 / sqrt(its slice count)``: the constants must carry to an unseen model, and a model cut
    into 126 slices would otherwise set them for one cut into 14 (equal weight per model lets
    the few slices of the smallest models set them instead). The per-kernel term may be
    negative: the profiler's own cost inflates every kernel's time inside a profiled run, and a
    slice runs without it."""
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


def within(pairs: Sequence[tuple[float, float]], tol: float = 0.10) -> float:
    """Fraction of (predicted, measured) pairs with ``|pred / measured - 1| <= tol``."""
    ok = [abs(p / m - 1.0) <= tol for p, m in pairs if m > 0]
    return sum(ok) / len(ok) if ok else float("nan")


def leave_one_model_out(nodes: Sequence[NodeSample], slices: Sequence[SliceSample],
                        features: Features, models: Sequence[str] | None = None,
                        extra: Sequence[NodeSample] = (),
                        relabel: Relabel | None = None,
                        progress: Callable[[str], None] | None = None,
                        ) -> dict[str, list[tuple[str, float, float]]]:
    """For each model (default: every model with slices): train on every other model's node
    and slice timings (``relabel`` as in :func:`train_slice_predictor`), predict this model's
    slices. Returns model -> [(slice, predicted, measured)]. A model never contributes to its
    own prediction. ``progress`` hears of each model before its predictor is trained."""
    out: dict[str, list[tuple[str, float, float]]] = {}
    held_out = list(models) if models is not None else sorted({s.model for s in slices})
    for i, held in enumerate(held_out, 1):
        if progress:
            progress(f"leave one model out {i}/{len(held_out)}: training without {held}")
        train_nodes = [n for n in nodes if n.model != held]
        train_slices = [s for s in slices if s.model != held]
        pred = train_slice_predictor(train_nodes, train_slices, features, extra,
                                     relabel=relabel)
        assert held not in pred.trained_on
        out[held] = [(s.slice, predict_slice(pred, s, features[held]), s.ms)
                     for s in slices if s.model == held]
    return out

