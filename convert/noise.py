"""The model's own noise floor on calibration data, and the inputs whose answer is stable.

A packing can only be judged against what the model itself does with an imperceptible change
of its input. Each float model input is moved by one least-significant step (LSB) of the
sensor it came from, in a random direction per element (a fixed seed per input), and the model
runs again. The task metric between that run and the clean one is the **noise floor**: how
many answers (pp) the model changes by itself. An input whose answer the perturbation leaves
untouched (loss exactly 0) is **stable**.

The LSB of an input is read off the data: when the values of an image channel (or of a whole
non-image tensor) lie on an even grid of at most 65,536 steps -- pixels mapped ``(p / 255 -
mean) / std``, PCM samples ``s / 32768`` -- it is that grid's step; otherwise it is the range
over 255 steps for an image channel and over 65,535 for anything else. Integer inputs (token
ids, class ids) and scalars (a sample rate, a threshold: settings, not sensor data) are never
perturbed. Perturbed values are clipped to the range the data spans.

Only decision metrics (the answer is the same or not: ``top1``, ``topK``, ``class``, ``ctc``,
``boxes@T``, ``lines@T``, ``cents@T``, ``decision@T``) have stable inputs; a continuous metric
(``maxrel``, ``meanrel``, ``cosine``, ``iou@T`` over a dense mask, a custom function) is judged
on every input, with the floor printed beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from coinf.ble_protocol import media
from coinf.convert.feeds import Dataset
from coinf.convert.metrics import Label, Metric

#: distinct values looked at per channel to find the grid (a subsample of big inputs)
MAX_VALUES = 1 << 20
#: the most steps a grid may have to count as a sensor's (16-bit ADC)
MAX_STEPS = 65536
SEED = 20261129


def is_decision(metric: Metric) -> bool:
    """Whether ``metric`` gives exactly 0 when the answer did not change (module docstring)."""
    name = metric.name
    return metric._fn is None and name not in ("maxrel", "meanrel", "cosine") \
        and not name.startswith("iou@")


def _grid_step(values: np.ndarray) -> float | None:
    """The step of the even grid ``values`` lie on (at most :data:`MAX_STEPS` steps), else
    None."""
    u = np.unique(values.astype(np.float64))
    if u.size < 2:
        return None
    gaps = np.diff(u)
    step = float(gaps.min())
    if not step > 0 or (u[-1] - u[0]) / step > MAX_STEPS - 0.5:
        return None
    return step if np.abs(gaps / step - np.round(gaps / step)).max() <= 1e-3 else None


def _subsample(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    flat = x.reshape(-1)
    return flat if flat.size <= MAX_VALUES else rng.choice(flat, MAX_VALUES, replace=False)


@dataclass(frozen=True)
class Lsb:
    """One input's step (per channel for an image, else one value) and the range it spans."""

    step: np.ndarray  # broadcastable to one feed of the input
    lo: np.ndarray
    hi: np.ndarray
    grid: bool  # whether the step is a grid found in the data (else range / levels)

    def describe(self) -> dict[str, object]:
        return {"lsb": [float(f"{v:.6g}") for v in np.ravel(self.step)],
                "grid": self.grid}


def input_lsb(data: Dataset) -> dict[str, Lsb]:
    """The LSB of every float input of ``data`` (module docstring)."""
    rng = np.random.default_rng(SEED)
    out: dict[str, Lsb] = {}
    for name, arr in data.inputs.items():
        shape = tuple(arr.shape[1:])
        if arr.dtype.kind != "f" or int(np.prod(shape)) < 2 or not np.isfinite(arr).all():
            continue  # a scalar is a setting (a sample rate, a threshold), not sensor data
        lay = media.image_layout(shape)
        if lay is not None:
            last, c, _, _ = lay
            axis = arr.ndim - 1 if last else 2  # (N, 1, C, H, W) or (N, 1, H, W, C)
            chans = np.moveaxis(arr, axis, -1).reshape(-1, c)
            steps, los, his, grids = [], [], [], []
            for k in range(c):
                v = chans[:, k]
                g = _grid_step(_subsample(v, rng))
                lo, hi = float(v.min()), float(v.max())
                steps.append(g if g is not None else (hi - lo) / 255.0)
                los.append(lo)
                his.append(hi)
                grids.append(g is not None)
            bshape = [1] * len(shape)
            bshape[len(shape) - 1 if last else 1] = c
            out[name] = Lsb(np.reshape(steps, bshape), np.reshape(los, bshape),
                            np.reshape(his, bshape), all(grids))
        else:
            g = _grid_step(_subsample(arr, rng))
            lo, hi = float(arr.min()), float(arr.max())
            step = g if g is not None else (hi - lo) / (MAX_STEPS - 1.0)
            out[name] = Lsb(np.asarray(step), np.asarray(lo), np.asarray(hi), g is not None)
    return {k: v for k, v in out.items() if float(np.max(v.step)) > 0}


