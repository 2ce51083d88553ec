"""Issue 15's parts on their own: metrics, feed layouts, If inlining, Pareto selection."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from coinf.convert import pareto
from coinf.convert.cost import all_costs
from coinf.convert.cuts import enumerate_cuts
from coinf.convert.feeds import dataset_from_arrays
from coinf.convert.freeze import freeze_inputs
from coinf.convert.graph import load_graph
from coinf.convert.metrics import parse_metric, upper_bound_pp
from coinf.convert.state import state_pairs
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from coinf.bundle import TensorSpec
from coinf.errors import InputError
from tests import realmodels as rm


# -- metrics ------------------------------------------------------------------------------------
def test_builtin_metrics_on_known_values() -> None:
    ref = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1]], np.float32)
    test = np.array([[0.6, 0.5, 0.0], [0.8, 0.1, 0.1]], np.float32)
    assert parse_metric("top1").loss([ref], [test]) == pytest.approx(0.5)  # 1 of 2 rows
    assert parse_metric("top2").loss([ref], [test]) == 0.0  # class 1 is still in the top 2
    assert parse_metric("top1").loss([ref[:1]], [test[:1]], label=1) == 1.0  # right -> wrong
    assert parse_metric("top1").loss([ref[:1]], [test[:1]], label=2) == 0.0  # was wrong
    assert parse_metric("decision@0.55").loss([ref], [test]) == pytest.approx(2 / 6)
    m_ref = np.array([0.9, 0.9, 0.1, 0.9])
    m_test = np.array([0.9, 0.1, 0.1, 0.9])
    assert parse_metric("iou@0.5").loss([m_ref], [m_test]) == pytest.approx(1 - 2 / 3)
    assert parse_metric("iou@0.5").loss([np.zeros(4)], [np.zeros(4)]) == 0.0
    a = np.array([1.0, -2.0, 4.0])
    b = np.array([1.0, -2.0, 3.0])
    assert parse_metric("maxrel").loss([a], [b]) == pytest.approx(1 / 4)
    assert parse_metric("meanrel").loss([a], [b]) == pytest.approx((1 / 3) / (7 / 3))
    cos = float(a @ b) / (np.linalg.norm(a) * np.linalg.norm(b))
    assert parse_metric("cosine").loss([a], [b]) == pytest.approx(1 - cos)
    # two outputs: the mean of their losses
    two = parse_metric("maxrel", ["p", "q"], ["p", "q"])
    assert two.loss([a, a], [b, a]) == pytest.approx(1 / 8)


def test_user_metric_and_bad_specs(tmp_path: Path) -> None:
    (tmp_path / "mymetric.py").write_text(
        "def agree(ref, test):\n    return 1.0 if (ref[0] > 0).all() == (test[0] > 0).all() "
        "else 0.0\n\ndef broken(ref, test):\n    raise KeyError('boom')\n")
    m = parse_metric(f"{tmp_path / 'mymetric.py'}:agree")
    assert m.loss([np.ones(3)], [np.ones(3)]) == 0.0
    assert m.loss([np.ones(3)], [-np.ones(3)]) == 1.0
    with pytest.raises(InputError, match="the function failed: KeyError"):
        parse_metric(f"{tmp_path / 'mymetric.py'}:broken").loss([np.ones(1)], [np.ones(1)])
    for text, why in (("top0", "expected one of"), ("iou@x", "expected one of"),
                      ("iou@1.2.3", "not a threshold"), ("nosuchmodule_xyz:f", "cannot import"),
                      (f"{tmp_path / 'mymetric.py'}:nope", "has no function"),
                      (f"{tmp_path / 'none.py'}:f", "no such file")):
        with pytest.raises(InputError, match=why):
            parse_metric(text)


def test_upper_bound_counts_fractional_losses_as_failures() -> None:
    # 0/1 losses: Clopper-Pearson, as the top-1 calibration always did
    assert upper_bound_pp(np.zeros(8), 0.95) == pytest.approx(31.23, abs=0.01)
    # fractional losses summing to 0.3: at least as cautious as one failure in 8
    assert upper_bound_pp(np.full(8, 0.3 / 8), 0.95) == pytest.approx(
        upper_bound_pp(np.array([1.0] + [0.0] * 7), 0.95))
    assert upper_bound_pp(np.full(10, 2.0), 0.95) == 200.0  # never below the mean


# -- feeds --------------------------------------------------------------------------------------
def test_feed_layouts() -> None:
    specs = [TensorSpec("img", (1, 3, 2), "float32", 24), TensorSpec("sr", (), "int64", 8),
             TensorSpec("frames", (4, 2), "float32", 32)]
    n = 5
    arrays = {
        "img": np.arange(n * 6, dtype=np.float64).reshape(n, 3, 2),  # N along the batch axis
        "sr": np.int32(16000),  # one value for every feed
        "frames": np.ones((n, 4, 2), np.float32),  # N on a new leading axis
        "extra": np.zeros(7),  # not an input: ignored
        "lab": np.arange(n),
    }
    data = dataset_from_arrays(arrays, specs, "t.npz", labels_key="lab")
    assert len(data) == n and list(data.labels) == list(range(n))  # type: ignore[arg-type]
    feed = data.feed(2)
    assert feed["img"].shape == (1, 3, 2) and feed["img"].dtype == np.float32
    assert feed["img"][0, 0, 0] == 12.0
    assert isinstance(feed["sr"], np.ndarray) and feed["sr"].shape == () and feed["sr"] == 16000
    assert feed["sr"].dtype == np.int64 and feed["frames"].shape == (4, 2)
    one = dataset_from_arrays({"x": np.ones((1, 3, 2))}, specs[:1], "one")
    assert len(one) == 1 and one.feed(0)["img"].shape == (1, 3, 2)
    with pytest.raises(InputError, match=r"\(N, 4, 2\)"):
        dataset_from_arrays({**arrays, "frames": np.ones((n, 2, 4))}, specs, "t.npz")
    with pytest.raises(InputError, match="labels 'lab' must be 5 integers"):
        dataset_from_arrays({**arrays, "lab": np.ones((5, 2))}, specs, "t.npz",
                            labels_key="lab")  # float rows: neither ids nor a pitch each
    with pytest.raises(InputError, match="labels 'lab' must be 5 integers"):
        dataset_from_arrays({**arrays, "lab": np.full(5, np.nan)}, specs, "t.npz",
                            labels_key="lab")
    pitch = dataset_from_arrays({**arrays, "lab": np.full(5, 440.0)}, specs, "t.npz",
                                labels_key="lab")  # one number each: a pitch in Hz
    assert pitch.labels is not None and pitch.labels.dtype.kind == "f"


# -- freeze -------------------------------------------------------------------------------------
def _nested_if() -> onnx.ModelProto:
    """``If mode > 0: (If mode > 1: x*3 else x*2) else -x``, then +1: nested decisions."""
    f = T.FLOAT
    inner = h.make_node(
        "If", ["gt1"], ["inner_out"], name="inner",
        then_branch=h.make_graph([h.make_node("Mul", ["x", "three"], ["a3"], name="m3")], "t",
                                 [], [h.make_tensor_value_info("a3", f, [1, 4])],
                                 [nh.from_array(np.float32([3.0]), "three")]),
        else_branch=h.make_graph([h.make_node("Mul", ["x", "two"], ["a2"], name="m2")], "e",
                                 [], [h.make_tensor_value_info("a2", f, [1, 4])],
                                 [nh.from_array(np.float32([2.0]), "two")]))
    outer_then = h.make_graph(
        [h.make_node("Greater", ["mode", "one"], ["gt1"], name="g1"), inner], "ot", [],
        [h.make_tensor_value_info("inner_out", f, [1, 4])])
    outer_else = h.make_graph([h.make_node("Neg", ["x"], ["neg"], name="neg")], "oe", [],
                              [h.make_tensor_value_info("neg", f, [1, 4])])
    nodes = [h.make_node("Greater", ["mode", "zero"], ["gt0"], name="g0"),
             h.make_node("If", ["gt0"], ["mid"], name="outer", then_branch=outer_then,
                         else_branch=outer_else),
             h.make_node("Add", ["mid", "onef"], ["y"], name="plus1")]
    g = h.make_graph(nodes, "nested", [h.make_tensor_value_info("x", f, [1, 4]),
                                       h.make_tensor_value_info("mode", T.INT64, [1])],
                     [h.make_tensor_value_info("y", f, [1, 4])],
                     [nh.from_array(np.int64([0]), "zero"), nh.from_array(np.int64([1]), "one"),
                      nh.from_array(np.float32([1.0]), "onef")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_nested_ifs_resolve_to_the_taken_branch(mode: int) -> None:
    model = _nested_if()
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = ref.run(None, {"x": x, "mode": np.int64([mode])})[0]
    frozen = onnx.ModelProto()
    frozen.CopyFrom(model)
    freeze_inputs(frozen, {"mode": mode})  # "mode=2" for a [1] input
    onnx.checker.check_model(frozen)
    assert not [n for n in frozen.graph.node if n.op_type == "If"]
    assert [i.name for i in frozen.graph.input] == ["x"]
    got = ort.InferenceSession(frozen.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want)


def test_state_pairs_by_name() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "rnn.onnx"
        onnx.save(rm.recurrent(), str(path))
        g = load_graph(path)
        assert state_pairs(g) == [("state", "stateN")]
        with pytest.raises(InputError, match="not a model output"):
            state_pairs(g, [("state", "nope")])
        with pytest.raises(InputError, match="shapes/dtypes differ"):
            state_pairs(g, [("state", "prob")])


# -- Pareto -------------------------------------------------------------------------------------
def _shrinking_chain(n: int) -> onnx.ModelProto:
    """x[1,1024] through n Slice ops that drop 1 to 4 elements each (cuts a few bytes and
    FLOPs apart) with a MatMul every 25 ops (the FLOPs)."""
    f = T.FLOAT
    rng = np.random.default_rng(3)
    nodes, inits = [], []
    width, cur = 1024, "x"
    for i in range(n):
        if i % 25 == 24:
            w = rng.standard_normal((width, width - 8)).astype(np.float32) * 0.05
            inits.append(nh.from_array(w, f"w{i}"))
            nodes.append(h.make_node("MatMul", [cur, f"w{i}"], [f"t{i}"], name=f"mm{i}"))
            width -= 8
        else:
            drop = 1 + i % 4
            inits += [nh.from_array(np.int64([0]), f"s{i}"),
                      nh.from_array(np.int64([width - drop]), f"e{i}"),
                      nh.from_array(np.int64([1]), f"a{i}")]
            nodes.append(h.make_node("Slice", [cur, f"s{i}", f"e{i}", f"a{i}"], [f"t{i}"],
                                     name=f"sl{i}"))
            width -= drop
        cur = f"t{i}"
    g = h.make_graph(nodes, "chain", [h.make_tensor_value_info("x", f, [1, 1024])],
                     [h.make_tensor_value_info(cur, f, [1, width])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_pareto_selection_skips_near_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "chain.onnx"
    onnx.save(_shrinking_chain(300), str(path))
    g = load_graph(path)
    costs = all_costs(g)
    total = sum(c.flops for c in costs)
    wide = enumerate_cuts(g, costs, 400)
    distinct = [(c.head_flops, c.crossing_bytes) for c in wide[1:-1]
                if c.reason != "spread"][:12]
    # with room for 12, the 12 cuts no other near-dominates: the Pareto front, one per run of
    # zero-FLOP Slices (the 300-cut pool is mostly near-duplicates: same compute, more bytes)
    cuts = enumerate_cuts(g, costs, 14)
    points = [(c.head_flops, c.crossing_bytes) for c in cuts[1:-1]]
    assert len(points) == 12 and points == sorted(distinct)
    ends = [(0, cuts[0].crossing_bytes), (total, cuts[-1].crossing_bytes)]
    for i, a in enumerate(points):
        for b in points[:i] + points[i + 1:] + ends:
            assert not pareto.near(a, b, total), (a, b)
        assert not any(b != a and b[0] <= a[0] and b[1] <= a[1] for b in points + ends)
    # with more room, near-duplicates fill the slots nothing else wants, after them
    assert len(wide) == 301 and [c.reason for c in wide].count("pareto") == 12
