"""Calibrating the ``ansN`` packing's priors (ble_protocol/priors.py) and storing them.

During a candidate's reference pass (:mod:`convert.packcal`) every float crossing tensor of
every input is quantized at each calibrated ``N`` exactly as ``qN`` packs it (this input's
min/max), and its levels are counted per channel. Two tables are fitted per tensor and width on
alternate inputs (even, odd) and one on all of them. A row's bytes and times are measured
**cross-fitted**: input ``i`` is packed with the table fitted on the other half, so
``mean_bytes`` is what unseen inputs cost, not the calibration set's own entropy (with a
single input, the table fitted on it). The row names, per tensor, the key of the table fitted on
all inputs (``row["priors"]``), which :func:`store` writes into the bundle. Both a plain and a
centred table (ble_protocol/priors.py) are counted; each tensor and width keeps the one whose
cross-fitted code length (one fold's counts under the other fold's table) is smaller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
from coinf.ble_protocol import packing, priors
from coinf.ble_protocol.packing import PackSpec

from coinf import bundle as bundle_mod
from coinf.bundle import ENTROPY_PRIORS, Bundle, Candidate
from coinf.errors import BundleError

FOLDS = 2
#: pseudo-counts of the tensor-wide pmf added to each channel, per symbol of the alphabet
POOLED_WEIGHT = 1.0


def ans_bits(specs: Iterable[str]) -> list[int]:
    """The widths of the ``ansN`` specs in ``specs``."""
    out = {PackSpec.parse(s).bits for s in specs if PackSpec.parse(s).codec == "ans"}
    return sorted(b for b in out if b is not None)


class PriorFit:
    """Per-channel level counts of a candidate's float crossing tensors, per width and fold."""

    def __init__(self, cand: Candidate, bits: Iterable[int]) -> None:
        self.cid = cand.id
        self.bits = list(bits)
        self.shapes = {t.name: tuple(t.shape) for t in cand.crossing
                       if np.dtype(t.dtype).kind == "f" and int(np.prod(t.shape)) > 0}
        self.counts: dict[tuple[str, int, bool], np.ndarray] = {}  # -> (folds, C, X, K)
        self.inputs = 0
        self.tables: dict[tuple[str, int], list[priors.TensorPriors]] = {}

    def add(self, i: int, crossing: Mapping[str, np.ndarray]) -> None:
        """Count the levels of input ``i``'s crossing tensors in their contexts (NaN/inf or
        constant: skipped, as ``qN`` would not quantize them)."""
        self.inputs = max(self.inputs, i + 1)
        for name, shape in self.shapes.items():
            a = crossing.get(name)
            if a is None or a.dtype.kind != "f" or tuple(a.shape) != shape:
                continue
            flat = np.ascontiguousarray(a.reshape(-1))
            lo, hi = float(flat.min()), float(flat.max())
            if not (np.isfinite(lo) and np.isfinite(hi) and hi > lo):
                continue
            axis = priors.channel_axis(shape)
            width = priors.width_of(shape, axis)
            for b in self.bits:
                q = packing._quantize(flat, b, lo, hi - lo)  # the very levels qN sends
                ch = priors.to_channels(q, shape, axis).astype(np.int64)
                zero = priors.zero_level((hi - lo) / ((1 << b) - 1), lo, b)
                for centered, sym in ((False, ch), (True, priors.fold(ch - zero))):
                    wide = b + centered
                    got = priors.count_levels(sym, wide, priors.contexts_for(shape, axis, wide),
                                              width)
                    acc = self.counts.setdefault((name, b, centered),
                                                 np.zeros((FOLDS, *got.shape), np.int64))
                    acc[i % FOLDS] += got

    def fit(self) -> None:
        """Fit the fold tables and the all-input table of every (tensor, width) counted."""
        best: dict[tuple[str, int], tuple[float, list[priors.TensorPriors]]] = {}
        for (name, b, centered), acc in self.counts.items():
            every = self._table(name, b, centered, acc.sum(axis=0))
            crossed = acc[0].any() and acc[1].any() and self.inputs >= FOLDS
            folds = [self._table(name, b, centered, acc[f]) if crossed else every
                     for f in range(FOLDS)]
            cost = sum(_bits(folds[f], acc[1 - f]) for f in range(FOLDS)) if crossed \
                else _bits(every, acc.sum(axis=0))
            if (name, b) not in best or cost < best[(name, b)][0]:
                best[(name, b)] = (cost, [*folds, every])
        self.tables = {k: v for k, (_, v) in best.items()}
        self.counts.clear()

    def _table(self, name: str, bits: int, centered: bool,
               counts: np.ndarray) -> priors.TensorPriors:
        axis = priors.channel_axis(self.shapes[name])
        return priors.TensorPriors.from_counts(counts, self.cid, name, bits, axis, POOLED_WEIGHT,
                                               centered)

    @property
    def book(self) -> dict[str, priors.TensorPriors]:
        """Every table fitted here, by key (``packing.unpack(..., book=...)``)."""
        return {tp.key: tp for tables in self.tables.values() for tp in tables}

    def specs_for(self, specs: Mapping[str, PackSpec], i: int) -> dict[str, PackSpec]:
        """``specs`` for input ``i``: each ``ansN`` spec with the table fitted on the other
        inputs (cross-fitting)."""
        out = dict(specs)
        for name, spec in specs.items():
            got = self.tables.get((name, spec.bits or 0)) if spec.codec == "ans" else None
            if got is not None:
                out[name] = replace(spec, priors=got[(i + 1) % FOLDS])
        return out

    def row_priors(self, specs: Mapping[str, PackSpec]) -> dict[str, str]:
        """tensor -> key of the all-input table, for the row's ``ansN`` tensors (registered in
        this process so :func:`store` finds them)."""
        out = {}
        for name, spec in specs.items():
            got = self.tables.get((name, spec.bits or 0)) if spec.codec == "ans" else None
            if got is not None:
                priors.register(got[-1])
                out[name] = got[-1].key
        return out


