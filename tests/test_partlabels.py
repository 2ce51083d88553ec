"""Node labels decomposed from unprofiled part timings (issue 17, part 1): cutting a network
into parts that run alone, timing them, and solving part times for node times."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import pytest
from coinf.device.incontext import anchors, model_features
from coinf.research.context_data import PART_REPEATS
from coinf.research.context_sweep import network
from coinf.research.partlabels import cut_points, decompose, parts, relabel, time_parts
from coinf.research.slicetrain import NodeSample, SliceSample, train_slice_predictor

from tests.cachecheck import check_planted_fresh_corrupt

# time beyond the suite's 30 s a test: times synthetic networks (up to 26 s alone)
pytestmark = pytest.mark.timeout(180)


def test_cuts_never_split_a_fused_group_and_parts_cover_the_network() -> None:
    model = network(0)
    names = [n.name or f"{n.op_type}_{k}" for k, n in enumerate(model.graph.node)]
    index = {n: k for k, n in enumerate(names)}
    anchor = anchors(model)
    fused = [(index[a], k) for k, n in enumerate(names) if (a := anchor.get(n, n)) != n]
    assert fused  # the network has Conv + BN + activation groups
    cuts = cut_points(model)
    assert cuts and cuts[-1] == len(names) - 1
    for k in cuts:  # a group lies wholly on one side of every cut
        assert all((a <= k) == (f <= k) for a, f in fused)
    for a, f in fused:  # and no cut falls between an anchor and its follower
        assert not any(a <= k < f for k in cuts)
    feats = model_features(model)
    got = parts(model)
    prefixes = [p for p in got if p[0].startswith("prefix")]
    suffixes = [p for p in got if p[0].startswith("suffix")]
    assert len({p[1] for p in prefixes}) == len(prefixes)  # one per distinct anchor set
    assert set(max(prefixes, key=lambda p: len(p[1]))[1]) == set(feats)  # the whole network
    assert suffixes and all(set(p[1]) < set(feats) for p in suffixes)
    for _, _, part, mb in got:
        onnx.checker.check_model(part)
        assert mb > 0


def test_parts_run_alone_and_are_timed_with_their_kernels() -> None:
    model = network(1)
    timed = time_parts("n1", model, repeats=2)
    assert len(timed) == len(parts(model))
    assert all(s.model == "n1" and s.ms > 0 and s.kernels > 0 and s.nodes for s in timed)
    whole = max(timed, key=lambda s: len(s.nodes))
    assert set(whole.nodes) == set(model_features(model))


def _world(models: int = 4, nodes: int = 6, seed: int = 0, reorders: float = 0.003,
           ) -> tuple[dict[str, dict[str, float]], list[SliceSample], np.ndarray]:
    """True node times, every prefix and suffix of each model timed exactly as
    sum + c0 (20 us) + g . (boundary MB, reorders, reordered Melems), and g."""
    rng = np.random.default_rng(seed)
    g = np.array([0.02, reorders, 0.05])
    truth, slices = {}, []
    for m in range(models):
        name = f"m{m}"
        x = {f"{name}n{k}": float(v) for k, v in enumerate(rng.uniform(0.01, 0.5, nodes))}
        truth[name] = x
        order = list(x)
        for k in range(1, nodes + 1):
            for side, sub in (("prefix", order[:k]), ("suffix", order[nodes - k:])):
                z = np.array([rng.uniform(0.01, 0.5), rng.integers(0, 3), rng.uniform(0, 0.2)])
                ms = sum(x[n] for n in sub) + 0.02 + float(g @ z)
                slices.append(SliceSample(name, f"{side}{k}", tuple(sub), k, float(z[0]), ms,
                                          int(z[1]), float(z[2])))
    return truth, slices, g


def _rel_err(got: dict[str, dict[str, float]], truth: dict[str, dict[str, float]]) -> float:
    return max(abs(got[m][n] / v - 1) for m, x in truth.items() for n, v in x.items())


def test_decompose_recovers_node_times_from_part_times() -> None:
    truth, slices, _ = _world()
    rng = np.random.default_rng(1)
    # priors 30-60 % off either way: the part times must move every node back
    priors = {m: {n: v * float(rng.choice([0.5, 0.7, 1.4, 1.6])) for n, v in x.items()}
              for m, x in truth.items()}
    assert _rel_err(priors, truth) > 0.25
    shared = decompose(slices, priors, 0.001, shared=True)
    assert _rel_err(shared, truth) < 0.02
    # per model, the reorder count is no term of its own: exact where reorders cost nothing
    _, free_reorders, _ = _world(reorders=0.0)
    assert _rel_err(decompose(free_reorders, priors, 0.001), truth) < 0.02
    # a heavy prior holds the labels near it instead
    assert _rel_err(decompose(slices, priors, 100.0, shared=True), truth) > 0.25
    # models with no part, and names no part runs, are left out; a zero weight is refused
    assert set(decompose(slices, {**priors, "none": {"a": 1.0}}, 0.01)) == set(truth)
    with pytest.raises(ValueError, match="weight"):
        decompose(slices, priors, 0.0)
    assert decompose([], {}, 0.03, shared=True) == {} and relabel([], [], 0.03, True) == []


def test_shared_decomposition_pins_the_run_constant_on_short_parts() -> None:
    """A network whose parts run for milliseconds cannot tell its few microseconds of per-run
    constant from its last node (whose one-node suffix is its only short part); shared over
    the family, the constant comes from the networks whose parts are short."""
    c0 = 0.0025
    rng = np.random.default_rng(3)
    truth: dict[str, dict[str, float]] = {}
    slices: list[SliceSample] = []
    for m in range(6):
        name, big = f"m{m}", m == 0
        times = rng.uniform(0.5, 2.0, 5) if big else rng.uniform(0.001, 0.004, 5)
        if big:
            times[-1] = 0.001  # a small last node: its suffix alone runs 3.5 us
        x = {f"{name}n{k}": float(v) for k, v in enumerate(times)}
        truth[name] = x
        order = list(x)
        for k in range(1, 6):
            for side, sub in (("prefix", order[:k]), ("suffix", order[5 - k:])):
                slices.append(SliceSample(name, f"{side}{k}", tuple(sub), k, 0.0,
                                          sum(x[n] for n in sub) + c0))
    # priors: every node 1.5x its truth (a profiler that adds to each kernel), the small last
    # node 5x (a microsecond of the profiler's is most of it)
    priors = {m: {n: 1.5 * v for n, v in x.items()} for m, x in truth.items()}
    last = "m0n4"
    priors["m0"][last] = 5 * truth["m0"][last]
    shared = decompose(slices, priors, 0.05, shared=True)
    assert shared["m0"][last] == pytest.approx(truth["m0"][last], rel=0.15)
    assert _rel_err(shared, truth) < 0.15
    # per network, the big one's constant goes to 0 and its last node takes it
    alone = decompose(slices, priors, 0.05)
    assert alone["m0"][last] > 2 * truth["m0"][last]


def test_relabel_takes_the_profilers_share_off_and_fits_the_parts() -> None:
    from coinf.research.slicetrain import profiler_inflation

    truth, slices, _ = _world(models=3)
    feats = model_features(network(0))
    f, grp = next(iter(feats.values()))
    # profiled labels: each kernel 30 us slower than it runs alone
    nodes = [NodeSample(m, replace(f, name=n), grp, v + 0.03)
             for m, x in truth.items() for n, v in x.items()]
    inflation = profiler_inflation(nodes, slices)
    assert inflation > 0.01
    nodes.append(NodeSample("unparted", replace(f, name="lone"), grp, 0.1))
    out = relabel(nodes, slices, 0.001, shared=True)
    assert [n.features.name for n in out] == [n.features.name for n in nodes]
    got = {n.features.name: n.ms for n in out}
    assert max(abs(got[n] / v - 1) for x in truth.values() for n, v in x.items()) < 0.02
    # a model with no part keeps its profiled label less the profiler's share
    assert got["lone"] == pytest.approx(0.1 - inflation)


def test_train_fits_the_trees_on_relabelled_times() -> None:
    fm = model_features(network(5))
    nodes = [NodeSample(f"m{i}", f, g, 0.004 * (1 + i % 3)) for i in range(20)
             for f, g in fm.values()]

    def doubled(ns: list[NodeSample], _: list[SliceSample]) -> list[NodeSample]:
        return [replace(n, ms=2 * n.ms) for n in ns]

    plain = train_slice_predictor(nodes, [], {})
    twice = train_slice_predictor(nodes, [], {}, relabel=doubled)
    f, g = next(iter(fm.values()))
    assert twice.node_ms(f, g) == pytest.approx(2 * plain.node_ms(f, g), rel=0.05)


def test_synthetic_parts_are_cached_and_timed_again_on_request(tmp_path: Path) -> None:
    from coinf.research.context_data import synthetic_labels, synthetic_parts

    heard: list[str] = []
    first = synthetic_parts(tmp_path, 2, seed=1, repeats=2, passes=2, progress=heard.append)
    assert {s.model for s in first} == {"synthetic0", "synthetic1"}
    # networks 1 and 2 of each pass, the last saying nothing is left
    assert len(heard) == 4
    assert heard[-1].startswith("synthetic parts, pass 2/2, mixed: network 2/2")
    assert heard[-1].endswith("about 0 min left")
    check_planted_fresh_corrupt(tmp_path / "synthetic-parts-2-1-1-2.json", "parts",
                                partial(synthetic_parts, tmp_path, 2, seed=1, repeats=2),
                                len(first))
    assert synthetic_parts(tmp_path, 0) == []
    with pytest.raises(ValueError, match="passes"):
        synthetic_parts(tmp_path, 2, passes=0)
    labels = synthetic_labels(tmp_path, 2, seed=1, passes=1, families={"small": 2})
    assert labels and all(n.ms > 0 for n in labels)
    assert {n.model for n in labels} == {"synthetic0", "synthetic1", "small0", "small1"}
    assert (tmp_path / f"synthetic-small-parts-2-1-1-{PART_REPEATS}.json").is_file()
    for bad, message in (({"tiny": 2}, "unknown network family 'tiny'"),
                         ({"gated": -1}, "gated family needs a count >= 0")):
        with pytest.raises(ValueError, match=message):
            synthetic_labels(tmp_path / "bad", 2, seed=1, passes=1, families=bad)
        assert not (tmp_path / "bad").exists()  # refused before any network was measured


def test_every_family_is_timed_in_each_pass_before_the_next_pass(tmp_path: Path) -> None:
    """A part's passes lie minutes apart: pass 1 over every family, then pass 2."""
    from coinf.research.context_data import synthetic_parts_of

    heard: list[str] = []
    got = synthetic_parts_of(tmp_path, {"mixed": 1, "small": 1, "gated": 0}, seed=1, repeats=2,
                             passes=2, progress=heard.append)
    assert [m.split(":")[0] for m in heard] == [
        "synthetic parts, pass 1/2, mixed", "synthetic parts, pass 1/2, small",
        "synthetic parts, pass 2/2, mixed", "synthetic parts, pass 2/2, small"]
    assert got["gated"] == [] and {s.model for s in got["small"]} == {"small0"}
    assert all(s.ms > 0 for s in got["mixed"] + got["small"])
    # each family is cached on its own and read back without timing anything
    again: list[str] = []
    assert synthetic_parts_of(tmp_path, {"small": 1}, seed=1, repeats=2, passes=2,
                              progress=again.append) == {"small": got["small"]}
    assert again == []


