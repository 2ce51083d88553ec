"""In-context node timings (profiler kernels mapped back to nodes) and the leave-one-model-out
slice predictor (issue 17, part 1)."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import pytest
from coinf.device.features import NodeFeatures
from coinf.device.incontext import (
    anchors,
    attribute,
    kernel_times,
    model_features,
    profile_in_context,
)
from coinf.device.slicepred import SlicePredictor
from coinf.research.context_sweep import random_network, run_context_sweep
from coinf.research.slicetrain import (
    NodeSample,
    SliceSample,
    leave_one_model_out,
    train_slice_predictor,
    within,
)
from onnx import TensorProto, helper, numpy_helper

from tests.cachecheck import check_planted_fresh_corrupt

# time beyond the suite's 30 s a test: scores the zoo from a timed cache (13 s alone)
pytestmark = pytest.mark.timeout(120)


def conv_bn_relu_gemm() -> onnx.ModelProto:
    """x -> Conv -> BN -> Relu -> GlobalAveragePool -> Flatten -> Gemm -> Relu -> Gemm."""
    rng = np.random.default_rng(0)

    def w(name: str, *shape: int, offset: float = 0.0) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1 + offset)
                                       .astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "cw", "cb"], ["c"], name="conv", kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"], name="bn"),
        helper.make_node("Relu", ["n"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="gap"),
        helper.make_node("Flatten", ["p"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "gw", "gb"], ["g"], name="fc1", transB=1),
        helper.make_node("Relu", ["g"], ["gr"], name="fc1_relu"),
        helper.make_node("Gemm", ["gr", "hw", "hb"], ["y"], name="fc2", transB=1),
    ]
    inits = [w("cw", 32, 8, 3, 3), w("cb", 32), w("s", 32, offset=1), w("b", 32), w("m", 32),
             w("v", 32, offset=2), w("gw", 64, 32), w("gb", 64), w("hw", 10, 64), w("hb", 10)]
    graph = helper.make_graph(
        nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_anchors_fold_followers_into_conv_and_gemm() -> None:
    a = anchors(conv_bn_relu_gemm())
    assert a["bn"] == "conv" and a["relu"] == "conv" and a["fc1_relu"] == "fc1"
    assert a["gap"] == "gap" and a["fc2"] == "fc2"


@pytest.mark.parametrize("level", ["basic", "all"])
def test_kernels_map_back_to_anchor_nodes(level: str) -> None:
    model = conv_bn_relu_gemm()
    kern, ops, run_ms = kernel_times(model, level, repeats=3)
    assert run_ms > 0 and kern
    nodes, other = attribute(model, kern, ops)
    # every kernel but layout reorders lands on an original node, and only on anchors
    assert set(nodes) <= {"conv", "gap", "flat", "fc1", "fc2"}
    assert {"conv", "fc1", "fc2"} <= set(nodes)
    assert sum(nodes.values()) + other == pytest.approx(sum(kern.values()))
    if level == "all":  # fused at this level: no kernel of its own for bn / relu
        assert not any(k in ("bn", "relu", "fc1_relu") for k in kern)


def test_profile_in_context_of_a_file(tmp_path: Path) -> None:
    path = f"{tmp_path}/m.onnx"
    onnx.save(conv_bn_relu_gemm(), path)
    prof = profile_in_context(path, "all", repeats=3)
    assert prof.kernels >= 3 and prof.kernel_sum_ms > 0 and "conv" in prof.nodes


def test_context_sweep_trains_on_a_tiny_subset() -> None:
    samples = run_context_sweep(3, seed=1, repeats=2)
    assert samples and all(s.ms > 0 for s in samples)
    assert any(s.group.startswith("conv:") for s in samples)
    pred = train_slice_predictor(samples, [], {})
    f, g = next(iter(model_features(random_network(99)).values()))
    assert pred.node_ms(f, g) > 0
    again = SlicePredictor.from_json(pred.to_json())
    assert again.node_ms(f, g) == pytest.approx(pred.node_ms(f, g))


# -- leave-one-model-out on synthetic timings (no clock involved) --------------------------
def _feat(name: str, mflops: float) -> NodeFeatures:
    return NodeFeatures(name, "Conv", "conv", (0, 3, 1, 0, 16, 16, 64, 0),
                        (mflops, mflops / 10, mflops / 10, 0.01), mflops * 1e6)


def _zoo(speed: dict[str, float]) -> tuple[list[NodeSample], list[SliceSample], dict]:
    """Three 'models' of 8 conv nodes each; ms = mflops / speed[model] (+ a 0.01 ms constant
    per slice); slices are the prefixes of each model."""
    nodes, slices, feats = [], [], {}
    for m, sp in speed.items():
        fm = {}
        for k in range(8):
            f = _feat(f"{m}{k}", 0.5 * (k + 1))
            fm[f.name] = (f, "conv:k+fused")
            nodes.append(NodeSample(m, f, "conv:k+fused", f.linear[0] / sp))
        feats[m] = fm
        names = list(fm)
        for j in range(1, 9):
            ms = sum(fm[n][0].linear[0] / sp for n in names[:j]) + 0.01
            slices.append(SliceSample(m, f"s{j}", tuple(names[:j]), j, 0.0, ms))
    return nodes, slices, feats


def test_lomo_predicts_a_model_that_runs_like_the_others() -> None:
    nodes, slices, feats = _zoo({"a": 10.0, "b": 10.0, "c": 10.0})
    heard: list[str] = []
    res = leave_one_model_out(nodes, slices, feats, progress=heard.append)
    assert [h.split(": ")[0] for h in heard] == [f"leave one model out {i}/3" for i in (1, 2, 3)]
    for m in "abc":
        assert within([(p, t) for _, p, t in res[m]]) == 1.0


def test_lomo_can_fail_and_never_sees_the_held_out_model() -> None:
    nodes, slices, feats = _zoo({"a": 10.0, "b": 10.0, "c": 30.0})  # c: 3x faster kernels
    res = leave_one_model_out(nodes, slices, feats)
    assert within([(p, t) for _, p, t in res["c"]]) < 0.2  # trained on a, b only: misses c
    assert within([(p, t) for _, p, t in res["a"]]) < 1.0  # c pulls a's training off
    # c's own timings do not change c's prediction (they are never used for it)
    moved = [replace(n, ms=n.ms * 50) if n.model == "c" else n for n in nodes]
    again = leave_one_model_out(moved, slices, feats, models=["c"])
    assert [p for _, p, _ in again["c"]] == pytest.approx([p for _, p, _ in res["c"]])


def test_synthetic_profiles_are_cached_per_arguments_and_refreshed_on_request(
        tmp_path: Path) -> None:
    from coinf.research.context_data import synthetic_samples

    first = synthetic_samples(tmp_path, 3, seed=1, repeats=2)
    assert first and {s.model for s in first} == {"synthetic0", "synthetic1", "synthetic2"}
    cache = tmp_path / "synthetic-3-1-1-2.json"
    stamp = cache.stat().st_mtime_ns
    again = synthetic_samples(tmp_path, 3, seed=1, repeats=2)
    assert again == first and cache.stat().st_mtime_ns == stamp  # read back, not re-profiled
    # the groups read back are the in-context ones (e.g. a Conv with its fused activation)
    assert [s.group for s in again] == [s.group for s in first]
    # features and groups are derived anew from the networks; only the times are read
    obj = json.loads(cache.read_text())
    obj["samples"][0]["group"], obj["samples"][0]["tree"][1] = "conv:bogus", 99.0
    obj["samples"].append({**obj["samples"][0], "name": "no-such-node"})  # not an anchor: dropped
    cache.write_text(json.dumps(obj))
    assert synthetic_samples(tmp_path, 3, seed=1, repeats=2) == first
    # a planted value is read back, fresh=True measures anew, a corrupt cache is re-measured
    check_planted_fresh_corrupt(cache, "samples",
                                partial(synthetic_samples, tmp_path, 3, seed=1, repeats=2),
                                len(first))
    # and so is a cache made by other generators
    obj = json.loads(cache.read_text())
    obj["networks"] = "0" * 64
    obj["samples"][0]["ms"] = 123.0
    cache.write_text(json.dumps(obj))
    assert 123.0 not in [s.ms for s in synthetic_samples(tmp_path, 3, seed=1, repeats=2)]
    assert synthetic_samples(tmp_path, 0) == []


def test_reference_scores_reach_one_on_exact_labels_and_can_fail() -> None:
    from coinf.research.slicecheck import additive_pairs, profiled_pairs

    nodes, slices, _ = _zoo({"a": 10.0, "b": 10.0, "c": 30.0})
    # every model's profiled node times are exact: both references are perfect, even for c
    # (whose kernels run 3x faster: the trees miss it, its own profile does not)
    for ref in (profiled_pairs(nodes, slices), additive_pairs(nodes, slices)):
        assert set(ref) == {"a", "b", "c"}
        assert all(within(pairs) == 1.0 for pairs in ref.values())
    # c's profile says its kernels take twice what its slices show: its reference score drops
    doubled = [replace(n, ms=n.ms * 2) if n.model == "c" else n for n in nodes]
    assert within(profiled_pairs(doubled, slices, ["c"])["c"]) < 0.2
    # ... but c's slices never fit the constants c is predicted with
    moved = [replace(s, ms=s.ms * 7) if s.model == "c" else s for s in slices]
    assert [p for p, _ in profiled_pairs(nodes, moved, ["c"])["c"]] == pytest.approx(
        [p for p, _ in profiled_pairs(nodes, slices, ["c"])["c"]])
    # slices of the same nodes measured 1.6x apart: no sum of node times explains both
    noisy = slices + [replace(s, slice=s.slice + "'", ms=s.ms * 1.6)
                      for s in slices if s.model == "a"]
    assert within(additive_pairs(nodes, noisy)["a"]) <= 0.5
    assert within(additive_pairs(nodes, noisy)["b"]) == 1.0
    # a model with no timed slice gets no reference score (and breaks nothing)
    untimed = [replace(s, ms=0.0) if s.model == "b" else s for s in slices]
    assert "b" not in additive_pairs(nodes, untimed)
    assert "b" not in profiled_pairs(nodes, untimed)


def test_additive_fit_explains_consistent_slices_and_not_a_busy_machines() -> None:
    """The reference ``additive_within_10pct`` doubles as a check of the cache: slice times that
    add up are explained in full; the same slices, each 0.62x or 1.55x at random (the plateaus
    of a busy host), are not (``bench predict --zoo`` then warns)."""
    from coinf.research.slicecheck import CONSISTENT_WITHIN_10PCT, additive_pairs

    names = [f"n{i}" for i in range(10)]
    times = dict(zip(names, np.linspace(0.01, 0.1, 10), strict=True))
    nodes = [NodeSample("m", _feat(n, 1.0), "conv:k", float(v)) for n, v in times.items()]
    rng = np.random.default_rng(0)

    def slices(noisy: bool) -> list[SliceSample]:
        out = []
        for k in range(1, 11):
            for side, part in (("head", names[:k]), ("tail", names[k - 1:])):
                ms = sum(times[n] for n in part) + 0.003
                factor = float(rng.choice([0.62, 1.55])) if noisy else 1.0
                out.append(SliceSample("m", f"c{k}.{side}", tuple(part), len(part), 0.001,
                                       ms * factor))
        return out

    assert within(additive_pairs(nodes, slices(False))["m"]) == pytest.approx(1.0)
    assert within(additive_pairs(nodes, slices(True))["m"]) < CONSISTENT_WITHIN_10PCT


def test_zoo_leave_one_out_scores_every_model_from_the_cache(tmp_path: Path) -> None:
    """Three real zoo models, measured once into the cache, each predicted by the others."""
    from coinf.research.context_data import zoo_leave_one_out
    from coinf.research.planregret import LINK_KB_S, SLOWDOWNS, bundle_cuts

    from coinf.bundle import Bundle

    names = ("lenet_digits", "senna_mlp", "digitnet")
    per = zoo_leave_one_out(tmp_path, repeats=3, synthetic=0, names=names, sweep_scale=0,
                            families={})  # no synthetic network: the zoo's timings alone
    assert set(per) == set(names)
    for r in per.values():
        assert r["slices"] > 0 and 0.0 <= r["within_10pct"] <= r["within_25pct"] <= 1.0
        assert r["median_predicted_over_measured"] > 0
        assert r["profiler_surplus_us_per_kernel"] is not None  # every model has a whole slice
        assert 0.0 <= r["profiled_within_10pct"] <= 1.0
        assert 0.0 <= r["additive_within_10pct"] <= 1.0
        assert 0.0 <= r["measurement_repeatability_within_10pct"] <= 1.0  # rounds were kept
        assert len(r["plan_regret"]) == len(SLOWDOWNS) * len(LINK_KB_S) + 1  # + x10@break-even
        assert r["max_plan_regret"] == max(r["plan_regret"].values()) >= 0.0
        assert set(r["measurement_plan_regret"]) == set(r["plan_regret"])
        assert r["break_even_kb_s"]["x10"] > 0  # every model runs 10x slower on the wearable
    for name in names:  # the split's bundle is in the cache: its cuts' bytes
        bundle = Bundle.load(tmp_path / name)
        cuts = bundle_cuts(bundle)
        assert set(cuts) == {c.id for c in bundle.candidates}
        for c in bundle.candidates:
            if c.is_wearable_only:
                assert cuts[c.id] == (0, 0, True, False)
            elif not c.head.nodes:  # handheld-only sends the input
                assert cuts[c.id].up == sum(t.nbytes for t in bundle.inputs) > 0
                assert not cuts[c.id].head and cuts[c.id].tail
    cached = {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("*.timings.json")}
    assert set(cached) == {f"{n}.timings.json" for n in names}
    again = zoo_leave_one_out(tmp_path, 3, 0, names, 0, families={})
    assert again == per  # cache read, nothing re-timed
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("*.timings.json")} == cached


def test_slice_constants_follow_most_models_not_the_one_with_most_slices() -> None:
    """One model cut into 100 slices runs 10 us of fixed cost, five cut into 9 run 30 us: the
    constants must carry to an unseen model, so the five pull them most of the way (counted
    per slice, the one sets them: 10.7 us)."""
    from coinf.research.slicetrain import fit_slice_constants

    rng = np.random.default_rng(0)
    slices, sums = [], []
    for m, (n, c0) in enumerate([(100, 0.010)] + [(9, 0.030)] * 5):
        for k in range(n):
            s = float(rng.uniform(0.02, 0.2))
            slices.append(SliceSample(f"m{m}", f"s{k}", (), 0, 0.0, s + c0))
            sums.append(s)
    scale, c0, *_ = fit_slice_constants(np.array(sums), slices)
    assert 0.022 < c0 < 0.031 and scale == pytest.approx(1.0, abs=0.05)


def test_slice_predictor_json_is_validated() -> None:
    nodes, slices, feats = _zoo({"a": 10.0, "b": 10.0})
    pred = train_slice_predictor(nodes, slices, feats)
    obj = pred.to_json()
    assert SlicePredictor.from_json(obj).slice_ms(("a0",), 1, 0.0, feats["a"]) == \
        pytest.approx(pred.slice_ms(("a0",), 1, 0.0, feats["a"]))
    with pytest.raises(ValueError, match="not a coinf slice predictor"):
        SlicePredictor.from_json({"format": "x"})
    with pytest.raises(ValueError, match="scale"):
        SlicePredictor.from_json({**obj, "scale": float("nan")})
    with pytest.raises(ValueError, match="global"):
        SlicePredictor.from_json({**obj, "groups": {}})


def test_planner_uses_the_incontext_predictor_stored_in_a_profile(tmp_path: Path) -> None:
    from coinf.convert.split import split_model
    from coinf.device.predict import Predictor
    from coinf.device.profile import DeviceProfile, ProfileError
    from coinf.wearable.planner.planner import Planner

    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu_gemm(), str(path))
    bundle = split_model(path, tmp_path / "b")
    samples = run_context_sweep(3, seed=2, repeats=2)
    ctx = train_slice_predictor(samples, [], {})
    prof = DeviceProfile.pi_zero_2w()
    prof.predictor = Predictor({}, meta={"slice_model": ctx.to_json()})
    prof.save(tmp_path / "p.json")
    prof = DeviceProfile.load(tmp_path / "p.json")  # validated on load
    planner = Planner(bundle, prof)
    head, _, src, _ = planner.base_times()[-1]  # wearable-only: the whole model
    feats = model_features(onnx.load(str(bundle.model_path)))
    expected = sum(max(ctx.node_ms(f, g) + ctx.c_kernel, 0.0) for f, g in feats.values())
    assert src == "predicted nodes" and head == pytest.approx(expected) and head > 0
    # the sweep style ignores it (an empty sweep predictor predicts 0)
    assert Planner(bundle, prof, predictor_style="coinf").base_times()[-1][0] == 0.0
    bad = prof.to_json()
    bad["predictor"]["slice_model"] = {"format": "x"}
    with pytest.raises(ProfileError, match="slice predictor"):
        DeviceProfile.from_json(bad)


def test_slices_are_timed_round_robin_and_a_burst_in_one_round_is_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every slice is timed once per round, all slices in each round; a slice's time is the
    fastest of its rounds, so a burst of contention in one round does not reach the cache."""
    import coinf.device.sweep as sweep
    from coinf.convert.split import split_model
    from coinf.research.context_data import measure_model

    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu_gemm(), str(path))
    bundle = split_model(path, tmp_path / "b")
    order: list[int] = []
    real = sweep.time_session

    def timed(sess: object, feeds: dict[str, np.ndarray], *args: float) -> float:
        order.append(id(sess))
        ms = real(sess, feeds, 1, 1)  # type: ignore[arg-type]
        return ms * 50 if len(order) == 2 else ms  # a burst: slice 1 in the first round

    monkeypatch.setattr(sweep, "time_session", timed)
    t = measure_model("m", bundle, repeats=1, rounds=3)
    n = len(t.slices)
    assert n >= 4 and len(order) == 3 * n  # every slice in every round
    assert all(len(s["rounds_ms"]) == 3 and s["ms"] == min(s["rounds_ms"])
               for s in t.slices)
    unburst = real(*_session_and_feeds(bundle, t.slices[1]["slice"]), 1, 50)
    assert t.slices[1]["ms"] < 10 * unburst  # its burst dropped
    # one round only keeps the burst
    order.clear()
    one = measure_model("m", bundle, repeats=1, rounds=1)
    assert one.slices[1]["ms"] > 10 * unburst
    with pytest.raises(ValueError, match="rounds"):
        measure_model("m", bundle, rounds=0)


