"""Issue 18: plans that can actually run, and packings whose accuracy is established.

A configuration whose predicted exchange does not fit the Session's timeout (with the 2x margin)
is never chosen; the reassembly and request deadlines scale with the message size; a packing
calibrated on too few samples to establish the tolerance is never offered.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from coinf.ble_protocol.chunks import Reassembler, encode_chunks
from coinf.ble_protocol.messages import Message, MsgType
from coinf.convert import calibrate as cal
from coinf.device.profile import DeviceProfile, ModelProfile
from coinf.wearable.options import request_timeout
from coinf.wearable.planner.adapt import LinkEstimate
from coinf.wearable.planner.planner import Planner
from coinf.wearable.policy import Policy

from coinf.bundle import Bundle
from tests.planner_bundle import make_bundle

LINK_20 = LinkEstimate(20_000, 20_000, 30, "test")


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    """The ResNet-50 case: a 224x224 image (602 kB raw) crossing a 20 kB/s link."""
    return make_bundle(tmp_path_factory.mktemp("big") / "b", hw=224)


def resnet_like(bundle: Bundle) -> tuple[DeviceProfile, DeviceProfile]:
    """A slow wearable (8.2 s for the whole model): sending the image costs its battery less."""
    w, h = DeviceProfile.pi_zero_2w(), DeviceProfile.laptop()
    w.models[bundle.identity] = ModelProfile(candidates={
        "c000": {"head_ms": 0.0}, "c001": {"head_ms": 50.0}, "c002": {"head_ms": 8000.0},
        "c003": {"head_ms": 8200.0}})
    h.models[bundle.identity] = ModelProfile(candidates={
        "c000": {"tail_ms": 300.0}, "c001": {"tail_ms": 290.0}, "c002": {"tail_ms": 1.0},
        "c003": {"tail_ms": 0.0}})
    return w, h


def test_least_energy_plan_whose_transfer_exceeds_the_timeout_is_not_chosen(big: Bundle) -> None:
    w, h = resnet_like(big)
    # control: with a long enough timeout, least energy is sending the raw image (~30 s)
    loose = Planner(big, w, h, Policy(), timeout_s=600).decide(LINK_20, objective="auto",
                                                                latency_budget_ms=None)
    assert loose.winner == "c000"
    assert loose.row.transfer_ms > 30_000 and not loose.excluded
    # the default 30 s timeout: the same plan is infeasible and the Decision says why
    d = Planner(big, w, h, Policy()).decide(LINK_20, objective="auto", latency_budget_ms=None)
    assert d.winner == "c002"
    assert "c000" in d.excluded and "infeasible" in d.excluded["c000"]
    assert "30 s timeout" in d.excluded["c000"]
    assert {r.id for r in d.rows} == {"c000", "c001", "c002", "c003"}  # still shown
    assert d.row.exchange_ms() * 2 <= 30_000
    # one line says the objective and why the winner won; explain() starts with it
    assert d.headline.startswith("least energy (objective auto, no latency budget)")
    assert "-> chose c002" in d.headline
    text = d.explain()
    assert text.splitlines()[0] == d.headline
    assert "excluded c000: infeasible" in text
    assert "x c000 handheld-only" in text
    # every objective respects it, not only the default
    for objective in ("energy", "neurosurgeon-energy", "dyno", "latency"):
        got = Planner(big, w, h, Policy()).decide(LINK_20, objective=objective)
        assert got.winner not in ("c000", "c001"), objective


def test_wearable_only_is_kept_when_nothing_else_fits(big: Bundle) -> None:
    w, h = resnet_like(big)
    d = Planner(big, w, h, Policy(), timeout_s=0.01).decide(LINK_20, objective="latency")
    assert d.winner == "c003"  # exchange 0: always feasible
    assert set(d.excluded) == {"c000", "c001", "c002"}


def test_request_deadline_scales_with_size_and_bandwidth() -> None:
    # small request: the configured timeout
    assert request_timeout(30.0, 4_000, 20_000, 30) == 30.0
    # 602 kB at 20 kB/s: 2 x (15 ms + 30.1 s)
    assert request_timeout(30.0, 602_000, 20_000, 30) == pytest.approx(2 * (0.015 + 30.1))
    # a faster measured link needs no stretch
    assert request_timeout(30.0, 602_000, 200_000, 30) == 30.0
    # no estimate: the planner's default link (20 kB/s)
    assert request_timeout(30.0, 602_000) > 60
    # a per-call RunOptions.timeout is a hard bound
    assert request_timeout(1.0, 602_000, 20_000, 30, explicit=True) == 1.0


def test_reassembly_of_a_large_message_that_keeps_arriving_is_not_cut() -> None:
    now = [0.0]
    r = Reassembler(timeout_s=30.0, clock=lambda: now[0])
    chunks = list(encode_chunks(Message(MsgType.REQUEST, 7, bytes(602_000)), 512))
    done = None
    for c in chunks:  # 20 kB/s: the whole message takes ~30 s, the fixed timeout's age
        now[0] += len(c) / 20_000
        assert r.expire() == []
        done = r.feed(c)
    assert now[0] > 30.0 and done is not None and len(done.payload) == 602_000


def test_reassembly_expires_a_stalled_or_crawling_message() -> None:
    now = [0.0]
    r = Reassembler(timeout_s=30.0, clock=lambda: now[0], min_rate_bps=1000)
    chunks = list(encode_chunks(Message(MsgType.REQUEST, 8, bytes(100_000)), 512))
    r.feed(chunks[0])
    now[0] = 29.0
    assert r.expire() == []
    now[0] = 31.0
    assert r.expire() == [8]  # no data for 30 s
    # a message that trickles (one chunk every 20 s) outlives its size-scaled deadline
    r2 = Reassembler(timeout_s=30.0, clock=lambda: now[0], min_rate_bps=1000)
    now[0] = 0.0
    expired: list[int] = []
    for c in chunks[:20]:
        r2.feed(c)
        now[0] += 20.0
        expired += r2.expire()
        if expired:
            break
    assert expired == [8]
    assert now[0] > r2.deadline(100_004)


# -- calibration confidence -------------------------------------------------------------------
def test_upper_bound_and_samples_needed() -> None:
    assert 100 * cal.upper_bound(0, 8) == pytest.approx(31.2, abs=0.1)  # the 8-sample case
    assert cal.upper_bound(8, 8) == 1.0
    assert cal.upper_bound(1, 100) > cal.upper_bound(0, 100) > 0.01 > cal.upper_bound(0, 400)
    assert cal.samples_needed(1.0) == 299
    assert 100 * cal.upper_bound(0, cal.samples_needed(1.0)) <= 1.0
    assert 100 * cal.upper_bound(0, cal.samples_needed(1.0) - 1) > 1.0


def _calibrated(tmp_path: Path, rows: list[dict[str, object]], samples: int | None) -> Bundle:
    b = make_bundle(tmp_path / "b", hw=32)
    b.candidates = tuple(replace(c, extra={**c.extra, "packing": rows}) if c.id == "c000" else c
                         for c in b.candidates)
    if samples is not None:
        b.meta[cal.META_KEY] = {"samples": samples}
    return b


def test_planner_refuses_a_packing_whose_bound_exceeds_the_tolerance(tmp_path: Path) -> None:
    row = {"spec": "q2", "mean_bytes": 800.0, "accuracy_drop_pp": 0.0, "top1_agreement": 1.0}
    link = LinkEstimate(2_000, 2_000, 0)  # slow: the smallest packing would win
    few = _calibrated(tmp_path / "few", [{**row, "samples": 8,
                                          "accuracy_drop_upper_pp": 31.2}], None)
    d = Planner(few, *resnet_like(few), Policy(objective="latency")).decide(link)
    assert "c000~q2" not in {r.id for r in d.rows}
    assert "upper bound is 31.2 pp" in d.excluded["c000~q2"]
    assert "8 samples" in d.excluded["c000~q2"]
    assert d.winner == "c000"
    many = _calibrated(tmp_path / "many", [{**row, "samples": 400,
                                            "accuracy_drop_upper_pp": 0.75}], None)
    planner = Planner(many, *resnet_like(many), Policy(objective="latency"))
    assert planner.decide(link).winner == "c000~q2"
    # tables written before the bound existed: computed from the agreement and the meta count
    legacy = _calibrated(tmp_path / "legacy", [row], samples=8)
    assert "c000~q2" in Planner(legacy, *resnet_like(legacy), Policy(objective="latency")).decide(
        link).excluded
    legacy_many = _calibrated(tmp_path / "legacy_many", [row], samples=400)
    assert Planner(legacy_many, *resnet_like(legacy_many),
                   Policy(objective="latency")).decide(
        link).winner == "c000~q2"
