"""Min-cut cut search equals exhaustive search over downward-closed sets."""

from __future__ import annotations

from pathlib import Path

import pytest
from coinf.wearable.planner.mincut import (
    Dag,
    brute_force_cut,
    cut_latency,
    min_cut,
    transfer_costs,
)
from hypothesis import given, settings
from hypothesis import strategies as st


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


def test_onnx_adapter_matches_brute_force(tmp_path: Path) -> None:
    import random

    from coinf.wearable.planner.onnx_dag import dag_from_onnx

    from tests.planner_bundle import make_skip_model

    model = make_skip_model(tmp_path / "skip.onnx", hw=16)
    dag = dag_from_onnx(model, {}, {})
    t = {x.name: x for x in dag.tensors}
    assert t["x"].producer is None and t["x"].nbytes == 3 * 16 * 16 * 4
    assert sorted(t["b"].consumers) == ["add", "conv2"]
    assert t["y"].is_output and "w1" not in t  # initializers do not travel
    rng = random.Random(3)
    names = [n.name for n in dag.nodes]
    for _ in range(20):
        w = {n: rng.uniform(0, 10) for n in names}
        h = {n: rng.uniform(0, 2) for n in names}
        dag = dag_from_onnx(model, w, h)
        up, down = transfer_costs(dag, bandwidth_bps=rng.choice([1e3, 1e5, 1e7]), rtt_ms=1)
        fast, slow = min_cut(dag, up, down), brute_force_cut(dag, up, down)
        assert fast.latency_ms == pytest.approx(slow.latency_ms, abs=0.05)
    # a cut after conv2 sends both b and c (b once, although two nodes read it)
    _, crossing = cut_latency(dag, {"conv1", "relu", "conv2"}, up, down)
    assert sorted(crossing) == ["b", "c"]


def test_planner_optimal_cut_on_a_bundle(tmp_path: Path) -> None:
    from coinf.wearable.planner.adapt import LinkEstimate
    from coinf.wearable.planner.planner import Planner

    from tests.planner_bundle import make_bundle

    bundle = make_bundle(tmp_path / "b", hw=32)
    planner = Planner(bundle)
    slow = planner.optimal_cut(LinkEstimate(1_000, 1_000, 0))
    fast = planner.optimal_cut(LinkEstimate(1e9, 1e9, 0))
    assert len(slow.wearable) == 6  # 1 kB/s: keep everything local
    assert fast.wearable == frozenset()  # free link, 30x faster handheld: offload everything
