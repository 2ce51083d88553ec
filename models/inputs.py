"""What a zoo model's graph inputs are (name, shape, dtype, id range) and how to sample a feed.

Needs numpy only: the registry (:mod:`models.zoo`) and the torch exporter (:mod:`models.export`)
both describe inputs with it, so the exporter does not have to import the registry.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class InputSpec:
    """One graph input. Integer inputs (token ids) are drawn from ``[0, high)``."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    high: int | None = None

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """A random feed valid for this input (standard normal floats, ids below ``high``)."""
        if self.dtype == "int64":
            assert self.high is not None
            return rng.integers(0, self.high, size=self.shape, dtype=np.int64)
        return rng.standard_normal(self.shape).astype(self.dtype)

    def describe(self) -> str:
        dims = "x".join(str(d) for d in self.shape)
        return f"{self.name}:{dims}" + ("" if self.dtype == "float32" else f":{self.dtype}")