def missing_priors(cand: Candidate, packing: str) -> str | None:
    """Why ``cand``'s ``packing`` (an ``ansN``) row cannot be encoded here: it names no table,
    or one no loaded bundle has; None when every table is found."""
    rows = cand.extra.get("packing")
    row = next((r for r in rows if isinstance(r, dict) and r.get("spec") == packing), {}) \
        if isinstance(rows, list) else {}
    named = row.get("priors")
    if not isinstance(named, dict) or not named:
        return "its calibration row names none"
    lost = sorted(str(k) for k in named.values() if not priors.has(str(k)))
    return f"not in any loaded bundle: {', '.join(lost)}" if lost else None


def _bits(tp: priors.TensorPriors, counts: np.ndarray) -> float:
    """Code length of symbol ``counts`` (C, X, K) under a table (no escapes, no lane states)."""
    cp = tp.priors
    f = cp.freqs[:, :, :-1].astype(np.float64)
    return float(np.sum(counts * (cp.precision - np.log2(f))))


def keys_of(bundle: Bundle) -> set[str]:
    """The table keys the calibration rows of every candidate name."""
    keys: set[str] = set()
    for cand in bundle.candidates:
        rows = cand.extra.get("packing")
        for row in rows if isinstance(rows, list) else []:
            named = row.get("priors") if isinstance(row, dict) else None
            if isinstance(named, dict):
                keys.update(str(v) for v in named.values())
    return keys


def store(bundle: Bundle) -> dict[str, Any] | None:
    """Write the tables the rows name (fitted in this process, or already in the bundle's
    files) as ``priors.json`` + ``priors.bin`` and record them in the manifest; the manifest
    entry, or None when no row names one (the files are then left alone)."""
    keys = keys_of(bundle)
    if not keys:
        bundle.meta.pop(ENTROPY_PRIORS, None)
        return None
    old = {tp.key: tp for tp in priors.read_tables(bundle.root)} if (
        bundle.root / priors.INDEX).is_file() else {}
    tables = []
    for key in sorted(keys):
        tp = old.get(key) or priors.lookup(key)
        if tp is None:
            raise BundleError(f"calibration rows name entropy priors {key}, which neither this "
                              f"run nor {bundle.root / priors.INDEX} has")
        tables.append(tp)
    entry = priors.write(bundle.root, tables)
    bundle.meta[ENTROPY_PRIORS] = entry
    if bundle.root.resolve() not in bundle_mod.PRIOR_ROOTS:
        bundle_mod.PRIOR_ROOTS.append(bundle.root.resolve())
    return entry
