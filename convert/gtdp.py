"""GTDP (MeDNN Algorithm 1) and layer grouping: who computes which tile of which layers.

:func:`gtdp` cuts a feature map into one rectangle per device, with areas in proportion to
weights. Like MeDNN's greedy two-dimensional partition, it splits the device set into two
groups (every subset of up to half the devices), cuts the map across its rows or its columns in
the ratio of the two groups' weights, recurses, and keeps the layout whose dividing lines are
shortest. Short lines mean small halos.

:func:`balance` chooses the weights. Tiles start in proportion to device speed. Each round
then re-weights them by the time each device would really take for its tile (Eq. 1: the
compute of the tile and its halo at that device's speed, plus sending its input region and
receiving its output over that device's link), and the best layout seen is kept.

:func:`plan_groups` decides where halos are exchanged. ``per-layer`` makes a group of every
window layer (MeDNN: the coordinator gathers and redistributes after each conv). ``fused``
lets a dynamic program choose groups of consecutive layers, trading the redundant compute of
larger halos against fewer exchanges (DeepThings' fused tiles). ``whole`` is one group.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from coinf.convert.spatial import Layer, Rect, input_region

from coinf.errors import InputError

STRATEGIES = ("per-layer", "fused", "whole")


@dataclass(frozen=True)
class Worker:
    """A device that computes tiles: speed in FLOP/s, link to the coordinator (inf = itself)."""

    name: str
    flops_per_s: float
    bandwidth_bps: float = math.inf
    latency_s: float = 0.0
    #: fixed cost of one tile on this device (runtime call, request handling), seconds
    overhead_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.flops_per_s > 0:
            raise InputError(f"worker {self.name}: speed must be > 0 FLOP/s, "
                             f"got {self.flops_per_s}")
        if not self.bandwidth_bps > 0 or self.latency_s < 0 or self.overhead_s < 0:
            raise InputError(f"worker {self.name}: bandwidth must be > 0, latency and "
                             f"overhead >= 0")


@dataclass(frozen=True)
class Tile:
    worker: int
    out: Rect


@dataclass
class Group:
    """Layers ``[i0, i1)`` of the chain, split into tiles; ``est_s`` by Eq. 1."""

    i0: int
    i1: int
    tiles: list[Tile]
    est_s: float
    per_worker_s: list[float] = field(default_factory=list)


def _split(n: int, ratio: float) -> int:
    return min(max(round(n * ratio), 1), n - 1)


def gtdp(rect: Rect, weights: Sequence[float]) -> list[Rect]:
    """One rectangle per weight (an empty one for a weight of 0 or a device that cannot get a
    row and a column), covering ``rect`` exactly, cut lines as short as MeDNN's search finds."""
    live = tuple(i for i, w in enumerate(weights) if w > 0)
    if not live:
        raise InputError("gtdp: every weight is 0; expected at least one device with weight > 0")
    w = tuple(float(x) for x in weights)
    # with more devices than pixels, the lightest devices stay idle
    while len(live) > rect.area:
        live = tuple(sorted(live, key=lambda i: -w[i])[:-1])
    out = [Rect(rect.r0, rect.r0, rect.c0, rect.c0)] * len(weights)
    _, layout = _best(live, rect, w)
    for i, r in layout:
        out[i] = r
    return out


