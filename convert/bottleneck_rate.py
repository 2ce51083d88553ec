"""Where a learned bottleneck's rate points go: the latent's quantisation step from the cut's own
statistics, not a fixed list (docs/BOTTLENECK.md, "Rate points").

At step 0 a bottleneck is a transform coder: the principal components of the cut's normalised
tensor, scaled by a gain and rounded. The gain alone sets its rate and its distortion, and both
can be measured without training: :func:`sweep` rounds the training crossing at a ladder of
gains, estimates each one's bytes per frame from the latents' own histograms, and runs the
bundle's tail (onnxruntime) on the reconstruction to measure the task metric the bundle was
calibrated with (its loss against the unpacked model's answers, what the app consumes) and the
relative L2 error of the output that metric reads.

:func:`pick_gains` takes the coarsest gain whose loss is within the tolerance and its neighbours
on the ladder; training (with the tail, or in feature space) lowers the distortion from there.
A bundle never calibrated has no metric: the target is then 5 % output error.
:func:`reference` names the calibrated packing the points must beat at the cut (fewest bytes
within the tolerance), for the progress line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from coinf.bundle import Bundle, Candidate

#: the ladder of gains tried: 2^(k/2), 0.5 .. 64
LADDER = tuple(2.0 ** (k / 2) for k in range(-2, 13))
#: the output error aimed at when the cut was never calibrated
FALLBACK_REL_L2 = 0.05
#: feeds the sweep runs through the tail
SWEEP_FEEDS = 64


@dataclass(frozen=True)
class Reference:
    """What the cut's calibration says the task tolerates: the packing ``spec`` that sends
    fewest bytes within the tolerance, its ``bytes`` and the output error ``rel_l2`` it made."""

    spec: str
    bytes: float
    rel_l2: float
    loss_pp: float


@dataclass(frozen=True)
class Step:
    """One gain of the sweep: estimated bytes per frame and the output's mean relative L2."""

    gain: float
    bytes: float
    rel_l2: float
    #: the task metric's mean loss against the unpacked model, pp (None without a metric)
    loss_pp: float | None = None


def reference(cand: Candidate, tolerance_pp: float) -> Reference | None:
    """The calibrated packing at ``cand`` that sends fewest bytes within ``tolerance_pp``
    (measured loss), with its output error; None when the cut was never calibrated."""
    from coinf.convert.calibrate import packing_rows

    fits = []
    for row in packing_rows(cand):
        try:
            loss, rel, size = (float(row["accuracy_drop_pp"]), float(row["rel_l2"]),
                               float(row["mean_bytes"]))
        except (KeyError, TypeError, ValueError):
            continue
        if loss <= tolerance_pp and math.isfinite(rel) and rel > 0:
            fits.append(Reference(str(row.get("spec")), size, rel, loss))
    return min(fits, key=lambda r: (r.bytes, -r.rel_l2)) if fits else None


def calibration_metric(bundle: Bundle) -> Any:
    """The task metric the bundle was calibrated with (``packing_calibration.metric_spec``), or
    None when it never was."""
    from coinf.convert.metrics import parse_metric

    spec = bundle.meta.get("packing_calibration")
    ms = spec.get("metric_spec") if isinstance(spec, dict) else None
    if not isinstance(ms, dict) or not isinstance(ms.get("name"), str):
        return None
    outs = [o for o in ms.get("outputs", []) if isinstance(o, str)]
    return parse_metric(ms["name"], outs)


def histogram_bytes(latents: np.ndarray) -> float:
    """Mean bytes per frame of integer latents ``(N, C, ...)`` under per-channel histograms of
    their own (what a factorized entropy model fitted to them spends)."""
    n, c = latents.shape[:2]
    sym = np.rint(latents).astype(np.int64).reshape(n, c, -1)
    bits = 0.0
    for ch in range(c):
        _, counts = np.unique(sym[:, ch], return_counts=True)
        p = counts / counts.sum()
        bits += float(-(counts * np.log2(p)).sum())
    return bits / 8 / n + 4


def sweep(bundle: Bundle, cand: Candidate, crossing: np.ndarray,
          coder: Callable[[float], tuple[Callable[[np.ndarray], np.ndarray],
                                         Callable[[np.ndarray], np.ndarray]]],
          gains: Sequence[float] = LADDER, feeds: int = SWEEP_FEEDS,
          progress: Callable[[str, int, int], None] | None = None) -> list[Step]:
    """Each gain's estimated bytes per frame, task-metric loss and output error on ``feeds``
    frames of ``crossing``: ``coder(gain)`` gives (encode to rounded latents, decode) in
    numpy."""
    import onnxruntime as ort
    from coinf.convert.packcal import metric_outputs

    assert cand.tail.file is not None
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    tail = ort.InferenceSession(str(bundle.path(cand.tail.file)), opts,
                                providers=["CPUExecutionProvider"])
    metric = calibration_metric(bundle)
    names = [o.name for o in tail.get_outputs()]
    outs = [o for o in metric_outputs(bundle, metric) if o in names] or names[:1]
    name = cand.crossing[0].name
    pick = np.linspace(0, len(crossing) - 1, min(feeds, len(crossing))).round().astype(int)
    sample = np.ascontiguousarray(crossing[np.unique(pick)], np.float32)
    refs = [tail.run(outs, {name: sample[i:i + 1]}) for i in range(len(sample))]
    steps = []
    for k, gain in enumerate(gains):
        encode, decode = coder(gain)
        codes = encode(sample)
        restored = decode(codes)
        rel, loss = [], []
        for i, ref in enumerate(refs):
            got = tail.run(outs, {name: np.ascontiguousarray(restored[i:i + 1], np.float32)})
            r64 = ref[0].astype(np.float64)
            rel.append(float(np.linalg.norm(got[0].astype(np.float64) - r64))
                       / (float(np.linalg.norm(r64)) or 1.0))
            if metric is not None:
                loss.append(metric.loss(ref, got))
        steps.append(Step(float(gain), histogram_bytes(codes), float(np.mean(rel)),
                          100 * float(np.mean(loss)) if loss else None))
        if progress is not None:
            progress("rate sweep", k + 1, len(gains))
    return steps


