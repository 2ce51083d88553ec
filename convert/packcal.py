"""One candidate's packing table: task-aware metric, per-tensor packing, drift over sequences.

For every packing spec (a row), each crossing tensor gets its own packing: the row's spec,
except state-like tensors (:mod:`convert.state`), which travel lossless (``f32``) unless
``pack_state``, and the user's ``tensor_packing`` overrides. When a row's drop exceeds the
tolerance and two or more tensors are packed lossy, each is measured alone at that spec and
those whose own drop exceeds their share of the tolerance travel as ``f16`` instead; the row is
then measured again with that assignment (``row["promoted"]``). ``row["tensors"]`` records the
assignment whenever it is not uniform, and the wearable packs each tensor that way
(:func:`tensor_specs`).

A model with state pairs is calibrated over **sequences**: the state input is taken from the
data at the first step of each sequence only; afterwards the reference run and every packed
run feed back their own state output, so quantization error accumulates as it would over a
stream, and the metric is taken at every step. ``row["drift_rel_l2"]`` is the relative L2 error
of the fed-back state, mean over every step; ``final_drift_rel_l2`` the same at the last step of
each sequence.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from coinf.ble_protocol import media, packing
from coinf.ble_protocol.packing import PackSpec
from coinf.convert import noise
from coinf.convert import state as st
from coinf.convert.entropy_cal import PriorFit, ans_bits
from coinf.convert.feeds import Dataset
from coinf.convert.headtail import Runner
from coinf.convert.metrics import Label, Metric, upper_bound_pp
from coinf.convert.packrows import LOSSLESS, codec_applies, criterion_summary, drop_dominated

from coinf.bundle import Bundle, Candidate
from coinf.errors import InputError

PROMOTE_TO = "f16"
MAX_PROMOTE_TENSORS = 8  # beyond this many lossy tensors, no per-tensor search
CONFIDENCE = 0.95

#: a crossing carried another way than packing: (restored crossing, bytes sent, encode s,
#: decode s)
RoundTrip = Callable[[dict[str, np.ndarray]], tuple[dict[str, np.ndarray], int, float, float]]


@dataclass
class Options:
    """How to calibrate (``coinf calibrate`` flags)."""

    metric: Metric = field(default_factory=Metric)
    tolerance_pp: float = 1.0
    pack_state: bool = False
    tensor_packing: Mapping[str, str] = field(default_factory=dict)
    sequence_length: int | None = None  # stateful models: None = all feeds, one sequence


def base_assignment(cand: Candidate, spec: str, opts: Options) -> dict[str, str]:
    """Per crossing tensor: the row's spec, state-like ones lossless, then the overrides."""
    state_like = set(cand.extra.get(st.EXTRA_KEY, [])) if not opts.pack_state else set()
    out = {t.name: (LOSSLESS if t.name in state_like else spec) for t in cand.crossing}
    for name, s in opts.tensor_packing.items():
        if name in out:
            out[name] = s
    return out


def tensor_specs(cand: Candidate, spec: str | PackSpec) -> dict[str, PackSpec]:
    """How the wearable packs each crossing tensor under row ``spec``: the calibrated
    assignment when the table has one, else state-like tensors lossless; ``{}`` = uniform."""
    name = str(spec)
    if name == "raw":
        return {}
    rows = cand.extra.get("packing") or []
    for row in rows if isinstance(rows, list) else []:
        if not (isinstance(row, dict) and row.get("spec") == name):
            continue
        out: dict[str, PackSpec] = {}
        if isinstance(row.get("tensors"), dict):
            try:
                out = {str(k): PackSpec.parse(str(v)) for k, v in row["tensors"].items()}
            except ValueError:
                return {}
        uniform = PackSpec.parse(name)
        if isinstance(row.get("ranges"), dict):
            ranged = _ranged(row["ranges"], uniform)
            out.update({k: v for k, v in ranged.items() if out.get(k, uniform).is_media})
        for k, key in (row["priors"] if isinstance(row.get("priors"), dict) else {}).items():
            if out.get(k, uniform).codec == "ans":  # the calibrated table (ble_protocol/priors)
                out[str(k)] = replace(out.get(k, uniform), priors=str(key))
        if out:
            return out
    like = cand.extra.get(st.EXTRA_KEY) or []
    return {str(t): PackSpec.parse(LOSSLESS) for t in like} if isinstance(like, list) else {}