def test_a_parts_cache_is_topped_up_with_the_missing_passes_only(tmp_path: Path) -> None:
    """Asked for more passes than it holds, a cache times only the missing ones, and each part
    keeps the fastest of all its passes, the cached ones included."""
    import json

    from coinf.research.context_data import synthetic_parts_of

    def parts_of(passes: int, heard: list[str]) -> list[SliceSample]:
        return synthetic_parts_of(tmp_path, {"small": 2}, seed=1, repeats=2, passes=passes,
                                  progress=heard.append)["small"]

    heard: list[str] = []
    one = parts_of(1, heard)
    assert [m.split(":")[0] for m in heard] == ["synthetic parts, pass 1/1, small"] * 2
    cache = tmp_path / "synthetic-small-parts-2-1-1-2.json"
    planted = json.loads(cache.read_text())
    planted["parts"][0]["ms"] = 1e-6  # faster than any pass can be: it must survive
    cache.write_text(json.dumps(planted))
    heard.clear()
    assert parts_of(2, heard)[0].ms == 1e-6
    assert [m.split(":")[0] for m in heard] == ["synthetic parts, pass 2/2, small"] * 2
    assert json.loads(cache.read_text())["passes"] == 2
    heard.clear()
    three = parts_of(3, heard)
    assert [m.split(":")[0] for m in heard] == ["synthetic parts, pass 3/3, small"] * 2
    assert [(s.model, s.slice) for s in three] == [(s.model, s.slice) for s in one]
    assert three[0].ms == 1e-6
    assert all(0 < b.ms <= a.ms for a, b in zip(one, three, strict=True))
    assert json.loads(cache.read_text())["passes"] == 3
    heard.clear()
    assert parts_of(2, heard) == three and heard == []  # it holds enough: nothing timed


def test_lomo_with_relabelling_never_reads_the_held_out_models_timings() -> None:
    from coinf.research.slicetrain import leave_one_model_out

    truth, slices, _ = _world(models=3, nodes=8)
    f0, grp = next(iter(model_features(network(0)).values()))
    feats = {m: {n: (replace(f0, name=n, linear=(v * 100, v, v, 0.01)), grp) for n, v in x.items()}
             for m, x in truth.items()}
    nodes = [NodeSample(m, feats[m][n][0], grp, v + 0.001) for m, x in truth.items()
             for n, v in x.items()]
    hook = partial(relabel, weight=0.3)
    res = leave_one_model_out(nodes, slices, feats, ["m2"], relabel=hook)
    moved_nodes = [replace(n, ms=n.ms * 50) if n.model == "m2" else n for n in nodes]
    moved_slices = [replace(s, ms=s.ms * 50) if s.model == "m2" else s for s in slices]
    again = leave_one_model_out(moved_nodes, moved_slices, feats, ["m2"], relabel=hook)
    assert [p for _, p, _ in again["m2"]] == pytest.approx([p for _, p, _ in res["m2"]])
    assert [t for _, _, t in again["m2"]] == pytest.approx([50 * t for _, _, t in res["m2"]])
