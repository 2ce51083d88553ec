"""Calibration and representative data: complete feeds, each input in exactly its model shape.

An ``.npz`` holds N feeds. Each array is one model input (by name; any key when the model has
one input and the file one array) stacked one of two ways:

* on a new leading axis: shape ``(N, *input_shape)`` (a scalar input is ``(N,)``);
* along an axis of size 1 of the input (a batch axis): the input's shape with that axis = N.

An array exactly of the input's shape is one feed; with other inputs holding N feeds it is the
same value in every feed (a sample rate, a fixed mask). A recurrent state input (the bundle's
state pairs) may be left out: it starts at zeros. Arrays that are not model inputs are
ignored, or name the labels (``labels_key``, default ``"labels"``). Frozen inputs
(``coinf split --freeze``) are not model inputs any more: arrays for them are ignored too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from coinf.convert.state import pairs_of

from coinf.bundle import Bundle, TensorSpec
from coinf.errors import InputError

LABELS = "labels"


@dataclass
class Dataset:
    """N complete feeds: ``inputs[name]`` is ``(N, *input_shape)``; optional integer labels."""

    name: str
    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None = None

    def __len__(self) -> int:
        return len(next(iter(self.inputs.values())))

    def feed(self, i: int) -> dict[str, np.ndarray]:
        """Feed ``i``: every input in exactly its model shape and dtype."""
        return {k: np.asarray(v[i]) for k, v in self.inputs.items()}  # 0-d stays an array


def stack(name: str, arr: np.ndarray, spec: TensorSpec, source: str) -> np.ndarray | None:
    """``arr`` as ``(N, *spec.shape)``; ``None`` when it is exactly one feed (``spec.shape``)."""
    arr = np.asarray(arr)
    shape = tuple(spec.shape)
    if arr.dtype.kind not in "fiub":
        raise InputError(f"{source}: array {name!r} has dtype {arr.dtype}; expected numbers")
    if arr.shape == shape:
        return None
    if arr.ndim == len(shape) + 1 and arr.shape[1:] == shape:
        out = arr
    else:
        out = None
        if arr.ndim == len(shape):  # along a batch axis of size 1
            diff = [a for a in range(len(shape)) if arr.shape[a] != shape[a]]
            if len(diff) == 1 and shape[diff[0]] == 1:
                out = np.moveaxis(arr, diff[0], 0)
                out = out.reshape((out.shape[0], *shape))
        if out is None:
            want = "(N,)" if not shape else f"(N, {', '.join(map(str, shape))})"
            ones = [a for a, d in enumerate(shape) if d == 1]
            alt = (f", or N along axis {ones[0]} of size 1" if ones else "")
            raise InputError(f"{source}: array {name!r} has shape {list(arr.shape)}; model input"
                             f" {name!r} is {spec.dtype}{list(shape)}: expected {want}{alt}, "
                             f"or exactly {list(shape)} for one feed")
    return out


def fit_feeds(arrays: Mapping[str, np.ndarray], specs: Sequence[TensorSpec], source: str
              ) -> dict[str, np.ndarray]:
    """Every input as ``(N, *shape)`` of its model dtype; one-feed arrays repeated N times."""
    stacked = {s.name: stack(s.name, arrays[s.name], s, source) for s in specs}
    counts = {len(v) for v in stacked.values() if v is not None}
    if len(counts) > 1:
        sizes = {k: len(v) for k, v in stacked.items() if v is not None}
        raise InputError(f"{source}: inputs hold different numbers of feeds {sizes}")
    n = counts.pop() if counts else 1
    if n == 0:
        raise InputError(f"{source}: no feeds (N = 0)")
    out: dict[str, np.ndarray] = {}
    for s in specs:
        v = stacked[s.name]
        if v is None:
            one = np.asarray(arrays[s.name])
            v = np.broadcast_to(one, (n, *one.shape))
        out[s.name] = np.ascontiguousarray(v.astype(s.dtype, copy=False))
    return out


def read_npz(path: str | Path, flag: str = "--data") -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` (never unpickled); :class:`InputError` when unreadable."""
    p = Path(path)
    if p.suffix != ".npz" or not p.is_file():
        raise InputError(f"{flag} {str(path)!r}: expected an existing .npz file")
    try:
        with np.load(p, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError) as exc:
        raise InputError(f"{flag} {path}: cannot read the .npz: {exc}") from None


