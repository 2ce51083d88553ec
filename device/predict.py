"""Layer-type latency predictors, trained from the synthetic sweep, stored as JSON (no pickle).

Two models per layer kind (see :mod:`.features`):

* **CoINF-style** -- a shallow regression tree over structural features (sub-type, kernel, stride,
  depthwise, channels, spatial size) routes a layer to a leaf; each leaf holds a linear regression
  over sizes (MFLOPs, input/output/parameter elements). Stored as explicit arrays.
* **Neurosurgeon-style** -- one linear regression per layer type (op, or kind where the sweep has
  few samples of the op) over the same sizes.

Prediction needs only numpy, so the wearable does not need scikit-learn; training does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from coinf.device.features import FREE_OPS, LINEAR_FEATURES, TREE_FEATURES, NodeFeatures
from coinf.device.sweep import Sample

FORMAT = "coinf-predictor"
VERSION = 1
MIN_MS = 0.0


@dataclass
class Linear:
    """``ms = coef . x + intercept``; with ``log`` the same in log space (a power law):
    ``log(ms + EPS_MS) = coef . log(x + EPS_X) + intercept``."""

    coef: list[float]
    intercept: float
    log: bool = False

    def __call__(self, x: Sequence[float]) -> float:
        if self.log:
            z = float(np.dot(self.coef, np.log(np.asarray(x, dtype=np.float64) + EPS_X)))
            return float(np.exp(min(z + self.intercept, 30.0))) - EPS_MS
        return float(np.dot(self.coef, x) + self.intercept)

    def to_json(self) -> dict[str, Any]:
        return {"coef": self.coef, "intercept": self.intercept, "log": self.log}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Linear:
        coef = [float(c) for c in obj["coef"]]
        if len(coef) != len(LINEAR_FEATURES):
            raise ValueError(f"linear model has {len(coef)} coefficients, "
                             f"expected {len(LINEAR_FEATURES)}")
        if not all(np.isfinite(coef)) or not np.isfinite(float(obj["intercept"])):
            raise ValueError("linear model has a non-finite coefficient")
        return cls(coef, float(obj["intercept"]), bool(obj.get("log", False)))


EPS_X = 1e-4   # in millions: 100 elements / FLOPs
EPS_MS = 1e-4  # 0.1 us


def _fit_loglinear(x: np.ndarray, y: np.ndarray, ridge_weight: float = 1e-3) -> Linear:
    """Least squares in log space with a small ridge (sizes span four orders of magnitude, so
    an additive model would be ruled by the biggest layers): a power law
    ``ms = exp(b) * prod((x + eps)^a)``."""
    lx = np.log(x + EPS_X)
    ly = np.log(np.maximum(y, 0) + EPS_MS)
    # drop constant columns (e.g. no parameters): they would only fight the intercept
    keep = lx.std(axis=0) > 1e-9
    a = np.hstack([lx[:, keep], np.ones((len(y), 1))])
    ridge = ridge_weight * np.eye(a.shape[1])
    ridge[-1, -1] = 0.0
    sol = np.linalg.solve(a.T @ a + ridge, a.T @ ly)
    coef = np.zeros(x.shape[1])
    coef[keep] = sol[:-1]
    return Linear([float(c) for c in coef], float(sol[-1]), log=True)


@dataclass
class Tree:
    """A binary regression tree as arrays (sklearn's layout): leaf ids index ``leaves``."""

    left: list[int]
    right: list[int]
    feature: list[int]
    threshold: list[float]
    leaves: dict[int, Linear]

    def leaf(self, x: Sequence[float]) -> int:
        node = 0
        for _ in range(len(self.left) + 1):
            if self.left[node] < 0:
                return node
            node = self.left[node] if x[self.feature[node]] <= self.threshold[node] \
                else self.right[node]
        raise ValueError("predictor tree has a cycle")

    def __call__(self, x_tree: Sequence[float], x_lin: Sequence[float]) -> float:
        return self.leaves[self.leaf(x_tree)](x_lin)

    def to_json(self) -> dict[str, Any]:
        return {"left": self.left, "right": self.right, "feature": self.feature,
                "threshold": self.threshold,
                "leaves": {str(k): v.to_json() for k, v in self.leaves.items()}}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Tree:
        left = [int(v) for v in obj["left"]]
        right = [int(v) for v in obj["right"]]
        feature = [int(v) for v in obj["feature"]]
        threshold = [float(v) for v in obj["threshold"]]
        n = len(left)
        if not (len(right) == len(feature) == len(threshold) == n) or n == 0:
            raise ValueError("predictor tree arrays differ in length or are empty")
        leaves = {int(k): Linear.from_json(v) for k, v in obj["leaves"].items()}
        for i in range(n):
            if left[i] < 0:
                if i not in leaves:
                    raise ValueError(f"predictor tree leaf {i} has no linear model")
            elif not (0 < left[i] < n and 0 < right[i] < n
                      and 0 <= feature[i] < len(TREE_FEATURES)):
                raise ValueError(f"predictor tree node {i} points outside the tree")
        return cls(left, right, feature, threshold, leaves)


@dataclass
class KindModel:
    """Both predictors for one layer kind, with their held-out R²."""

    coinf: Tree
    neurosurgeon: Linear
    r2: dict[str, float] = field(default_factory=dict)
    n_train: int = 0
    n_test: int = 0
    #: Neurosurgeon fits one regression per layer type: per op where the sweep has enough
    #: samples of it, else the kind-wide ``neurosurgeon`` model
    neurosurgeon_ops: dict[str, Linear] = field(default_factory=dict)

    def ns(self, op: str) -> Linear:
        return self.neurosurgeon_ops.get(op, self.neurosurgeon)


MIN_OP_SAMPLES = 6


def _fit_ns(ops: Sequence[str], xl: np.ndarray,
            y: np.ndarray) -> tuple[Linear, dict[str, Linear]]:
    per_op = {}
    arr = np.asarray(ops)
    for op in sorted(set(ops)):
        mask = arr == op
        if mask.sum() >= MIN_OP_SAMPLES:
            per_op[op] = _fit_linear(xl[mask], y[mask])
    return _fit_linear(xl, y), per_op


def _r2(y: np.ndarray, p: np.ndarray) -> float:
    ss = float(np.sum((y - y.mean()) ** 2))
    return float("nan") if ss == 0 else 1.0 - float(np.sum((y - p) ** 2)) / ss


def require_training_deps() -> None:
    """Training needs scipy and scikit-learn (``coinf[train]``); predicting needs neither.
    Callers that sweep first check this before the sweep, not after it."""
    from coinf.deps import require

    require("scipy", "train", "training latency predictors")
    require("sklearn", "train", "training latency predictors")


def _fit_linear(x: np.ndarray, y: np.ndarray) -> Linear:
    """Least squares with non-negative coefficients and intercept (time grows with size), so the
    model cannot extrapolate to negative or wildly cancelling predictions."""
    from scipy.optimize import nnls

    if len(y) == 0:
        return Linear([0.0] * len(LINEAR_FEATURES), 0.0)
    if len(y) < 3:
        return Linear([0.0] * len(LINEAR_FEATURES), float(np.mean(y)))
    scale = np.maximum(np.abs(x).max(axis=0), 1e-12)
    a = np.hstack([x / scale, np.ones((len(y), 1))])
    sol, _ = nnls(a, y)
    return Linear([float(c) for c in sol[:-1] / scale], float(sol[-1]))


def _fit_tree(xt: np.ndarray, xl: np.ndarray, y: np.ndarray, depth: int) -> Tree:
    from sklearn.tree import DecisionTreeRegressor

    # route by log time per MFLOP (efficiency), so leaves group sub-types that run alike
    eff = np.log((y + EPS_MS) / (xl[:, 0] + EPS_X))
    leaf_min = max(4, len(y) // 8)
    t = DecisionTreeRegressor(max_depth=depth, min_samples_leaf=leaf_min, random_state=0)
    t.fit(xt, eff)
    tr = t.tree_
    ids = t.apply(xt)
    fallback = _fit_loglinear(xl, y)
    leaves = {}
    for leaf in np.unique(np.where(tr.children_left < 0)[0]):
        mask = ids == leaf
        n = int(mask.sum())
        if n >= 3 * len(LINEAR_FEATURES):
            leaves[int(leaf)] = _fit_loglinear(xl[mask], y[mask])
        elif n >= 3:  # too few for every size: a power law of MFLOPs only
            one = _fit_loglinear(xl[mask][:, :1], y[mask])
            leaves[int(leaf)] = Linear(one.coef + [0.0] * (len(LINEAR_FEATURES) - 1),
                                       one.intercept, log=True)
        else:
            leaves[int(leaf)] = fallback
    return Tree([int(v) for v in tr.children_left], [int(v) for v in tr.children_right],
                [max(int(v), 0) for v in tr.feature], [float(v) for v in tr.threshold], leaves)


@dataclass
class Predictor:
    """Per-kind latency predictors for one device (ms per node)."""

    kinds: dict[str, KindModel]
    device: str = ""
    threads: int = 1
    run_overhead_ms: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    # -- training ---------------------------------------------------------------------------
    @classmethod
    def train(cls, samples: Sequence[Sample], *, test_fraction: float = 0.25, seed: int = 0,
              depth: int = 3, device: str = "", threads: int = 1,
              run_overhead_ms: float = 0.0) -> Predictor:
        """Fit both models per kind on a random (1 - test_fraction) of the configurations and
        report R² on the held-out rest; then refit on everything."""
        rng = np.random.default_rng(seed)
        kinds: dict[str, KindModel] = {}
        for kind in sorted({s.features.kind for s in samples}):
            ks = [s for s in samples if s.features.kind == kind]
            xt = np.array([s.features.tree for s in ks], dtype=np.float64)
            xl = np.array([s.features.linear for s in ks], dtype=np.float64)
            y = np.array([s.ms for s in ks], dtype=np.float64)
            ops = [s.features.op_type for s in ks]
            order = rng.permutation(len(ks))
            n_test = max(1, round(len(ks) * test_fraction)) if len(ks) >= 8 else 0
            test, train = order[:n_test], order[n_test:]
            r2: dict[str, float] = {}
            if n_test:
                tree = _fit_tree(xt[train], xl[train], y[train], depth)
                lin, per_op = _fit_ns([ops[i] for i in train], xl[train], y[train])
                r2["coinf"] = _r2(y[test], np.array([max(tree(a, b), MIN_MS) for a, b in
                                                     zip(xt[test], xl[test], strict=True)]))
                r2["neurosurgeon"] = _r2(y[test], np.array(
                    [max(per_op.get(ops[i], lin)(xl[i]), MIN_MS) for i in test]))
            lin, per_op = _fit_ns(ops, xl, y)
            kinds[kind] = KindModel(_fit_tree(xt, xl, y, depth), lin, r2, len(train), n_test,
                                    per_op)
        return cls(kinds, device, threads, run_overhead_ms)

    # -- prediction -------------------------------------------------------------------------
    def predict(self, f: NodeFeatures, style: str = "coinf") -> float:
        """Predicted latency (ms) of one node as it runs in a fully optimised session: nodes
        onnxruntime fuses into the Conv before them cost 0; ops with no model of their own fall
        back to the element-wise model."""
        if f.op_type in FREE_OPS or f.fused:
            return 0.0
        km = self.kinds.get(f.kind) or self.kinds.get("eltwise")
        if km is None:
            return 0.0
        if style == "coinf":
            return max(km.coinf(f.tree, f.linear), MIN_MS)
        if style == "neurosurgeon":
            return max(km.ns(f.op_type)(f.linear), MIN_MS)
        raise ValueError(f"unknown predictor style {style!r}; expected coinf or neurosurgeon")

    def predict_nodes(self, feats: Sequence[NodeFeatures],
                      style: str = "coinf") -> dict[str, float]:
        return {f.name: self.predict(f, style) for f in feats}

    def r2_table(self) -> dict[str, dict[str, Any]]:
        return {k: {**m.r2, "n_train": m.n_train, "n_test": m.n_test}
                for k, m in self.kinds.items()}

    # -- JSON -------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "device": self.device,
                "threads": self.threads, "run_overhead_ms": self.run_overhead_ms,
                "tree_features": list(TREE_FEATURES), "linear_features": list(LINEAR_FEATURES),
                "kinds": {k: {"coinf": m.coinf.to_json(),
                              "neurosurgeon": m.neurosurgeon.to_json(),
                              "neurosurgeon_ops": {o: v.to_json()
                                                   for o, v in m.neurosurgeon_ops.items()},
                              "r2": m.r2,
                              "n_train": m.n_train, "n_test": m.n_test}
                          for k, m in self.kinds.items()},
                **self.meta}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Predictor:
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise ValueError("not a coinf predictor (format must be 'coinf-predictor')")
        if obj.get("version") != VERSION:
            raise ValueError(f"predictor version {obj.get('version')}; this coinf reads {VERSION}")
        if list(obj.get("tree_features", [])) != list(TREE_FEATURES) or \
                list(obj.get("linear_features", [])) != list(LINEAR_FEATURES):
            raise ValueError("predictor was trained on different features; retrain it")
        kinds = {}
        for k, m in obj["kinds"].items():
            kinds[str(k)] = KindModel(Tree.from_json(m["coinf"]),
                                      Linear.from_json(m["neurosurgeon"]),
                                      {a: float(b) for a, b in m.get("r2", {}).items()},
                                      int(m.get("n_train", 0)), int(m.get("n_test", 0)),
                                      {str(o): Linear.from_json(v) for o, v in
                                       m.get("neurosurgeon_ops", {}).items()})
        known = {"format", "version", "device", "threads", "run_overhead_ms", "tree_features",
                 "linear_features", "kinds"}
        return cls(kinds, str(obj.get("device", "")), int(obj.get("threads", 1)),
                   float(obj.get("run_overhead_ms", 0.0)),
                   {k: v for k, v in obj.items() if k not in known})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Predictor:
        return cls.from_json(json.loads(Path(path).read_text()))
