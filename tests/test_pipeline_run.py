"""A 3-device pipeline (the wearable and two helpers on local TCP ports, each helper a real
daemon with the forward role) run by a Session given helpers, against the whole model; a
helper dying mid-stream; hostile pipeline requests; cancellation down the chain."""

from __future__ import annotations

import asyncio
import functools

import numpy as np
import onnxruntime as ort
import pytest
from coinf.ble_protocol.messages import MsgType, decode_error, encode_error
from coinf.ble_protocol.request import (
    Hop,
    HopStats,
    Request,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)
from coinf.ble_protocol.tensors import encode_tensors
from coinf.convert.split import split_model
from coinf.device.profile import PI_ZERO_2W_POWER, DeviceProfile
from coinf.handheld.pipeline_host import local_helpers
from coinf.wearable.pipeline_config import HelperConfig

from coinf import AsyncSession, LinkOptions, PlacementOptions, PlannerOptions, SessionOptions
from coinf.errors import ErrorCode, ProtocolError
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


def pipeline_session(bundle, helpers, timeout: float = 10.0, every_device: bool = True,
                     **link) -> AsyncSession:
    """A Session given ``helpers``, for a stream (throughput), the wearable as fast as each
    helper (the whole model in 1 ms each) and planning over every device (``every_device``:
    LeNet's last slices are tiny, so over slow links fewer devices would be faster)."""
    even = DeviceProfile("even", "wearable", PI_ZERO_2W_POWER, gflops=even_speeds(bundle) / 1e9)
    sess = AsyncSession(bundle, SessionOptions(
        placement=PlacementOptions(helpers=helpers),
        planner=PlannerOptions(objective="throughput", wearable_profile=even,
                               handheld_profile=even),
        link=LinkOptions(timeout=timeout, **link)))
    assert sess.replanner is not None
    if every_device:
        sess.replanner.limit(all_devices=True)
    return sess


@sync
async def test_three_devices_equal_the_whole_model_and_survive_a_dying_helper(bundle) -> None:
    feeds = frames(bundle, 24)
    ref = reference(bundle, feeds)
    async with local_helpers(bundle, ["h1", "h2"]) as hosts:
        helpers = [HelperConfig(h.name, h.address, 1e9, speed_flops=even_speeds(bundle))
                   for h in hosts]
        # the wearable's timeout must outlast a hop's connect deadline (the forwarder's 5 s):
        # a killed h2 can stall h1's connection to it that long, and h1 must live to say so
        async with pipeline_session(bundle, helpers, timeout=15.0) as sess:
            assert sess.replanner is not None
            sess.replanner.adaptive = False
            plan = sess.replanner.plan
            assert tuple(s.device for s in plan.stages) == ("wearable", "h1", "h2")
            assert all(s.slice.count("..") == 1 for s in plan.stages)
            seen: list[tuple[str, ...]] = []
            got: list[np.ndarray] = []
            async for frame in sess.astream(feeds, depth=4):
                got.append(frame.value()[0])
                assert frame.stats is not None
                seen.append(frame.stats.devices)
                if len(got) == 8:
                    await hosts[1].kill()  # h2 vanishes with frames in flight
            assert len(got) == len(feeds)  # nothing lost
            for g, r in zip(got, ref, strict=True):
                np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
            assert seen[0] == ("wearable", "h1", "h2")
            assert seen[-1] == ("wearable", "h1")  # re-planned onto the remaining devices
            assert "h2" in sess.strategies["left_out"]
            assert hosts[0].daemon.forward.stages > 0
            # the first helper dies too: the frame finishes on the wearable
            await hosts[0].kill()
            (out,) = await sess.run(None, feeds[0])
            np.testing.assert_allclose(out, ref[0], rtol=1e-4, atol=1e-5)
            assert sess.last_run is not None and sess.last_run.fallback is not None
            assert sess.replanner.plan.local  # and the next frames stay here


@sync
async def test_hostile_pipeline_requests_are_refused(bundle) -> None:
    from coinf.ble_protocol.loopback import connect_socket
    from coinf.ble_protocol.rpc import RpcClient

    async with local_helpers(bundle, ["h1", "h2"]) as hosts:
        rpc = RpcClient(await connect_socket(hosts[0].address))
        ids = [c.id for c in bundle.candidates]
        x = frames(bundle, 1)[0]

        async def ask(hops: list[Hop], tensors: dict, edit: tuple[bytes, bytes] = (b"", b"")
                      ) -> ProtocolError:
            payload = encode_request(Request.route(hops), encode_tensors(tensors))
            payload = payload.replace(*edit, 1) if edit[0] else payload
            with pytest.raises(ProtocolError) as info:
                await rpc.request(MsgType.REQUEST, payload, 5.0)
            return info.value

        def hop(device: str, start: int, end: int, **kw: object) -> Hop:
            return Hop(ids[start], ids[end], device, **kw)  # type: ignore[arg-type]

        good = [hop("h1", 0, 3), hop("h2", 3, -1)]
        assert "this helper is" in (await ask([hop("h2", 0, 3), hop("h1", 3, -1)], x)).text
        assert (await ask([hop("h1", 3, 1), hop("h2", 1, -1)], x)).code \
            == ErrorCode.MALFORMED  # FROM after TO (PROTOCOL.md §6.11)
        assert (await ask(good, x, (b"\x04" + ids[3].encode(), b"\x04c999"))).code \
            == ErrorCode.UNKNOWN_CANDIDATE
        assert "no peer" in (await ask([hop("h1", 0, 3), hop("evil", 3, -1)], x)).text
        assert "last cut" in (await ask([hop("h1", 0, 3)], x)).text  # a tail must reach it
        assert "only the last hop" in (await ask([hop("h1", 0, -1), hop("h2", 3, -1)], x)).text
        assert "does not start" in (await ask([hop("h1", 0, 3), hop("h2", 4, -1)], x)).text
        bad = {k: v.astype(np.float64) for k, v in x.items()}
        assert (await ask(good, bad)).code in (ErrorCode.MALFORMED, ErrorCode.TOO_LARGE)
        assert (await ask([hop("h1", 0, 3, packing="q8"), hop("h2", 3, -1)], x,
                          (b"\x02q8", b"\x03q99"))).code == ErrorCode.MALFORMED
        reply = await rpc.request(MsgType.REQUEST, encode_request(
            Request.route(good), encode_tensors(x)), 5.0)
        stats, _ = decode_result(reply.payload, 2)
        assert stats[0].nbytes > 0 and stats[1].nbytes == 0
        await rpc.close()


