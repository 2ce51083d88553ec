"""Plan regret: what a slice predictor's error costs the planner's choice of cut."""

from __future__ import annotations

import pytest
from coinf.research.planregret import (
    LINK_KB_S,
    SLOWDOWNS,
    CutBytes,
    break_even_kb_s,
    plan_regret,
    regret_table,
)

# three cuts of one model: all on the handheld, a split, all on the wearable
CUTS = {"c0": CutBytes(1000, 10, False, True), "c1": CutBytes(100, 10, True, True),
        "c2": CutBytes(0, 0, True, False)}


def rows(head1: float, tail1: float, whole: float, error: float = 1.0,
         ) -> list[tuple[str, float, float]]:
    """Slices as (name, predicted, measured); the split's head is predicted ``error`` x."""
    return [("c0.tail", whole, whole), ("c1.head", head1 * error, head1),
            ("c1.tail", tail1, tail1), ("c2.head", whole, whole)]


def test_a_right_prediction_costs_nothing() -> None:
    table = regret_table(rows(4.0, 6.0, 10.0), CUTS)
    # the wearable 1x as fast never breaks even with sending it all: no x1@break-even
    assert set(table) == ({f"x{s:g}@{r:g}kB/s" for s in SLOWDOWNS for r in LINK_KB_S}
                          | {"x10@break-even"})
    assert all(v == 0.0 for v in table.values())


def test_break_even_is_where_all_local_and_all_remote_take_as_long() -> None:
    times = {s: (p, m) for s, p, m in rows(4.0, 6.0, 10.0)}
    rate = break_even_kb_s(times, CUTS, 10.0)
    assert rate == pytest.approx(1010 / 90)  # 10 x 10 ms = 10 ms + 1010 B / rate
    assert 10.0 + 1010 / rate == pytest.approx(10.0 * 10.0)
    assert break_even_kb_s(times, CUTS, 1.0) is None
    times["c2.head"] = (10.0, 10.5)  # noise makes the whole model's head slower than its tail
    assert break_even_kb_s(times, CUTS, 1.0) is None
    times["c2.head"] = (10.0, 10.0)
    assert break_even_kb_s({"c2.head": (1.0, 1.0)}, CUTS, 10.0) is None  # no all-remote cut
    # there the split (40 + 6 + 110 / rate = 55.8 ms) beats both (100 ms): a tail predicted
    # 10x too slow hides it, and the planner keeps a cut 79 % slower
    times["c1.tail"] = (60.0, 6.0)
    assert plan_regret(times, CUTS, 10.0, rate) == pytest.approx(100.0 / (46 + 110 / rate) - 1)


def test_a_wrong_prediction_costs_the_measured_difference() -> None:
    # at 100 kB/s, wearable 1x: c0 = 10 + 10.1 ms, c1 = 4 + 6 + 1.1 = 11.1 ms, c2 = 10 ms (best).
    # The split's head predicted at 0.5x (2 ms: 9.1 ms) makes the planner pick c1: 11 % slower.
    times = {s: (p, m) for s, p, m in rows(4.0, 6.0, 10.0, error=0.5)}
    assert plan_regret(times, CUTS, 1.0, 100.0) == pytest.approx(11.1 / 10.0 - 1.0)
    # an error too small to change the choice costs nothing
    times = {s: (p, m) for s, p, m in rows(4.0, 6.0, 10.0, error=0.95)}
    assert plan_regret(times, CUTS, 1.0, 100.0) == 0.0


def test_the_slowdown_applies_to_the_head_only() -> None:
    # wearable 10x: c0 = 10 + 10.1 = 20.1 ms (best), c1 = 40 + 6 + 1.1 = 47.1, c2 = 100.
    # c0's tail predicted 10x too slow (110.1 ms predicted) makes the planner pick c1.
    times = {"c0.tail": (100.0, 10.0), "c1.head": (4.0, 4.0), "c1.tail": (6.0, 6.0),
             "c2.head": (10.0, 10.0)}
    assert plan_regret(times, CUTS, 10.0, 100.0) == pytest.approx(47.1 / 20.1 - 1.0)


def test_cuts_without_times_are_skipped_and_none_is_an_error() -> None:
    times = {"c2.head": (10.0, 10.0)}
    assert plan_regret(times, CUTS, 1.0, 36.0) == 0.0
    # a split whose tail went untimed is not ranked (as if its tail took no time, it would
    # win on its predicted head and cost 4x)
    times["c1.head"] = (0.1, 50.0)
    assert plan_regret(times, CUTS, 1.0, 1e9) == 0.0
    with pytest.raises(ValueError, match="at least one cut"):
        plan_regret({}, CUTS, 1.0, 36.0)
