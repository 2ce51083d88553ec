"""Task-aware accuracy metrics: how much packing changed what the model *decides*.

A metric compares the outputs of a packed run with the unpacked (reference) run of the same
input and gives a per-sample **loss** (0 = the same answer). The calibration table's
``accuracy_drop_pp`` is ``100 x mean loss``: percentage points of answers changed, or, for
continuous metrics, of score lost. Names (``--metric``):

==================  =================================================================  =========
name                per-sample loss                                                    kind
==================  =================================================================  =========
``top1``            share of positions (last axis = classes) whose argmax changed;      decision
                    with labels and one position: reference correct, packed wrong
``top5``/``topK``   share of positions whose reference argmax left the packed top-K     decision
``iou@T``           ``1 - IoU`` of the masks ``output > T`` (both empty: 0)             score
``decision@T``      share of elements whose ``output > T`` decision flipped            decision
``maxrel``          ``max|test - ref| / max|ref|``                                      error
``meanrel``         ``mean|test - ref| / mean|ref|``                                    error
``cosine``          ``1 - cos(test, ref)`` of the flattened outputs                     score
``cents@T``         pitch: share of the frames the reference calls voiced whose pitch   decision
                    moved by more than T cents (``1200 log2(test / ref)``); the
                    outputs are (pitch, confidence), voiced = reference confidence
                    >= 0.5 (swift-f0's rule); with pitch alone, every frame whose
                    reference pitch is > 0; no voiced frame: 0. With labels (a
                    pitch in Hz per input): raw pitch accuracy, the share of
                    frames within T cents of the label
``ctc``             a CTC recogniser's per-step class ids (``--post argmax``): 1 when   decision
                    the greedy decodings (repeats collapsed, blank 0 dropped) differ;
                    with labels (each a row of class ids, padded with -1): reference
                    reads the label, packed does not. ``ctc@I,J``: ids I, J also
                    dropped from both sides (a word accuracy that ignores the space)
``class``           outputs that hold class ids (``--post argmax`` or the indices of   decision
                    ``--post topk:K``): share of positions whose first id changed
``boxes@T``         detections ``[1, K, 6]`` (cx, cy, w, h, score, class; ``--post        decision
                    boxes:K``): the boxes scoring >= 0.25 on each side are matched
                    greedily (same class, IoU >= T); loss = 1 - F1 of the matching
                    (both empty: 0)
``lines@T``         a text detector's mask (``--post mask:K``): each connected region is  decision
                    a text line, its box grown by DBNet's unclip (convert/textlines.py);
                    loss = 1 - F1 of the lines matched one to one at IoU >= T (both
                    empty: 0). With labels (each a [L, 4] array of line boxes x0, y0,
                    x1, y1 in fractions of the input, rows of -1 after the last):
                    accuracy = F1 against the labelled lines
``MODULE:FUNC``     ``1 - FUNC(outputs_ref, outputs_test)``; FUNC returns a score in      score
                    [0, 1], 1 = identical; both arguments are lists of the metric's
                    outputs (arrays, in model order); ``MODULE`` may be a ``.py`` path
==================  =================================================================  =========

Each metric applies to the chosen outputs (``--metric-output NAME``, repeatable; default the
first graph output); with several, the loss is their mean.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from coinf.convert import textlines

from coinf.errors import InputError

_THRESH = re.compile(r"^(iou|decision)@(-?[0-9.]+(?:e-?\d+)?)$")
_TOPK = re.compile(r"^top(\d{1,3})$")
_CENTS = re.compile(r"^cents@([0-9.]+(?:e-?\d+)?)$")
_BOXES = re.compile(r"^boxes@(0?\.[0-9]+|1(?:\.0*)?)$")
_CTC = re.compile(r"^ctc(?:@(\d{1,9}(?:,\d{1,9})*))?$")
_LINES = re.compile(r"^lines@(0?\.[0-9]+|1(?:\.0*)?)$")
BUILTIN = ("top1", "topK", "iou@T", "decision@T", "maxrel", "meanrel", "cosine", "cents@T",
           "class", "ctc", "ctc@IDS", "boxes@T", "lines@T")
BOX_SCORE = 0.25
"""``boxes@T``: the score from which a detection counts (on both sides)."""
EPS = 1e-12
VOICED = 0.5
"""``cents@T``: a frame is voiced when the reference confidence is at least this (swift-f0's
``PitchResult.confidence`` rule)."""


Label = int | float | np.ndarray | None
"""One input's label: a class id (``top1``), a row of class ids padded with -1 (``ctc``), a
pitch in Hz (``cents@T``) or line boxes (``lines@T``)."""


@dataclass
class Metric:
    """A parsed ``--metric`` applied to ``outputs`` (names; empty = the first graph output)."""

    name: str = "top1"
    outputs: tuple[str, ...] = ()
    _fn: Callable[..., Any] | None = field(default=None, repr=False, compare=False)

    def describe(self) -> dict[str, Any]:
        """What the manifest records."""
        return {"name": self.name, "outputs": list(self.outputs)}

    def judges_labels(self, label_ndim: int, positions: int) -> bool:
        """Whether labels of ``label_ndim`` dims per input judge this metric: class ids for
        ``top1`` on one position, id rows for ``ctc``, one pitch (Hz) for ``cents@T``."""
        return (self.name == "top1" and label_ndim == 0 and positions <= 1) \
            or (self._ctc_drop() is not None and label_ndim == 1) \
            or (self.cents is not None and label_ndim == 0) \
            or (self.lines is not None and label_ndim == 2)

    @property
    def cents(self) -> float | None:
        """``cents@T``'s T, else None."""
        m = _CENTS.match(self.name)
        return float(m.group(1)) if m else None

    @property
    def lines(self) -> float | None:
        """``lines@T``'s IoU threshold T, else None."""
        m = _LINES.match(self.name)
        return float(m.group(1)) if m else None

    @property
    def label_kind(self) -> str:
        """What a label holds for this metric (for messages)."""
        if self._ctc_drop() is not None:
            return "a row of class ids (padded with -1)"
        if self.lines is not None:
            return "line boxes [L, 4] (x0, y0, x1, y1 in fractions of the input)"
        return "one pitch in Hz" if self.cents is not None else "one class id"

    def _ctc_drop(self) -> frozenset[int] | None:
        """For ``ctc``/``ctc@IDS``: the ids dropped besides the blank; else None."""
        m = _CTC.match(self.name)
        if m is None:
            return None
        return frozenset(int(v) for v in m.group(1).split(",")) if m.group(1) else frozenset()

    def correct(self, test: np.ndarray, label: Label) -> float:
        """How far the output ``test`` gives ``label``, in [0, 1] (``top1``: the argmax is it;
        ``ctc``: the greedy decoding equals the label's ids; ``cents@T``: the share of frames
        whose pitch is within T cents of the label, raw pitch accuracy)."""
        if label is None:
            return 0.0
        if self.lines is not None:
            return textlines.f1(textlines.label_boxes(np.asarray(label)),
                                textlines.line_boxes(test), self.lines)
        if self.cents is not None:
            with np.errstate(divide="ignore", invalid="ignore"):
                moved = np.abs(1200.0 * np.log2(np.asarray(test, np.float64).reshape(-1)
                                                / float(np.asarray(label))))
            return float(np.mean(moved <= self.cents)) if moved.size else 0.0
        drop = self._ctc_drop()
        if drop is not None:
            want = np.asarray(label).reshape(-1)
            return _ctc(test, drop) == [int(c) for c in want[want >= 0] if int(c) not in drop]
        flat = np.asarray(test).reshape(-1)
        return bool(flat.size) and int(np.argmax(flat)) == int(np.asarray(label))

    def loss(self, ref: Sequence[np.ndarray], test: Sequence[np.ndarray],
             label: Label = None) -> float:
        """Per-sample loss over the metric's outputs (``ref``/``test`` in that order)."""
        if self._fn is not None:
            try:
                score = float(self._fn([np.asarray(r) for r in ref],
                                       [np.asarray(t) for t in test]))
            except Exception as exc:
                raise InputError(f"--metric {self.name}: the function failed: "
                                 f"{type(exc).__name__}: {exc}") from None
            if not math.isfinite(score):
                raise InputError(f"--metric {self.name}: the function returned {score}; "
                                 "expected a score in [0, 1]")
            return 1.0 - score
        if (self.cents is not None or self.lines is not None) and label is not None:
            # the answer's share right on the clean run, lost on this one
            return max(0.0, self.correct(ref[0], label) - self.correct(test[0], label))
        if self.cents is not None:
            return cents_loss(ref, test, self.cents)
        vals = [self._one(np.asarray(r), np.asarray(t), label if len(ref) == 1 else None)
                for r, t in zip(ref, test, strict=True)]
        return float(np.mean(vals))

    def _one(self, ref: np.ndarray, test: np.ndarray, label: Label) -> float:
        name = self.name
        if name == "class":
            r, t = _rows(ref), _rows(test)
            return float(np.mean(r[:, 0] != t[:, 0])) if r.size else 0.0
        drop = self._ctc_drop()
        if drop is not None:
            if label is not None and np.ndim(label) == 1:
                return float(self.correct(ref, label) and not self.correct(test, label))
            return float(_ctc(ref, drop) != _ctc(test, drop))
        box = _BOXES.match(name)
        if box:
            return boxes_loss(ref, test, float(box.group(1)))
        if self.lines is not None:
            return 1.0 - textlines.f1(textlines.line_boxes(ref), textlines.line_boxes(test),
                                      self.lines)
        m = _TOPK.match(name)
        if m:
            k = int(m.group(1))
            r = _rows(ref)
            t = _rows(test)
            if k == 1:
                rt, tt = r.argmax(-1), t.argmax(-1)
                if label is not None and np.ndim(label) == 0 and len(rt) == 1:
                    y = int(np.asarray(label))
                    return float(rt[0] == y and tt[0] != y)
                return float(np.mean(rt != tt))
            kk = min(k, t.shape[-1])
            top = np.argpartition(-t, kk - 1, axis=-1)[:, :kk]
            want = r.argmax(-1)[:, None]
            return float(np.mean(~(top == want).any(-1)))
        m = _THRESH.match(name)
        if m:
            thr = float(m.group(2))
            a, b = ref > thr, test > thr
            if m.group(1) == "decision":
                return float(np.mean(a != b)) if a.size else 0.0
            union = np.logical_or(a, b).sum()
            return 0.0 if union == 0 else 1.0 - float(np.logical_and(a, b).sum()) / float(union)
        r64, t64 = ref.astype(np.float64).reshape(-1), test.astype(np.float64).reshape(-1)
        if name == "maxrel":
            return float(np.max(np.abs(t64 - r64), initial=0.0)
                         / max(float(np.max(np.abs(r64), initial=0.0)), EPS))
        if name == "meanrel":
            return float(np.mean(np.abs(t64 - r64)) / max(float(np.mean(np.abs(r64))), EPS)) \
                if r64.size else 0.0
        if name == "cosine":
            nr, nt = float(np.linalg.norm(r64)), float(np.linalg.norm(t64))
            if nr < EPS and nt < EPS:
                return 0.0
            return 1.0 - float(r64 @ t64) / max(nr * nt, EPS)
        raise AssertionError(name)


