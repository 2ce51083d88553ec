"""Schedulers: pure functions from a cost table to a :class:`Decision`.

* :func:`coinf` -- CoINF Algorithm III.1 (latency-sensitive / energy-minimising / energy under a
  latency budget, wearable and handheld energy weights, streaming = max of stages).
* :func:`neurosurgeon` -- Neurosurgeon Algorithm 1 (best latency or best wearable energy, with the
  handheld's load factor K stretching its compute time).
* :func:`dyno` -- DynO Algorithm 2 (prioritised hard constraints, ordered soft targets,
  best-effort fallback).

Ties are broken by the row order (the bundle's candidate order), so results are deterministic.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from coinf.wearable.planner.costs import CandidateCost, Decision


def _check_rows(rows: Sequence[CandidateCost]) -> list[CandidateCost]:
    rows = list(rows)
    if not rows:
        raise ValueError("cannot schedule an empty cost table")
    ids = [r.id for r in rows]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate candidate ids in the cost table: {ids}")
    return rows


def _argmin(rows: Sequence[CandidateCost], key: Callable[[CandidateCost], float],
            then: Callable[[CandidateCost], float] | None = None) -> CandidateCost:
    """First row with the smallest key (then the smallest ``then`` among exact ties)."""
    return min(enumerate(rows),
               key=lambda ir: (key(ir[1]), then(ir[1]) if then else 0.0, ir[0]))[1]


# -- CoINF ---------------------------------------------------------------------------------------
def coinf_schedule(rows: Sequence[CandidateCost], latency_budget_ms: float | None = None, *,
          w_wearable: float = 1.0, w_handheld: float = 1.0,
          streaming: bool = False) -> Decision:
    """CoINF Algorithm III.1.

    ``latency_budget_ms`` is the paper's PropT: ``0`` means latency-sensitive (best latency),
    ``None`` or ``inf`` means latency-insensitive (least weighted energy), anything else picks the
    least weighted energy among the candidates meeting the budget -- or, when none meets it, the
    fastest (line 12: ``min(latency) > PropT`` falls back to best latency).
    """
    rows = _check_rows(rows)
    if w_wearable < 0 or w_handheld < 0:
        raise ValueError(f"energy weights must be >= 0, got {w_wearable}, {w_handheld}")
    budget = math.inf if latency_budget_ms is None else float(latency_budget_ms)
    if budget < 0 or math.isnan(budget):
        raise ValueError(f"latency budget must be >= 0 ms or None, got {latency_budget_ms}")

    def lat(r: CandidateCost) -> float:
        return r.latency_ms(streaming)

    def energy(r: CandidateCost) -> float:
        return r.energy_mj(w_wearable, w_handheld)

    scores = {r.id: {"latency_ms": lat(r), "weighted_energy_mj": energy(r)} for r in rows}
    name = f"coinf(Ww={w_wearable:g}, Wh={w_handheld:g})"
    fastest = _argmin(rows, lat, energy)
    best_effort = False
    if budget == 0:
        win = fastest
        why = f"latency-sensitive (budget 0): {win.id} has the lowest latency, {lat(win):.1f} ms"
    elif lat(fastest) > budget:
        win = fastest
        best_effort = True
        why = (f"no candidate meets the {budget:g} ms budget; {win.id} is the fastest at "
               f"{lat(win):.1f} ms")
    elif math.isinf(budget):
        win = _argmin(rows, energy, lat)
        why = (f"latency-insensitive (no budget): {win.id} has the least weighted energy, "
               f"{energy(win):.1f} mJ (Ww={w_wearable:g}, Wh={w_handheld:g})")
    else:
        feasible = [r for r in rows if lat(r) <= budget]
        win = _argmin(feasible, energy, lat)
        why = (f"{len(feasible)} of {len(rows)} candidates meet the {budget:g} ms budget; "
               f"{win.id} uses the least weighted energy among them, {energy(win):.1f} mJ "
               f"at {lat(win):.1f} ms")
    return Decision(win.id, why, rows, name, scores, best_effort, streaming)


# -- Neurosurgeon --------------------------------------------------------------------------------
def neurosurgeon(rows: Sequence[CandidateCost], objective: str = "latency", *,
                 handheld_load: float = 1.0) -> Decision:
    """Neurosurgeon Algorithm 1: best latency, or best *wearable* energy (the mobile's battery).

    ``handheld_load`` is the paper's K: the handheld's compute time is multiplied by it, so a busy
    handheld pushes the cut towards the wearable.
    """
    rows = _check_rows(rows)
    if objective not in ("latency", "energy"):
        raise ValueError(f"neurosurgeon objective must be 'latency' or 'energy', got {objective!r}")
    if not handheld_load > 0:
        raise ValueError(f"handheld load factor must be > 0, got {handheld_load}")

    def lat(r: CandidateCost) -> float:
        return r.head_ms + r.transfer_ms + handheld_load * r.tail_ms + r.return_ms

    scores = {r.id: {"latency_ms": lat(r), "wearable_energy_mj": r.wearable_energy_mj}
              for r in rows}
    name = f"neurosurgeon({objective}, K={handheld_load:g})"
    if objective == "latency":
        win = _argmin(rows, lat)
        why = (f"{win.id} has the lowest latency, {lat(win):.1f} ms, with the handheld's compute "
               f"scaled by its load K={handheld_load:g}")
    else:
        win = _argmin(rows, lambda r: r.wearable_energy_mj, lat)
        why = f"{win.id} uses the least wearable energy, {win.wearable_energy_mj:.1f} mJ"
    return Decision(win.id, why, rows, name, scores)


# -- DynO ----------------------------------------------------------------------------------------
#: metric name -> (getter, unit). "energy" is the weighted sum with the weights given to dyno().
METRICS: dict[str, str] = {
    "latency": "ms",
    "throughput": "fps",
    "wearable_compute": "ms",
    "handheld_compute": "ms",
    "energy": "mJ",
    "wearable_energy": "mJ",
    "handheld_energy": "mJ",
    "accuracy_drop": "pp",
}
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt,
}


@dataclass(frozen=True)
class Constraint:
    """A hard constraint ``metric op threshold``, e.g. ``Constraint("latency", "<=", 100)``."""

    metric: str
    op: str
    threshold: float

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"unknown metric {self.metric!r}; expected one of {sorted(METRICS)}")
        if self.op not in _OPS:
            raise ValueError(f"unknown operator {self.op!r}; expected one of {sorted(_OPS)}")

    def holds(self, value: float) -> bool:
        return _OPS[self.op](value, self.threshold)

    def violation(self, value: float) -> float:
        """How far ``value`` is from satisfying the constraint, relative to the threshold."""
        if self.holds(value):
            return 0.0
        return abs(value - self.threshold) / max(abs(self.threshold), 1e-9)

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.threshold:g} {METRICS[self.metric]}"


@dataclass(frozen=True)
class Target:
    """A soft target: ``goal`` is ``"min"``, ``"max"`` or a number to get close to."""

    metric: str
    goal: str | float = "min"

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"unknown metric {self.metric!r}; expected one of {sorted(METRICS)}")
        if isinstance(self.goal, str) and self.goal not in ("min", "max"):
            raise ValueError(
                f"soft target goal must be 'min', 'max' or a number, got {self.goal!r}")

    def key(self, value: float) -> float:
        if self.goal == "min":
            return value
        if self.goal == "max":
            return -value
        return abs(value - float(self.goal))

    def __str__(self) -> str:
        return f"{self.goal} {self.metric}" if isinstance(self.goal, str) else \
            f"{self.metric} close to {self.goal:g}"


def metric_value(row: CandidateCost, metric: str, *, streaming: bool = False,
                 w_wearable: float = 1.0, w_handheld: float = 1.0) -> float:
    """The value of a DynO metric for one row."""
    if metric == "latency":
        return row.latency_ms(streaming)
    if metric == "throughput":
        return row.throughput_fps(streaming)
    if metric == "wearable_compute":
        return row.head_ms
    if metric == "handheld_compute":
        return row.tail_ms
    if metric == "energy":
        return row.energy_mj(w_wearable, w_handheld)
    if metric == "wearable_energy":
        return row.wearable_energy_mj
    if metric == "handheld_energy":
        return row.handheld_energy_mj
    if metric == "accuracy_drop":
        return row.accuracy_drop_pp
    raise ValueError(f"unknown metric {metric!r}; expected one of {sorted(METRICS)}")


def dyno(rows: Sequence[CandidateCost], constraints: Sequence[Constraint] = (),
         targets: Sequence[Target] = (Target("latency"),), *, streaming: bool = False,
         w_wearable: float = 1.0, w_handheld: float = 1.0) -> Decision:
    """DynO Algorithm 2.

    Constraints are applied in priority order, each discarding the rows that violate it. If a
    constraint would discard every remaining row, the scheduler falls back to best effort: it keeps
    the remaining rows closest to satisfying that constraint (smallest relative violation) and
    ignores the lower-priority constraints. The survivors are sorted lexicographically by the soft
    targets, in order; the row order breaks remaining ties.
    """
    rows = _check_rows(rows)
    targets = list(targets) or [Target("latency")]

    def val(r: CandidateCost, m: str) -> float:
        return metric_value(r, m, streaming=streaming, w_wearable=w_wearable,
                            w_handheld=w_handheld)

    scores = {r.id: {m: val(r, m) for m in METRICS} for r in rows}
    feasible = rows
    notes: list[str] = []
    best_effort = False
    for c in constraints:
        kept = [r for r in feasible if c.holds(val(r, c.metric))]
        if kept:
            notes.append(f"{c}: {len(kept)} of {len(feasible)} kept")
            feasible = kept
            continue
        best_effort = True
        least = min(c.violation(val(r, c.metric)) for r in feasible)
        feasible = [r for r in feasible if c.violation(val(r, c.metric)) <= least + 1e-12]
        notes.append(f"{c}: nobody meets it, kept the closest ({least:.1%} off)")
        break
    order = {r.id: i for i, r in enumerate(rows)}
    win = min(feasible, key=lambda r: (*(t.key(val(r, t.metric)) for t in targets), order[r.id]))
    soft = ", ".join(str(t) for t in targets)
    values = ", ".join(f"{t.metric}={val(win, t.metric):.3g}" for t in targets)
    why = "; ".join([*notes, f"then by {soft}: {win.id} ({values})"])
    name = "dyno"
    return Decision(win.id, why, rows, name, scores, best_effort, streaming)


def parse_constraint(text: str) -> Constraint:
    """Parse ``"latency<=100"`` (the CLI and policy file form)."""
    for op in ("<=", ">=", "<", ">"):
        if op in text:
            metric, _, thr = text.partition(op)
            try:
                return Constraint(metric.strip(), op, float(thr))
            except ValueError as exc:
                raise ValueError(f"bad constraint {text!r}: {exc}") from None
    raise ValueError(f"bad constraint {text!r}; expected METRIC<=NUMBER (or <, >=, >)")


def constraint_from_json(obj: Any) -> Constraint:
    if isinstance(obj, str):
        return parse_constraint(obj)
    if isinstance(obj, (list, tuple)) and len(obj) == 3:
        return Constraint(str(obj[0]), str(obj[1]), float(obj[2]))
    raise ValueError(f"bad constraint {obj!r}; expected [metric, op, threshold]")


def target_from_json(obj: Any) -> Target:
    """``"energy"`` (minimise), ``"throughput:max"``, ``"latency:50"`` or ``[metric, goal]``."""
    if isinstance(obj, str):
        metric, _, text = obj.partition(":")
        obj = [metric.strip(), text.strip() or "min"]
    if isinstance(obj, (list, tuple)) and len(obj) == 2:
        try:
            goal: str | float = obj[1] if obj[1] in ("min", "max") else float(obj[1])
        except (TypeError, ValueError):
            raise ValueError(f"bad soft target goal {obj[1]!r}; expected min, max or a number") \
                from None
        return Target(str(obj[0]), goal)
    raise ValueError(f"bad soft target {obj!r}; expected [metric, 'min'|'max'|number]")