#: distinct values per channel gathered to recognise 8-bit pixels (a few frames' worth)
GRID_VALUES = 4096


def _snap(values: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
    """A channel's range for the map to 8-bit pixels. When its values lie on an even grid of
    at most 256 steps (a model input made from 8-bit pixels by an affine map: ``(p / 255 -
    mean) / std``), the range spans exactly 255 of those steps, so each pixel maps back to
    itself whatever the darkest and brightest pixel of the calibration data were."""
    if values.size < 2 or not hi > lo:
        return lo, hi
    gaps = np.diff(values.astype(np.float64))
    step = float(gaps.min())
    span = (hi - lo) / step if step > 0 else math.inf
    if not span <= 255.5 or np.abs(gaps / step - np.round(gaps / step)).max() > 1e-3:
        return lo, hi
    # the smallest gap carries float32 rounding (a few 1e-7): the span over its whole number
    # of steps gives the step to float precision, so the top pixel maps back too
    k = max(round(span), 1)
    step = (hi - lo) / k
    low = lo - (255 - k) // 2 * step
    return low, low + 255 * step


def _ranged(ranges: Mapping[str, Any], spec: PackSpec) -> dict[str, PackSpec]:
    """A standard codec's spec per tensor, with the range calibration measured for it (a
    manifest entry that is not a list of ``[lo, hi]`` pairs is ignored)."""
    out = {}
    for name, pairs in ranges.items():
        try:
            rng = tuple((float(lo), float(hi)) for lo, hi in pairs)
        except (TypeError, ValueError):
            continue
        if rng and all(np.isfinite(rng).ravel()):
            out[str(name)] = replace(spec, ranges=rng)
    return out


def metric_outputs(bundle: Bundle, metric: Metric | None) -> list[str]:
    """The outputs ``metric`` reads: its ``outputs``, else the model's first output that is not
    a fed-back state."""
    if metric is not None and metric.outputs:
        return list(metric.outputs)
    states = {b for _, b in st.pairs_of(bundle.meta)}
    names = [t.name for t in bundle.outputs]
    return [next((n for n in names if n not in states), names[0])]


@dataclass
class _Trial:
    """Accumulated measurements of one assignment over the data."""

    sizes: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    agree: list[bool] = field(default_factory=list)
    correct: list[float] = field(default_factory=list)
    rel: list[float] = field(default_factory=list)
    encode_s: list[float] = field(default_factory=list)  # packing every crossing tensor
    decode_s: list[float] = field(default_factory=list)
    drift: list[float] = field(default_factory=list)  # fed-back state error, every step
    final: list[float] = field(default_factory=list)  # ... at the end of each sequence
    #: per input: whether every crossing tensor came back bit for bit
    exact: list[bool] = field(default_factory=list)


class _Calibration:
    def __init__(self, bundle: Bundle, cand: Candidate, data: Dataset, opts: Options,
                 fit: PriorFit | None = None) -> None:
        self.cand, self.data, self.opts, self.fit = cand, data, opts, fit
        self.runner = Runner(bundle, cand)
        self.metric = opts.metric
        self.mout = metric_outputs(bundle, self.metric)
        self.pairs = [(a, b) for a, b in st.pairs_of(bundle.meta)
                      if a in data.inputs and b in self.runner.outputs]
        n = len(data)
        length = opts.sequence_length if self.pairs else 1
        length = n if length is None else max(1, min(length, n))
        self.sequences = [range(s, min(s + length, n)) for s in range(0, n, length)]
        self.ref_correct: list[float] = []
        self.float_bytes = 0.0
        #: per image- or audio-like crossing tensor, its value range over every input
        #: (the standard codecs' calibrated map to pixels or samples)
        self.ranges: dict[str, list[tuple[float, float]]] = {}
        self._grid: dict[str, list[np.ndarray]] = {}  # distinct values per channel, first inputs
        #: the head's output per input, run once (the head sees no state, so every trial's is
        #: the same); None when state is fed back or they would take too much memory
        self.heads: list[dict[str, np.ndarray]] | None = \
            [] if not self.pairs and self.runner.head is not None else None
        self._head_bytes = 0
        self._reference()
        self._check_labels()
        if self.labelled:  # the sequences run the inputs in order: ref[i] is input i's
            self.ref_correct = [self.metric.correct(r[self.mout[0]], self._label(i))
                                for i, r in enumerate(self.ref)]
        self.noise = noise.measure(
            data, self.sequences, self.ref,
            lambda feed: self.runner.run_tail(self.runner.run_head(feed)),
            self.metric, self.mout, self.pairs,
            lambda i: self._label(i) if self.labelled else None)
        if fit is not None:
            fit.fit()
        self.ranges = {k: [_snap(self._grid[k][c], lo, hi) for c, (lo, hi) in enumerate(v)]
                       for k, v in self.ranges.items()}

    def _reference(self) -> None:
        """The unpacked run (its own state fed back): outputs per step."""
        self.ref: list[dict[str, np.ndarray]] = []
        for seq in self.sequences:
            state: dict[str, np.ndarray] = {}
            for i in seq:
                feed = {**self.data.feed(i), **state}
                crossing = self.runner.run_head(feed)
                if self.fit is not None:
                    self.fit.add(i, crossing)
                self.float_bytes += sum(4 * a.size if a.dtype.kind == "f" else a.nbytes
                                        for a in crossing.values())
                self._widen(crossing)
                if self.heads is not None:
                    self._keep_head(crossing)
                out = self.runner.run_tail(crossing)
                self.ref.append(out)
                state = {a: out[b] for a, b in self.pairs}

    def _keep_head(self, crossing: dict[str, np.ndarray]) -> None:
        """Keep the head's output for the trials, within :data:`HEAD_CACHE_BYTES` (none kept
        once the inputs' crossings outgrow it)."""
        assert self.heads is not None
        self._head_bytes += sum(a.nbytes for a in crossing.values())
        if self._head_bytes > HEAD_CACHE_BYTES:
            self.heads = None
        else:
            self.heads.append(crossing)

    def _widen(self, crossing: Mapping[str, np.ndarray]) -> None:
        for name, a in crossing.items():
            got = media.channel_ranges(a) if a.dtype.kind == "f" and np.isfinite(a).all() \
                else None
            if got is None:
                continue
            old = self.ranges.setdefault(name, got)
            self.ranges[name] = [(min(a0, b0), max(a1, b1))
                                 for (a0, a1), (b0, b1) in zip(old, got, strict=True)]
            seen = self._grid.setdefault(name, [np.zeros(0, a.dtype)] * len(got))
            lay = media.image_layout(a.shape)
            if lay is not None and all(len(v) < GRID_VALUES for v in seen):  # images only
                hwc = a.reshape(-1, lay[1]) if lay[0] else a.reshape(lay[1], -1).T
                self._grid[name] = [np.unique(np.concatenate([v, hwc[:, c]]))
                                    for c, v in enumerate(seen)]

    def specs(self, assign: Mapping[str, str]) -> dict[str, PackSpec]:
        """The assignment's specs, a standard codec with the calibrated range of its tensor."""
        out = {}
        for name, text in assign.items():
            spec = PackSpec.parse(text)
            if spec.is_media and name in self.ranges:
                spec = replace(spec, ranges=tuple(self.ranges[name]))
            out[name] = spec
        return out

    def _label(self, i: int) -> Label:
        return None if self.data.labels is None else self.data.labels[i]

    def _check_labels(self) -> None:
        """Labels whose ids the model cannot output are one clear error naming the data."""
        labels = self.data.labels
        if labels is None:
            return
        ctc = self.metric.name.startswith("ctc")
        pitch = self.metric.cents is not None
        lines = self.metric.lines is not None
        have = "line boxes" if labels.ndim == 3 else "a row of ids" if labels.ndim == 2 \
            else "one class id" if labels.dtype.kind in "iu" else "one number"
        if (ctc and labels.ndim != 2) or (self.metric.name == "top1" and (
                labels.ndim != 1 or labels.dtype.kind == "f")) or (pitch and labels.ndim != 1) \
                or (lines and labels.ndim != 3):
            raise InputError(f"{self.data.name}: the labels hold {have} per input; --metric "
                             f"{self.metric.name} is judged against {self.metric.label_kind} "
                             f"per input")
        if lines:
            rows = labels.reshape(-1, 4)
            rows = rows[(rows >= 0).all(axis=1)]
            if ((rows > 1).any() or (rows[:, 2] <= rows[:, 0]).any()
                    or (rows[:, 3] <= rows[:, 1]).any()):
                raise InputError(f"{self.data.name}: a line box is not x0 < x1, y0 < y1 "
                                 f"within 0..1 (fractions of the input)")
            return
        if pitch:
            bad = labels[~(labels > 0)]
            if bad.size:
                raise InputError(f"{self.data.name}: label {float(bad[0]):g} is no pitch; "
                                 f"expected a frequency in Hz > 0 per input")
            return
        if not self.labelled:
            return
        out = self.ref[0][self.mout[0]]
        classes = int(out.shape[-1])
        if self.metric.name.startswith("ctc"):  # padding -1; the blank 0 is no character
            if out.dtype.kind in "iu":  # ids already (--post argmax): no class count here
                classes = 1 << 62
            bad = labels[(labels < -1) | (labels == 0) | (labels >= classes)]
            top = "" if classes == 1 << 62 else f"..{classes - 1}"
            want = f"class ids 1{top} (0 is the blank), padded with -1"
        else:
            bad = labels[(labels < 0) | (labels >= classes)]
            want = f"class ids 0..{classes - 1}"
        if bad.size:
            raise InputError(f"{self.data.name}: label {int(bad[0])} is not a class id of "
                             f"{self.mout[0]!r}; expected {want}")

    def trial(self, assign: Mapping[str, str], roundtrip: RoundTrip | None = None) -> _Trial:
        """Every input through the assignment's packings, or through ``roundtrip`` instead."""
        specs = self.specs(assign)
        book = self.fit.book if self.fit is not None else None
        tr = _Trial()
        k = 0
        for seq in self.sequences:
            state: dict[str, np.ndarray] = {}
            out: dict[str, np.ndarray] = {}
            for i in seq:
                if self.heads is not None:
                    crossing = self.heads[k]
                else:
                    crossing = self.runner.run_head({**self.data.feed(i), **state})
                if roundtrip is None:
                    now = specs if self.fit is None else self.fit.specs_for(specs, i)
                    t0 = time.perf_counter()
                    bodies = {n: packing.pack(v, now[n]) for n, v in crossing.items()}
                    t1 = time.perf_counter()
                    unpacked = {n: packing.unpack(b, book=book) for n, b in bodies.items()}
                    tr.encode_s.append(t1 - t0)
                    tr.decode_s.append(time.perf_counter() - t1)
                    tr.sizes.append(sum(len(b) for b in bodies.values()))
                else:
                    unpacked, nbytes, enc_s, dec_s = roundtrip(crossing)
                    tr.encode_s.append(enc_s)
                    tr.decode_s.append(dec_s)
                    tr.sizes.append(nbytes)
                tr.exact.append(all(same_values(unpacked[n], v) for n, v in crossing.items()))
                ref = self.ref[k]
                # the tail is deterministic: given back bit for bit, it answers as it did
                same = not state and all(unpacked[n].dtype == v.dtype
                                         and np.array_equal(unpacked[n], v)
                                         for n, v in crossing.items())
                out = ref if same else self.runner.run_tail(unpacked)
                state = {a: out[b] for a, b in self.pairs}
                label = self._label(i) if self.labelled else None
                r0, o0 = ref[self.mout[0]], out[self.mout[0]]
                tr.losses.append(self.metric.loss([ref[m] for m in self.mout],
                                                  [out[m] for m in self.mout], label))
                tr.agree.append(_top1(o0) == _top1(r0))
                tr.correct.append(self.metric.correct(o0, label))
                norm = float(np.linalg.norm(r0.astype(np.float64))) or 1.0
                tr.rel.append(float(np.linalg.norm((o0 - r0).astype(np.float64))) / norm)
                if self.pairs:
                    tr.drift.append(float(np.mean([_rel(out[b], ref[b]) for _, b in self.pairs])))
                    if i == seq[-1]:
                        tr.final.append(tr.drift[-1])
                k += 1
        return tr

    def drop(self, tr: _Trial) -> tuple[float, float]:
        """(measured drop in pp, its upper bound in pp) under the criterion: with labels,
        accuracy against them on every input; else the metric on the stable inputs."""
        losses = np.asarray(tr.losses, dtype=np.float64)
        if self.labelled:
            ref_c = np.asarray(self.ref_correct)
            cor = np.asarray(tr.correct)
            drop = 100.0 * (float(ref_c.mean()) - float(cor.mean()))
            return drop, upper_bound_pp(losses, CONFIDENCE)
        judged = losses[self.noise.stable]
        if not judged.size:  # no input the model itself answers stably: nothing established
            return 100.0 * float(losses.mean()), 100.0
        return 100.0 * float(judged.mean()), upper_bound_pp(judged, CONFIDENCE)

    @property
    def criterion(self) -> str:
        """``labels`` (accuracy against them), ``stable`` (agreement on the stable inputs) or
        ``all`` (a continuous metric on every input)."""
        if self.labelled:
            return "labels"
        return "stable" if self.noise.decision else "all"

    def judged(self) -> int:
        """How many inputs the criterion judges."""
        return len(self.noise.stable) if self.criterion != "stable" else self.noise.n_stable

    @property
    def metric_label(self) -> str:
        """The metric as rows and the manifest name it (the old names for plain top-1)."""
        if self.metric.name == "top1" and not self.metric.outputs:
            return "top1_accuracy" if self.labelled else "top1_disagreement"
        outs = f"[{','.join(self.mout)}]" if self.metric.outputs else ""
        return f"{self.metric.name}{outs}"

    @property
    def labelled(self) -> bool:
        """Whether the data's labels judge the metric (class ids for top-1 on one position,
        id rows for ``ctc``): the criterion is then accuracy against them."""
        labels = self.data.labels  # cents@T reads the pitch, the first of its outputs
        return labels is not None and (len(self.mout) == 1 or self.metric.cents is not None) \
            and self.metric.judges_labels(
                labels.ndim - 1, int(np.prod(self.ref[0][self.mout[0]].shape[:-1])))


#: memory the head outputs kept for a candidate's trials may take (beyond it, heads rerun)
HEAD_CACHE_BYTES = 512 << 20

#: float32 rounding steps (of the tensor's largest magnitude) within which a round trip still
#: gives back "the same" value: a dequantizing decoder's arithmetic, 10^4 below an 8-bit step
EXACT_ULPS = 8


def same_values(got: np.ndarray, ref: np.ndarray) -> bool:
    """Whether ``got`` holds ``ref``'s values: bit for bit for integers, within
    :data:`EXACT_ULPS` float32 rounding steps of ``max |ref|`` for floats (what two CPUs'
    SIMD kernels differ by, far below any sensor's step)."""
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape:
        return False
    if ref.dtype.kind != "f":
        return bool(np.array_equal(got, ref))
    r64 = ref.astype(np.float64)
    scale = float(np.max(np.abs(r64), initial=0.0))
    tol = EXACT_ULPS * float(np.finfo(np.float32).eps) * scale
    return bool(np.all(np.abs(got.astype(np.float64) - r64) <= tol))


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    """``||got - ref|| / ||ref||`` (the plain norm of the error when ``ref`` is 0)."""
    ref64 = ref.astype(np.float64)
    return float(np.linalg.norm(got.astype(np.float64) - ref64)) / (
        float(np.linalg.norm(ref64)) or 1.0)


def _top1(a: np.ndarray) -> int:
    flat = np.asarray(a).reshape(-1)
    return int(np.argmax(flat)) if flat.size else 0


def judge_roundtrips(bundle: Bundle, cand: Candidate, data: Dataset, opts: Options,
                     roundtrips: Mapping[str, RoundTrip]) -> dict[str, dict[str, Any]]:
    """Each way of carrying ``cand``'s crossing (a learned bottleneck: encoder, latent code,
    decoder) judged exactly as its packings are: the same inputs, criterion, noise floor and
    bound. Per key: ``bytes`` (mean sent), ``quality_loss`` and ``quality_loss_bound`` (pp),
    ``criterion``, ``judged``, ``noise_floor_pp``, median ``encode_ms`` and ``decode_ms``."""
    cal = _Calibration(bundle, cand, data, opts)
    out: dict[str, dict[str, Any]] = {}
    for key, rt in roundtrips.items():
        tr = cal.trial({}, rt)
        drop, bound = cal.drop(tr)
        out[key] = {"bytes": float(np.mean(tr.sizes)), "quality_loss": round(drop, 4),
                    "quality_loss_bound": round(bound, 4), "criterion": cal.criterion,
                    "judged": cal.judged(), "inputs": len(data),
                    "noise_floor_pp": round(cal.noise.floor_pp, 4),
                    "encode_ms": round(1e3 * float(np.median(tr.encode_s)), 3),
                    "decode_ms": round(1e3 * float(np.median(tr.decode_s)), 3)}
    return out


def calibrate_candidate(bundle: Bundle, cand: Candidate, data: Dataset, specs: Sequence[str],
                        opts: Options | None = None) -> list[dict[str, Any]]:
    """The packing table of one candidate (rows as in :mod:`convert.calibrate`, plus
    ``metric``, ``tensors``, ``promoted``, ``steps`` and ``drift_rel_l2`` where they apply)."""
    opts = opts or Options()
    _check_tensor_packing(opts)
    widths = ans_bits(specs)
    cal = _Calibration(bundle, cand, data, opts, PriorFit(cand, widths) if widths else None)
    n = len(data)
    mean_float = cal.float_bytes / n
    rows: list[dict[str, Any]] = []
    for spec_text in specs:
        spec = PackSpec.parse(spec_text)
        if spec.is_media and not codec_applies(bundle, cand, spec.codec):
            continue  # no image- or audio-like tensor crosses here: no codec candidate
        assign = base_assignment(cand, str(spec), opts)
        tr = cal.trial(assign)
        drop, bound = cal.drop(tr)
        promoted: list[str] = []
        uniform = drop
        lossy = [t for t, s in assign.items() if not PackSpec.parse(s).lossless
                 and _is_float(cand, t)]
        if drop > opts.tolerance_pp \
                and 2 <= len(lossy) <= MAX_PROMOTE_TENSORS and spec.codec == "q":
            promoted = _to_promote(cal, assign, lossy, opts.tolerance_pp)
            if promoted:
                assign = {k: (PROMOTE_TO if k in promoted else s) for k, s in assign.items()}
                tr = cal.trial(assign)
                drop, bound = cal.drop(tr)
        mean_bytes = float(np.mean(tr.sizes))
        row: dict[str, Any] = {
            "spec": str(spec),
            "codec": spec.codec,
            "bits": spec.sample_bits,
            "mean_bytes": round(mean_bytes, 2),
            "ratio": round(mean_float / mean_bytes, 3) if mean_bytes else 0.0,
            "accuracy_drop_pp": round(drop, 4),
            "top1_agreement": round(float(np.mean(tr.agree)), 5),
            "rel_l2": float(f"{float(np.mean(tr.rel)):.4g}"),
            "samples": cal.judged(),
            "inputs": n,
            "accuracy_drop_upper_pp": round(bound, 4),
            "metric": cal.metric_label,
            "criterion": cal.criterion,
            "noise_floor_pp": round(cal.noise.floor_pp, 4),
        }
        if cal.criterion == "stable":
            row["accuracy_drop_all_pp"] = round(100.0 * float(np.mean(tr.losses)), 4)
        if cal.ref_correct:  # what the drops are from: the unpacked model against the labels
            row["model_accuracy_pct"] = round(100.0 * float(np.mean(cal.ref_correct)), 4)
        if all(tr.exact):  # every input came back: no sample bound needed
            row["exact"] = True
        # what packing and unpacking take on this machine: the planner prices every packing
        row["encode_ms"] = round(1e3 * float(np.median(tr.encode_s)), 4)
        row["decode_ms"] = round(1e3 * float(np.median(tr.decode_s)), 4)
        if spec.codec == "ans" and cal.fit is not None:  # the tables fitted on every input
            row["priors"] = cal.fit.row_priors(cal.specs(assign))
        if spec.is_media:
            row["quality"] = spec.quality
            row["ranges"] = {k: [[float(f"{a:.9g}"), float(f"{b:.9g}")] for a, b in v]
                             for k, v in cal.ranges.items()}
        if any(s != str(spec) for s in assign.values()):
            row["tensors"] = dict(assign)
        if promoted:
            row["promoted"] = promoted
            row["unpromoted_drop_pp"] = round(uniform, 4)
        if cal.pairs:
            row["steps"] = max(len(s) for s in cal.sequences)
            row["sequences"] = len(cal.sequences)
            row["drift_rel_l2"] = float(f"{float(np.mean(tr.drift)):.4g}")
            row["final_drift_rel_l2"] = float(f"{float(np.mean(tr.final)):.4g}")
        rows.append(row)
    return drop_dominated(rows)


def _check_tensor_packing(opts: Options) -> None:
    """Every ``--tensor-packing`` override names a packing (else :class:`InputError`)."""
    for name, s in opts.tensor_packing.items():
        try:
            PackSpec.parse(s)
        except ValueError as exc:
            raise InputError(f"--tensor-packing {name}={s}: {exc}") from None


def _to_promote(cal: _Calibration, assign: Mapping[str, str], lossy: Sequence[str],
                tolerance_pp: float) -> list[str]:
    """The ``lossy`` tensors whose drop, each packed alone as assigned (the others lossless),
    exceeds its share of the tolerance: they travel as :data:`PROMOTE_TO` instead."""
    share = tolerance_pp / len(lossy)
    promoted = []
    for t in lossy:
        solo = {k: (s if k == t else LOSSLESS) for k, s in assign.items()}
        if cal.drop(cal.trial(solo))[0] > share:
            promoted.append(t)
    return promoted


def _is_float(cand: Candidate, name: str) -> bool:
    return any(t.name == name and np.dtype(t.dtype).kind == "f" for t in cand.crossing)


def record(meta: dict[str, Any], results: Mapping[str, list[dict[str, Any]]],
           options: Options | None) -> None:
    """Record in the manifest's calibration entry what the drops measure."""
    opts = options or Options()
    names = sorted({str(r["metric"]) for rows in results.values() for r in rows
                    if "metric" in r})
    if len(names) == 1:
        meta["metric"] = names[0]
    meta["metric_spec"] = opts.metric.describe()
    meta["tolerance_pp"] = opts.tolerance_pp
    meta.update(criterion_summary(results))
    meta["state_packing"] = "as rows" if opts.pack_state else LOSSLESS
    if opts.tensor_packing:
        meta["tensor_packing"] = dict(opts.tensor_packing)
    if opts.sequence_length is not None:
        meta["sequence_length"] = opts.sequence_length
