"""Choose a compressor for a link from its bandwidth (paper 002, §III and §IV-D, Eq. 3).

Each option at a cut is a (compressor gamma, packing) with the bytes it sends per frame and the
model's accuracy with it. With the pipeline's compute bound ``T_p`` (frames/s of its slowest
compute stage) and input rate ``T_gen``, an option's throughput at link bandwidth ``b`` is
``T = min(T_p, T_gen, b / bytes)`` and its *effective accuracy* (correct results per generated
frame; a dropped frame counts as wrong) is ``nu_eff = T * nu / T_gen``. :func:`select` picks the
option with the highest effective accuracy (ties: the more accurate one, then fewer bytes).

Since ``nu_eff`` of each option is piecewise linear in ``b``, the best option changes only at
a few bandwidths: the **thresholds** (Algorithm 2's Theta). :func:`thresholds` lists them with
the option that wins above each, so at run time a measured bandwidth is looked up, not solved.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

from coinf.convert.calibrate import packing_rows, row_bound

from coinf.bundle import Bundle, Candidate, Compressor
from coinf.errors import InputError

#: a pipeline REQUEST's bytes besides its tensors' (frame, route, tensor and packing headers):
#: priced into every link option, since it dominates a small code's cost
OVERHEAD_BYTES = 96.0
#: a cut is priced by its smallest option whose accuracy is within this (relative) of the
#: cut's most accurate option (1 pp)
DP_TOLERANCE = 0.01


@dataclass(frozen=True)
class CompressionOption:
    """One way to send a cut's tensors: the compressor, the packing, bytes/frame, accuracy."""

    gamma: int
    packing: str
    nbytes: float
    accuracy: float

    def __str__(self) -> str:
        return f"gamma{self.gamma}+{self.packing}"


def throughput(option: CompressionOption, bandwidth_bps: float, compute_fps: float,
               input_fps: float) -> float:
    return min(compute_fps, input_fps, bandwidth_bps / option.nbytes)


def effective_accuracy(option: CompressionOption, bandwidth_bps: float, compute_fps: float,
                       input_fps: float) -> float:
    """Correct results per generated frame: throughput x accuracy / input rate."""
    return throughput(option, bandwidth_bps, compute_fps, input_fps) * option.accuracy / input_fps


def _check(options: Sequence[CompressionOption], compute_fps: float, input_fps: float) -> None:
    if not options:
        raise InputError("no compression option to choose from")
    if not (compute_fps > 0 and input_fps > 0):
        raise InputError("compute and input rates must be > 0 frames/s")
    bad = [o for o in options if not (o.nbytes > 0 and 0 <= o.accuracy <= 1)]
    if bad:
        raise InputError(f"option {bad[0]}: bytes must be > 0 and accuracy in [0, 1]")


def select(options: Sequence[CompressionOption], bandwidth_bps: float, compute_fps: float,
           input_fps: float) -> CompressionOption:
    """The option with the highest effective accuracy at this bandwidth."""
    _check(options, compute_fps, input_fps)
    return max(options, key=lambda o: (
        round(effective_accuracy(o, bandwidth_bps, compute_fps, input_fps), 12), o.accuracy,
        -o.nbytes))


def thresholds(options: Sequence[CompressionOption], compute_fps: float,
               input_fps: float) -> list[tuple[float, CompressionOption]]:
    """``[(theta, option), ...]`` by increasing ``theta``: from bandwidth ``theta`` (B/s) up to
    the next threshold, ``option`` is the best (the first entry starts at 0)."""
    _check(options, compute_fps, input_fps)
    rate = min(compute_fps, input_fps)
    # every bandwidth where some option's nu_eff changes slope, and every crossing of two
    # options' nu_eff (Eq. 3: rate * nu_a = b / bytes_b * nu_b, or both still link-bound)
    points = {0.0}
    for a in options:
        points.add(rate * a.nbytes)
        for b in options:
            if b.accuracy > 0:
                points.add(rate * a.accuracy * b.nbytes / b.accuracy)
    cuts = sorted(points)
    regions: list[tuple[float, CompressionOption]] = []
    for i, lo in enumerate(cuts):
        hi = cuts[i + 1] if i + 1 < len(cuts) else lo * 2 + 1
        best = select(options, (lo + hi) / 2, compute_fps, input_fps)  # inside the region
        if not regions or regions[-1][1] != best:
            regions.append((lo, best))
    return regions


