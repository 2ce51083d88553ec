"""Schedulers on hand-made cost tables with known answers."""

from __future__ import annotations

import math

import pytest
from coinf.wearable.planner import (
    CandidateCost,
    Constraint,
    Target,
    coinf_schedule,
    dyno,
    neurosurgeon,
)


def row(cid: str, head: float, xfer: float, tail: float, ew: float, eh: float,
        ret: float = 0.0, acc: float = 0.0) -> CandidateCost:
    return CandidateCost(cid, head, tail, xfer, ret, ew, eh, 0, acc)


# A table shaped like CoINF Fig. 5/6: handheld-only pays a big upload, wearable-only a big compute,
# an inner cut (c2, like AvgPool_0a) is cheap in both; c1 is the fastest but costs more energy.
TABLE = [
    row("handheld-only", 0, 400, 20, ew=400, eh=300),
    row("c1", 40, 60, 15, ew=120, eh=80),
    row("c2", 110, 10, 5, ew=130, eh=20),
    row("wearable-only", 900, 0, 0, ew=2700, eh=0),
]


def test_coinf_latency_sensitive_budget_zero_picks_fastest() -> None:
    d = coinf_schedule(TABLE, 0)
    assert d.winner == "c1"  # 115 ms vs 125 ms for c2
    assert "latency-sensitive" in d.why


def test_coinf_tie_on_latency_broken_by_energy() -> None:
    # c1 and c2 both take 125 ms; c1 weighted energy 200, c2 150 -> c2
    t = [row("a", 50, 60, 15, 120, 80), row("b", 110, 10, 5, 130, 20)]
    assert coinf_schedule(t, 0).winner == "b"


def test_coinf_no_budget_minimises_weighted_energy() -> None:
    assert coinf_schedule(TABLE, None).winner == "c2"  # 150 mJ
    assert coinf_schedule(TABLE, math.inf).winner == "c2"
    # Only the wearable's battery matters: handheld-only has... c1 at 120 is least
    assert coinf_schedule(TABLE, None, w_wearable=1, w_handheld=0).winner == "c1"
    # Only the handheld's battery matters: wearable-only costs the handheld nothing
    assert coinf_schedule(TABLE, None, w_wearable=0, w_handheld=1).winner == "wearable-only"


def test_coinf_budget_picks_most_efficient_meeting_it() -> None:
    t = [row("fast", 10, 10, 10, 500, 500), row("mid", 40, 10, 10, 100, 100),
         row("slow", 200, 0, 0, 50, 0)]
    assert coinf_schedule(t, 35).winner == "fast"
    assert coinf_schedule(t, 60).winner == "mid"
    assert coinf_schedule(t, 200).winner == "slow"
    d = coinf_schedule(t, 5)  # nobody meets 5 ms: fall back to the fastest
    assert d.winner == "fast" and d.best_effort


def test_coinf_streaming_uses_max_of_stages() -> None:
    # balanced: head, link, tail 40 each -> period 40 (sum 120); link-bound: 10 + 70 + 10 -> 70
    # (sum 90). The tail overlaps the link, so "head vs everything else" (80) would be wrong.
    t = [row("balanced", 40, 40, 40, 1, 1), row("link-bound", 10, 70, 10, 1, 1)]
    assert coinf_schedule(t, 0).winner == "link-bound"
    d = coinf_schedule(t, 0, streaming=True)
    assert d.winner == "balanced"
    assert d.scores["balanced"]["latency_ms"] == 40
    assert d.scores["link-bound"]["latency_ms"] == 70


def test_coinf_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="budget"):
        coinf_schedule(TABLE, -1)
    with pytest.raises(ValueError, match="weights"):
        coinf_schedule(TABLE, None, w_wearable=-1)
    with pytest.raises(ValueError, match="empty"):
        coinf_schedule([], 0)
    with pytest.raises(ValueError, match="head_ms"):
        row("x", -1, 0, 0, 0, 0)


def test_neurosurgeon_latency_and_handheld_load() -> None:
    t = [row("handheld-only", 0, 30, 60, 30, 60), row("mid", 40, 20, 20, 50, 20),
         row("wearable-only", 100, 0, 0, 300, 0)]
    assert neurosurgeon(t, "latency").winner == "mid"  # 90 vs 80 vs 100 -> mid (80)
    assert neurosurgeon(t, "latency", handheld_load=1.0).winner == "mid"
    # handheld 3x slower: handheld-only 210, mid 120, wearable-only 100
    assert neurosurgeon(t, "latency", handheld_load=3.0).winner == "wearable-only"
    assert neurosurgeon(t, "energy").winner == "handheld-only"


def test_dyno_constraints_then_soft_targets() -> None:
    t = [row("a", 10, 10, 10, 300, 10, acc=0.0), row("b", 30, 5, 5, 100, 10, acc=0.5),
         row("c", 80, 0, 0, 50, 0, acc=2.0)]
    assert dyno(t, [Constraint("latency", "<=", 50)], [Target("energy")]).winner == "b"
    # accuracy first, then energy: c dropped, b (110) beats a (310)
    d = dyno(t, [Constraint("accuracy_drop", "<=", 1)], [Target("energy")])
    assert d.winner == "b" and not d.best_effort
    # lexicographic soft targets: min wearable compute first -> a
    assert dyno(t, [], [Target("wearable_compute"), Target("energy")]).winner == "a"
    # close-to-value target
    assert dyno(t, [], [Target("latency", 45)]).winner == "b"
    assert dyno(t, [], [Target("throughput", "max")]).winner == "a"


def test_dyno_best_effort_keeps_closest_and_stops() -> None:
    t = [row("a", 10, 10, 10, 300, 10), row("b", 30, 5, 5, 100, 10),
         row("c", 80, 0, 0, 50, 0)]
    d = dyno(t, [Constraint("latency", "<=", 20), Constraint("energy", "<=", 60)],
             [Target("energy")])
    assert d.best_effort and d.winner == "a"  # 30 ms is closest to 20 ms; energy ignored
    # priority order matters: energy first keeps c; then latency <= 20 impossible -> c
    d = dyno(t, [Constraint("energy", "<=", 60), Constraint("latency", "<=", 20)],
             [Target("latency")])
    assert d.best_effort and d.winner == "c"


def test_decision_explain_marks_winner() -> None:
    d = coinf_schedule(TABLE, None)
    text = d.explain()
    lines = [ln for ln in text.splitlines() if ln.startswith("*")]
    assert len(lines) == 1 and "c2" in lines[0]
    assert "why:" in text
    assert d.to_json()["winner"] == "c2"