def cents_loss(ref: Sequence[np.ndarray], test: Sequence[np.ndarray], cents: float) -> float:
    """``cents@T``: share of the reference's voiced frames whose pitch moved by more than
    ``cents``. ``ref``/``test`` are ``[pitch]`` or ``[pitch, confidence]`` (same shapes)."""
    if len(ref) not in (1, 2):
        raise InputError(f"--metric cents@{cents:g}: expected the outputs pitch and confidence "
                         f"(--metric-output twice) or pitch alone, got {len(ref)} outputs")
    rp = np.asarray(ref[0], dtype=np.float64).reshape(-1)
    tp = np.asarray(test[0], dtype=np.float64).reshape(-1)
    voiced = rp > 0
    if len(ref) == 2:
        conf = np.asarray(ref[1], dtype=np.float64).reshape(-1)
        if conf.shape != rp.shape:
            raise InputError(f"--metric cents@{cents:g}: pitch has {rp.size} frames, confidence "
                             f"{conf.size}")
        voiced &= conf >= VOICED
    if not voiced.any():
        return 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        moved = np.abs(1200.0 * np.log2(tp[voiced] / rp[voiced]))
    return float(np.mean(~(moved <= cents)))  # NaN (test pitch <= 0) counts as moved


def boxes_loss(ref: np.ndarray, test: np.ndarray, iou: float,
               score: float = BOX_SCORE) -> float:
    """``1 - F1`` of the detections (rows cx, cy, w, h, score, class) scoring >= ``score``,
    matched greedily by IoU (>= ``iou``, same class), best reference box first."""
    r = ref.reshape(-1, 6).astype(np.float64)
    t = test.reshape(-1, 6).astype(np.float64)
    r, t = r[r[:, 4] >= score], t[t[:, 4] >= score]
    if len(r) == 0 and len(t) == 0:
        return 0.0
    free = np.ones(len(t), bool)
    hits = 0
    for box in r[np.argsort(-r[:, 4])]:
        ious = _iou(box, t) * free * (t[:, 5] == box[5])
        if ious.size and ious.max() >= iou:
            free[int(ious.argmax())] = False
            hits += 1
    return 1.0 - 2.0 * hits / (len(r) + len(t))