def matched_lambda(model: Any, crossing: np.ndarray, gain: float,
                   feeds: int = SWEEP_FEEDS) -> float:
    """Lambda for training in feature space that holds the rate where ``gain`` puts it: the
    untrained coder's own slope there, the drop of the mean squared error per value (normalised
    per channel, as the feature loss is) per bit a frame added, between the ladder's neighbours
    of ``gain``. A smaller lambda lets training buy fidelity with bytes."""
    pick = np.linspace(0, len(crossing) - 1, min(feeds, len(crossing))).round().astype(int)
    x = np.ascontiguousarray(crossing[np.unique(pick)], np.float32)
    axes = (0, *range(2, x.ndim))
    std = x.std(axes, keepdims=True) + 1e-6 * max(float(x.std()), 1e-6)
    coder = numpy_coder(model)
    ends = []
    for g in (gain / math.sqrt(2), gain * math.sqrt(2)):
        encode, decode = coder(g)
        codes = encode(x)
        ends.append((float(np.mean(((decode(codes) - x) / std) ** 2)),
                     8 * (histogram_bytes(codes) - 4)))
    (d_lo, b_lo), (d_hi, b_hi) = ends
    coder(gain)  # the model back at its gain
    return float(f"{max(d_lo - d_hi, 0.0) / max(b_hi - b_lo, 1.0):.2g}")


def pick_gains(steps: Sequence[Step], tolerance_pp: float, n: int = 3) -> list[float]:
    """``n`` gains around the coarsest whose task loss is within ``tolerance_pp`` (without a
    metric: whose output error is within :data:`FALLBACK_REL_L2`): that one, then alternately
    one coarser and one finer on the ladder (coarser first: training lowers the distortion from
    where it starts)."""
    ordered = sorted(steps, key=lambda s: s.gain)
    fits = [k for k, s in enumerate(ordered)
            if (s.rel_l2 <= FALLBACK_REL_L2 if s.loss_pp is None else s.loss_pp <= tolerance_pp)]
    at = fits[0] if fits else len(ordered) - 1
    picked, k = [at], 1
    while len(picked) < min(n, len(ordered)):
        for j in (at - k, at + k):
            if 0 <= j < len(ordered) and len(picked) < n:
                picked.append(j)
        k += 1
    return [ordered[j].gain for j in sorted(picked)]


def describe(ref: Reference | None, steps: Sequence[Step], gains: Sequence[float]) -> str:
    """One line: the gains chosen with their estimated bytes and loss, and the calibrated
    packing they must beat."""
    by = {s.gain: s for s in steps}
    picks = ", ".join(
        f"{g:.3g} (~{by[g].bytes:,.0f} B, " + (f"{by[g].loss_pp:.1f} pp)" if by[g].loss_pp
                                             is not None else f"output error {by[g].rel_l2:.3f})")
        for g in gains)
    beat = (f"; to beat: calibrated {ref.spec}, {ref.bytes:,.0f} B at {ref.loss_pp:.2f} pp"
            if ref is not None else "")
    return f"rate points at gains {picks}, as swept before training{beat}"


def numpy_coder(model: Any) -> Callable[[float], tuple[Callable[[np.ndarray], np.ndarray],
                                                       Callable[[np.ndarray], np.ndarray]]]:
    """``coder(gain)`` for :func:`sweep` from an untrained torch bottleneck (its principal
    components): the gain replaces its own."""
    import torch

    def coder(gain: float) -> tuple[Callable[[np.ndarray], np.ndarray],
                                    Callable[[np.ndarray], np.ndarray]]:
        with torch.no_grad():
            model.log_gain.fill_(math.log(gain))

        @torch.no_grad()
        def encode(x: np.ndarray) -> np.ndarray:
            return np.concatenate([torch.round(model.encode(torch.from_numpy(x[i:i + 16])))
                                   .numpy() for i in range(0, len(x), 16)])

        @torch.no_grad()
        def decode(y: np.ndarray) -> np.ndarray:
            return np.concatenate([model.decode(torch.from_numpy(y[i:i + 16])).numpy()
                                   for i in range(0, len(y), 16)])
        return encode, decode
    return coder


__all__ = ["FALLBACK_REL_L2", "LADDER", "Reference", "Step", "calibration_metric", "describe",
           "histogram_bytes", "matched_lambda", "numpy_coder", "pick_gains",
           "reference", "sweep"]
