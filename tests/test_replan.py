"""A Session given helpers re-plans mid-stream: a helper killed while frames are in flight is left
out (the frame in flight finishes on the wearable, later frames run on the other helper) and
joins again once it is back; no frame is lost or duplicated. Real helper daemons on TCP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest
from coinf.convert.split import split_model
from coinf.handheld.pipeline_host import local_helpers
from coinf.wearable import replan
from coinf.wearable.pipeline_config import HelperConfig
from coinf.wearable.replan import Replanner

from coinf import AsyncSession, LinkOptions, PlacementOptions, Session, SessionOptions
from tests.test_pipeline_run import LENET, frames, reference, sync
from tests.test_plan_executor import _profile_speed

# time beyond the suite's 30 s a test:
# streams through helper daemons that die and come back (up to 13 s alone)
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return split_model(LENET, tmp_path_factory.mktemp("replan") / "lenet")


def _helpers(bundle, hosts) -> list[HelperConfig]:  # type: ignore[no-untyped-def]
    """h1 faster than h2, both far faster than the wearable on fast links: a split to h1."""
    wear = _profile_speed(bundle)
    speed = {"h1": wear * 200, "h2": wear * 100}
    return [HelperConfig(h.name, h.address, bandwidth_bps=1e9, speed_flops=speed[h.name])
            for h in hosts]


def _devices(plan: str) -> set[str]:
    return {part.split("@")[1].split("(")[0] for part in plan.split(": ", 1)[1].split(" -> ")}


@pytest.fixture
def fixed_speeds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measured speeds and links never move or enter the plan (these tests follow failures
    alone): LeNet's slices are so small that a helper measures far below its configured speed,
    and which of two helpers measures faster is noise, so a plan chosen again when a helper
    comes back would depend on it."""
    monkeypatch.setattr(replan, "SPEED_FACTOR", float("inf"))
    monkeypatch.setattr(replan, "SPEED_FRAMES", 10**9)


@sync
async def test_a_helper_killed_mid_stream_is_left_out_and_rejoins_when_back(  # type: ignore[no-untyped-def]
        bundle, fixed_speeds) -> None:
    pool = frames(bundle, 8)
    ref = reference(bundle, pool)
    async with local_helpers(bundle, ["h1", "h2"]) as hosts:
        opts = SessionOptions(placement=PlacementOptions(helpers=_helpers(bundle, hosts)),
                              link=LinkOptions(timeout=10.0, max_backoff_s=0.2))
        async with AsyncSession(bundle, opts) as sess:
            assert sess.replanner is not None
            first = sess.strategies
            assert first is not None and first["chosen"] == "depth split"
            assert _devices(first["history"][0]["plan"]) == {"wearable", "h1"}
            sent: list[int] = []

            async def feeds() -> AsyncIterator[dict[str, np.ndarray]]:
                for i in range(400):
                    if i == 4:
                        await hosts[0].kill()  # h1 vanishes with frames in flight
                    if i == 10:
                        await hosts[0].revive()  # and comes back at the same address
                    if i > 10:
                        if sess.replanner is not None and sess.replanner.version >= 3 \
                                and _later_h1(sess) >= 4:
                            return  # h1 is back and has had frames
                        await asyncio.sleep(0.01)  # time for the background probe
                    sent.append(i)
                    yield pool[i % len(pool)]

            results = [r async for r in sess.astream(feeds(), depth=3)]
            # every frame once, in order, right (nothing lost, nothing twice)
            assert [r.index for r in results] == list(range(len(sent)))
            for r in results:
                assert r.error is None and r.stats is not None
                np.testing.assert_allclose(r.value()[0], ref[r.index % len(pool)],
                                           rtol=1e-4, atol=1e-5)
            history = sess.strategies["history"]  # type: ignore[index]
            assert [_devices(h["plan"]) for h in history[:3]] == [
                {"wearable", "h1"}, {"wearable", "h2"}, {"wearable", "h1"}]
            assert history[1]["reason"].startswith("h1 failed") and \
                history[2]["reason"] == "h1 is back"
            stats = [r.stats for r in results]
            # the frames in flight when h1 died finished here; none was lost
            fell = [s for s in stats if s.fallback is not None]
            assert fell and all(s.local and s.plan_version == 1 for s in fell)
            # every frame planned after the failure ran on h2 until h1 came back
            on_h2 = [s for s in stats if s.plan_version == 2]
            assert on_h2 and all(_devices(s.plan) == {"wearable", "h2"} and not s.local
                                 and [h["device"] for h in s.hops] == ["h2"] for s in on_h2)
            back = [s for s in stats if s.plan_version == 3]
            assert len(back) >= 3 and all(s.fallback is None and s.hops[0]["device"] == "h1"
                                          for s in back)
            assert hosts[0].daemon.requests >= 3  # the revived daemon served them