def _iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """IoU of one (cx, cy, w, h) box with each row of ``others``."""
    def corners(b: np.ndarray) -> tuple[np.ndarray, ...]:
        return (b[..., 0] - b[..., 2] / 2, b[..., 1] - b[..., 3] / 2,
                b[..., 0] + b[..., 2] / 2, b[..., 1] + b[..., 3] / 2)

    ax0, ay0, ax1, ay1 = corners(box)
    bx0, by0, bx1, by1 = corners(others)
    w = np.clip(np.minimum(ax1, bx1) - np.maximum(ax0, bx0), 0, None)
    h = np.clip(np.minimum(ay1, by1) - np.maximum(ay0, by0), 0, None)
    inter = w * h
    union = (ax1 - ax0) * (ay1 - ay0) + (bx1 - bx0) * (by1 - by0) - inter
    return np.where(union > 0, inter / np.maximum(union, EPS), 0.0)


def _ctc(ids: np.ndarray, drop: frozenset[int] = frozenset()) -> list[int]:
    """Greedy CTC decoding of per-step class ids: repeats collapsed, the blank (0) and the ids
    in ``drop`` dropped."""
    flat = np.asarray(ids).reshape(-1).astype(np.int64)
    if flat.size == 0:
        return []
    keep = np.ones(flat.size, dtype=bool)
    keep[1:] = flat[1:] != flat[:-1]
    return [int(c) for c in flat[keep & (flat != 0)] if int(c) not in drop]


