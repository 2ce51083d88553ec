"""The Session chooses its split with the planner and adapts it at run time."""

from __future__ import annotations

import numpy as np
import pytest
from coinf.ble_protocol.shaped import Channel, ShapedLink
from coinf.convert.split import split_model
from coinf.device.profile import LAPTOP_POWER, PI_ZERO_2W_POWER, DeviceProfile
from coinf.models.zoo import committed_path
from coinf.wearable.policy import Policy

from coinf import LinkOptions, PlacementOptions, PlannerOptions, Session, SessionOptions
from coinf.cli.sample import bundle_feeds

# time beyond the suite's 30 s a test: packs on a slow emulated link (up to 8 s alone)
pytestmark = pytest.mark.timeout(120)

SLOW_WEARABLE = DeviceProfile("slow", "wearable", PI_ZERO_2W_POWER, gflops=0.002)
FAST_HANDHELD = DeviceProfile("fast", "handheld", LAPTOP_POWER, gflops=50.0)


@pytest.fixture(scope="module")
def lenet(tmp_path_factory):
    return split_model(committed_path("lenet_digits"), tmp_path_factory.mktemp("b") / "lenet")


def session(bundle, bandwidth, **placement):
    return Session(bundle, SessionOptions(
        placement=PlacementOptions(**placement),
        link=LinkOptions(transport=Channel(bandwidth, latency_s=0.0005)),
        planner=PlannerOptions(wearable_profile=SLOW_WEARABLE, handheld_profile=FAST_HANDHELD,
                               policy=Policy(battery_aware=False), objective="latency")))


def test_session_changes_cut_when_the_bandwidth_changes(lenet):
    x = bundle_feeds(lenet)
    with session(lenet, 5_000_000) as sess:
        fast_choices = set()
        for _ in range(4):
            sess.run(None, x)
            fast_choices.add(sess.last_run.candidate)
        fast = sess.split
        assert not fast.is_wearable_only  # a fast link: offload
        assert sess.link is not None
        link = sess.link
        assert isinstance(link, ShapedLink)
        link.retune(Channel(2_000, latency_s=0.0005))  # the radio gets 2500x slower
        slow_choices = []
        for _ in range(4):
            sess.run(None, x)
            slow_choices.append(sess.last_run.candidate)
        slow = sess.split
        assert slow.id != fast.id
        # fewer bytes cross at the new choice (or none: all on the wearable)
        assert slow.is_wearable_only or slow.crossing_bytes < fast.crossing_bytes
        assert slow_choices[-1] == slow.id
        decision = sess.plan()
        assert decision.winner.split("~")[0] == slow.id
        assert "link" in "\n".join(decision.notes)


def test_plan_explains_every_candidate(lenet):
    with session(lenet, 20_000) as sess:
        d = sess.plan()
        text = d.explain()
        assert len(d.rows) == len(lenet.candidates)
        for cand in lenet.candidates:
            assert cand.id in text
        assert "why:" in text


def test_fixed_split_is_kept_and_planner_can_be_restored(lenet):
    x = bundle_feeds(lenet)
    with session(lenet, 5_000_000, split="wearable-only") as sess:
        sess.run(None, x)
        assert sess.last_run.candidate == lenet.candidates[-1].id
        assert "fixed by the caller" in "\n".join(sess.plan().notes)
    with session(lenet, 5_000_000) as sess:
        sess.set_split("c001")
        sess.run(None, x)
        assert sess.last_run.candidate == "c001"
        sess.set_split(None)
        sess.run(None, x)
        assert sess.autoplan is not None


def test_unknown_objective_is_a_clear_error():
    with pytest.raises(ValueError, match=r"PlannerOptions\.objective must be one of .*'fastest'"):
        PlannerOptions(objective="fastest")


def test_results_equal_the_whole_model_whatever_the_planner_picks(lenet):
    import onnxruntime as ort

    ref = ort.InferenceSession(str(lenet.model_path), providers=["CPUExecutionProvider"])
    with session(lenet, 50_000) as sess:
        for seed in range(3):
            x = bundle_feeds(lenet, seed)
            np.testing.assert_allclose(sess.run(None, x)[0], ref.run(None, x)[0],
                                       rtol=1e-4, atol=1e-5)


def test_session_packs_on_a_slow_link_within_tolerance(lenet, tmp_path):
    import shutil

    from coinf.cli import main

    cal = tmp_path / "lenet_cal"
    shutil.copytree(lenet.root, cal)
    assert main(["calibrate", str(cal), "--data", "digits", "--bits", "2,4,8"]) == 0
    x = bundle_feeds(lenet)
    with session(cal, 20_000, packings=("raw", "q2", "q4", "q8")) as sess:
        for _ in range(3):
            sess.run(None, x)
        stats = sess.last_run
        decision = sess.plan()
    assert stats is not None and not stats.local
    assert stats.packing in ("q2", "q4", "q8")  # 20 kB/s: packing pays
    cand = sess.bundle.candidate(stats.candidate)
    row = next(r for r in cand.extra["packing"] if r["spec"] == stats.packing)
    assert row["accuracy_drop_pp"] <= 1.0
    assert "~" in decision.winner  # plan() shows the packing choice
