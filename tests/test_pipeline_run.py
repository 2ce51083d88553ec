"""A 3-device pipeline (the wearable and two helpers on local TCP ports, each helper a real
daemon with the forward role) against the whole model; a helper dying mid-stream; hostile
pipeline requests; cancellation down the chain."""

from __future__ import annotations

import asyncio
import functools

import numpy as np
import onnxruntime as ort
import pytest
from coinf.ble_protocol.messages import Message, MsgType, encode_request
from coinf.ble_protocol.route import (
    Hop,
    HopStats,
    decode_route,
    decode_stage_result,
    encode_route,
    encode_stage_result,
    failed_hop,
)
from coinf.ble_protocol.tensors import encode_tensors
from coinf.convert.split import split_model
from coinf.handheld.pipeline_host import local_helpers
from coinf.wearable.pipeline import HelperConfig, PipelineSession, load_helpers

from coinf.errors import ErrorCode, InputError, ProtocolError
from tests.test_pipeline_slices import LENET


def sync(fn):
    """Run an async test function on a fresh event loop."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        return asyncio.run(asyncio.wait_for(fn(*args, **kwargs), 60))

    return run


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory):
    return split_model(LENET, tmp_path_factory.mktemp("run") / "lenet")


def frames(bundle, n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    spec = bundle.inputs[0]
    return [{spec.name: rng.standard_normal(spec.shape).astype(np.float32)} for _ in range(n)]


def reference(bundle, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    whole = ort.InferenceSession(str(bundle.model_path), providers=["CPUExecutionProvider"])
    return [whole.run(None, f)[0] for f in feeds]


def even_speeds(bundle) -> float:
    return float(bundle.candidates[-1].head.flops) * 1000  # the whole model in 1 ms


@sync
async def test_three_devices_equal_the_whole_model_and_survive_a_dying_helper(bundle) -> None:
    feeds = frames(bundle, 24)
    ref = reference(bundle, feeds)
    async with local_helpers(bundle, ["h1", "h2"]) as hosts:
        helpers = [HelperConfig(h.name, h.address, 1e9, speed_flops=even_speeds(bundle))
                   for h in hosts]
        async with PipelineSession(bundle, helpers, wearable_speed_flops=even_speeds(bundle),
                                   timeout=5.0) as sess:
            sess.adaptive = False
            plan = sess.plan()
            assert plan is not None and plan.devices == ("wearable", "h1", "h2")
            assert len(plan.cuts) == 2 and all(s.slice.count("..") == 1 for s in plan.stages)
            seen: list[tuple[str, ...]] = []
            got: list[np.ndarray] = []
            async for out, stats in sess.astream(feeds, depth=4):
                got.append(out[bundle.outputs[0].name])
                seen.append(stats.devices)
                if len(got) == 8:
                    await hosts[1].kill()  # h2 vanishes with frames in flight
            assert len(got) == len(feeds)  # nothing lost
            for g, r in zip(got, ref, strict=True):
                np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
            assert seen[0] == ("wearable", "h1", "h2")
            assert seen[-1] == ("wearable", "h1")  # re-planned onto the remaining devices
            assert hosts[0].daemon.forward.stages > 0
            # the first helper dies too: the wearable finishes alone
            await hosts[0].kill()
            out = await sess.run(feeds[0])
            np.testing.assert_allclose(out[bundle.outputs[0].name], ref[0], rtol=1e-4,
                                       atol=1e-5)
            assert sess.last is not None and sess.last.local


@sync
async def test_hostile_pipeline_requests_are_refused(bundle) -> None:
    from coinf.ble_protocol.loopback import connect_socket
    from coinf.ble_protocol.rpc import RpcClient

    async with local_helpers(bundle, ["h1", "h2"]) as hosts:
        rpc = RpcClient(await connect_socket(hosts[0].address))
        ids = [c.id for c in bundle.candidates]
        x = frames(bundle, 1)[0]

        async def ask(route: str, tensors: dict) -> ProtocolError:
            with pytest.raises(ProtocolError) as info:
                await rpc.request(MsgType.REQUEST, encode_request(route, encode_tensors(tensors)),
                                  5.0)
            return info.value

        good = f"pipe:h1={ids[0]}..{ids[3]};h2={ids[3]}..{ids[-1]}"
        assert "this helper is" in (await ask(f"pipe:h2={ids[0]}..{ids[-1]}", x)).text
        assert (await ask(f"pipe:h1={ids[3]}..{ids[1]};h2={ids[1]}..{ids[-1]}", x)).code \
            == ErrorCode.UNKNOWN_CANDIDATE
        assert "no peer" in (await ask(f"pipe:h1={ids[0]}..{ids[3]};evil={ids[3]}..{ids[-1]}",
                                       x)).text
        assert "last cut" in (await ask(f"pipe:h1={ids[0]}..{ids[3]}", x)).text
        assert "does not start" in (await ask(
            f"pipe:h1={ids[0]}..{ids[3]};h2={ids[4]}..{ids[-1]}", x)).text
        bad = {k: v.astype(np.float64) for k, v in x.items()}
        assert (await ask(good, bad)).code in (ErrorCode.MALFORMED, ErrorCode.TOO_LARGE)
        assert (await ask("pipe:h1=c0;;", x)).code == ErrorCode.MALFORMED
        assert (await ask(f"pipe:h1={ids[0]}..{ids[3]}+q99;h2={ids[3]}..{ids[-1]}",
                          x)).code == ErrorCode.MALFORMED
        assert "no tensors to pack" in (await ask(
            f"pipe:h1={ids[0]}..{ids[3]};h2={ids[3]}..{ids[-1]}+q8", x)).text
        reply = await rpc.request(MsgType.REQUEST, encode_request(good, encode_tensors(x)), 5.0)
        stats, _ = decode_stage_result(reply.payload, 2)
        assert stats[0].nbytes > 0 and stats[1].nbytes == 0
        await rpc.close()


@sync
async def test_a_timeout_cancels_the_whole_chain(bundle) -> None:
    """h2 hangs: the wearable's timeout cancels the request on h1, which cancels it on h2; the
    frame is not lost (re-planned, finally on the wearable alone)."""
    feed = frames(bundle, 1)[0]
    async with local_helpers(bundle, ["h1", "h2"], slowdowns={"h2": 1e6}) as hosts:
        helpers = [HelperConfig(h.name, h.address, 1e9, speed_flops=even_speeds(bundle))
                   for h in hosts]
        async with PipelineSession(bundle, helpers, wearable_speed_flops=even_speeds(bundle),
                                   timeout=0.5) as sess:
            sess.adaptive = False
            out = await sess.run(feed)
            np.testing.assert_allclose(out[bundle.outputs[0].name], reference(bundle, [feed])[0],
                                       rtol=1e-4, atol=1e-5)
            assert sess.last is not None and sess.last.retries >= 1
        for _ in range(100):  # the CANCELs travel wearable -> h1 -> h2
            if hosts[0].daemon.cancelled >= 1 and hosts[1].daemon.cancelled >= 2:
                break
            await asyncio.sleep(0.02)
        # h1 cancelled the first attempt; h2 both the first (from h1) and the second (the
        # wearable's, once h1 was left out)
        assert hosts[0].daemon.cancelled >= 1 and hosts[1].daemon.cancelled >= 2


def test_route_and_result_codecs() -> None:
    hops = [Hop("h1", "c001", "c004", "q8"), Hop("h2", "c004", "c008")]
    assert decode_route(encode_route(hops)) == tuple(hops)
    for bad in ("pipe:", "pipe:h1=c1", "pipe:h 1=c1..c2", "pipe:" + ";".join(["a=b..c"] * 17)):
        with pytest.raises(ProtocolError):
            decode_route(bad)
    payload = encode_stage_result([HopStats(5, 6, 7), HopStats(8, 0, 0)], b"xyz")
    stats, blob = decode_stage_result(payload, 2)
    assert stats == [HopStats(5, 6, 7), HopStats(8, 0, 0)] and bytes(blob) == b"xyz"
    with pytest.raises(ProtocolError):
        decode_stage_result(payload, 3)
    with pytest.raises(ProtocolError):
        decode_stage_result(payload[:9], 2)
    err = ProtocolError(ErrorCode.DISCONNECTED, "hop h7 unreachable: gone")
    assert failed_hop(err) == "h7" and failed_hop(ProtocolError(ErrorCode.TIMEOUT, "x")) is None
    _ = Message  # (imported for the reader: requests are ordinary REQUEST messages)


def test_config_errors_name_the_field(tmp_path) -> None:
    good = {"helpers": [{"name": "h1", "address": "tcp:127.0.0.1:1", "bandwidth_kbps": 100}]}
    (h,) = load_helpers(good)
    assert h.bandwidth_bps == 100_000
    for obj, what in (({}, "helpers"), ({"helpers": [{"name": "a b", "address": "tcp:x:1"}]},
                                         "name"),
                      ({"helpers": [{"name": "h", "address": "nowhere"}]}, "address"),
                      ({"helpers": [{"name": "h", "address": "tcp:x:1", "speed_gflops": -1}]},
                       "speed_gflops"),
                      ({"helpers": [{"name": "h", "address": "tcp:x:1"}] * 2}, "unique")):
        with pytest.raises(InputError, match=what):
            load_helpers(obj)
    with pytest.raises(InputError, match="cannot read"):
        load_helpers(tmp_path / "missing.json")


def test_helper_processes_from_a_config_file(bundle, tmp_path) -> None:
    """Two ``coinf handheld --pipeline CONFIG --name hI`` processes. The chain is wearable ->
    h2 -> h1: h2 reaches h1 on h1's config address (TCP), while h1 also listens on a unix
    socket for the wearable (--listen). h2 is killed mid-stream; the wearable re-plans onto h1
    (over the unix socket) and every frame still comes back right."""
    import json
    import socket

    from tests.procs import handheld_daemon

    ports = {}
    for name in ("h2", "h1"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports[name] = s.getsockname()[1]
    config = tmp_path / "pipeline.json"
    config.write_text(json.dumps({"helpers": [
        {"name": n, "address": f"tcp:127.0.0.1:{p}", "bandwidth_kbps": 50_000,
         "latency_ms": 1, "shape": True} for n, p in ports.items()]}))
    feeds = frames(bundle, 12)
    ref = reference(bundle, feeds)
    wearable_side = f"unix:{tmp_path / 'h1.sock'}"
    helpers = load_helpers(config)
    helpers[1] = HelperConfig("h1", wearable_side, helpers[1].bandwidth_bps, shape=True)

    async def stream(kill) -> list[np.ndarray]:
        got = []
        async with PipelineSession(bundle, helpers, timeout=5.0,
                                   wearable_speed_flops=even_speeds(bundle)) as sess:
            sess.adaptive = False
            async for out, _ in sess.astream(feeds, depth=3):
                got.append(out[bundle.outputs[0].name])
                if len(got) == 4:
                    assert sess.plan().devices == ("wearable", "h2", "h1")
                    kill()
            assert sess.plan().devices == ("wearable", "h1")
        return got

    with handheld_daemon(bundle.root, wearable_side, "--pipeline", str(config),
                         "--name", "h1") as h1, \
            handheld_daemon(bundle.root, f"tcp:127.0.0.1:{ports['h2']}", "--pipeline",
                            str(config), "--name", "h2") as h2:
        got = asyncio.run(stream(h2.kill))
        assert h1.poll() is None
    assert len(got) == len(feeds)
    for g, r in zip(got, ref, strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


def test_plan_command_shows_every_stage(bundle, tmp_path, capsys) -> None:
    import json

    from coinf.cli import main

    config = tmp_path / "p.json"
    config.write_text(json.dumps({"helpers": [
        {"name": "phone", "address": "tcp:127.0.0.1:9", "bandwidth_kbps": 100},
        {"name": "laptop", "address": "tcp:127.0.0.1:10", "speed_gflops": 50}]}))
    assert main(["plan", str(bundle.root), "--pipeline", str(config), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["devices"][0] == "wearable" and len(out["stages"]) == len(out["devices"])
    assert [s["device"] for s in out["stages"]] == out["devices"]
    assert out["stages"][-1]["link_ms"] is None and out["stages"][0]["compressor"] == "raw"
    assert all(s["slice"].count("..") == 1 for s in out["stages"])
    assert main(["plan", str(bundle.root), "--pipeline", str(tmp_path / "none.json")]) == 2
    assert "cannot read pipeline config" in capsys.readouterr().err


def test_auto_packing_follows_the_first_links_bandwidth(tmp_path) -> None:
    """S3 on the first link: a slow link gets a calibrated lossy packing, a fast one raw."""
    from coinf.convert import calibrate as cal

    from coinf.bundle import Bundle

    bundle = split_model(LENET, tmp_path / "b")
    speed = even_speeds(bundle)
    helpers = [HelperConfig(n, "tcp:127.0.0.1:9", 1e9, speed_flops=speed) for n in ("h1", "h2")]
    plan = PipelineSession(bundle, helpers, wearable_speed_flops=speed).plan()
    assert plan is not None  # the first cut the session below will use: calibrate only it
    data = cal.load_dataset("digits", bundle, limit=30)
    cal.store(bundle, cal.calibrate(bundle, data, ["q8"], [plan.cuts[0]]), data)
    asyncio.run(_auto_packing(Bundle.load(bundle.root)))


async def _auto_packing(bundle) -> None:
    from coinf.bundle import Bundle

    feeds = frames(bundle, 3)
    ref = reference(bundle, feeds)
    async with local_helpers(bundle, ["h1", "h2"]) as hosts:
        helpers = [HelperConfig(h.name, h.address, 1e9, speed_flops=even_speeds(bundle))
                   for h in hosts]
        async with PipelineSession(bundle, helpers, packing="auto", timeout=5.0,
                                   wearable_speed_flops=even_speeds(bundle)) as sess:
            sess.adaptive = False
            plan = sess.plan()
            assert plan is not None
            sess._bw["h1"].value = 1e9
            assert str(sess.link_packing(plan)) == "raw"
            sess._bw["h1"].value = 1e3
            assert str(sess.link_packing(plan)) == "q8"
            for feed, r in zip(feeds, ref, strict=True):
                out = await sess.run(feed)
                # the first link is slow: q8; the second (1 GB/s, its cut not calibrated): raw
                assert sess.last is not None and sess.last.packing == ["q8", "raw"]
                assert out[bundle.outputs[0].name].argmax() == r.argmax()
            # a slow second link with a calibrated cut: h1 packs what it sends to h2
            from coinf.convert import calibrate as cal

            data = cal.load_dataset("digits", bundle, limit=20)
            cal.store(bundle, cal.calibrate(bundle, data, ["q8"], [plan.cuts[1]]), data)
            reloaded = Bundle.load(bundle.root)
            sess.bundle = reloaded
            sess._tables.clear()
            sess._bw["h1"].value = 1e9
            sess._bw["h2"].value = 1e3
            out = await sess.run(feeds[0])
            assert sess.last is not None and sess.last.packing == ["raw", "q8"]
            assert out[bundle.outputs[0].name].argmax() == ref[0].argmax()


@sync
async def test_a_busy_helper_costs_no_frame(bundle) -> None:
    """A helper that admits one request at a time answers BUSY to the rest: those frames finish
    on the wearable, every result is right, and the helpers stay in the plan."""
    feeds = frames(bundle, 8)
    ref = reference(bundle, feeds)
    async with local_helpers(bundle, ["h1", "h2"], slowdowns={"h1": 200.0},
                             max_pending=1) as hosts:
        helpers = [HelperConfig(h.name, h.address, 1e9, speed_flops=even_speeds(bundle))
                   for h in hosts]
        async with PipelineSession(bundle, helpers, wearable_speed_flops=even_speeds(bundle),
                                   timeout=5.0) as sess:
            sess.adaptive = False
            results = [(out, st) async for out, st in sess.astream(feeds, depth=4)]
            assert sess.alive() == ["h1", "h2"]
    assert any(st.local for _, st in results) and not all(st.local for _, st in results)
    for (out, _), r in zip(results, ref, strict=True):
        np.testing.assert_allclose(out[bundle.outputs[0].name], r, rtol=1e-4, atol=1e-5)
