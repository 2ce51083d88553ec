"""Deterministic sample inputs for a model's input specs (demo, run, benches)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import onnx

from coinf.bundle import Bundle, TensorSpec
from coinf.errors import InputError


def int_highs(model_path: str | Path) -> dict[str, int]:
    """Upper bounds of integer inputs (token ids) recorded in the model's metadata, if any.

    Zoo models store them as ``coinf.zoo.input_high`` (JSON ``{input: high}``).
    """
    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception:
        return {}
    for prop in model.metadata_props:
        if prop.key == "coinf.zoo.input_high":
            try:
                return {str(k): int(v) for k, v in json.loads(prop.value).items()}
            except (ValueError, AttributeError):
                return {}
    return {}


def random_feeds(
    specs: Iterable[TensorSpec],
    seed: int = 0,
    int_high: int | Mapping[str, int] = 10,
) -> dict[str, np.ndarray]:
    """Floats ~ N(0, 1); integers uniform in [0, high) (safe token ids); bools random.

    ``int_high`` is one bound for every integer input or a per-input mapping (default 10).
    """
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        dtype = np.dtype(spec.dtype)
        if dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(spec.shape).astype(dtype)
        elif dtype.kind in "iu":
            high = int_high.get(spec.name, 10) if isinstance(int_high, Mapping) else int_high
            feeds[spec.name] = rng.integers(0, high, spec.shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[spec.name] = rng.integers(0, 2, spec.shape).astype(bool)
        else:
            raise InputError(f"cannot make a sample for input {spec.name!r} of dtype {dtype}")
    return feeds


def load_feeds(pairs: Iterable[str], specs: Iterable[TensorSpec]) -> dict[str, np.ndarray]:
    """Parse ``NAME=file.npy`` pairs (from the CLI) into feeds, checked against ``specs``
    (name, shape, dtype) so a wrong file is a one-line :class:`InputError`, not a runtime error."""
    by_name = {s.name: s for s in specs}
    names = set(by_name)
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
            value = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise InputError(f"--input {name}: {path} is not a .npy array ({exc})") from None
        if not isinstance(value, np.ndarray):
            raise InputError(f"--input {name}: {path} holds several arrays (.npz); give one .npy")
        spec = by_name[name]
        want = np.dtype(spec.dtype)
        if tuple(value.shape) != tuple(spec.shape):
            raise InputError(f"--input {name}: {path} has shape {list(value.shape)}; the model "
                             f"expects {list(spec.shape)} ({want.name})")
        if value.dtype != want:
            if not np.can_cast(value.dtype, want, casting="same_kind"):
                raise InputError(f"--input {name}: {path} holds {value.dtype.name}; the model "
                                 f"expects {want.name}")
            value = value.astype(want)
        feeds[name] = value
    return feeds


def bundle_feeds(bundle: Bundle, seed: int = 0) -> dict[str, np.ndarray]:
    """Random feeds valid for ``bundle``'s model (token ids within the recorded vocabulary)."""
    return random_feeds(bundle.inputs, seed, int_highs(bundle.model_path))
