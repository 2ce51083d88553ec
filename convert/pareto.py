"""Pareto selection of candidate cuts over (wearable compute, bytes crossing).

On graphs of 1,000+ nodes the prefix pool holds many near-duplicates: cuts a few FLOPs and a
few bytes apart (a Slice, a Reshape or a Relu more or less in the head) that offer the planner
nothing new. A cut is **near-dominated** by another when their head FLOPs differ by at most
``NEAR_FLOPS`` of the model's total (so the wearable, and the handheld, do the same work) and
the other sends no more bytes than it plus ``NEAR_BYTES`` of its bytes (or ``NEAR_BYTES_ABS``):
it is no better on any objective the planner weighs.

The selection (:func:`convert.cuts.enumerate_cuts`) takes the Pareto set first: every cut that
no other beats on both head FLOPs and bytes. When that set exceeds the budget it is thinned to
cuts no other kept one near-dominates (preferring fewer bytes), then spread over FLOPs. The
later tiers (single-tensor, in-block, spread) skip every cut a chosen one near-dominates;
near-duplicates only fill the slots left once every distinct cut has one.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import TypeVar

NEAR_FLOPS = 0.002  # of the model's total head FLOPs
NEAR_BYTES = 0.02  # of the cut's crossing bytes
NEAR_BYTES_ABS = 16

P = TypeVar("P")


def front(items: Sequence[P], flops: Callable[[P], int], nbytes: Callable[[P], int],
          bound: int) -> list[P]:
    """The Pareto set over (flops, bytes), both minimised, of the items sending fewer than
    ``bound`` bytes; by increasing flops (then bytes). Ties keep the first item."""
    out: list[P] = []
    best = bound
    for p in sorted(items, key=lambda q: (flops(q), nbytes(q))):
        if nbytes(p) < best:
            out.append(p)
            best = nbytes(p)
    return out


def near(p: tuple[int, int], other: tuple[int, int], total_flops: int) -> bool:
    """Whether (flops, bytes) ``other`` near-dominates ``p`` (module docstring)."""
    if abs(p[0] - other[0]) > NEAR_FLOPS * max(total_flops, 1):
        return False
    return other[1] <= p[1] + max(NEAR_BYTES_ABS, NEAR_BYTES * p[1])


def distinct(items: Sequence[P], point: Callable[[P], tuple[int, int]], total_flops: int,
             taken: Sequence[tuple[int, int]] = ()) -> list[P]:
    """``items`` (in their order) without those near-dominated by one of ``taken`` or by
    another kept item; items sending fewer bytes are considered first. Points are kept sorted
    by FLOPs, so each check looks only at the points within the FLOPs window."""
    window = NEAR_FLOPS * max(total_flops, 1)
    seen: list[tuple[int, int]] = sorted(taken)
    kept: set[int] = set()
    order = sorted(range(len(items)), key=lambda i: (point(items[i])[1], point(items[i])[0]))
    for i in order:
        xy = point(items[i])
        lo = bisect.bisect_left(seen, (xy[0] - window, -1))
        hi = bisect.bisect_right(seen, (xy[0] + window, 1 << 62))
        if any(near(xy, s, total_flops) for s in seen[lo:hi]):
            continue
        kept.add(i)
        bisect.insort(seen, xy)
    return [p for i, p in enumerate(items) if i in kept]
