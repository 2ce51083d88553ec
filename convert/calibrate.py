"""Offline packing calibration: accuracy drop and packed size per (candidate, packing).

For every candidate cut and every packing (default q2..q8, q10, q12, q16, f16, plus lossless f32
for the size, and qz2..qz6, qz8 when zstandard is installed), the head runs on each validation
input, every crossing tensor is packed and unpacked with :mod:`ble_protocol.packing`, and the
tail runs on what came out. The result, per
candidate, is stored in the bundle manifest under ``Candidate.extra["packing"]``::

    {"spec": "q4", "codec": "q", "bits": 4, "mean_bytes": 812.4, "ratio": 23.1,
     "accuracy_drop_pp": 0.28, "top1_agreement": 0.994, "rel_l2": 0.031}

``accuracy_drop_pp`` is, with labels, top-1 accuracy of the unpacked run minus that of the packed
run, in percentage points (it can be slightly negative by chance). Without labels it is the top-1
*disagreement* with the unpacked run in pp, which bounds the accuracy change from above. ``ratio``
is the float bytes of the crossing tensors over ``mean_bytes`` (packed bodies, headers included).

The planner reads the table with :func:`expected_packed_bytes` and :func:`accuracy_drop`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from coinf.ble_protocol import packing
from coinf.ble_protocol.packing import PackSpec
from coinf.convert.bundle import Bundle, Candidate

from coinf.errors import BundleError, InputError, UserError

#: quantized levels + zstd (ble_protocol/codecs.py), calibrated when zstandard is installed
ZSTD_SPECS: tuple[str, ...] = ("qz2", "qz3", "qz4", "qz5", "qz6", "qz8")
DEFAULT_SPECS: tuple[str, ...] = (
    "q2", "q3", "q4", "q5", "q6", "q7", "q8", "q10", "q12", "q16", "f16", "f32",
) + (ZSTD_SPECS if packing.codecs.AVAILABLE else ())
DEFAULT_TOLERANCE_PP = 1.0
#: one-sided confidence of the reported upper bound on the accuracy drop
CONFIDENCE = 0.95
EXTRA_KEY = "packing"
META_KEY = "packing_calibration"


@dataclass
class Dataset:
    """Validation inputs (first axis = samples, one array per model input) and optional labels."""

    name: str
    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None = None

    def __len__(self) -> int:
        return len(next(iter(self.inputs.values())))

    def feed(self, i: int) -> dict[str, np.ndarray]:
        return {k: v[i : i + 1] for k, v in self.inputs.items()}


def _fit(name: str, arr: np.ndarray, shape: tuple[int, ...], dtype: str, source: str) -> np.ndarray:
    """Shape ``arr`` as (N, *shape[1:]) samples of a batch-1 model input."""
    arr = np.asarray(arr)
    if len(shape) >= 1 and shape[0] == 1 and arr.shape[1:] == shape[1:]:
        out = arr
    elif arr.shape[1:] == shape:  # (N, 1, ...) given for a batch-1 input
        out = arr.reshape((arr.shape[0], *shape[1:])) if shape and shape[0] == 1 else arr
    else:
        want = ", ".join(map(str, shape[1:]))
        raise InputError(f"{source}: input {name!r} has shape {arr.shape}; expected (N, {want})"
                         f" for model input shape {shape}")
    if arr.dtype.kind not in "fiub":
        raise InputError(f"{source}: input {name!r} has dtype {arr.dtype}; expected numbers")
    return np.ascontiguousarray(out.astype(dtype, copy=False))


def load_dataset(source: str, bundle: Bundle, limit: int | None = None) -> Dataset:
    """``digits`` (the zoo's validation split) or an ``.npz`` with one array per model input
    (any key when the model has one input) and optional ``labels``."""
    specs = bundle.inputs
    labels: np.ndarray | None
    if source == "digits":
        try:
            from coinf.models.digits import digits_data
        except ImportError:
            raise InputError(
                "--data digits needs the model zoo (models/digits.py); pass an .npz instead"
            ) from None
        split = digits_data()
        if len(specs) != 1:
            raise InputError(f"--data digits feeds one input; the model has {len(specs)}")
        raw = {specs[0].name: split.x_val}
        labels = split.y_val
    else:
        path = Path(source)
        if path.suffix != ".npz" or not path.is_file():
            raise InputError(f"--data {source!r}: expected 'digits' or an existing .npz file")
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError) as exc:
            raise InputError(f"--data {source}: cannot read the .npz: {exc}") from None
        labels = arrays.pop("labels", None)
        if len(specs) == 1 and len(arrays) == 1:
            raw = {specs[0].name: next(iter(arrays.values()))}
        else:
            missing = [s.name for s in specs if s.name not in arrays]
            if missing:
                raise InputError(f"--data {source}: no array for model input(s) {missing}; "
                                 f"it has {sorted(arrays)}")
            raw = {s.name: arrays[s.name] for s in specs}
    inputs = {s.name: _fit(s.name, raw[s.name], s.shape, s.dtype, source) for s in specs}
    counts = {len(v) for v in inputs.values()}
    if len(counts) != 1 or 0 in counts:
        raise InputError(f"--data {source}: inputs need the same, non-zero number of samples")
    n = counts.pop()
    if labels is not None:
        labels = np.asarray(labels).reshape(-1)
        if len(labels) != n or labels.dtype.kind not in "iu":
            raise InputError(f"--data {source}: labels must be {n} integers, got "
                             f"{labels.shape} {labels.dtype}")
    if limit is not None and limit < n:
        inputs = {k: v[:limit] for k, v in inputs.items()}
        labels = labels[:limit] if labels is not None else None
    return Dataset(source if source == "digits" else Path(source).name, inputs, labels)


def session(path: Path) -> Any:
    """A one-thread CPU onnxruntime session (calibration and benches are single-core)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
        raise BundleError(f"{path}: onnxruntime cannot load it: {exc}") from None


class CandidateRunner:
    """Runs one candidate's head and tail slices straight from the bundle files."""

    def __init__(self, bundle: Bundle, cand: Candidate) -> None:
        if cand.is_wearable_only:
            raise BundleError(f"candidate {cand.id} is wearable-only: nothing crosses the link")
        self.cand = cand
        self.head = None if cand.head.file is None else session(bundle.path(cand.head.file))
        assert cand.tail.file is not None
        self.tail = session(bundle.path(cand.tail.file))
        self.crossing = [t.name for t in cand.crossing]
        self.tail_inputs = [i.name for i in self.tail.get_inputs()]
        unknown = [n for n in self.tail_inputs if n not in self.crossing]
        if unknown:
            raise BundleError(f"candidate {cand.id}: tail needs {unknown}, not in its crossing")
        self.output = self.tail.get_outputs()[0].name

    def run_head(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.head is None:
            return {n: feed[n] for n in self.crossing}
        outs = self.head.run(self.crossing, feed)
        return dict(zip(self.crossing, outs, strict=True))

    def run_tail(self, crossing: dict[str, np.ndarray]) -> np.ndarray:
        feed = {n: crossing[n] for n in self.tail_inputs}
        return np.asarray(self.tail.run([self.output], feed)[0])


def _top1(logits: np.ndarray) -> int:
    """Class index of a batch-1 output (argmax of its first row)."""
    rows = logits.reshape(logits.shape[0], -1) if logits.ndim > 1 else logits.reshape(1, -1)
    return int(np.argmax(rows[0]))


def upper_bound(k: int, n: int, confidence: float = CONFIDENCE) -> float:
    """One-sided Clopper-Pearson upper bound on a rate seen ``k`` times in ``n`` trials.

    With no disagreement at all it is ``1 - (1 - confidence) ** (1 / n)``: 31 % at 8 samples,
    under 1 % only from 299 samples -- the tolerance a calibration can establish."""
    if n <= 0:
        return 1.0
    if k >= n:
        return 1.0
    from scipy.stats import beta

    return float(beta.ppf(confidence, k + 1, n - k))


def samples_needed(tolerance_pp: float, confidence: float = CONFIDENCE) -> int:
    """Fewest samples whose upper bound, with no disagreement seen, is within the tolerance."""
    import math

    p = tolerance_pp / 100.0
    if p >= 1:
        return 1
    return math.ceil(math.log(1 - confidence) / math.log(1 - p))


def calibrate_candidate(
    bundle: Bundle, cand: Candidate, data: Dataset, specs: Sequence[str] = DEFAULT_SPECS
) -> list[dict[str, Any]]:
    """The packing table of one candidate (see the module docstring for the row fields)."""
    runner = CandidateRunner(bundle, cand)
    parsed = [PackSpec.parse(s) for s in specs]
    n = len(data)
    sizes = np.zeros((len(parsed), n))
    agree = np.zeros((len(parsed), n), dtype=bool)
    correct = np.zeros((len(parsed), n), dtype=bool)
    rel = np.zeros((len(parsed), n))
    ref_correct = np.zeros(n, dtype=bool)
    float_bytes = 0.0
    for i in range(n):
        crossing = runner.run_head(data.feed(i))
        float_bytes += sum(4 * a.size if a.dtype.kind == "f" else a.nbytes
                           for a in crossing.values())
        ref = runner.run_tail(crossing)
        ref_top = _top1(ref)
        label = None if data.labels is None else int(data.labels[i])
        ref_correct[i] = ref_top == label
        ref_norm = float(np.linalg.norm(ref)) or 1.0
        for j, spec in enumerate(parsed):
            bodies = {k: packing.pack(v, spec) for k, v in crossing.items()}
            sizes[j, i] = sum(len(b) for b in bodies.values())
            out = runner.run_tail({k: packing.unpack(b) for k, b in bodies.items()})
            top = _top1(out)
            agree[j, i] = top == ref_top
            correct[j, i] = top == label
            rel[j, i] = float(np.linalg.norm(out - ref)) / ref_norm
    mean_float = float_bytes / n
    rows = []
    for j, spec in enumerate(parsed):
        if data.labels is not None:
            drop = 100.0 * (float(ref_correct.mean()) - float(correct[j].mean()))
            # the drop is at most the share of inputs packing turned from right to wrong
            lost = int(np.sum(ref_correct & ~correct[j]))
        else:
            drop = 100.0 * (1.0 - float(agree[j].mean()))
            lost = int(np.sum(~agree[j]))
        mean_bytes = float(sizes[j].mean())
        rows.append({
            "spec": str(spec),
            "codec": spec.codec,
            "bits": spec.bits if spec.bits is not None else (16 if spec.codec == "f16" else 32),
            "mean_bytes": round(mean_bytes, 2),
            "ratio": round(mean_float / mean_bytes, 3) if mean_bytes else 0.0,
            "accuracy_drop_pp": round(drop, 4),
            "top1_agreement": round(float(agree[j].mean()), 5),
            "rel_l2": float(f"{rel[j].mean():.4g}"),
            "samples": n,
            "accuracy_drop_upper_pp": round(100.0 * upper_bound(lost, n), 4),
        })
    return rows


def calibrate(
    bundle: Bundle,
    data: Dataset,
    specs: Sequence[str] = DEFAULT_SPECS,
    candidate_ids: Iterable[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Calibrate every candidate that sends something (all but ``wearable-only``)."""
    for s in specs:
        try:
            PackSpec.parse(s)
        except ValueError as exc:
            raise InputError(str(exc)) from None
    wanted = None if candidate_ids is None else {bundle.candidate(c).id for c in candidate_ids}
    results: dict[str, list[dict[str, Any]]] = {}
    for cand in bundle.candidates:
        if cand.is_wearable_only or (wanted is not None and cand.id not in wanted):
            continue
        t0 = time.perf_counter()
        results[cand.id] = calibrate_candidate(bundle, cand, data, specs)
        if progress:
            best = best_row(results[cand.id], DEFAULT_TOLERANCE_PP)
            note = (f"best established within 1 pp: {best['spec']} x{best['ratio']:.1f}"
                    if best else "no lossy packing established within 1 pp")
            progress(f"{cand.id} {cand.label}: {len(data)} inputs x {len(specs)} packings "
                     f"in {time.perf_counter() - t0:.1f} s; {note}")
    return results


def store(bundle: Bundle, results: dict[str, list[dict[str, Any]]], data: Dataset) -> Path:
    """Write the tables into the manifest (``Candidate.extra["packing"]``) and save it."""
    for cand in bundle.candidates:
        if cand.id in results:
            cand.extra[EXTRA_KEY] = results[cand.id]
    bundle.meta[META_KEY] = {
        "data": data.name,
        "samples": len(data),
        "metric": "top1_accuracy" if data.labels is not None else "top1_disagreement",
    }
    return bundle.save()


# --- readers for the planner -----------------------------------------------------------------


def _spec_name(bits: int | str | PackSpec) -> str:
    return str(bits if isinstance(bits, PackSpec) else PackSpec.parse(bits))


def packing_rows(candidate: Candidate) -> list[dict[str, Any]]:
    """The calibrated table of a candidate ([] when never calibrated)."""
    rows = candidate.extra.get(EXTRA_KEY, [])
    return rows if isinstance(rows, list) else []


def _row(candidate: Candidate, bits: int | str | PackSpec) -> dict[str, Any]:
    name = _spec_name(bits)
    for row in packing_rows(candidate):
        if row.get("spec") == name:
            return row
    have = ", ".join(str(r.get("spec")) for r in packing_rows(candidate)) or "none"
    raise BundleError(f"candidate {candidate.id} has no calibration for packing {name} "
                      f"(calibrated: {have}); run `coinf calibrate BUNDLE --data ...`")


def expected_packed_bytes(candidate: Candidate, bits: int | str | PackSpec) -> float:
    """Mean bytes on the wire of the candidate's crossing tensors packed with ``bits``.

    ``raw`` needs no calibration (the RAW size); ``wearable-only`` sends nothing (0)."""
    if candidate.is_wearable_only:
        return 0.0
    if _spec_name(bits) == "raw":
        return float(candidate.crossing_bytes)
    return float(_row(candidate, bits)["mean_bytes"])


def accuracy_drop(candidate: Candidate, bits: int | str | PackSpec) -> float:
    """Calibrated accuracy drop (pp, >= 0) of packing the candidate's crossing with ``bits``.

    The table keeps the signed measurement; a negative drop (packing happened to fix a few
    inputs) is noise on a finite validation set and is reported to the planner as 0."""
    if candidate.is_wearable_only or PackSpec.parse(_spec_name(bits)).lossless:
        return 0.0
    return max(0.0, float(_row(candidate, bits)["accuracy_drop_pp"]))


def row_bound(row: dict[str, Any], samples: int | None = None) -> tuple[float, int | None]:
    """(upper bound on the drop in pp, samples) of a table row. Rows written before the bound
    existed get it from ``top1_agreement`` and ``samples`` (the row's or the given count);
    without any sample count the measured drop is all there is."""
    n = row.get("samples", samples)
    if "accuracy_drop_upper_pp" in row:
        return float(row["accuracy_drop_upper_pp"]), n
    if n and "top1_agreement" in row:
        k = round((1.0 - float(row["top1_agreement"])) * int(n))
        return 100.0 * upper_bound(k, int(n)), int(n)
    return max(0.0, float(row.get("accuracy_drop_pp", 0.0))), n


def accuracy_bound(candidate: Candidate, bits: int | str | PackSpec,
                   samples: int | None = None) -> tuple[float, int | None]:
    """(95 % upper bound on the accuracy drop in pp, samples) of packing the candidate's
    crossing with ``bits``; lossless packings and ``wearable-only`` are (0, None)."""
    if candidate.is_wearable_only or PackSpec.parse(_spec_name(bits)).lossless:
        return 0.0, None
    return row_bound(_row(candidate, bits), samples)


def best_row(rows: list[dict[str, Any]], tolerance_pp: float = DEFAULT_TOLERANCE_PP
             ) -> dict[str, Any] | None:
    """The smallest packing whose accuracy drop is within ``tolerance_pp`` and whose upper
    bound establishes it (rows without a bound: the measured drop)."""
    ok = [r for r in rows if r["accuracy_drop_pp"] <= tolerance_pp
          and row_bound(r)[0] <= tolerance_pp]
    return min(ok, key=lambda r: r["mean_bytes"]) if ok else None


def check_calibrated(bundle: Bundle) -> None:
    """Raise :class:`CoinfError` when no candidate carries a packing table."""
    if not any(packing_rows(c) for c in bundle.candidates):
        raise UserError(f"bundle {bundle.root} has no packing calibration; "
                         "run `coinf calibrate BUNDLE --data ...`")