def _later_h1(sess: AsyncSession) -> int:
    """Frames started since the plan went back to h1."""
    rp = sess.replanner
    assert rp is not None
    return rp.frames - rp.history[-1]["from_frame"]


def test_every_helper_gone_leaves_the_wearable_alone_and_the_session_says_so(bundle) -> None:  # type: ignore[no-untyped-def]
    """Both helpers die: the sync Session's frames keep coming, on the wearable, and
    ``strategies`` lists who is left out and why."""
    pool = frames(bundle, 10)
    ref = reference(bundle, pool)

    async def start() -> tuple[object, list[HelperConfig]]:
        cm = local_helpers(bundle, ["h1", "h2"])
        hosts = await cm.__aenter__()
        return (cm, hosts), _helpers(bundle, hosts)

    from coinf.wearable.loop import LoopThread

    loop = LoopThread()
    try:
        (cm, hosts), helpers = loop.run(start())  # type: ignore[misc]
        opts = SessionOptions(placement=PlacementOptions(helpers=helpers),
                              link=LinkOptions(timeout=10.0, max_backoff_s=30.0))
        with Session(bundle, opts) as sess:
            out = list(sess.stream(pool[:2]))
            assert all(r.stats is not None and r.stats.hops[0]["device"] == "h1" for r in out)
            for h in hosts:
                loop.run(h.kill())
            out += list(sess.stream(pool[2:]))
            assert [r.index for r in out] == [0, 1, *range(8)]
            for r, want in zip(out, ref, strict=True):
                np.testing.assert_allclose(r.value()[0], want, rtol=1e-4, atol=1e-5)
            info = sess.strategies
            assert info is not None and info["chosen"] == "local"
            assert set(info["left_out"]) == {"h1", "h2"}
            last = out[-1].stats  # planned after both failures were seen (depth 3 < 6)
            assert last is not None and last.strategy == "local" and last.fallback is None
            assert last.plan.startswith("local:") and last.plan_version == info["version"]
    finally:
        loop.run(cm.__aexit__(None, None, None))  # type: ignore[attr-defined]
        loop.close()


def test_replanner_backoff_doubles_and_a_new_helper_joins(bundle) -> None:  # type: ignore[no-untyped-def]
    """The bookkeeping alone: a failed helper's probe failing doubles its backoff (bounded);
    a helper announced later joins the choice; the same failure seen twice counts once."""
    from coinf.device.profile import load_or_default
    from coinf.wearable.planner.planner import Planner
    from coinf.wearable.policy import Policy

    planner = Planner(bundle, load_or_default("wearable", None),
                      load_or_default("handheld", None), Policy())
    wear = _profile_speed(bundle)
    h1 = HelperConfig("h1", "tcp:127.0.0.1:9", bandwidth_bps=1e9, speed_flops=wear * 100)
    rp = Replanner(bundle, planner, [h1], "latency", max_backoff_s=4.0)
    assert rp.plan.stages[1].device == "h1" and rp.version == 1
    assert rp.failed("h1", OSError("gone")) and not rp.failed("h1", OSError("gone"))
    assert rp.plan.local and rp.version == 2
    backoffs = []
    for _ in range(4):
        rp.dead["h1"] = (0.0, *rp.dead["h1"][1:])  # its backoff has passed
        assert rp.due() == ["h1"]
        rp.probing.add("h1")
        assert rp.due() == []  # one probe at a time
        rp.still_out("h1", OSError("refused"))
        backoffs.append(rp.dead["h1"][1])
    assert backoffs == [2.0, 4.0, 4.0, 4.0]
    h2 = HelperConfig("h2", "tcp:127.0.0.1:10", bandwidth_bps=1e9, speed_flops=wear * 50)
    assert rp.merge([h2]) == ["h2"] and rp.merge([h2]) == []
    assert rp.plan.stages[1].device == "h2" and rp.history[-1]["reason"] == "discovered h2"
    rp.back("h1")
    assert rp.plan.stages[1].device == "h1" and "h1" not in rp.summary()["left_out"]


