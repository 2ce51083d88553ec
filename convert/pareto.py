"""Pareto selection of candidate cuts over (wearable compute, bytes crossing).

On graphs of 1,000+ nodes the prefix pool holds many *near-duplicates*: cuts a few FLOPs and a
few bytes apart (a Relu more or less in the head) that offer the planner the same trade-off.
Two cuts are near when their head FLOPs differ by at most ``NEAR_FLOPS`` of the model's total
and their crossing bytes by at most ``NEAR_BYTES`` of the larger (or ``NEAR_BYTES_ABS``).

The selection (:func:`convert.cuts.enumerate_cuts`) keeps the Pareto set first: every cut that
no other cut beats on both head FLOPs and bytes. When the set exceeds the budget, it is thinned
to one cut per near-duplicate group (the one sending fewer bytes) before being spread. Later
tiers skip cuts near one already chosen; near-duplicates only fill slots nothing else wants.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import TypeVar

NEAR_FLOPS = 0.002  # of the model's total head FLOPs
NEAR_BYTES = 0.02  # of the larger crossing
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


def near(a: tuple[int, int], b: tuple[int, int], total_flops: int) -> bool:
    """Whether (flops, bytes) ``a`` and ``b`` offer the same trade-off (module docstring)."""
    if abs(a[0] - b[0]) > NEAR_FLOPS * max(total_flops, 1):
        return False
    gap = abs(a[1] - b[1])
    return gap <= NEAR_BYTES_ABS or gap <= NEAR_BYTES * max(a[1], b[1])


def distinct(items: Sequence[P], point: Callable[[P], tuple[int, int]], total_flops: int,
             taken: Sequence[tuple[int, int]] = ()) -> list[P]:
    """``items`` without those near one of ``taken`` or near an earlier kept item; put the
    item to prefer first (e.g. sorted by bytes). Points are kept sorted by FLOPs, so each check
    looks only at the points within the FLOPs window."""
    window = NEAR_FLOPS * max(total_flops, 1)
    seen: list[tuple[int, int]] = sorted(taken)
    kept: list[P] = []
    for p in items:
        xy = point(p)
        lo = bisect.bisect_left(seen, (xy[0] - window, -1))
        hi = bisect.bisect_right(seen, (xy[0] + window, 1 << 62))
        if any(near(xy, s, total_flops) for s in seen[lo:hi]):
            continue
        kept.append(p)
        bisect.insort(seen, xy)
    return kept
