"""Deterministic sample inputs for a model's input specs (demo, run, benches)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from coinf.errors import InputError
from convert.bundle import TensorSpec


def random_feeds(
    specs: Iterable[TensorSpec], seed: int = 0, int_high: int = 10
) -> dict[str, np.ndarray]:
    """Floats ~ N(0, 1); integers uniform in [0, int_high) (safe token ids); bools random."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        dtype = np.dtype(spec.dtype)
        if dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(spec.shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[spec.name] = rng.integers(0, int_high, spec.shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[spec.name] = rng.integers(0, 2, spec.shape).astype(bool)
        else:
            raise InputError(f"cannot make a sample for input {spec.name!r} of dtype {dtype}")
    return feeds


def load_feeds(pairs: Iterable[str], specs: Iterable[TensorSpec]) -> dict[str, np.ndarray]:
    """Parse ``NAME=file.npy`` pairs (from the CLI) into feeds."""
    names = {s.name for s in specs}
    feeds: dict[str, np.ndarray] = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not path:
            raise InputError(f"--input {pair!r}: expected NAME=path.npy")
        if name not in names:
            raise InputError(f"--input {name!r}: the model's inputs are {sorted(names)}")
        if not Path(path).is_file():
            raise InputError(f"--input {name}: no such file {path}")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except ValueError as exc:
            raise InputError(f"--input {name}: {path} is not a .npy array ({exc})") from None
    return feeds
