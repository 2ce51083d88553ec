"""What a slice predictor's error costs the planner: *plan regret*, the goal of latency
prediction.

The planner only ranks candidate cuts, so the figure a user feels is: when it picks the cut with
the lowest *predicted* latency, how much slower is that cut (in measured times) than the cut
with the lowest *measured* latency? That fraction is the regret; 0 when the prediction picks the
best cut or one as fast. The goal is a regret of at most :data:`REGRET_TARGET` (2 %).
``within_10pct`` (the fraction of slices predicted within +-10 %) scores every slice alike, a
5 µs one as much as the slice that decides the plan; it is reported next to
``measurement_repeatability_within_10pct`` (how often the machine repeats its own measurement
of the slices within +-10 %), which bounds it, and is no target by itself.

Latency is the planner's sequential one (:meth:`coinf.wearable.planner.costs.CandidateCost.
latency_ms`): ``slowdown x head + uplink / rate + tail + downlink / rate``. The slice times
were measured on one machine; ``slowdown`` stands the wearable in for a slower CPU running the
head (the tail stays on the measured machine, the handheld), and ``rate`` is the link's. At
BLE rates the bytes of small models outweigh their compute and the cut is set by them; the
hardest condition for a predictor is the model's *break-even* rate, where running it all on
the wearable and sending it all to the handheld take the same measured time and the cuts in
between compete on compute.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

#: wearable CPU x the measured machine's: as fast, and about a Pi Zero 2 W against a laptop core
SLOWDOWNS = (1.0, 10.0)
#: link rates (kB/s): BLE 4.2 without DLE (low and high end), Wi-Fi-class, and a link so fast
#: that only compute counts (where a predictor's error shows most)
LINK_KB_S = (10.0, 36.0, 1_000.0, 100_000.0)

#: the goal (issue 43): the plan chosen from predicted times is at most 2 % slower, measured,
#: than the best plan, under every condition of :func:`regret_table`
REGRET_TARGET = 0.02

Times = Mapping[str, tuple[float, float]]  # slice "<cid>.head|tail" -> (predicted, measured) ms


class CutBytes(NamedTuple):
    """One candidate cut: bytes sent up (wearable -> handheld) and back, and which sides run
    something (``wearable-only`` has no tail, ``handheld-only`` no head)."""

    up: int
    down: int
    head: bool
    tail: bool


def bundle_cuts(bundle: Any) -> dict[str, CutBytes]:
    """Every candidate of ``bundle``. A ``wearable-only`` cut sends nothing; every other cut
    sends its crossing tensors and gets the graph outputs back."""
    out_bytes = sum(t.nbytes for t in bundle.outputs)
    return {c.id: CutBytes(c.crossing_bytes if c.tail.nodes else 0,
                           out_bytes if c.tail.nodes else 0, bool(c.head.nodes),
                           bool(c.tail.nodes))
            for c in bundle.candidates}


def _latencies(times: Times, cuts: Mapping[str, CutBytes], which: int, slowdown: float,
               kb_s: float) -> dict[str, float]:
    """Latency (ms) of every cut whose sides all have times; ``which`` 0 from the predicted
    times, 1 from the measured ones."""
    out: dict[str, float] = {}
    for cid, cut in cuts.items():
        head, tail = times.get(f"{cid}.head"), times.get(f"{cid}.tail")
        if (cut.head and head is None) or (cut.tail and tail is None):
            continue
        out[cid] = (slowdown * (head[which] if head and cut.head else 0.0)
                    + (tail[which] if tail and cut.tail else 0.0)
                    + (cut.up + cut.down) / kb_s)  # bytes / (kB/s) = ms
    return out


def plan_regret(times: Times, cuts: Mapping[str, CutBytes], slowdown: float, kb_s: float) -> float:
    """Measured latency of the cut the predicted times pick, over the best measured one, - 1."""
    pred = _latencies(times, cuts, 0, slowdown, kb_s)
    meas = _latencies(times, cuts, 1, slowdown, kb_s)
    if not meas:
        raise ValueError("plan regret needs at least one cut with timed slices")
    best = min(meas.values())
    chosen = meas[min(pred, key=lambda c: pred[c])]
    return chosen / best - 1.0 if best > 0 else 0.0


def break_even_kb_s(times: Times, cuts: Mapping[str, CutBytes], slowdown: float) -> float | None:
    """The link rate (kB/s) at which the all-wearable cut and the all-handheld one take the
    same measured time; None if either is untimed, or at ``slowdown`` <= 1 (both run the whole
    model on the same CPU: only noise would part them)."""
    local = [times[f"{c}.head"][1] for c, cut in cuts.items()
             if not cut.tail and f"{c}.head" in times]
    remote = [(times[f"{c}.tail"][1], cut.up + cut.down) for c, cut in cuts.items()
              if not cut.head and f"{c}.tail" in times]
    if slowdown <= 1 or not local or not remote or slowdown * local[0] <= remote[0][0]:
        return None
    return remote[0][1] / (slowdown * local[0] - remote[0][0])  # bytes / ms = kB/s


def regret_table(rows: Iterable[tuple[str, float, float]], cuts: Mapping[str, CutBytes],
                 slowdowns: Iterable[float] = SLOWDOWNS,
                 rates: Iterable[float] = LINK_KB_S) -> dict[str, float]:
    """:func:`plan_regret` under every (slowdown, link rate), keyed ``"x10@36kB/s"``, and at
    each slowdown's :func:`break_even_kb_s` (``"x10@break-even"``, when there is one), from
    ``rows`` of (slice, predicted ms, measured ms)."""
    times = {s: (p, m) for s, p, m in rows}
    rates = tuple(rates)
    out: dict[str, float] = {}
    for s in slowdowns:
        out.update({f"x{s:g}@{r:g}kB/s": plan_regret(times, cuts, s, r) for r in rates})
        even = break_even_kb_s(times, cuts, s)
        if even is not None:
            out[f"x{s:g}@break-even"] = plan_regret(times, cuts, s, even)
    return out


def worst_regret(tables: Iterable[Mapping[str, float] | None]) -> float | None:
    """The largest regret in any of the :func:`regret_table` results ``tables`` (None if there
    is none): what is held against :data:`REGRET_TARGET`."""
    values = [v for t in tables if t for v in t.values()]
    return max(values) if values else None