def _rows(a: np.ndarray) -> np.ndarray:
    """Positions x classes: the last axis holds the classes (a vector is one position)."""
    a = np.asarray(a, dtype=np.float64)
    if a.ndim == 0:
        return a.reshape(1, 1)
    return a.reshape(-1, a.shape[-1])


def _load_function(spec: str) -> Callable[..., Any]:
    module, _, func = spec.rpartition(":")
    try:
        if module.endswith(".py"):
            path = Path(module)
            if not path.is_file():
                raise InputError(f"--metric {spec}: no such file {module}")
            loader = importlib.util.spec_from_file_location(f"coinf_metric_{path.stem}", path)
            if loader is None or loader.loader is None:
                raise InputError(f"--metric {spec}: cannot import {module}")
            mod = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(mod)
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))
            mod = importlib.import_module(module)
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"--metric {spec}: cannot import {module!r}: {type(exc).__name__}: "
                         f"{exc}") from None
    fn = getattr(mod, func, None)
    if not callable(fn):
        raise InputError(f"--metric {spec}: {module!r} has no function {func!r}")
    return fn


def parse_metric(text: str | None, outputs: Sequence[str] = (),
                 model_outputs: Sequence[str] = ()) -> Metric:
    """A :class:`Metric` from ``--metric`` and ``--metric-output``; :class:`InputError` naming
    the choices when either is wrong."""
    name = (text or "top1").strip()
    bad = [o for o in outputs if model_outputs and o not in model_outputs]
    if bad:
        raise InputError(f"--metric-output {bad[0]!r}: not a model output; the outputs are "
                         f"{', '.join(model_outputs)}")
    chosen = tuple(outputs)
    if ":" in name and not name.startswith(("iou@", "decision@")):
        module, _, func = name.rpartition(":")
        if not module or not func:
            raise InputError(f"--metric {name!r}: expected MODULE:FUNCTION")
        return Metric(name, chosen, _load_function(name))
    name = name.lower()
    t = _THRESH.match(name)
    if t:
        try:
            float(t.group(2))
        except ValueError:
            raise InputError(f"--metric {text!r}: {t.group(2)!r} is not a threshold") from None
    k = _TOPK.match(name)
    c = _CENTS.match(name)
    if c:
        try:
            float(c.group(1))
        except ValueError:
            raise InputError(f"--metric {text!r}: {c.group(1)!r} is not a number of cents"
                             ) from None
    if (k and int(k.group(1)) >= 1) or _THRESH.match(name) or c or _BOXES.match(name) \
            or _LINES.match(name) \
            or _CTC.match(name) or name in ("maxrel", "meanrel", "cosine", "class"):
        return Metric(name, chosen)
    raise InputError(f"--metric {text!r}: expected one of {', '.join(BUILTIN)} (e.g. top1, "
                     "top5, iou@0.5, decision@0.5, cents@50, class, ctc@6624, boxes@0.5, "
                     "lines@0.5) or "
                     "MODULE:FUNCTION")