@lru_cache(maxsize=4096)
def _best(devs: tuple[int, ...], rect: Rect, w: tuple[float, ...]
          ) -> tuple[float, tuple[tuple[int, Rect], ...]]:
    if len(devs) == 1:
        return 0.0, ((devs[0], rect),)
    total = sum(w[i] for i in devs)
    best: tuple[float, tuple[tuple[int, Rect], ...]] | None = None
    for k in range(1, len(devs) // 2 + 1):
        for sub in itertools.combinations(devs, k):
            rest = tuple(i for i in devs if i not in sub)
            ratio = sum(w[i] for i in sub) / total
            options = []
            if rect.w >= 2:  # vertical line: left | right, length = height
                c = rect.c0 + _split(rect.w, ratio)
                options.append((rect.h, Rect(rect.r0, rect.r1, rect.c0, c),
                                Rect(rect.r0, rect.r1, c, rect.c1)))
            if rect.h >= 2:  # horizontal line: top / bottom, length = width
                r = rect.r0 + _split(rect.h, ratio)
                options.append((rect.w, Rect(rect.r0, r, rect.c0, rect.c1),
                                Rect(r, rect.r1, rect.c0, rect.c1)))
            for line, a, b in options:
                if a.area < len(sub) or b.area < len(rest):
                    continue
                la, pa = _best(sub, a, w)
                lb, pb = _best(rest, b, w)
                cand = (line + la + lb, pa + pb)
                if best is None or cand[0] < best[0] - 1e-9:
                    best = cand
    if best is None:  # cannot cut: the lightest device drops out
        return _best(tuple(sorted(devs, key=lambda i: -w[i])[:-1]), rect, w)
    return best


def layouts(rect: Rect, weights: Sequence[float], limit: int = 256) -> list[list[Rect]]:
    """Every guillotine layout of ``rect`` over the devices with weight > 0 (areas in the
    weights' ratio; both cut directions, every split of the device set), at most ``limit``.
    :func:`balance` scores them by completion time instead of cut length: with fused layer
    groups, strips often need less redundant halo compute than the shortest-cut grid."""
    live = tuple(i for i, w in enumerate(weights) if w > 0)
    w = tuple(float(x) for x in weights)
    out: list[list[Rect]] = []
    for layout in _all(live, rect, w):
        rects = [Rect(rect.r0, rect.r0, rect.c0, rect.c0)] * len(weights)
        for i, r in layout:
            rects[i] = r
        out.append(rects)
        if len(out) >= limit:
            break
    return out


def _all(devs: tuple[int, ...], rect: Rect, w: tuple[float, ...]
         ) -> Iterator[tuple[tuple[int, Rect], ...]]:
    if len(devs) == 1:
        yield ((devs[0], rect),)
        return
    total = sum(w[i] for i in devs)
    for k in range(1, len(devs) // 2 + 1):
        for sub in itertools.combinations(devs, k):
            if 2 * k == len(devs) and devs[0] not in sub:
                continue  # {A,B}|{C,D} and {C,D}|{A,B} are the same cut
            rest = tuple(i for i in devs if i not in sub)
            ratio = sum(w[i] for i in sub) / total
            parts = []
            if rect.w >= 2:
                c = rect.c0 + _split(rect.w, ratio)
                parts.append((Rect(rect.r0, rect.r1, rect.c0, c),
                              Rect(rect.r0, rect.r1, c, rect.c1)))
            if rect.h >= 2:
                r = rect.r0 + _split(rect.h, ratio)
                parts.append((Rect(rect.r0, r, rect.c0, rect.c1),
                              Rect(r, rect.r1, rect.c0, rect.c1)))
            for a, b in parts:
                if a.area < len(sub) or b.area < len(rest):
                    continue
                for pa in _all(sub, a, w):
                    for pb in _all(rest, b, w):
                        yield pa + pb


def worker_times(chain: Sequence[Layer], i0: int, i1: int, tiles: Sequence[Tile],
                 workers: Sequence[Worker], itemsize: int = 4) -> list[float]:
    """Eq. 1 per worker: send the input region, compute every layer's tile, return the output."""
    times = [0.0] * len(workers)
    cin, cout = chain[i0].in_shape[0], chain[i1 - 1].out_shape[0]
    for t in tiles:
        if t.out.empty():
            continue
        region, _pads, outs = input_region(list(chain), i0, i1, t.out)
        wk = workers[t.worker]
        compute = sum(layer.flops * o.area / (layer.out_shape[1] * layer.out_shape[2])
                      for layer, o in zip(chain[i0:i1], outs, strict=True))
        sent = region.area * cin * itemsize + t.out.area * cout * itemsize
        link = sent / wk.bandwidth_bps + 2 * wk.latency_s if math.isfinite(wk.bandwidth_bps) \
            else 0.0
        times[t.worker] += compute / wk.flops_per_s + link + wk.overhead_s
    return times


def balance(chain: Sequence[Layer], i0: int, i1: int, workers: Sequence[Worker],
            rounds: int = 8) -> Group:
    """The GTDP layout of layers ``[i0, i1)`` with the smallest Eq. 1 completion time found.

    Running the whole group on one device is a candidate too; on the small maps of deep layers
    per-tile overheads and transfers often make that the faster choice.
    """
    full = chain[i1 - 1].out_rect()
    singles = []
    for k in range(len(workers)):  # the whole group on one device
        alone = [Tile(i, full if i == k else Rect(0, 0, 0, 0)) for i in range(len(workers))]
        per = worker_times(chain, i0, i1, alone, workers)
        singles.append(Group(i0, i1, alone, max(per), per))
    best = min(singles, key=lambda g: g.est_s)
    if len(workers) == 1:
        return best
    weights = [w.flops_per_s for w in workers]
    for _ in range(rounds):
        round_best: Group | None = None
        candidates = [gtdp(full, weights), *layouts(full, weights)]
        for rects in candidates:
            tiles = [Tile(i, r) for i, r in enumerate(rects)]
            per = worker_times(chain, i0, i1, tiles, workers)
            if round_best is None or max(per) < round_best.est_s - 1e-12:
                round_best = Group(i0, i1, tiles, max(per), per)
        assert round_best is not None
        if round_best.est_s < best.est_s - 1e-12:
            best = round_best
        per = round_best.per_worker_s
        mean = sum(per) / len(per)
        if mean <= 0:
            break
        # damped: a device that would finish late gets less area, an early one more
        weights = [w * math.sqrt(mean / p) if p > 0 else w * 1.5
                   for w, p in zip(weights, per, strict=True)]
    return best


def plan_groups(chain: Sequence[Layer], workers: Sequence[Worker], strategy: str = "fused"
                ) -> list[Group]:
    """Groups covering the whole chain, each with its balanced tiles."""
    n = len(chain)
    if n == 0:
        return []
    if strategy == "whole":
        return [balance(chain, 0, n, workers)]
    if strategy == "per-layer":
        starts = [i for i, layer in enumerate(chain) if layer.window is not None or i == 0]
        bounds = [*starts, n]
        return [balance(chain, a, b, workers) for a, b in itertools.pairwise(bounds) if a < b]
    if strategy != "fused":
        raise InputError(f"unknown spatial strategy {strategy!r}; expected one of {STRATEGIES}")
    # groups start at window layers (a per-pixel layer joins the window before it)
    bounds = [i for i, layer in enumerate(chain) if layer.window is not None or i == 0] + [n]
    best = {0: 0.0}
    back: dict[int, int] = {}
    for j in bounds[1:]:
        best[j] = math.inf
        for i in (b for b in bounds if b < j):
            est = balance(chain, i, j, workers, rounds=2).est_s
            if best[i] + est < best[j]:
                best[j], back[j] = best[i] + est, i
    cuts = [n]
    while cuts[-1] > 0:
        cuts.append(back[cuts[-1]])
    cuts.reverse()
    return [balance(chain, a, b, workers) for a, b in itertools.pairwise(cuts)]
