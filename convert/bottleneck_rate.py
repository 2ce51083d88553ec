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
from pathlib import Path
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


class _Judge:
    """The bundle's tail at ``cand`` in onnxruntime, reading the outputs the calibrated metric
    reads (else its first), and that metric (None when the bundle was never calibrated)."""

    def __init__(self, bundle: Bundle, cand: Candidate) -> None:
        import onnxruntime as ort
        from coinf.convert.packcal import metric_outputs

        assert cand.tail.file is not None
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.log_severity_level = 3
        self.tail = ort.InferenceSession(str(bundle.path(cand.tail.file)), opts,
                                         providers=["CPUExecutionProvider"])
        self.metric = calibration_metric(bundle)
        names = [o.name for o in self.tail.get_outputs()]
        self.outs = [o for o in metric_outputs(bundle, self.metric) if o in names] or names[:1]
        self.name = cand.crossing[0].name

    def run(self, frame: np.ndarray) -> list[np.ndarray]:
        """The tail's outputs for one crossing frame ``(1, ...)``."""
        return list(self.tail.run(self.outs, {self.name: np.ascontiguousarray(frame,
                                                                               np.float32)}))

    def compare(self, refs: Sequence[Sequence[np.ndarray]], restored: np.ndarray
                ) -> tuple[float, float | None]:
        """(mean relative L2 of the first output, mean metric loss in pp or None) of the
        reconstructions ``restored`` (N, ...) against the outputs ``refs`` of the originals."""
        rel, loss = [], []
        for i, ref in enumerate(refs):
            got = self.run(restored[i:i + 1])
            r64 = ref[0].astype(np.float64)
            rel.append(float(np.linalg.norm(got[0].astype(np.float64) - r64))
                       / (float(np.linalg.norm(r64)) or 1.0))
            if self.metric is not None:
                loss.append(self.metric.loss(ref, got))
        return float(np.mean(rel)), (100 * float(np.mean(loss)) if loss else None)


def sweep(bundle: Bundle, cand: Candidate, crossing: np.ndarray,
          coder: Callable[[float], tuple[Callable[[np.ndarray], np.ndarray],
                                         Callable[[np.ndarray], np.ndarray]]],
          gains: Sequence[float] = LADDER, feeds: int = SWEEP_FEEDS,
          progress: Callable[[str, int, int], None] | None = None) -> list[Step]:
    """Each gain's estimated bytes per frame, task-metric loss and output error on ``feeds``
    frames of ``crossing``: ``coder(gain)`` gives (encode to rounded latents, decode) in
    numpy."""
    judge = _Judge(bundle, cand)
    pick = np.linspace(0, len(crossing) - 1, min(feeds, len(crossing))).round().astype(int)
    sample = np.ascontiguousarray(crossing[np.unique(pick)], np.float32)
    refs = [judge.run(sample[i:i + 1]) for i in range(len(sample))]
    steps = []
    for k, gain in enumerate(gains):
        encode, decode = coder(gain)
        codes = encode(sample)
        rel, loss = judge.compare(refs, decode(codes))
        steps.append(Step(float(gain), histogram_bytes(codes), rel, loss))
        if progress is not None:
            progress("rate sweep", k + 1, len(gains))
    return steps


def cached_sweep(path: Path, reuse: bool, bundle: Bundle, cand: Candidate, crossing: np.ndarray,
                 coder: Callable[[], Any], config: str,
                 progress: Callable[[str, int, int], None] | None = None) -> list[Step]:
    """:func:`sweep` of ``coder()`` (made only when needed), written to ``path`` (JSON) and,
    with ``reuse`` (``--resume``), read back instead of sweeping again when the cut, the
    training crossing, the coder's ``config`` and the calibrated metric are the same; a file
    that does not parse or does not match is swept again and replaced."""
    import hashlib
    import json

    metric = bundle.meta.get("packing_calibration", {})
    metric = metric.get("metric_spec") if isinstance(metric, dict) else None
    digest = hashlib.sha256(np.ascontiguousarray(crossing, np.float32).tobytes())
    digest.update(json.dumps([cand.id, config, metric, list(LADDER), SWEEP_FEEDS],
                             sort_keys=True, default=str).encode())
    key = digest.hexdigest()
    if reuse and path.is_file():
        try:
            obj = json.loads(path.read_text())
            if obj.get("key") == key:
                return [Step(float(s["gain"]), float(s["bytes"]), float(s["rel_l2"]),
                             None if s["loss_pp"] is None else float(s["loss_pp"]))
                        for s in obj["steps"]]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # swept again below
    steps = sweep(bundle, cand, crossing, coder(), progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "steps": [
        {"gain": s.gain, "bytes": s.bytes, "rel_l2": s.rel_l2, "loss_pp": s.loss_pp}
        for s in steps]}))
    return steps


