"""Min-cut cut search equals exhaustive search over downward-closed sets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wearable.planner.mincut import (
    Dag,
    brute_force_cut,
    cut_latency,
    min_cut,
    transfer_costs,
)


@st.composite
def random_dags(draw: st.DrawFn) -> tuple[Dag, dict[str, float], dict[str, float]]:
    n = draw(st.integers(1, 9))
    cost = st.floats(0, 50, allow_nan=False).map(lambda x: round(x, 3))
    dag = Dag()
    for i in range(n):
        dag.add_node(f"n{i}", draw(cost), draw(cost))
    consumers: dict[int, list[str]] = {i: [] for i in range(-1, n)}
    for j in range(n):
        # every node reads the graph input or some earlier node's output, maybe several
        srcs = draw(st.sets(st.integers(-1, j - 1), min_size=1, max_size=3))
        for s in srcs:
            consumers[s].append(f"n{j}")
    up: dict[str, float] = {}
    down: dict[str, float] = {}
    for i in range(-1, n):
        name = "input" if i < 0 else f"t{i}"
        is_out = i >= 0 and (not consumers[i] or draw(st.booleans()))
        dag.add_tensor(name, None if i < 0 else f"n{i}", consumers[i], 0, is_out)
        up[name] = draw(cost)
        if is_out:
            down[name] = draw(cost)
    return dag, up, down


def is_downward_closed(dag: Dag, w: frozenset[str]) -> bool:
    preds = dag.predecessors()
    return all(preds[v] <= w for v in w)


@settings(max_examples=300, deadline=None)
@given(random_dags())
def test_min_cut_equals_brute_force(case: tuple[Dag, dict[str, float], dict[str, float]]) -> None:
    dag, up, down = case
    fast = min_cut(dag, up, down)
    slow = brute_force_cut(dag, up, down)
    assert is_downward_closed(dag, fast.wearable)
    # capacities are rounded to whole microseconds: allow 1 us per edge
    assert fast.latency_ms == pytest.approx(slow.latency_ms, abs=1e-3 * (3 * len(dag.nodes) + 2))
    assert fast.latency_ms == pytest.approx(cut_latency(dag, fast.wearable, up, down)[0])


def test_shared_tensor_is_paid_once() -> None:
    # input -> a -> (b, c); t_a is big for the wearable to compute past but cheap to send once
    dag = Dag()
    dag.add_node("a", 1, 10)
    dag.add_node("b", 10, 1)
    dag.add_node("c", 10, 1)
    dag.add_tensor("in", None, ["a"], 10_000)
    dag.add_tensor("ta", "a", ["b", "c"], 100)
    dag.add_tensor("tb", "b", [], 0, True)
    dag.add_tensor("tc", "c", [], 0, True)
    up, down = transfer_costs(dag, bandwidth_bps=10_000)  # in: 1000 ms, ta: 10 ms
    res = min_cut(dag, up, down)
    assert res.wearable == frozenset({"a"})
    assert res.crossing == ("ta",)
    assert res.latency_ms == pytest.approx(1 + 10 + 1 + 1)


def test_rejects_cycles_and_unknown_nodes() -> None:
    dag = Dag()
    dag.add_node("a", 1, 1)
    dag.add_node("b", 1, 1)
    dag.add_tensor("x", "a", ["b"], 1)
    dag.add_tensor("y", "b", ["a"], 1)
    with pytest.raises(ValueError, match="cycle"):
        min_cut(dag, {}, {})
    dag2 = Dag()
    dag2.add_node("a", 1, 1)
    dag2.add_tensor("x", "a", ["zz"], 1)
    with pytest.raises(ValueError, match="unknown consumer"):
        min_cut(dag2, {}, {})
