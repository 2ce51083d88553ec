"""One cost model with helpers: ``choose_strategy`` (what a Session given helpers runs) prices
each cut by what its hop sends -- the smallest packing or compressor code within the policy's
accuracy tolerance -- and the plan's stages carry that packing, so a slow link draws the cut to
where a compressor shrinks it, and the frame really crosses as that code."""

from __future__ import annotations

import numpy as np
import pytest
from coinf.device.profile import LAPTOP_POWER, PI_ZERO_2W_POWER, DeviceProfile
from coinf.handheld.pipeline_host import local_helpers
from coinf.wearable.pipeline_config import HelperConfig
from coinf.wearable.planner.compress_select import hop_option, option_label
from coinf.wearable.planner.planner import Planner
from coinf.wearable.planner.strategy import choose_strategy, codec_s, to_plan
from coinf.wearable.policy import Policy

from coinf import AsyncSession, LinkOptions, PlacementOptions, PlannerOptions, SessionOptions
from coinf.bundle import Bundle
from tests.test_compressor_runtime import bundle, compressed_reference, cset, frames, sync

__all__ = ["bundle", "cset"]  # the fixtures, shared with test_compressor_runtime

SLOW = DeviceProfile("slow", "wearable", PI_ZERO_2W_POWER, gflops=0.0005)
FAST = DeviceProfile("fast", "handheld", LAPTOP_POWER, gflops=50.0)


def _planner(bundle: Bundle, tolerance_pp: float) -> Planner:
    return Planner(bundle, SLOW, FAST, Policy(battery_aware=False,
                                              accuracy_tolerance_pp=tolerance_pp))


def test_cuts_are_priced_as_their_hop_sends_them_within_the_tolerance(bundle: Bundle) -> None:
    """At 2 kB/s into h1 a tolerance of 10 pp lets a compressor's code carry the first hop:
    the chosen split sends it (a ``gN`` stage packing at a cut with compressors), priced at
    the code's bytes; at 0.01 pp nothing lossy is allowed and every hop is raw."""
    whole = float(bundle.candidates[-1].head.flops) * 100
    helpers = [HelperConfig("h1", "tcp:127.0.0.1:9", 2000.0, speed_flops=whole)]
    _, loose, _ = choose_strategy(bundle, _planner(bundle, 10.0), helpers, "latency", 1e6)
    _, strict, _ = choose_strategy(bundle, _planner(bundle, 0.01), helpers, "latency", 1e6)
    assert loose.name == "depth split" and loose.packings[0].startswith("g")
    cut = loose.cuts[0]
    assert bundle.compressors(cut)
    option = hop_option(bundle, cut, 0.10)
    assert option.nbytes < bundle.candidate(cut).crossing_bytes
    assert loose.packings == (option_label(option),)
    assert not any(p.startswith("g") for p in strict.packings)  # no code within 0.01 pp
    # the code's encoder runs on the wearable and its decoder on h1: both are priced in
    enc, dec = codec_s(bundle, _planner(bundle, 10.0), cut, loose.packings[0])
    assert enc > 0 and dec > 0
    assert loose.stage_s[0] >= enc and loose.stage_s[2] >= dec
    assert loose.latency_s == pytest.approx(sum(loose.stage_s) + 2 * helpers[0].latency_s)
    plan = to_plan(loose, bundle)
    assert plan.stages[0].packing == loose.packings[0] and plan.stages[-1].packing == "raw"


@sync
async def test_a_session_given_helpers_sends_the_planned_code(bundle: Bundle) -> None:
    """The Session runs that plan through a real helper daemon: the first hop's tensors go as
    the compressor's code, and the output is the model's through that compressor."""
    whole = float(bundle.candidates[-1].head.flops) * 100
    feed = frames(bundle, 1)[0]
    async with local_helpers(bundle, ["h1"]) as hosts:
        helpers = [HelperConfig("h1", hosts[0].address, 2000.0, speed_flops=whole)]
        opts = SessionOptions(
            placement=PlacementOptions(helpers=helpers),
            planner=PlannerOptions(wearable_profile=SLOW, handheld_profile=FAST,
                                   policy=Policy(battery_aware=False,
                                                 accuracy_tolerance_pp=10.0)),
            link=LinkOptions(timeout=10.0))
        async with AsyncSession(bundle, opts) as sess:
            assert sess.replanner is not None
            stage = sess.replanner.plan.stages[0]
            assert stage.packing.startswith("g")
            (out,) = await sess.run(None, feed)
            st = sess.last_run
    assert st is not None and st.fallback is None and st.hops
    assert st.bytes_up < bundle.candidate(stage.end).crossing_bytes
    ref = compressed_reference(bundle, feed, {stage.end: stage.gamma})
    assert np.abs(out - ref).max() <= 0.05 * np.abs(ref).max() + 0.05
