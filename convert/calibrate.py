"""Offline packing calibration: accuracy drop and packed size per (candidate, packing).

For every candidate cut and every packing (default q2..q8, q10, q12, q16, f16, plus lossless f32
for the size, qz2..qz6, qz8 when zstandard is installed, and ans2..ans4, ans6, ans8 with priors
fitted here, :mod:`convert.entropy_cal`), the head runs on each validation
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
``qN``, ``qzN`` and ``ansN`` rows of one ``N`` decode to the very same values (same accuracy);
only their bytes and times differ, and the planner takes whichever configuration is cheaper.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from coinf.ble_protocol import codecs, media
from coinf.ble_protocol.packing import PackSpec
from coinf.convert import entropy_cal, packcal, packrows
from coinf.convert.feeds import Dataset, load_dataset  # noqa: F401 - re-exported
from coinf.convert.packcal import Options

from coinf.bundle import Bundle, Candidate
from coinf.errors import BundleError, InputError

#: quantized levels + zstd (ble_protocol/codecs.py), calibrated when zstandard is installed
ZSTD_SPECS: tuple[str, ...] = ("qz2", "qz3", "qz4", "qz5", "qz6", "qz8")
#: quantized levels + rANS under per-channel priors fitted on the calibration inputs
#: (ble_protocol/priors.py; pure numpy, so always calibrated)
ANS_SPECS: tuple[str, ...] = ("ans2", "ans3", "ans4", "ans6", "ans8")
#: standard codecs (ble_protocol/media.py), calibrated where a crossing tensor is image- or
#: audio-like and their library is installed (the `codecs` extra)
MEDIA_SPECS: tuple[str, ...] = (
    "jpeg-q50", "jpeg-q75", "jpeg-q90", "jpeg-q95", "webp-q50", "webp-q75", "webp-q90", "webp-ll",
    "png", "pcm16", "flac")
DEFAULT_SPECS: tuple[str, ...] = (
    "q2", "q3", "q4", "q5", "q6", "q7", "q8", "q10", "q12", "q16", "f16", "f32",
) + (ZSTD_SPECS if codecs.AVAILABLE else ()) + ANS_SPECS + tuple(
    s for s in MEDIA_SPECS if PackSpec.parse(s).codec in media.available())
#: what a cut inside the network is calibrated with (standard codecs fit images, and a feature
#: map of 1 or 3 channels is rare): the quantizing packings and the lossless ones
SPLIT_SPECS: tuple[str, ...] = ("q2", "q3", "q4", "q6", "q8", "f16", "f32") + (
    ("qz2", "qz3", "qz4", "qz6", "qz8") if codecs.AVAILABLE else ()) + ANS_SPECS
DEFAULT_TOLERANCE_PP = 1.0
#: one-sided confidence of the reported upper bound on the accuracy drop
CONFIDENCE = 0.95
EXTRA_KEY = "packing"
META_KEY = "packing_calibration"


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
        wanted = {i.name for i in self.head.get_inputs()}
        outs = self.head.run(self.crossing, {k: v for k, v in feed.items() if k in wanted})
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
    bundle: Bundle, cand: Candidate, data: Dataset, specs: Sequence[str] = DEFAULT_SPECS,
    options: Options | None = None,
) -> list[dict[str, Any]]:
    """The packing table of one candidate (module docstring; :mod:`convert.packcal`)."""
    return packcal.calibrate_candidate(bundle, cand, data, specs, options)


def calibrate(
    bundle: Bundle,
    data: Dataset,
    specs: Sequence[str] = DEFAULT_SPECS,
    candidate_ids: Iterable[str] | None = None,
    progress: Callable[[str], None] | None = None,
    options: Options | None = None,
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
        results[cand.id] = calibrate_candidate(bundle, cand, data, specs, options)
        if progress:
            best = best_row(results[cand.id], DEFAULT_TOLERANCE_PP)
            note = (f"best established within 1 pp: {best['spec']} x{best['ratio']:.1f}"
                    if best else "no lossy packing established within 1 pp")
            progress(f"{cand.id} {cand.label}: {len(data)} inputs x {len(specs)} packings "
                     f"in {time.perf_counter() - t0:.1f} s; {note}")
    return results


def store(bundle: Bundle, results: dict[str, list[dict[str, Any]]], data: Dataset,
          options: Options | None = None) -> Path:
    """Write the tables into the manifest (``Candidate.extra["packing"]``), the entropy priors
    their ``ansN`` rows name into ``priors.json``/``priors.bin``, and save it."""
    for cand in bundle.candidates:
        if cand.id in results:
            cand.extra[EXTRA_KEY] = results[cand.id]
    entropy_cal.store(bundle)
    bundle.meta[META_KEY] = {
        "data": data.name,
        "samples": len(data),
        "metric": "top1_accuracy" if data.labels is not None else "top1_disagreement",
    }
    packcal.record(bundle.meta[META_KEY], results, options)
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
    row = _row(candidate, bits)
    return 0.0 if row.get("exact") is True else max(0.0, float(row["accuracy_drop_pp"]))


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
    crossing with ``bits``; lossless packings, ``wearable-only`` and a packing that came back
    bit for bit on every calibration input (:func:`is_exact`) are (0, None)."""
    if candidate.is_wearable_only or PackSpec.parse(_spec_name(bits)).lossless:
        return 0.0, None
    row = _row(candidate, bits)
    if row.get("exact") is True:
        return 0.0, None
    return row_bound(row, samples)


