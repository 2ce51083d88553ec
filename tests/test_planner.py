"""Planner on a tiny hand-made bundle, device profiles, status, and run-time adaptation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from coinf.device.profile import DeviceProfile, ModelProfile, ProfileError, profile_bundle
from coinf.device.status import DeviceStatus
from coinf.wearable.planner.adapt import LinkEstimate, LinkEstimator, LoadFactor, ReplanTrigger
from coinf.wearable.planner.planner import Planner
from coinf.wearable.policy import Policy

from coinf.bundle import Bundle
from tests.planner_bundle import make_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return make_bundle(tmp_path_factory.mktemp("plan") / "tiny")


def profiles(bundle: Bundle) -> tuple[DeviceProfile, DeviceProfile]:
    """Hand-set slice times: the wearable is slow, the handheld fast."""
    w = DeviceProfile.pi_zero_2w()
    h = DeviceProfile.laptop()
    w.models[bundle.identity] = ModelProfile(candidates={
        "c000": {"head_ms": 0.0}, "c001": {"head_ms": 5.0}, "c002": {"head_ms": 40.0},
        "c003": {"head_ms": 41.0}})
    h.models[bundle.identity] = ModelProfile(candidates={
        "c000": {"tail_ms": 2.0}, "c001": {"tail_ms": 1.5}, "c002": {"tail_ms": 0.1},
        "c003": {"tail_ms": 0.0}})
    return w, h


def test_cut_follows_bandwidth(bundle: Bundle) -> None:
    w, h = profiles(bundle)
    planner = Planner(bundle, w, h, Policy(objective="latency"))
    slow = planner.decide(LinkEstimate(20_000, 20_000, 0))
    fast = planner.decide(LinkEstimate(50_000_000, 50_000_000, 0))
    assert slow.winner == "c003"  # 41 ms locally beats 40 ms + 6.4 ms of upload
    assert fast.winner == "c000"  # 12 kB at 50 MB/s + 2 ms beats 41 ms
    mid = planner.decide(LinkEstimate(2_000_000, 2_000_000, 0))
    assert mid.winner == "c000"
    assert "c003" in slow.explain() and "link:" in slow.explain()


def test_load_factor_and_handheld_load_move_the_cut(bundle: Bundle) -> None:
    w, h = profiles(bundle)
    planner = Planner(bundle, w, h, Policy(objective="latency"))
    link = LinkEstimate(2_000_000, 2_000_000, 0)  # c000: 6.1 + 2 ms; c003: 41 ms
    assert planner.decide(link).winner == "c000"
    # handheld 30x slower (K) under Neurosurgeon: c000 = 6.1 + 60 ms > c003 = 41 ms
    d = planner.decide(link, objective="neurosurgeon-latency", handheld_load=30)
    assert d.winner == "c003"
    # a busy wearable (load factor 0.1 = 10x faster than predicted) keeps everything local
    assert planner.decide(link, load_factor=0.1).winner == "c003"


def test_policy_objectives_and_budget(bundle: Bundle) -> None:
    w, h = profiles(bundle)
    link = LinkEstimate(20_000, 20_000, 0)
    planner = Planner(bundle, w, h, Policy())
    # save the wearable: offloading everything costs it 614 ms of radio at 0.15 W = 92 mJ; c002
    # costs 40 ms x 1.4 W + 6.4 ms radio = 57 mJ; wearable-only 41 x 1.4 = 57.4 mJ
    d = planner.decide(link, objective="energy")
    assert d.winner in {"c002", "c003"}
    assert planner.decide(link, objective="latency").winner == "c003"
    rows = {r.id: r for r in planner.costs(link)}
    assert rows["c003"].transfer_ms == 0 and rows["c003"].return_ms == 0
    assert rows["c000"].head_ms == 0
    # what travels is the exact raw REQUEST payload: 128 bytes of tensor plus headers
    import numpy as np
    from coinf.ble_protocol.tensors import encode_tensors

    from tests.wire import result_payload, tail_request

    c2 = bundle.candidate("c002")
    req = len(tail_request(bundle, "c002", encode_tensors(
        {t.name: np.zeros(t.shape, np.float32) for t in c2.crossing})))
    res = len(result_payload(0, encode_tensors(
        {t.name: np.zeros(t.shape, np.float32) for t in bundle.outputs})))
    assert rows["c002"].crossing_bytes == req > 128
    assert rows["c002"].transfer_ms == pytest.approx(1000 * req / 20_000)
    assert rows["c002"].return_ms == pytest.approx(1000 * res / 20_000)
    assert rows["c002"].wearable_energy_mj == pytest.approx(
        40 * (2.0 - 0.6) + 1000 * req / 20_000 * 0.15 + 1000 * res / 20_000 * 0.12)


def test_status_slows_the_side(bundle: Bundle) -> None:
    w, h = profiles(bundle)
    planner = Planner(bundle, w, h, Policy())
    base = {r.id: r for r in planner.costs()}
    busy = {r.id: r for r in planner.costs(
        wearable_status=DeviceStatus(cpu_load=1.0, freq_mhz=500, max_freq_mhz=1000))}
    assert busy["c002"].head_ms == pytest.approx(4 * base["c002"].head_ms)
    assert busy["c002"].tail_ms == base["c002"].tail_ms


def test_unprofiled_model_is_planned_from_default_op_rates(bundle: Bundle) -> None:
    import onnx
    from coinf.device.defaults import PI_ZERO_2W_RATES
    from coinf.device.features import node_features

    planner = Planner(bundle)  # built-in profiles: no timings, no predictor -> per-op rates
    rows = planner.costs()
    feats = node_features(onnx.load(str(bundle.model_path)))
    head = set(bundle.candidates[-1].head.nodes)
    expected = 0.0
    for f in feats:  # conv at 3 GFLOP/s, gemm 0.8, element ops 0.2, + 20 us per kernel
        if f.name in head and not f.fused and f.op_type not in ("Reshape", "Flatten"):
            rate = {"conv": 3.0, "gemm": 0.8}.get(f.kind, 0.2)
            expected += f.flops / (rate * 1e6) + 0.02
    assert PI_ZERO_2W_RATES.conv_gflops == 3.0 and PI_ZERO_2W_RATES.gemm_gflops == 0.8
    assert rows[-1].head_ms == pytest.approx(expected, rel=1e-6)
    text = planner.decide().explain()
    assert "default op rates" in text and "not measurements" in text
    # a profile without rates (an old file) still falls back to flops / gflops
    bare = DeviceProfile.pi_zero_2w()
    bare.rates = None
    again = Planner(bundle, bare).costs()
    assert again[-1].head_ms == pytest.approx(bundle.candidates[-1].head.flops / 2e6)


def test_profile_bundle_measures_nodes_and_slices(bundle: Bundle, tmp_path: Path) -> None:
    mp = profile_bundle(bundle, threads=1, warmup=1, repeats=3)
    assert {"conv1", "conv2", "fc"} <= set(mp.nodes)
    assert mp.candidates["c000"]["head_ms"] == 0 and mp.candidates["c000"]["tail_ms"] > 0
    assert mp.candidates["c003"]["tail_ms"] == 0 and mp.candidates["c003"]["head_ms"] > 0
    prof = DeviceProfile.pi_zero_2w()
    prof.models[bundle.identity] = mp
    prof.slowdown = 10
    prof.save(tmp_path / "p.json")
    again = DeviceProfile.load(tmp_path / "p.json")
    assert again.models[bundle.identity].nodes == mp.nodes
    planner = Planner(bundle, again)
    assert planner.costs()[1].head_ms == pytest.approx(10 * mp.candidates["c001"]["head_ms"])


def test_profile_rejects_bad_json(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="not a coinf device profile"):
        DeviceProfile.from_bytes(b'{"format": "x"}')
    good = DeviceProfile.laptop().to_json()
    good["power"]["cpu_active_w"] = -3
    with pytest.raises(ProfileError, match="cpu_active_w"):
        DeviceProfile.from_bytes(json.dumps(good).encode())
    with pytest.raises(ProfileError, match="limit"):
        DeviceProfile.from_bytes(b" " * (9 * 1024 * 1024))
    with pytest.raises(ProfileError, match="no device profile"):
        DeviceProfile.load(tmp_path / "missing.json")


def test_status_from_peer_is_validated() -> None:
    st = DeviceStatus(0.5, 600, 1000, "ondemand", 40, False)
    assert DeviceStatus.from_bytes(st.to_bytes()) == st
    for bad in ({"cpu_load": 2}, {"battery_pct": "x"}, {"charging": "yes"}, {"evil": 1},
                {"governor": "g" * 100}):
        with pytest.raises(ValueError):
            DeviceStatus.from_json(bad)
    with pytest.raises(ValueError, match="limit"):
        DeviceStatus.from_bytes(b"{" * 5000)


def test_replan_trigger_threshold() -> None:
    t = ReplanTrigger(0.05)
    inputs = {"up_bps": 20_000.0, "load": 1.0}
    assert t.should_replan(inputs)  # never planned
    t.planned(inputs)
    assert not t.should_replan({"up_bps": 20_900.0, "load": 1.0})  # +4.5%
    assert not t.should_replan({"up_bps": 19_000.0, "load": 1.04})  # -5% exactly, +4%
    assert t.changed({"up_bps": 21_100.0, "load": 1.0}) == ["up_bps"]  # +5.5%
    assert t.changed({"up_bps": 20_000.0, "load": 0.9}) == ["load"]
    assert t.should_replan({"up_bps": 20_000.0, "load": 1.0, "battery": 50.0})  # new input


def test_link_estimator_recent_then_historical() -> None:
    now = [0.0]
    est = LinkEstimator(LinkEstimate(10_000, 10_000, 50), recent_alpha=0.5,
                        historical_alpha=0.1, recent_window_s=300, clock=lambda: now[0])
    assert est.estimate().source == "default" and est.probe_due()
    est.observe_transfer(30_000, 1.0)
    est.observe_transfer(10_000, 1.0)
    e = est.estimate()
    # averaged as seconds per byte: mean(1/30000, 1/10000) -> 15 kB/s
    assert e.source == "recent" and e.up_bps == pytest.approx(15_000)
    assert not est.probe_due()
    now[0] = 301.0
    e = est.estimate()
    # historical (alpha 0.1): 1/30000 then 10% of the way to 1/10000
    assert e.source == "historical" and e.up_bps == pytest.approx(1 / (1 / 30_000 + 0.1 * (
        1 / 10_000 - 1 / 30_000)))
    assert est.probe_due(300)
    est.observe_transfer(10, 0.001)  # too small to measure bandwidth: ignored
    assert est.estimate().source == "historical"
    est.observe_rtt(40)
    assert est.estimate().rtt_ms == pytest.approx(40)
    with pytest.raises(ValueError):
        LinkEstimate(0, 1)


def test_load_factor_smooths_and_clamps() -> None:
    lf = LoadFactor(alpha=0.5)
    assert lf.value == 1.0
    lf.observe(20, 10)
    assert lf.value == 2.0
    lf.observe(10, 10)
    assert lf.value == 1.5
    lf.observe(10_000, 1)  # clamped to 20
    assert lf.value == pytest.approx(10.75)
    lf.observe(5, 0.1)  # too short to trust
    assert lf.value == pytest.approx(10.75)


def test_adaptive_planner_replans_only_past_threshold(bundle: Bundle) -> None:
    from coinf.wearable.planner.planner import AdaptivePlanner

    now = [0.0]
    w, h = profiles(bundle)
    ap = AdaptivePlanner(Planner(bundle, w, h, Policy(objective="latency")),
                         link=LinkEstimator(LinkEstimate(20_000, 20_000, 0),
                                            recent_alpha=1.0, clock=lambda: now[0]))
    assert ap.current().winner == "c003" and ap.replans == 1
    ap.link.observe_transfer(20_600, 1.0)  # +3%: no re-plan
    ap.current()
    assert ap.replans == 1
    ap.link.observe_transfer(50_000_000, 1.0)  # the link got fast: re-plan, offload everything
    assert ap.current().winner == "c000" and ap.replans == 2
    ap.observe_head("c003", 41.0 * 1.04)  # head ran 4% slow: below threshold
    ap.current()
    assert ap.replans == 2
    ap.handheld_status = DeviceStatus(battery_pct=50)
    ap.current()
    assert ap.replans == 3  # a new input appeared


def test_plot_decision_writes_png(bundle: Bundle, tmp_path: Path) -> None:
    from coinf.wearable.planner.chart import plot_decision

    w, h = profiles(bundle)
    out = plot_decision(Planner(bundle, w, h).decide(), tmp_path / "plan.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_command(bundle: Bundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                      capsys: pytest.CaptureFixture[str]) -> None:
    from coinf.cli import main

    monkeypatch.setenv("COINF_CONFIG", str(tmp_path / "policy.json"))
    png = tmp_path / "plan.png"
    assert main(["plan", str(bundle.root), "--json", "--optimal", "--png", str(png),
                 "--objective", "latency", "--bandwidth-kbps", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["winner"] == "c003"  # 1 kB/s: nothing is worth sending
    assert out["optimal_cut"]["wearable_nodes"] == 6 and png.is_file()
    assert main(["plan", str(bundle.root), "--bandwidth-kbps", "0"]) == 2
    assert "bandwidth" in capsys.readouterr().err


def test_measured_nodes_sum_when_slices_were_not_measured(bundle: Bundle) -> None:
    w = DeviceProfile.pi_zero_2w()
    # flatten is missing: onnxruntime optimised it away, so it costs nothing
    w.models[bundle.identity] = ModelProfile(nodes={"conv1": 1.0, "relu1": 0.5, "conv2": 2.0,
                                                    "gap": 0.25, "fc": 0.125})
    w.slowdown = 2
    rows = Planner(bundle, w).costs()
    assert rows[1].head_ms == pytest.approx(2 * 1.5)
    assert rows[2].head_ms == pytest.approx(2 * 3.75)
    assert rows[3].head_ms == pytest.approx(2 * 3.875)


def test_packings_are_configurations_dyno_picks_within_accuracy(tmp_path: Path) -> None:
    """(candidate, packing) rows from the bundle's calibration; DynO's accuracy constraint."""
    from dataclasses import replace

    from coinf.wearable.planner.planner import split_config
    from coinf.wearable.planner.schedulers import dyno, parse_constraint

    b = make_bundle(tmp_path / "b", hw=32)
    cal = {"c000": [{"spec": "q4", "mean_bytes": 1600.0, "accuracy_drop_pp": 3.0},
                    {"spec": "q8", "mean_bytes": 3100.0, "accuracy_drop_pp": 0.4}],
           "c001": [{"spec": "q8", "mean_bytes": 16400.0, "accuracy_drop_pp": 0.2}]}
    cands = tuple(replace(c, extra={**c.extra, "packing": cal.get(c.id, [])})
                  for c in b.candidates)
    b.candidates = cands
    w, h = profiles(b)
    packings = ("raw", "q8", "q4", "f16")
    loose = Planner(b, w, h, Policy(objective="latency", accuracy_tolerance_pp=5.0),
                    packings=packings)
    link = LinkEstimate(200_000, 200_000, 0)
    rows = {r.id: r for r in loose.costs(link)}
    assert set(rows) == {"c000", "c000~q4", "c000~q8", "c001", "c001~q8", "c002", "c003"}
    assert rows["c000~q4"].accuracy_drop_pp == 3.0
    assert rows["c000~q4"].crossing_bytes == rows["c000"].crossing_bytes - 12288 + 1600
    # packing costs wearable time: the packed rows' heads are longer than the raw one's
    assert rows["c000~q4"].head_ms > rows["c000"].head_ms
    # with a 5 pp tolerance the fastest is the 4-bit upload
    assert loose.decide(link).winner == "c000~q4"
    # the default tolerance (1 pp) never offers the 3 pp packing: 8-bit it is
    strict = Planner(b, w, h, Policy(objective="latency"), packings=packings)
    assert "c000~q4" not in {r.id for r in strict.costs(link)}
    assert strict.decide(link).winner == "c000~q8"
    d = dyno(loose.costs(link), [parse_constraint("accuracy_drop<=1")], [])
    assert split_config(d.winner) == ("c000", "q8")


def test_joint_choice_packs_harder_when_bandwidth_drops(tmp_path: Path) -> None:
    """Fast link: raw (packing time is not worth it); slow link: the smallest packing within
    the tolerance."""
    from dataclasses import replace

    from coinf.wearable.planner.planner import split_config

    b = make_bundle(tmp_path / "b", hw=32)
    cal = {"c000": [{"spec": "q8", "mean_bytes": 3100.0, "accuracy_drop_pp": 0.4},
                    {"spec": "q4", "mean_bytes": 1600.0, "accuracy_drop_pp": 0.9},
                    {"spec": "q2", "mean_bytes": 800.0, "accuracy_drop_pp": 4.0}]}
    b.candidates = tuple(replace(c, extra={**c.extra, "packing": cal.get(c.id, [])})
                         for c in b.candidates)
    w, h = profiles(b)
    planner = Planner(b, w, h, Policy(objective="latency"), packings=("raw", "q8", "q4", "q2"),
                      pack_mb_s=1.0)
    fast = planner.decide(LinkEstimate(1e9, 1e9, 0))
    slow = planner.decide(LinkEstimate(100_000, 100_000, 0))
    assert split_config(fast.winner)[1] == "raw"
    assert split_config(slow.winner) == ("c000", "q4")  # q2 is faster but costs 4 pp
    assert split_config("c003") == ("c003", "raw")


def test_default_packings_are_every_calibrated_one(tmp_path: Path) -> None:
    """``auto`` (the default): the calibrated packings within tolerance; raw when uncalibrated;
    a bad packing name is refused up front."""
    from dataclasses import replace

    b = make_bundle(tmp_path / "b", hw=32)
    w, h = profiles(b)
    link = LinkEstimate(20_000, 20_000, 0)
    plain = Planner(b, w, h, Policy(objective="latency"))
    assert all("~" not in r.id for r in plain.costs(link))
    cal = {"c000": [{"spec": "q8", "mean_bytes": 3100.0, "accuracy_drop_pp": 0.4},
                    {"spec": "q2", "mean_bytes": 800.0, "accuracy_drop_pp": 4.0}],
           "c001": [{"spec": "f16", "mean_bytes": 8200.0, "accuracy_drop_pp": 0.0}]}
    b.candidates = tuple(replace(c, extra={**c.extra, "packing": cal.get(c.id, [])})
                         for c in b.candidates)
    auto = Planner(b, w, h, Policy(objective="latency"))
    packed = {r.id for r in auto.costs(link) if "~" in r.id}
    assert packed == {"c000~q8", "c001~f16"}  # q2 is beyond the 1 pp tolerance
    with pytest.raises(ValueError, match=r"bits in 1\.\.16"):
        Planner(b, w, h, packings=("raw", "q99"))
