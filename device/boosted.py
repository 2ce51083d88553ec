"""Gradient-boosted regression trees that predict a kernel's time from its features, stored as
plain arrays (JSON) and evaluated with numpy, so a wearable needs no scikit-learn to predict.

Training (``coinf.research.slicetrain.fit_boosted``) uses scikit-learn's
``GradientBoostingRegressor`` (squared error in log space: the target is ``log(ms)``, so every
size range counts alike) and copies each tree's arrays out of it. A kernel's time is not a
power law of its size: onnxruntime's NCHWc convolutions run two to ten times faster per FLOP on
some channel counts and map sizes than on others; trees split on those features instead of
averaging over them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

FORMAT = "coinf-boosted-trees"


@dataclass(frozen=True)
class Tree:
    """One regression tree in scikit-learn's array layout (a leaf has ``left < 0``)."""

    left: np.ndarray
    right: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    value: np.ndarray

    def predict(self, x: np.ndarray) -> np.ndarray:
        node = np.zeros(len(x), dtype=np.int64)
        for _ in range(64):  # depth bound: trees here are a few levels deep
            inner = self.left[node] >= 0
            if not inner.any():
                break
            f = self.feature[node[inner]]
            go_left = x[np.nonzero(inner)[0], f] <= self.threshold[node[inner]]
            node[inner] = np.where(go_left, self.left[node[inner]], self.right[node[inner]])
        return self.value[node]

    def to_json(self) -> list[list[float]]:
        return [self.left.tolist(), self.right.tolist(), self.feature.tolist(),
                self.threshold.tolist(), self.value.tolist()]

    @classmethod
    def from_json(cls, obj: Any, features: int) -> Tree:
        if not isinstance(obj, list) or len(obj) != 5:
            raise ValueError("boosted tree: expected [left, right, feature, threshold, value]")
        left, right, feat = (np.asarray(obj[i], dtype=np.int64) for i in range(3))
        thr, val = (np.asarray(obj[i], dtype=np.float64) for i in (3, 4))
        n = len(left)
        if n == 0 or any(len(a) != n for a in (right, feat, thr, val)):
            raise ValueError("boosted tree: arrays of different lengths")
        inner = left >= 0
        if ((left[inner] >= n) | (right[inner] < 0) | (right[inner] >= n)).any() or \
                ((feat[inner] < 0) | (feat[inner] >= features)).any():
            raise ValueError("boosted tree: a child or feature index is out of range")
        # children always come after their parent in scikit-learn's layout: no cycles
        idx = np.arange(n)
        if (left[inner] <= idx[inner]).any() or (right[inner] <= idx[inner]).any():
            raise ValueError("boosted tree: a child precedes its parent")
        if not (np.isfinite(thr).all() and np.isfinite(val).all()):
            raise ValueError("boosted tree: a non-finite threshold or value")
        return cls(left, right, feat, thr, val)


@dataclass(frozen=True)
class Boosted:
    """``log(ms) = base + rate * sum(tree(x))`` over ``features`` inputs."""

    base: float
    rate: float
    trees: tuple[Tree, ...]
    features: int

    def __call__(self, x: Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
        """Predicted ``log(ms)`` per row."""
        a = np.asarray(x, dtype=np.float64)
        if a.ndim != 2 or a.shape[1] != self.features:
            raise ValueError(f"boosted trees take {self.features} features per row")
        total = np.full(len(a), self.base)
        for t in self.trees:
            total += self.rate * t.predict(a)
        return total

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "base": self.base, "rate": self.rate,
                "features": self.features, "trees": [t.to_json() for t in self.trees]}

    @classmethod
    def from_json(cls, obj: Any) -> Boosted:
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise ValueError(f"not boosted trees (format must be {FORMAT!r})")
        base, rate, features = float(obj["base"]), float(obj["rate"]), int(obj["features"])
        if not (math.isfinite(base) and math.isfinite(rate)) or not 0 < features <= 64:
            raise ValueError("boosted trees: bad base, rate or feature count")
        trees = obj.get("trees")
        if not isinstance(trees, list) or len(trees) > 5000:
            raise ValueError("boosted trees: 'trees' must be a list of at most 5000 trees")
        return cls(base, rate, tuple(Tree.from_json(t, features) for t in trees), features)


__all__ = ["Boosted", "Tree"]
