"""Split a model over a pipeline of n devices: the bottleneck-minimising DP (paper 002, Eq. 2).

Devices 1..n form a chain: device 1 is the wearable, device i sends its slice's crossing tensors
to device i+1 over link i, and the result travels back along the chain. With frames streaming,
the pipeline's period is its slowest stage: a device's compute (its slice's FLOPs at its
measured speed) or a link's transfer (the cut's bytes, plus the result's, at its measured
bandwidth). :func:`split_dp` chooses the n-1 cuts that minimise that bottleneck.

The paper splits a chain of layers; a DAG's cuts are not always ordered, so the "layers" here are
the bundle's candidate cuts ordered by containment: cut ``a`` may precede cut ``b`` only when
``a``'s head is a strict subset of ``b``'s (then ``b``'s head minus ``a``'s is the slice between
them). The recurrence is Eq. 2 read forwards: ``best[q][k]`` is the smallest bottleneck of
stages 1..q when stage q ends at cut k::

    best[1][k] = compute_1(start, k)
    best[q][k] = min over j before k of max(best[q-1][j], link_{q-1}(j), compute_q(j, k))

and the answer is ``best[n][end]``: O(m^2 n) for m cuts. The wearable's stage may be empty
(cut = ``handheld-only``: it sends the raw input); every helper's slice holds at least one node.
:func:`split_exhaustive` enumerates every chain (tests prove the two agree).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from coinf.bundle import Bundle
from coinf.errors import InputError


@dataclass(frozen=True)
class CutPoint:
    """A cut for the DP: its id, the nodes before it, their FLOPs and the bytes crossing it."""

    id: str
    nodes: frozenset[str]
    flops: float
    nbytes: float


@dataclass(frozen=True)
class PipelineSplit:
    """Where the n-1 cuts go and what each stage then costs (seconds per frame)."""

    cuts: tuple[str, ...]
    compute_s: tuple[float, ...]  # one per device
    link_s: tuple[float, ...]  # one per link (device i -> i+1)

    @property
    def stage_s(self) -> tuple[float, ...]:
        """Every stage in pipeline order: compute 1, link 1, compute 2, ..., compute n."""
        out: list[float] = []
        for i, c in enumerate(self.compute_s):
            out.append(c)
            if i < len(self.link_s):
                out.append(self.link_s[i])
        return tuple(out)

    @property
    def bottleneck_s(self) -> float:
        return max(self.stage_s)

    @property
    def bound_fps(self) -> float:
        """The pipeline's throughput bound: one frame per bottleneck stage."""
        b = self.bottleneck_s
        return math.inf if b <= 0 else 1.0 / b


def cut_points(bundle: Bundle) -> list[CutPoint]:
    """The bundle's candidates as DP cuts (first ``handheld-only``, last ``wearable-only``)."""
    return [CutPoint(c.id, frozenset(c.head.nodes), float(c.head.flops),
                     float(c.crossing_bytes)) for c in bundle.candidates]


def _check(points: Sequence[CutPoint], speeds: Sequence[float],
           bandwidths: Sequence[float]) -> None:
    if len(points) < 2:
        raise InputError("a pipeline split needs at least the start and the end cut")
    if len(speeds) < 1:
        raise InputError("a pipeline needs at least one device")
    if len(bandwidths) != len(speeds) - 1:
        raise InputError(f"{len(speeds)} devices need {len(speeds) - 1} link bandwidths, "
                         f"got {len(bandwidths)}")
    bad = [v for v in (*speeds, *bandwidths) if not (v > 0 and math.isfinite(v))]
    if bad:
        raise InputError(f"device speeds (FLOP/s) and link bandwidths (B/s) must be finite "
                         f"and > 0, got {bad[0]}")
    first, last = points[0], points[-1]
    if first.nodes or any(not p.nodes <= last.nodes for p in points):
        raise InputError("the first cut must have an empty head and the last cut every node")


def _compute(points: Sequence[CutPoint], speeds: Sequence[float], q: int, j: int,
             k: int) -> float:
    return max(points[k].flops - points[j].flops, 0.0) / speeds[q]


def _link(points: Sequence[CutPoint], bandwidths: Sequence[float], q: int, j: int,
          result_bytes: float) -> float:
    return (points[j].nbytes + result_bytes) / bandwidths[q]


def _before(points: Sequence[CutPoint]) -> list[list[int]]:
    """``before[k]``: the cuts that may directly precede cut k (strictly nested)."""
    return [[j for j in range(len(points)) if points[j].nodes < points[k].nodes]
            for k in range(len(points))]


