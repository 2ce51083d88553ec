"""Plans are data (JSON in, JSON out, checked against the bundle) and one executor runs any of
them: a Session given a fixed 3-stage plan sends one request that two real helper daemons
forward, and falls back on the wearable, naming the device, when a helper dies."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from coinf.convert.split import split_model
from coinf.handheld.pipeline_host import local_helpers
from coinf.wearable.pipeline_config import HelperConfig
from coinf.wearable.plan import Plan, Stage

from coinf import AsyncSession, LinkOptions, PlacementOptions, SessionOptions
from coinf.errors import InputError
from tests.test_pipeline_run import LENET, frames, reference, sync


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return split_model(LENET, tmp_path_factory.mktemp("plan") / "lenet")


def three_stages(bundle, packing: str = "raw") -> list[Stage]:  # type: ignore[no-untyped-def]
    ids = [c.id for c in bundle.candidates]
    a, b = ids[len(ids) // 3], ids[2 * len(ids) // 3]
    return [Stage("wearable", ids[0], a, packing=packing), Stage("h1", a, b),
            Stage("h2", b, ids[-1])]


def test_a_plan_round_trips_through_json_and_names_its_strategy(bundle) -> None:
    ids = [c.id for c in bundle.candidates]
    split = Plan.for_candidate(bundle, bundle.candidate(ids[2]), "q8")
    assert split.strategy == "split" and [s.device for s in split.stages] == ["wearable",
                                                                                "handheld"]
    local = Plan.for_candidate(bundle, bundle.candidates[-1])
    assert local.strategy == "local" and local.local
    pipe = Plan.build(bundle, three_stages(bundle, "q8"))
    assert pipe.strategy == "pipeline" and str(pipe.packing) == "q8"
    for plan in (split, local, pipe):
        again = Plan.from_json(json.loads(json.dumps(plan.to_json())), bundle)
        assert again == plan and again.candidate is plan.candidate
    hops = pipe.hops()  # the wire route: every remote stage, named
    assert [(h.device, h.start, h.end) for h in hops] == [
        (s.device, s.start, s.end) for s in pipe.stages[1:]]
    assert split.hops()[0].device == ""  # a split's one hop: whoever receives it


def test_a_bad_plan_is_refused_naming_what_is_wrong(bundle) -> None:
    ids = [c.id for c in bundle.candidates]
    good = three_stages(bundle)
    cases = {
        "first stage is always": [Stage("h1", ids[0], ids[-1])],
        "starts at": [good[0], Stage("h1", ids[1], ids[4]), good[2]],
        "from the first cut": [Stage("wearable", ids[1], good[0].end), *good[1:]],
        "unknown cut": [good[0], Stage("h1", good[1].start, "c999"), good[2]],
        "runtime must be": [good[0], Stage("h1", good[1].start, good[1].end, "tensorflow"),
                            good[2]],
        "sends nothing": [*good[:2], Stage("h2", good[2].start, good[2].end, packing="q8")],
        "end must come after": [Stage("wearable", ids[0], ids[3]), Stage("h1", ids[3], ids[2]),
                                Stage("h2", ids[2], ids[-1])],
        "no compressor": [Stage("wearable", ids[0], ids[2], packing="g4"),
                          Stage("handheld", ids[2], ids[-1])],
    }
    for words, stages in cases.items():
        with pytest.raises(InputError, match=words):
            Plan.build(bundle, stages)
    obj = Plan.build(bundle, good).to_json()
    for broken, words in ((dict(obj, strategy="split"), "strategy"),
                          ({"stages": [{**obj["stages"][0], "gpu": 1}]}, "unknown fields"),
                          ({"stages": "wearable"}, "list 'stages'")):
        with pytest.raises(InputError, match=words):
            Plan.from_json(broken, bundle)
    with pytest.raises(InputError, match="split or plan, not both"):
        PlacementOptions(split=ids[1], plan=obj)


@sync
async def test_one_request_runs_a_three_stage_plan_and_a_dead_helper_falls_back(
        bundle) -> None:
    feeds = frames(bundle, 3)
    ref = reference(bundle, feeds)
    plan = Plan.build(bundle, three_stages(bundle))
    async with local_helpers(bundle, ["h1", "h2"]) as hosts:
        helpers = [HelperConfig(h.name, h.address) for h in hosts]
        opts = SessionOptions(placement=PlacementOptions(plan=plan.to_json(), helpers=helpers),
                              link=LinkOptions(timeout=10.0))
        async with AsyncSession(bundle, opts) as sess:
            for feed, want in zip(feeds[:2], ref, strict=False):
                (out,) = await sess.run(None, feed)
                np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
                stats = sess.last_run
                assert stats is not None and stats.strategy == "pipeline" and not stats.local
                assert [h["device"] for h in stats.hops] == ["h1", "h2"]
                assert stats.hops[0]["bytes"] > 0 and stats.hops[1]["bytes"] == 0
            assert hosts[0].daemon.forward.stages == 2 and hosts[1].daemon.requests == 2
            await hosts[1].kill()  # h2 vanishes: h1 reports it as its route's hop 1
            (out,) = await sess.run(None, feeds[2])
            np.testing.assert_allclose(out, ref[2], rtol=1e-4, atol=1e-5)
            stats = sess.last_run
            assert stats is not None and stats.local and stats.fallback is not None
            assert stats.fallback.startswith("h2:")  # the device at fault, from a field
        plain = SessionOptions(placement=PlacementOptions(plan=plan))
        with pytest.raises(InputError, match="neither 'handheld' nor a helper"):
            async with AsyncSession(bundle, plain) as sess:
                await sess.run(None, feeds[0])


def test_coinf_plan_prints_the_plan_a_session_runs(bundle, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from coinf import Session
    from coinf.cli import main

    assert main(["plan", str(bundle.root), "--json", "--bandwidth", "1MB/s"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["strategy"] == out["plan"]["strategy"] in ("local", "split")
    assert out["plan"]["latency_ms"] > 0 and out["plan"]["wearable_mj"] > 0
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(out))
    feed = frames(bundle, 1)[0]
    with Session(bundle, SessionOptions(placement=PlacementOptions(plan=str(path)))) as sess:
        (got,) = sess.run(None, feed)
        assert sess.last_run is not None and sess.last_run.strategy == out["strategy"]
    np.testing.assert_allclose(got, reference(bundle, [feed])[0], rtol=1e-4, atol=1e-5)
    assert main(["run", str(bundle.root), "--plan", "3"]) == 2
    assert "--planner-runs" in capsys.readouterr().err


def test_coinf_run_runs_a_pipeline_plan_file(bundle, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """`coinf run --plan FILE --helpers CONFIG`: helpers in their own event loop thread."""
    import threading

    from coinf.cli import main

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(Plan.build(bundle, three_stages(bundle)).to_json()))
    ready, stop = threading.Event(), None
    config = tmp_path / "helpers.json"

    async def host() -> None:
        nonlocal stop
        stop = asyncio.Event()
        async with local_helpers(bundle, ["h1", "h2"]) as hosts:
            config.write_text(json.dumps({"helpers": [{"name": h.name, "address": h.address}
                                                      for h in hosts]}))
            ready.set()
            await stop.wait()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(host(),), daemon=True)
    thread.start()
    try:
        assert ready.wait(30)
        assert main(["run", str(bundle.root), "--plan", str(plan), "--helpers", str(config),
                     "--repeat", "1", "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)["rows"]
        assert [r["strategy"] for r in rows] == ["pipeline"] and rows[0]["match"]
        assert rows[0]["fallbacks"] == 0
    finally:
        assert stop is not None
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)


def _profile_speed(bundle) -> float:  # type: ignore[no-untyped-def]
    from coinf.device.profile import load_or_default
    from coinf.wearable.planner.planner import Planner
    from coinf.wearable.planner.strategy import profile_speeds
    from coinf.wearable.policy import Policy

    planner = Planner(bundle, load_or_default("wearable", None),
                      load_or_default("handheld", None), Policy())
    return profile_speeds(planner)[0]


@sync
async def test_a_session_given_helpers_chooses_the_strategy_and_runs_it(bundle) -> None:
    from coinf import PlannerOptions

    feeds = frames(bundle, 2)
    ref = reference(bundle, feeds)
    wear = _profile_speed(bundle)
    async with local_helpers(bundle, ["h1", "h2"]) as hosts:
        # helpers as fast as this wearable on fast links: a stream gets 3 devices' worth
        even = [HelperConfig(h.name, h.address, bandwidth_bps=1e9, speed_flops=wear)
                for h in hosts]
        opts = SessionOptions(placement=PlacementOptions(helpers=even),
                              planner=PlannerOptions(objective="throughput"))
        async with AsyncSession(bundle, opts) as sess:
            assert sess.strategies is not None and sess.strategies["chosen"] == "pipeline"
            assert sess.strategies["plan"]["strategy"] == "pipeline"
            names = {o["strategy"] for o in sess.strategies["options"]}
            assert names >= {"local", "depth split", "pipeline"}
            for feed, want in zip(feeds, ref, strict=True):
                (out,) = await sess.run(None, feed)
                np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
                assert sess.last_run is not None and sess.last_run.strategy == "pipeline"
                assert not sess.last_run.local
        # the same helpers behind a link of 1 byte/s: nothing is worth sending
        slow = [HelperConfig(h.name, h.address, bandwidth_bps=1.0, speed_flops=wear * 100)
                for h in hosts]
        opts = SessionOptions(placement=PlacementOptions(helpers=slow))
        async with AsyncSession(bundle, opts) as sess:
            assert sess.strategies is not None and sess.strategies["chosen"] == "local"
            (out,) = await sess.run(None, feeds[0])
            np.testing.assert_allclose(out, ref[0], rtol=1e-4, atol=1e-5)
            assert sess.last_run is not None and sess.last_run.strategy == "local"


def test_a_changed_slice_is_refused_and_its_bundle_has_another_identity(tmp_path: Path) -> None:
    """The handheld's tail had its weights changed after the split (issue 40's negated-weights
    probe; same manifest, so the same identity): it refuses to run it and the wearable finishes
    the frame itself; a manifest made to match the new file has another identity."""
    import shutil

    import onnx
    from coinf.ble_protocol.loopback import InProcessLink
    from coinf.handheld.daemon import HandheldDaemon
    from onnx import numpy_helper

    from coinf.bundle import Bundle, sha256_file
    from tests.bundles import fixed

    bundle = split_model(LENET, tmp_path / "b")
    copy = tmp_path / "handheld"
    shutil.copytree(bundle.root, copy)
    cand = bundle.candidates[len(bundle.candidates) // 2]
    assert cand.tail.sha256 and cand.tail.file
    path = copy / cand.tail.file
    model = onnx.load(str(path))
    init = model.graph.initializer[0]
    init.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(init), init.name))
    onnx.save(model, str(path))
    tampered = Bundle.load(copy)
    assert tampered.identity == bundle.identity  # the manifest still says the old file
    feed = frames(bundle, 1)[0]
    want = reference(bundle, [feed])[0]

    async def main() -> None:
        async with HandheldDaemon(tampered) as daemon:
            async def factory() -> InProcessLink:
                ours, theirs = InProcessLink.pair()
                daemon.start(theirs)
                return ours

            opts = fixed(cand.id, link=LinkOptions(transport=factory))
            async with AsyncSession(bundle, opts) as sess:
                (got,) = await sess.run(None, feed)
                assert sess.last_run is not None and sess.last_run.local
                assert "not the one this bundle was split with" in (sess.last_run.fallback
                                                                    or "")
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
            assert daemon.requests == 0

    asyncio.run(asyncio.wait_for(main(), 60))
    manifest = json.loads((copy / "manifest.json").read_text())
    for c in manifest["candidates"]:
        if c["id"] == cand.id:
            c["tail"]["sha256"] = sha256_file(path)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert Bundle.load(copy).identity != bundle.identity  # refused at HELLO