def samples_for_bound(tolerance_pp: float, confidence: float = 0.95) -> int:
    """The fewest inputs whose upper bound (:func:`upper_bound_pp`, no failure among them) is
    within ``tolerance_pp``: the least any measurement needs to establish that tolerance."""
    if not 0 < tolerance_pp <= 100:
        raise ValueError(f"tolerance {tolerance_pp} pp: expected (0, 100]")
    if tolerance_pp >= 100:
        return 1
    return max(1, math.ceil(math.log(1 - confidence) / math.log(1 - tolerance_pp / 100) - 1e-9))


def upper_bound_pp(losses: np.ndarray, confidence: float) -> float:
    """One-sided upper bound (pp) on the mean loss: Clopper-Pearson on the count of failures
    for 0/1 losses; for fractional losses, on ``ceil(sum(min(loss, 1)))`` failures (a loss in
    [0, 1] spreads no wider than a Bernoulli of the same mean), never below the mean."""
    n = len(losses)
    if n == 0:
        return 100.0
    clipped = np.clip(losses, 0.0, 1.0)
    k = math.ceil(float(clipped.sum()) - 1e-9)
    if k >= n:
        bound = 1.0
    else:
        from scipy.stats import beta

        bound = float(beta.ppf(confidence, k + 1, n - k))
    return max(100.0 * bound, 100.0 * float(np.mean(losses)))