def evaluate(points: Sequence[CutPoint], cuts: Sequence[str], speeds: Sequence[float],
             bandwidths: Sequence[float], result_bytes: float = 0.0) -> PipelineSplit:
    """The stage times of a given chain of cuts (ids, in pipeline order)."""
    _check(points, speeds, bandwidths)
    index = {p.id: i for i, p in enumerate(points)}
    unknown = [c for c in cuts if c not in index]
    if unknown or len(cuts) != len(speeds) - 1:
        raise InputError(f"{len(speeds)} devices need {len(speeds) - 1} cuts from this "
                         f"bundle, got {list(cuts)}")
    chain = [0, *(index[c] for c in cuts), len(points) - 1]
    for q in range(1, len(chain) - 1):
        a, b = points[chain[q]], points[chain[q + 1]]
        if not a.nodes < b.nodes:
            raise InputError(f"cut {a.id} does not lie strictly before {b.id}")
    compute = tuple(_compute(points, speeds, q, chain[q], chain[q + 1])
                    for q in range(len(speeds)))
    links = tuple(_link(points, bandwidths, q, chain[q + 1], result_bytes)
                  for q in range(len(bandwidths)))
    return PipelineSplit(tuple(cuts), compute, links)


def split_dp(points: Sequence[CutPoint], speeds: Sequence[float],
             bandwidths: Sequence[float], result_bytes: float = 0.0) -> PipelineSplit:
    """The cuts minimising the bottleneck stage (a stream's period); O(m^2 n). ``speeds`` are
    FLOP/s per device (the wearable first), ``bandwidths`` B/s per link, ``result_bytes`` what
    every link also carries back. :class:`InputError` when the bundle has too few nested cuts
    for n devices."""
    return _chain(points, speeds, bandwidths, result_bytes, lambda a, b, c: max(a, b, c))


def split_latency(points: Sequence[CutPoint], speeds: Sequence[float],
                  bandwidths: Sequence[float], result_bytes: float = 0.0) -> PipelineSplit:
    """The cuts minimising one frame's time, the sum of every stage (:func:`split_dp`
    minimises the bottleneck); same inputs and errors."""
    return _chain(points, speeds, bandwidths, result_bytes, lambda a, b, c: a + b + c)


def _chain(points: Sequence[CutPoint], speeds: Sequence[float], bandwidths: Sequence[float],
           result_bytes: float, combine: Callable[[float, float, float], float]
           ) -> PipelineSplit:
    """The chain of cuts over every device whose stages ``combine`` (stages so far, the next
    link, the next compute) to the least value."""
    _check(points, speeds, bandwidths)
    m, n = len(points), len(speeds)
    before = _before(points)
    inf = math.inf
    best = [[inf] * m for _ in range(n)]
    prev = [[-1] * m for _ in range(n)]
    for k in range(m - 1):  # the wearable's stage: start -> k (k = 0: nothing runs here)
        best[0][k] = _compute(points, speeds, 0, 0, k)
    if n == 1:
        best[0][m - 1] = _compute(points, speeds, 0, 0, m - 1)
    for q in range(1, n):
        ends = [m - 1] if q == n - 1 else range(1, m - 1)
        for k in ends:
            for j in before[k]:
                if best[q - 1][j] == inf:
                    continue
                v = combine(best[q - 1][j], _link(points, bandwidths, q - 1, j, result_bytes),
                            _compute(points, speeds, q, j, k))
                if v < best[q][k]:
                    best[q][k], prev[q][k] = v, j
    if best[n - 1][m - 1] == inf:
        raise InputError(f"{n} devices need {n - 1} nested cuts; this bundle's cuts do not "
                         f"form such a chain (re-split with more candidates, or use fewer "
                         f"devices)")
    chain, k = [], m - 1
    for q in range(n - 1, 0, -1):
        k = prev[q][k]
        chain.append(points[k].id)
    return evaluate(points, chain[::-1], speeds, bandwidths, result_bytes)


def stage_name(split: PipelineSplit, index: int, devices: Sequence[str]) -> str:
    """What stage ``index`` of ``split.stage_s`` is: a device's compute or a link."""
    q = index // 2
    if index % 2 == 0:
        return f"{'the ' if devices[q] == 'wearable' else ''}{devices[q]}'s compute"
    return f"the link {devices[q]} -> {devices[q + 1]}"


def slowest_stage(split: PipelineSplit, devices: Sequence[str]) -> str:
    """The stage that bounds ``split``'s throughput, named, with its predicted time."""
    stages = split.stage_s
    i = max(range(len(stages)), key=stages.__getitem__)
    return f"{stage_name(split, i, devices)} ({stages[i] * 1e3:.1f} ms)"


def split_exhaustive(points: Sequence[CutPoint], speeds: Sequence[float],
                     bandwidths: Sequence[float], result_bytes: float = 0.0) -> PipelineSplit:
    """Every valid chain of n-1 cuts tried (small cases only; tests compare it with the DP)."""
    _check(points, speeds, bandwidths)
    n, m = len(speeds), len(points)
    best: PipelineSplit | None = None
    for chain in itertools.permutations(range(m - 1), n - 1):
        try:  # evaluate refuses a chain whose cuts are not strictly nested
            s = evaluate(points, [points[i].id for i in chain], speeds, bandwidths,
                         result_bytes)
        except InputError:
            continue
        if best is None or s.bottleneck_s < best.bottleneck_s:
            best = s
    if best is None:
        raise InputError(f"{n} devices need {n - 1} nested cuts; none found")
    return best


__all__ = ["CutPoint", "PipelineSplit", "cut_points", "evaluate", "slowest_stage", "split_dp",
           "split_exhaustive", "split_latency"]
