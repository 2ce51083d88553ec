"""The wearable's memory budget: measured peak RSS per head, the prediction for unprofiled heads,
and the hard planner constraint (issue 16)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from coinf.convert.split import split_model
from coinf.device.memprofile import runtime_baseline_mb, slice_peak_rss_mb
from coinf.device.profile import DeviceProfile, ModelProfile, ProfileError
from coinf.models import committed_path
from coinf.wearable.planner.adapt import LinkEstimate
from coinf.wearable.planner.memory import MemoryModel, head_activation_bytes
from coinf.wearable.planner.planner import Planner, split_config
from onnx import TensorProto, helper, numpy_helper

from coinf.bundle import Bundle
from tests.bundles import make_tiny_bundle

SLOW_LINK = LinkEstimate(500.0, 500.0, 30.0, "test")  # 0.5 kB/s: deep cuts send least


@pytest.fixture(scope="module")
def vgg(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return split_model(committed_path("vgg"), tmp_path_factory.mktemp("m") / "vgg")


def _head_mb(planner: Planner, config_id: str) -> float:
    return planner.memory.heads()[split_config(config_id)[0]].total_mb


def test_memory_budget_changes_the_choice_on_a_heavy_head(vgg: Bundle) -> None:
    free = Planner(vgg, memory_budget_mb=None, timeout_s=1e4).decide(SLOW_LINK,
                                                                     objective="latency")
    winner = split_config(free.winner)[0]
    cand = next(c for c in vgg.candidates if c.id == winner)
    assert cand.head.param_bytes > 0, "without a budget the slow link should favour a deep head"
    p = Planner(vgg, memory_budget_mb=None, timeout_s=1e4)
    need = _head_mb(p, free.winner)
    budget = need - 0.2  # the unconstrained winner's head no longer fits
    tight = Planner(vgg, memory_budget_mb=budget, timeout_s=1e4)
    d = tight.decide(SLOW_LINK, objective="latency")
    assert d.winner != free.winner
    assert _head_mb(tight, d.winner) <= budget
    assert "memory" in d.excluded[free.winner] and f"{budget:g} MB" in d.excluded[free.winner]
    assert any(n.startswith(f"memory: budget {budget:g} MB") for n in d.notes)
    # every excluded-for-memory row really is over, every kept row under
    for r in d.rows:
        over = _head_mb(tight, r.id) > budget
        assert over == ("memory" in d.excluded.get(r.id, "")), r.id


def test_tiny_budget_leaves_only_handheld_only(vgg: Bundle) -> None:
    d = Planner(vgg, memory_budget_mb=1.0).decide(SLOW_LINK, objective="latency")
    assert d.winner == "c000"  # handheld-only: no head, always fits
    assert sum("memory" in why for why in d.excluded.values()) == len(vgg.candidates) - 1


def test_peak_activations_by_liveness(tmp_path: Path) -> None:
    b = make_tiny_bundle(tmp_path / "t")
    acts = head_activation_bytes(b)
    # x(64 B) and a(32 B) are alive together in mm1; later fewer bytes are live
    assert acts == {"c000": 0, "c001": 96, "c002": 96}


def test_measured_heads_override_and_calibrate_the_overhead(tmp_path: Path) -> None:
    b = make_tiny_bundle(tmp_path / "t")
    prof = DeviceProfile.pi_zero_2w()
    prof.models[b.identity] = ModelProfile(candidates={"c001": {"head_ms": 1.0,
                                                               "head_peak_rss_mb": 140.0}})
    mem = MemoryModel(b, prof, 120.0)
    heads = mem.heads()
    assert heads["c001"].source == "measured" and heads["c001"].total_mb == 140.0
    assert mem.overhead_mb == pytest.approx(140.0, abs=0.01)  # the tiny head's share is ~0
    assert heads["c002"].source == "predicted" and heads["c002"].total_mb > 120.0
    assert mem.over_budget("c001") and mem.over_budget("c002") and not mem.over_budget("c000")


def test_profile_memory_budget_round_trip_and_validation(tmp_path: Path) -> None:
    prof = DeviceProfile.pi_zero_2w()
    prof.memory_budget_mb = 250.0
    prof.save(tmp_path / "p.json")
    again = DeviceProfile.load(tmp_path / "p.json")
    assert again.memory_budget_mb == 250.0
    obj = json.loads((tmp_path / "p.json").read_text())
    obj["memory_budget_mb"] = -5
    with pytest.raises(ProfileError, match="memory_budget_mb"):
        DeviceProfile.from_json(obj)


def test_profile_budget_is_the_planner_default(tmp_path: Path) -> None:
    b = make_tiny_bundle(tmp_path / "t")
    prof = DeviceProfile.pi_zero_2w()
    prof.memory_budget_mb = 1.0
    d = Planner(b, prof).decide(SLOW_LINK)
    assert d.winner == "c000"
    assert Planner(b).memory.budget_mb == 300.0  # Pi Zero 2 W default


def test_peak_rss_of_a_slice_grows_with_its_weights(tmp_path: Path) -> None:
    n = 2048  # 16 MB of float32 weights
    w = numpy_helper.from_array(np.ones((n, n), np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "big.onnx"))
    base = runtime_baseline_mb()
    big = slice_peak_rss_mb(tmp_path / "big.onnx")
    assert 20 < base < 1000
    assert big - base > 16  # at least the weights themselves


def test_bad_slice_is_a_profile_error(tmp_path: Path) -> None:
    (tmp_path / "bad.onnx").write_bytes(b"not onnx")
    with pytest.raises(ProfileError, match=r"bad\.onnx"):
        slice_peak_rss_mb(tmp_path / "bad.onnx")


def test_profile_and_plan_commands_measure_and_show_memory(tmp_path: Path, capsys) -> None:
    from coinf.cli import main

    b = make_tiny_bundle(tmp_path / "t")
    prof = tmp_path / "w.json"
    assert main(["profile", "--role", "wearable", "--bundle", str(b.root), "--out", str(prof),
                 "--repeats", "1", "--warmup", "0", "--memory-budget", "250"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["head_peak_rss_mb"]) == {"c001", "c002"}  # c000 runs no head
    saved = DeviceProfile.load(prof)
    assert saved.memory_budget_mb == 250.0
    measured = saved.models[b.identity].candidates["c001"]["head_peak_rss_mb"]
    assert 20 < measured < 1000
    assert main(["plan", str(b.root), "--wearable-profile", str(prof), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    heads = {h["id"]: h for h in out["memory"]["heads"]}
    assert out["memory"]["budget_mb"] == 250.0
    assert heads["c001"]["source"] == "measured" and heads["c001"]["head_peak_rss_mb"] == measured
    assert any(n.startswith("memory: budget 250 MB") for n in out["notes"])
    assert main(["plan", str(b.root), "--wearable-profile", str(prof),
                 "--memory-budget", "1"]) == 0
    text = capsys.readouterr().out
    assert "chose c000" in text and "> the wearable's 1 MB budget" in text
    assert main(["plan", str(b.root), "--memory-budget", "-3"]) == 2


def test_without_handheld_only_the_smallest_head_is_kept(tmp_path: Path) -> None:
    import dataclasses

    b = make_tiny_bundle(tmp_path / "t")
    no_hh = dataclasses.replace(b, candidates=b.candidates[1:])  # c001, c002: both have heads
    p = Planner(no_hh, memory_budget_mb=1.0)
    d = p.decide(SLOW_LINK)
    heads = p.memory.heads()
    assert d.winner == min(heads, key=lambda c: heads[c].total_mb)
    assert set(d.excluded) == {"c001", "c002"} - {d.winner}