def _session_and_feeds(bundle: object, key: str) -> tuple[object, dict[str, np.ndarray]]:
    from coinf.device.sweep import make_session, random_feeds

    cid, side = key.split(".")
    cand = next(c for c in bundle.candidates if c.id == cid)  # type: ignore[attr-defined]
    sess = make_session(str(bundle.path(getattr(cand, side).file)), 1)  # type: ignore[attr-defined]
    return sess, random_feeds(sess)


def test_models_timed_together_see_the_same_machine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two models' slices are interleaved round by round: a machine that turns 2x slower
    halfway through slows both models alike (timed one model after the other, the second
    would be measured 2x slow against the first), and as each half of the rounds keeps its
    fastest, both halves hold a fast round and agree."""
    import coinf.device.sweep as sweep
    from coinf.convert.split import split_model
    from coinf.research.context_data import measure_models, repeatability

    bundles = {}
    for name in ("a", "b"):
        path = tmp_path / f"{name}.onnx"
        onnx.save(conv_bn_relu_gemm(), str(path))
        bundles[name] = split_model(path, tmp_path / name)
    true_ms = {}  # a fixed time per slice file, so the machine's speed is all that varies
    calls: list[str] = []

    def timed(sess: str, feeds: object, *args: float) -> float:
        calls.append(sess)
        slow = 2.0 if len(calls) > total // 2 else 1.0
        return true_ms.setdefault(sess, 0.01 * (1 + len(true_ms))) * slow

    monkeypatch.setattr(sweep, "make_session", lambda path, threads: path)
    real_feeds = sweep.random_feeds  # the in-context profile still runs for real
    monkeypatch.setattr(sweep, "random_feeds",
                        lambda sess: {} if isinstance(sess, str) else real_feeds(sess))
    monkeypatch.setattr(sweep, "time_session", timed)
    per_round = sum(1 for b in bundles.values() for c in b.candidates
                    for part in (c.head, c.tail) if part.file is not None and part.nodes)
    total = 6 * per_round
    got = measure_models(bundles, repeats=1, rounds=6)
    assert len(calls) == total
    first = [Path(c).relative_to(tmp_path).parts[0] for c in calls[:per_round]]
    assert first[:4] == ["a", "b", "a", "b"]  # models alternate within a round
    by_model = {}
    for m, t in got.items():
        paths = {f"{c.id}.{side}": str(bundles[m].path(getattr(c, side).file))
                 for c in bundles[m].candidates for side in ("head", "tail")
                 if getattr(c, side).file is not None}
        by_model[m] = [s["ms"] / true_ms[paths[s["slice"]]] for s in t.slices]
    # every slice of both models got the same mix of fast and slow rounds
    assert max(max(v) for v in by_model.values()) == pytest.approx(
        min(min(v) for v in by_model.values()), rel=1e-6)
    # rounds 0-2 ran fast and 3-5 slow: even (0, 2, 4) and odd (1, 3, 5) rounds each hold a
    # fast one (their medians, 2 and 3, would disagree 2x)
    assert repeatability(got["a"]) == repeatability(got["b"]) == 1.0
    assert all(s["ms"] == min(s["rounds_ms"]) for t in got.values() for s in t.slices)


def test_repeatability_compares_even_with_odd_rounds() -> None:
    from coinf.research.context_data import ModelTimings, repeatability

    def t(*rounds: list[float]) -> ModelTimings:
        return ModelTimings("m", "", {}, [{"slice": f"s{i}", "rounds_ms": r}
                                          for i, r in enumerate(rounds)])

    assert repeatability(t([1.0, 1.05, 1.0, 1.05], [2.0, 2.0])) == 1.0
    assert repeatability(t([1.0, 1.3, 1.0, 1.3], [2.0, 2.0])) == 0.5  # 30 % apart
    # each half keeps its fastest round: a burst in one round of each half does not count
    assert repeatability(t([1.0, 1.0, 5.0, 1.05])) == 1.0  # medians: 3.0 against 1.025
    assert repeatability(t([1.3, 1.0, 1.3, 5.0])) == 0.0  # the even rounds never ran fast
    assert repeatability(t([1.0, 1.3, 1.0, 1.3], [2.0, 2.0]), tol=0.35) == 1.0
    assert repeatability(t([1.0], [2.0, 2.0])) is None  # a cache timed in one round