def perturb(feed: Mapping[str, np.ndarray], lsb: Mapping[str, Lsb], index: int
            ) -> dict[str, np.ndarray]:
    """``feed`` with each input in ``lsb`` moved one step up or down per element (seeded by
    the input's index), within the range the data spans."""
    rng = np.random.default_rng([SEED, index])
    out = dict(feed)
    for name, s in lsb.items():
        if name not in feed:
            continue
        x = np.asarray(feed[name])
        sign = rng.integers(0, 2, size=x.shape, dtype=np.int8) * 2 - 1
        moved = x.astype(np.float64) + sign * s.step
        out[name] = np.asarray(np.clip(moved, s.lo, s.hi), dtype=x.dtype)
    return out


@dataclass
class NoiseFloor:
    """What one LSB of input noise does to the model's answers on the calibration data."""

    losses: np.ndarray  # per input: the metric's loss, clean run against perturbed run
    stable: np.ndarray  # per input: bool (all True when nothing was perturbed)
    lsb: dict[str, Lsb] = field(default_factory=dict)
    decision: bool = True
    #: with labels: accuracy of the clean run minus that of the perturbed run (pp)
    accuracy_change_pp: float | None = None

    @property
    def floor_pp(self) -> float:
        """Answers (pp) the perturbation alone changes; 0 when nothing could be perturbed."""
        return 100.0 * float(np.mean(self.losses)) if self.losses.size else 0.0

    @property
    def n_stable(self) -> int:
        return int(np.sum(self.stable))

    def describe(self) -> dict[str, object]:
        """The manifest's record of it."""
        out: dict[str, object] = {
            "perturbation": "1 LSB per element, random sign" if self.lsb else "none (no float "
                            "input)",
            "noise_floor_pp": round(self.floor_pp, 4),
            "inputs": int(self.stable.size),
            "stable": self.n_stable,
            "lsb": {k: v.describe() for k, v in self.lsb.items()},
        }
        if self.accuracy_change_pp is not None:
            out["noise_accuracy_change_pp"] = round(self.accuracy_change_pp, 4)
        return out


def measure(data: Dataset, sequences: Sequence[range], ref: Sequence[Mapping[str, np.ndarray]],
            run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], metric: Metric,
            mout: Sequence[str], pairs: Sequence[tuple[str, str]],
            label: Callable[[int], Label]) -> NoiseFloor:
    """Run the model (``run``: feed -> outputs) on every perturbed input, in the same
    sequences as the clean reference ``ref`` (state fed back from its own outputs), and
    compare each step with the clean one."""
    lsb = input_lsb(data)
    n = sum(len(s) for s in sequences)
    if not lsb:
        return NoiseFloor(np.zeros(n), np.ones(n, dtype=bool), lsb, is_decision(metric))
    losses: list[float] = []
    changed_correct: list[float] = []
    k = 0
    for seq in sequences:
        state: dict[str, np.ndarray] = {}
        for i in seq:
            out = run(perturb({**data.feed(i), **state}, lsb, i))
            state = {a: out[b] for a, b in pairs}
            r = ref[k]
            losses.append(metric.loss([r[m] for m in mout], [out[m] for m in mout]))
            y = label(i)
            if y is not None:
                changed_correct.append(float(metric.correct(r[mout[0]], y))
                                       - float(metric.correct(out[mout[0]], y)))
            k += 1
    arr = np.asarray(losses, dtype=np.float64)
    decision = is_decision(metric)
    stable = arr == 0.0 if decision else np.ones(arr.size, dtype=bool)
    acc = 100.0 * float(np.mean(changed_correct)) if changed_correct else None
    return NoiseFloor(arr, stable, lsb, decision, acc)