def link_options(cand: Candidate, compressors: Sequence[Compressor] = (),
                 overhead_bytes: float = 0.0) -> list[CompressionOption]:
    """Raw and every calibrated lossy packing of a cut, with its bytes and relative accuracy
    (1 - the calibrated drop's upper bound; the model's own accuracy cancels out), and every
    (compressor, packing of its code) with the code's bytes and the set's accuracy relative to
    the model's own. ``overhead_bytes`` (a message's headers) is added to every option: it
    dominates a small code's cost."""
    options = [CompressionOption(1, "raw", float(cand.crossing_bytes), 1.0)]
    for row in packing_rows(cand):
        spec, size = row.get("spec"), row.get("mean_bytes")
        if not isinstance(spec, str) or spec in ("f32", "raw") or not isinstance(
                size, int | float) or not size > 0:
            continue
        # the calibration's one-sided 95 % upper bound on the drop: a drop of 0 measured on a
        # few inputs is not worth giving up lossless tensors for
        drop = max(row_bound(row)[0], 0.0)
        options.append(CompressionOption(1, spec, float(size), max(1.0 - drop / 100.0, 0.0)))
    for comp in compressors:
        for spec, size in sorted(comp.code_bytes.items()):
            if spec in comp.accuracy and size > 0:
                options.append(CompressionOption(comp.gamma, spec, float(size),
                                                 comp.relative_accuracy(spec)))
    if overhead_bytes:
        options = [CompressionOption(o.gamma, o.packing, o.nbytes + overhead_bytes, o.accuracy)
                   for o in options]
    return options


def cheapest(options: Sequence[CompressionOption],
             tolerance: float = DP_TOLERANCE) -> CompressionOption:
    """The smallest option within ``tolerance`` (relative accuracy) of the most accurate one
    (ties: the more accurate): how a planned hop sends its cut, so that a slow link draws the
    cut to where a packing or a compressor shrinks it within the quality allowed."""
    if not options:
        raise InputError("no compression option to choose from")
    best = max(o.accuracy for o in options)
    return min((o for o in options if o.accuracy >= best - tolerance),
               key=lambda o: (o.nbytes, -o.accuracy))


def hop_option(bundle: Bundle, cut: str, tolerance: float = DP_TOLERANCE) -> CompressionOption:
    """How a hop sends cut ``cut`` of ``bundle``: :func:`cheapest` of its options (raw, its
    calibrated packings, its compressors' codes), headers included."""
    cand = bundle.candidate(cut)
    return cheapest(link_options(cand, bundle.compressors(cand.id), OVERHEAD_BYTES), tolerance)


def choose_hop(options: Sequence[CompressionOption], bandwidth_bps: float, compute_fps: float,
               input_fps: float | None = None, tolerance: float = DP_TOLERANCE,
               objective: str = "throughput") -> CompressionOption:
    """How a hop sends its cut. ``objective="throughput"`` (a stream): the option with the best
    effective accuracy (:func:`select`) at this bandwidth, the plan's compute rate and the
    stream's input rate (None: the compute rate): a lossier option wins where it delivers
    enough more frames (paper 002, §IV-D), raw where the link keeps up. ``"latency"`` (one
    frame): the smallest option within ``tolerance`` of the most accurate (:func:`cheapest`,
    what the planner priced the cut at), whatever the bandwidth."""
    if objective == "latency":
        return cheapest(options, tolerance)
    rate = compute_fps if math.isfinite(compute_fps) and compute_fps > 0 else 1e9
    return select(options, bandwidth_bps, rate, input_fps or rate)


def option_label(option: CompressionOption | str) -> str:
    """``raw``, ``q8``, ``g4`` (compressor gamma 4, raw code), ``g4+q8``."""
    if isinstance(option, str):
        return option
    if option.gamma <= 1:
        return option.packing
    return f"g{option.gamma}" if option.packing == "raw" else f"g{option.gamma}+{option.packing}"


def lookup(table: list[tuple[float, CompressionOption]], bandwidth_bps: float) -> CompressionOption:
    """The option a threshold table gives for a measured bandwidth."""
    if not table:
        raise InputError("empty threshold table")
    i = bisect.bisect_right([t for t, _ in table], bandwidth_bps) - 1
    return table[max(i, 0)][1]


__all__ = ["DP_TOLERANCE", "OVERHEAD_BYTES", "CompressionOption", "cheapest",
           "choose_hop", "effective_accuracy", "hop_option", "link_options",
           "lookup", "option_label", "select", "thresholds", "throughput"]