@sync
async def test_a_timeout_cancels_the_whole_chain(bundle) -> None:
    """h2 hangs: the wearable's timeout cancels the request on h1, which cancels it on h2; the
    frame is not lost (finished on the wearable), and the next one goes without h1."""
    feed = frames(bundle, 1)[0]
    ref = reference(bundle, [feed])[0]
    async with local_helpers(bundle, ["h1", "h2"], slowdowns={"h2": 1e6}) as hosts:
        helpers = [HelperConfig(h.name, h.address, 1e9, speed_flops=even_speeds(bundle))
                   for h in hosts]
        async with pipeline_session(bundle, helpers, timeout=0.5) as sess:
            for _ in range(2):  # through h1 and h2, then (h1 left out) through h2 alone
                (out,) = await sess.run(None, feed)
                np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
                assert sess.last_run is not None and sess.last_run.fallback is not None
        for _ in range(100):  # the CANCELs travel wearable -> h1 -> h2
            if hosts[0].daemon.cancelled >= 1 and hosts[1].daemon.cancelled >= 2:
                break
            await asyncio.sleep(0.02)
        # h1 cancelled the first frame; h2 both the first (from h1) and the second (the
        # wearable's, once h1 was left out)
        assert hosts[0].daemon.cancelled >= 1 and hosts[1].daemon.cancelled >= 2


def test_request_header_and_result_codecs() -> None:
    hops = (Hop("c001", "c004", "h1", packing="q8"), Hop("c004", "c008", "h2", gamma=4))
    request, blob = decode_request(encode_request(Request.route(hops), b"xyz"))
    assert request.hops == hops and bytes(blob) == b"xyz"
    split = encode_request(Request.split("c003", "c008"), b"")
    assert decode_request(split)[0].hops == (Hop("c003", "c008"),)
    last_packed = encode_request(Request.route(hops[:1]), b"")  # the last hop sends nothing
    hostile = [b"", b"\x00", b"\x01\x00", b"\x01\x11" + b"\x00" * 40, split[:-3],
               split.replace(b"c003", b"c 03"), last_packed, split[:-2] + b"\x01\x00"]
    for bad in hostile:
        with pytest.raises(ProtocolError):
            decode_request(bad)
    payload = encode_result([HopStats(5, 6, 7), HopStats(8, 0, 0)], b"xyz")
    stats, blob = decode_result(payload, 2)
    assert stats == [HopStats(5, 6, 7), HopStats(8, 0, 0)] and bytes(blob) == b"xyz"
    with pytest.raises(ProtocolError):
        decode_result(payload, 3)
    with pytest.raises(ProtocolError):
        decode_result(payload[:9], 2)
    # the hop at fault travels as a field of ERROR, never in its text
    err = decode_error(encode_error(ErrorCode.DISCONNECTED, "gone", hop=2))
    assert err.code == ErrorCode.DISCONNECTED and err.hop == 2 and err.text == "gone"
    assert decode_error(encode_error(ErrorCode.TIMEOUT, "x")).hop is None


@sync
async def test_a_blocking_feed_is_pulled_off_the_event_loop(bundle) -> None:
    """The feed blocks until the loop itself releases it: pulled on the loop, it would wait
    out its guard and fail; pulled on a worker thread (as a Session's stream), it flows."""
    import threading

    gate = threading.Event()
    feed = frames(bundle, 1)[0]

    def feeds():  # type: ignore[no-untyped-def]
        yield feed
        assert gate.wait(5), "the event loop was blocked by the feed"
        yield feed

    async with local_helpers(bundle, ["h1"]) as hosts:
        helpers = [HelperConfig(h.name, h.address, 1e9, speed_flops=even_speeds(bundle))
                   for h in hosts]
        async with pipeline_session(bundle, helpers) as sess:
            asyncio.get_running_loop().call_soon(gate.set)
            outs = [frame.value() async for frame in sess.astream(feeds(), depth=2)]
    assert len(outs) == 2 and gate.is_set()