@sync
async def test_set_split_overrides_the_helpers_plan_until_handed_back(bundle) -> None:  # type: ignore[no-untyped-def]
    """A split fixed by the caller goes to the handheld (here in-process) whatever the helpers;
    ``set_split(None)`` hands the frames back to the plan over the helpers."""
    feeds = frames(bundle, 1)
    want = reference(bundle, feeds)[0]
    async with local_helpers(bundle, ["h1", "h2"]) as hosts:
        opts = SessionOptions(placement=PlacementOptions(helpers=_helpers(bundle, hosts)))
        async with AsyncSession(bundle, opts) as sess:
            cut = bundle.candidates[len(bundle.candidates) // 2].id
            sess.set_split(cut)
            (out,) = await sess.run(None, feeds[0])
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
            assert sess.last_run is not None and "@handheld" in sess.last_run.plan
            assert sess.last_run.candidate == cut and sess.strategies is not None
            sess.set_split(None)
            (out,) = await sess.run(None, feeds[0])
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
            assert sess.last_run.hops[0]["device"] == "h1"


@pytest.fixture
def configured_links(monkeypatch: pytest.MonkeyPatch) -> None:
    """Links stay as configured (a test of speeds alone): in-process helpers on a loaded
    machine can measure their loopback links at anything."""
    monkeypatch.setattr(Replanner, "_link_off", lambda self, name, planned: None)


@sync
async def test_a_helper_measured_slower_than_planned_loses_its_place(  # type: ignore[no-untyped-def]
        bundle, configured_links) -> None:
    """h1 is configured as the fastest helper but plays a machine 40x slower: after a few
    frames its measured speed (its slice's FLOPs over the compute time its RESULT reports) is
    far off the planned one, the plan is chosen again with it, and the frames go to h2; every
    frame comes back once, in order, right."""
    pool = frames(bundle, 6)
    ref = reference(bundle, pool)
    async with local_helpers(bundle, ["h1", "h2"], {"h1": 40.0}) as hosts:
        opts = SessionOptions(placement=PlacementOptions(helpers=_helpers(bundle, hosts)),
                              link=LinkOptions(timeout=10.0))
        async with AsyncSession(bundle, opts) as sess:
            assert sess.replanner is not None
            results = [r async for r in sess.astream((pool[i % 6] for i in range(30)),
                                                     depth=2)]
            assert [r.index for r in results] == list(range(30))
            for r in results:
                np.testing.assert_allclose(r.value()[0], ref[r.index % 6], rtol=1e-4,
                                           atol=1e-5)
            history = sess.strategies["history"]  # type: ignore[index]
            assert _devices(history[0]["plan"]) == {"wearable", "h1"}
            moved = [h for h in history if h["reason"].startswith("h1 measured at")]
            assert moved and "h1" not in _devices(history[-1]["plan"])
            assert sess.replanner.measured["h1"][0] >= replan.SPEED_FRAMES
            last = results[-1].stats
            assert last is not None and last.hops and last.hops[0]["device"] != "h1"


def test_links_measured_off_the_plan_move_it(bundle) -> None:  # type: ignore[no-untyped-def]
    """The bookkeeping of links: h1 is planned at 100 MB/s; sends too short to time only bound
    it from below and move nothing. Then frames take 2.5 s each to carry 50 kB into it
    (20 kB/s): after SPEED_FRAMES timed sends the plan is chosen again with the measured link
    and h2 (50 MB/s) takes h1's place. A link measured far faster than planned is taken too."""
    from coinf.device.profile import load_or_default
    from coinf.wearable.frame import RunStats
    from coinf.wearable.planner.planner import Planner
    from coinf.wearable.policy import Policy

    planner = Planner(bundle, load_or_default("wearable", None),
                      load_or_default("handheld", None), Policy())
    wear = _profile_speed(bundle)
    h1 = HelperConfig("h1", "tcp:127.0.0.1:9", bandwidth_bps=1e8, speed_flops=wear * 100)
    h2 = HelperConfig("h2", "tcp:127.0.0.1:10", bandwidth_bps=5e7, speed_flops=wear * 100)
    rp = Replanner(bundle, planner, [h1, h2], "latency", max_backoff_s=4.0)
    first = rp.plan
    assert first.stages[1].device == "h1" and rp.version == 1
    clock = 100.0

    def frame(nbytes: int, seconds: float) -> None:
        nonlocal clock
        rp.sent("h1", nbytes, clock, {"sent": clock + seconds})
        rp.observed(first, RunStats(candidate=first.candidate.id))
        clock += seconds + 1.0

    for _ in range(5):
        frame(10_000, 1e-4)  # too short to time: at least 20 MB/s, no news
    assert rp.version == 1 and rp.links.timed.get("h1", 0) == 0
    for _ in range(replan.SPEED_FRAMES):
        frame(50_000, 2.5)
    assert rp.links.timed["h1"] == replan.SPEED_FRAMES
    assert rp.version == 2 and rp.plan.stages[1].device == "h2"
    assert rp.history[-1]["reason"].startswith("the link into h1 measured at ")
    assert rp.links.value("h1") == pytest.approx(20e3, rel=0.3)
    # h2's link proves far faster than configured: chosen again with it (still h2)
    before = rp.options
    rp.sent("h2", 5_000_000, clock, {"sent": clock + 0.01})  # 500 MB/s
    rp.observed(rp.plan, RunStats(candidate=rp.plan.candidate.id))
    assert rp.links.value("h2") == pytest.approx(5e8) and rp.options is not before
    assert rp.plan.stages[1].device == "h2" and rp.version == 2


def test_the_wearable_measured_slower_than_its_profile_moves_the_plan(bundle) -> None:  # type: ignore[no-untyped-def]
    """The wearable's own speed is measured like a helper's, from each offloaded frame's
    head: planned from its profile to keep most of the model, it proves 50x slower over
    SPEED_FRAMES frames and the plan gives the work to h1; with ``adaptive`` off the same
    measurements move nothing."""
    from coinf.device.profile import load_or_default
    from coinf.wearable.frame import RunStats
    from coinf.wearable.planner.planner import Planner
    from coinf.wearable.policy import Policy

    planner = Planner(bundle, load_or_default("wearable", None),
                      load_or_default("handheld", None), Policy())
    wear = _profile_speed(bundle)
    h1 = HelperConfig("h1", "tcp:127.0.0.1:9", bandwidth_bps=2e5, speed_flops=wear * 3)
    for adaptive in (False, True):
        rp = Replanner(bundle, planner, [h1], "latency", max_backoff_s=4.0)
        rp.adaptive = adaptive
        first = rp.plan
        head = first.stages[0]
        work = rp._flops[head.end] - rp._flops[head.start]
        assert work > 0.05 * rp._flops[bundle.candidates[-1].id]  # the head is timed
        for _ in range(replan.SPEED_FRAMES):
            rp.observed(first, RunStats(candidate=first.candidate.id,
                                        head_ms=work / (wear / 50) * 1e3))
        assert rp.measured["wearable"][0] == replan.SPEED_FRAMES
        assert rp.measured["wearable"][1] == pytest.approx(wear / 50, rel=1e-6)
        if not adaptive:
            assert rp.plan == first and rp.version == 1
            continue
        assert rp.version == 2 and "wearable measured at" in rp.history[-1]["reason"]
        moved = rp.plan.stages[0]
        assert rp._flops[moved.end] < rp._flops[head.end]  # less work kept here