def answers(bundle: Bundle, cand: Candidate, crossing: np.ndarray
            ) -> list[list[np.ndarray]] | None:
    """The tail's answers on each original frame of ``crossing`` (N, ...), the reference for
    :func:`task_loss`; None when the bundle was never calibrated (no metric to judge by)."""
    judge = _Judge(bundle, cand)
    if judge.metric is None:
        return None
    return [judge.run(crossing[i:i + 1]) for i in range(len(crossing))]


def task_loss(bundle: Bundle, cand: Candidate, refs: Sequence[Sequence[np.ndarray]] | None,
              restored: np.ndarray) -> float | None:
    """The calibrated task metric's mean loss (pp) of the reconstructions ``restored`` (N, ...)
    against the :func:`answers` ``refs`` on the originals, the criterion the rate points were
    picked by; None without ``refs``."""
    if refs is None:
        return None
    return _Judge(bundle, cand).compare(refs, restored)[1]


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
    """``n`` gains from the coarsest whose task loss is within ``tolerance_pp`` (without a
    metric: whose output error is within :data:`FALLBACK_REL_L2`) towards finer ones on the
    ladder (coarser ones when the ladder ends): the sweep's few feeds bound a loss loosely,
    and training keeps the untrained coder's loss rather than lowering it much."""
    ordered = sorted(steps, key=lambda s: s.gain)
    fits = [k for k, s in enumerate(ordered)
            if (s.rel_l2 <= FALLBACK_REL_L2 if s.loss_pp is None else s.loss_pp <= tolerance_pp)]
    at = fits[0] if fits else len(ordered) - 1
    lo = max(0, min(at, len(ordered) - n))
    return [s.gain for s in ordered[lo:lo + n]]


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


def as_trained(model: Any) -> Callable[[float], tuple[Callable[[np.ndarray], np.ndarray],
                                                      Callable[[np.ndarray], np.ndarray]]]:
    """A :func:`sweep` coder for a trained torch bottleneck: its own learned gains, whatever
    gain the sweep names."""
    import torch

    @torch.no_grad()
    def encode(x: np.ndarray) -> np.ndarray:
        return np.concatenate([torch.round(model.encode(torch.from_numpy(x[i:i + 16]))).numpy()
                               for i in range(0, len(x), 16)])

    @torch.no_grad()
    def decode(y: np.ndarray) -> np.ndarray:
        return np.concatenate([model.decode(torch.from_numpy(y[i:i + 16])).numpy()
                               for i in range(0, len(y), 16)])
    return lambda _gain: (encode, decode)


def worse(trained: Step, untrained: Sequence[Step]) -> bool:
    """Whether training left a point dominated by the untrained coder, on the sweep's frames:
    some gain of it sends no more bytes at no more loss (task metric; without one, output
    error), one of them strictly less. A point that trades loss for fewer bytes is not worse."""
    def loss(s: Step) -> float:
        both = trained.loss_pp is not None and s.loss_pp is not None
        v = s.loss_pp if both else s.rel_l2
        return v if v is not None and math.isfinite(v) else math.inf

    if not math.isfinite(trained.bytes) or not math.isfinite(loss(trained)):
        return True
    return any(s.bytes <= trained.bytes and loss(s) <= loss(trained)
               and (s.bytes < trained.bytes or loss(s) < loss(trained)) for s in untrained)


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


__all__ = ["FALLBACK_REL_L2", "LADDER", "Reference", "Step", "answers", "as_trained",
           "cached_sweep", "calibration_metric", "describe", "histogram_bytes", "matched_lambda",
           "numpy_coder", "pick_gains", "reference", "sweep", "task_loss", "worse"]