def dataset_from_arrays(arrays: Mapping[str, np.ndarray], specs: Sequence[TensorSpec],
                        name: str, labels_key: str | None = None,
                        limit: int | None = None, zeros: Sequence[str] = ()) -> Dataset:
    """A :class:`Dataset` from named arrays (see the module docstring for the layouts).

    Inputs named in ``zeros`` (recurrent state) may be missing: they are zeros then."""
    arrays = dict(arrays)
    absent = [s for s in specs if s.name in zeros and s.name not in arrays]
    if absent and len(absent) < len(specs):
        data = dataset_from_arrays(arrays, [s for s in specs if s not in absent], name,
                                   labels_key, limit)
        n = len(data)
        for s in absent:
            data.inputs[s.name] = np.zeros((n, *s.shape), dtype=s.dtype)
        data.inputs = {s.name: data.inputs[s.name] for s in specs}
        return data
    key = labels_key or LABELS
    if labels_key is not None and labels_key not in arrays:
        raise InputError(f"{name}: --labels {labels_key!r}: no such array; it has "
                         f"{sorted(arrays)}")
    labels = arrays.pop(key, None)
    if len(specs) == 1 and len(arrays) == 1 and specs[0].name not in arrays:
        arrays = {specs[0].name: next(iter(arrays.values()))}
    missing = [s.name for s in specs if s.name not in arrays]
    if missing:
        raise InputError(f"{name}: no array for model input(s) {missing}; it has "
                         f"{sorted(arrays)} (model inputs: "
                         f"{', '.join(f'{s.name} {s.dtype}{list(s.shape)}' for s in specs)})")
    inputs = fit_feeds(arrays, specs, name)
    n = len(next(iter(inputs.values())))
    if labels is not None:
        labels = np.asarray(labels)
        boxes = labels.ndim == 3 and labels.shape[0] == n and labels.shape[2] == 4
        if (labels.ndim != 2 and not boxes) or len(labels) != n:
            labels = labels.reshape(-1)
        ok = labels.dtype.kind in "iu" or (labels.dtype.kind == "f" and labels.ndim in (1, 3)
                                            and bool(np.isfinite(labels).all()))
        if len(labels) != n or not ok:
            raise InputError(f"{name}: labels {key!r} must be {n} integers (one per feed), "
                             f"{n} rows of integers (a sequence per feed, padded with -1), "
                             f"{n} finite numbers (a pitch in Hz per feed) or {n} x L x 4 "
                             f"finite numbers (line boxes per feed), got shape "
                             f"{list(np.shape(labels))} {labels.dtype}")
    if limit is not None and limit < n:
        inputs = {k: v[:limit] for k, v in inputs.items()}
        labels = labels[:limit] if labels is not None else None
    return Dataset(name, inputs, labels)


def load_dataset(source: str, bundle: Bundle, limit: int | None = None,
                 labels_key: str | None = None) -> Dataset:
    """``digits`` (the zoo's validation split) or an ``.npz`` of feeds (module docstring)."""
    specs = bundle.inputs
    if source == "digits":
        try:
            from coinf.models.digits import digits_data
        except ImportError:
            raise InputError(
                "--data digits needs the model zoo (models/digits.py); pass an .npz instead"
            ) from None
        if len(specs) != 1:
            raise InputError(f"--data digits feeds one input; the model has {len(specs)}")
        split = digits_data()
        x = np.asarray(split.x_val)
        spec = specs[0]
        if x.shape[1:] != spec.shape and x[0].size == int(np.prod(spec.shape)):
            x = x.reshape((len(x), *spec.shape))  # (N, 1, 8, 8) samples of a (1, 1, 8, 8) input
        return dataset_from_arrays({spec.name: x, LABELS: split.y_val}, specs, "digits",
                                   None, limit)
    arrays = read_npz(source)
    states = [a for a, _ in pairs_of(bundle.meta)]  # a stream starts from a zero state
    return dataset_from_arrays(arrays, specs, Path(source).name, labels_key, limit, states)