def is_exact(candidate: Candidate, bits: int | str | PackSpec) -> bool:
    """Whether packing the candidate's crossing with ``bits`` is exact: a lossless packing, or
    one whose round trip gave every crossing tensor back bit for bit on every calibration
    input (PNG or lossless WebP of a frame made from 8-bit pixels). An exact packing changes
    no answer, so it needs no sample bound."""
    if candidate.is_wearable_only or PackSpec.parse(_spec_name(bits)).lossless:
        return True
    try:
        return _row(candidate, bits).get("exact") is True
    except BundleError:
        return False


def best_row(rows: list[dict[str, Any]], tolerance_pp: float = DEFAULT_TOLERANCE_PP
             ) -> dict[str, Any] | None:
    """The smallest packing whose accuracy drop is within ``tolerance_pp`` and whose upper
    bound establishes it (rows without a bound: the measured drop)."""
    ok = [r for r in rows if r.get("exact") is True or (
        r["accuracy_drop_pp"] <= tolerance_pp and row_bound(r)[0] <= tolerance_pp)]
    return min(ok, key=lambda r: r["mean_bytes"]) if ok else None


def criterion_line(meta: dict[str, Any] | None) -> str | None:
    """One sentence saying what the calibration's drops measure: the criterion, the data, how
    many inputs it judged, the model's own noise floor (None for tables without it)."""
    m = (meta or {}).get(META_KEY) or {}
    kind = m.get("criterion")
    if kind not in packrows.CRITERIA:
        return None
    n, judged = int(m.get("inputs", m.get("samples", 0))), int(m.get("judged", 0))
    data = m.get("data", "?")
    floor = float(m.get("noise_floor_pp", 0.0))
    if kind == "labels":
        what = f"accuracy against the labels on {n} inputs of {data}"
        if "model_accuracy_pct" in m:
            what += f", the unpacked model's {float(m['model_accuracy_pct']):.2f} %"
    elif kind == "stable":
        what = (f"agreement with the unpacked model on the {judged} of {n} inputs of {data} "
                "whose answer survives 1 LSB of input noise")
    else:
        what = f"the metric against the unpacked model on {n} inputs of {data}"
    if judged:
        bound = (f"with no change seen, {judged} inputs bound a loss at "
                 f"{100 * upper_bound(0, judged):.2f} pp ({CONFIDENCE:.0%})")
    else:
        bound = "no input to judge by"
    return (f"quality: {what} ({m.get('metric', '?')}); the model's own noise floor: "
            f"{floor:.2f} pp of answers change under 1 LSB; {bound}")

