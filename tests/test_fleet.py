"""The tail service (issue 53): batches equal single runs, an unbatchable tail still answers,
the batcher is fair to a quiet wearable next to a flooding one, the service speaks the
daemon's protocol over real TLS (HELLO routing between bundles, BUSY beyond the per-link bound,
STATUS queue_ms, tiles refused, a real Session served), and the planner prices the queue."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from coinf.ble_protocol.listen import open_listener
from coinf.ble_protocol.messages import PROTOCOL_VERSION, ErrorCode, MsgType, encode_json
from coinf.ble_protocol.request import Request, encode_request
from coinf.ble_protocol.rpc import RpcClient
from coinf.ble_protocol.tensors import decode_tensors, encode_tensors
from coinf.ble_protocol.transport import open_connector
from coinf.convert.split import split_model
from coinf.handheld.batch import BatchRunner
from coinf.handheld.daemon import HandheldDaemon, request_bound
from coinf.handheld.engines import EngineOptions, LocalEngine, open_engine
from coinf.handheld.fleet import FleetService
from coinf.handheld.fleet_queue import TailQueue
from coinf.wearable.autoplan import queue_ms_of
from coinf.wearable.options import LinkOptions
from coinf.wearable.planner.adapt import LinkEstimate
from coinf.wearable.planner.planner import Planner
from coinf.wearable.policy import Policy
from coinf.wearable.session import AsyncSession
from onnx import TensorProto, helper, numpy_helper

from coinf.bundle import Bundle
from coinf.cli import main
from coinf.errors import InputError, ProtocolError
from tests.bundles import fixed, make_tiny_bundle, reference
from tests.wire import result_blob, tail_request

RNG = np.random.default_rng(5)


def frames(bundle: Bundle, cut: str, n: int) -> list[bytes]:
    cand = next(c for c in bundle.candidates if c.id == cut)
    out = []
    for i in range(n):
        feeds = {t.name: RNG.standard_normal(t.shape).astype(t.dtype) for t in cand.crossing}
        out.append(encode_request(Request.split(cut, bundle.candidates[-1].id, nonce=i + 1),
                                  encode_tensors(feeds)))
    return out


def test_a_batch_answers_each_frame_as_the_daemon_does(tmp_path: Path) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")
    runner = BatchRunner(bundle)
    daemon = HandheldDaemon(bundle)
    good = frames(bundle, "c000", 5)
    bad = tail_request(bundle, "c000", encode_tensors({"x": np.zeros((1, 15), np.float32)}))
    outcomes = runner.run([*good[:2], bad, *good[2:]])
    assert [o.payload is None for o in outcomes] == [False, False, True, False, False, False]
    assert outcomes[2].code == ErrorCode.MALFORMED and "x" in outcomes[2].text  # this one only
    for payload, outcome in zip(good, [o for o in outcomes if o.payload], strict=True):
        want = decode_tensors(result_blob(daemon.run_request(payload).payload))["y"]
        got = decode_tensors(result_blob(outcome.payload))["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert runner.stacked == 5  # the five good frames ran as one batch


def reshape_model(path: Path) -> None:
    """x(1x4x2) -> Reshape to [1, 8] (batch 1 baked in) -> MatMul -> y(1x3)."""
    w = numpy_helper.from_array(RNG.standard_normal((8, 3)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, 8], np.int64), "shape")
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["flat"], name="flat"),
             helper.make_node("MatMul", ["flat", "w"], ["y"], name="mm")]
    graph = helper.make_graph(
        nodes, "baked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], [w, shape])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_a_tail_that_cannot_batch_runs_frame_by_frame(tmp_path: Path) -> None:
    reshape_model(tmp_path / "m.onnx")
    bundle = split_model(tmp_path / "m.onnx", tmp_path / "b")
    runner = BatchRunner(bundle)
    cut = bundle.candidates[0].id
    assert runner.batched_session(bundle.candidates[0]) is None  # the probe refused it
    payloads = frames(bundle, cut, 3)
    outcomes = runner.run(payloads)
    daemon = HandheldDaemon(bundle)
    for payload, outcome in zip(payloads, outcomes, strict=True):
        assert outcome.payload is not None, outcome.text
        want = decode_tensors(result_blob(daemon.run_request(payload).payload))["y"]
        np.testing.assert_allclose(decode_tensors(result_blob(outcome.payload))["y"], want,
                                   rtol=1e-5, atol=1e-6)
    assert runner.stacked == 0


def test_the_batcher_takes_one_frame_per_wearable_in_turn() -> None:
    batches: list[list[bytes]] = []

    async def run_batch(payloads):
        batches.append(list(payloads))
        await asyncio.sleep(0.01)
        return [p.upper() for p in payloads]

    async def main() -> None:
        queue = TailQueue(run_batch, max_batch=4, max_wait_s=0.05, slots=1)
        flood = [asyncio.ensure_future(queue.submit("flood", b"f%d" % i)) for i in range(12)]
        await asyncio.sleep(0)
        quiet = asyncio.ensure_future(queue.submit("quiet", b"q"))
        gone = asyncio.ensure_future(queue.submit("quiet", b"cancelled"))
        await asyncio.sleep(0)
        gone.cancel()  # a frame whose wearable gave up never runs
        assert await quiet == b"Q"
        assert [await f for f in flood] == [b"F%d" % i for i in range(12)]
        await queue.aclose()
        assert queue.stats.frames == 13 and queue.stats.queue_ms() >= 0

    asyncio.run(main())
    assert b"q" in batches[0] + batches[1]  # not behind all twelve of the flood
    assert all(len(b) <= 4 for b in batches) and all(b"cancelled" not in b for b in batches)


async def hello(client: RpcClient, identity: str) -> None:
    payload = encode_json({"protocol": PROTOCOL_VERSION, "bundle": identity})
    await client.request(MsgType.HELLO, payload, 10)


def test_the_service_speaks_the_daemons_protocol_over_tls(tmp_path: Path) -> None:
    a = make_tiny_bundle(tmp_path / "a", seed=0)
    b = make_tiny_bundle(tmp_path / "b", seed=1)
    x = RNG.standard_normal((1, 16)).astype(np.float32)

    async def main() -> None:
        engine = LocalEngine("2", EngineOptions())
        async with FleetService([a, b], engine, max_pending=2, max_wait_ms=5) as service, \
                open_listener("tcp:127.0.0.1:0") as listener:
            serving = asyncio.ensure_future(service.serve_listener(listener))
            for bundle in (b, a):  # each link serves the bundle its HELLO names
                async with open_connector(listener.address) as conn:
                    client = RpcClient(await conn.connect(10))
                    with pytest.raises(ProtocolError, match="HELLO first"):
                        await client.request(MsgType.STATUS, b"", 10)
                    await hello(client, bundle.identity)
                    reply = await client.request(
                        MsgType.REQUEST, tail_request(bundle, "c000", encode_tensors({"x": x})),
                        30)
                    np.testing.assert_allclose(decode_tensors(result_blob(reply.payload))["y"],
                                               reference(bundle, x), rtol=1e-5, atol=1e-6)
                    status = await client.request(MsgType.STATUS, b"", 10)
                    assert queue_ms_of(status.payload) >= 0
                    await client.close()
            async with open_connector(listener.address) as conn:
                client = RpcClient(await conn.connect(10))
                with pytest.raises(ProtocolError, match="serves 2 others"):
                    await hello(client, "0" * 16 + "-" + "0" * 8)
                await hello(client, a.identity)
                huge = tail_request(a, "c000", bytes(request_bound(a) + 1))
                with pytest.raises(ProtocolError, match="exceeds"):  # at the header: TOO_LARGE
                    await client.request(MsgType.REQUEST, huge, 10)
                tile = bytes([2]) + bytes(40)  # a TILE request: not a tail
                with pytest.raises(ProtocolError):
                    await client.request(MsgType.REQUEST, tile, 10)
                flood = [client.request(MsgType.REQUEST, p, 30) for p in frames(a, "c001", 12)]
                got = await asyncio.gather(*flood, return_exceptions=True)
                busy = [g for g in got if isinstance(g, ProtocolError) and g.code == ErrorCode.BUSY]
                assert busy and len(busy) < 12  # beyond 2 in flight: BUSY, the rest served
                await client.close()
            assert service.serve_stats.busy == len(busy)
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)

    asyncio.run(main())


def test_a_session_is_served_by_the_service_as_by_a_handheld(tmp_path: Path) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")
    x = RNG.standard_normal((1, 16)).astype(np.float32)

    async def main() -> None:
        async with FleetService([bundle], LocalEngine()) as service, \
                open_listener("tcp:127.0.0.1:0") as listener:
            serving = asyncio.ensure_future(service.serve_listener(listener))
            opts = fixed("c001", link=LinkOptions(transport=listener.address, timeout=10.0))
            async with AsyncSession(bundle, opts) as sess:
                for _ in range(3):
                    (y,) = await asyncio.wait_for(sess.run(None, {"x": x}), 60)
                    np.testing.assert_allclose(y, reference(bundle, x), rtol=1e-5, atol=1e-6)
                    assert sess.last_run is not None and not sess.last_run.local
                assert service.queues[bundle.identity].stats.frames == 3
                serving.cancel()  # the service goes away: the next frame finishes here
                await asyncio.gather(serving, return_exceptions=True)
                await service.aclose()
                (y,) = await asyncio.wait_for(sess.run(None, {"x": x}), 60)
                np.testing.assert_allclose(y, reference(bundle, x), rtol=1e-5, atol=1e-6)
                assert sess.last_run is not None and sess.last_run.local

    asyncio.run(main())


def test_the_planner_adds_the_queue_to_offloaded_plans_only(tmp_path: Path) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")
    planner = Planner(bundle, policy=Policy(objective="latency"))
    link = LinkEstimate(1e6, 1e6, 5.0, "test", kind="wifi")
    base = {r.id: r for r in planner.costs(link)}
    queued = {r.id: r for r in planner.costs(LinkEstimate(1e6, 1e6, 5.0, "test", kind="wifi",
                                                          queue_ms=40.0))}
    for rid, row in base.items():
        extra = 0.0 if rid == bundle.candidates[-1].id else 40.0
        assert queued[rid].latency_ms() == pytest.approx(row.latency_ms() + extra)
        assert queued[rid].wearable_energy_mj == pytest.approx(row.wearable_energy_mj)  # idle wait
    slow = LinkEstimate(1e6, 1e6, 5.0, "test", kind="wifi", queue_ms=1e6)
    assert planner.decide(slow, objective="latency").winner == bundle.candidates[-1].id


def test_a_status_queue_must_be_a_bounded_number() -> None:
    assert queue_ms_of(encode_json({"device": {}})) == 0.0
    assert queue_ms_of(encode_json({"queue_ms": 12.5})) == 12.5
    for bad in (-1, "12", True, 1e9, None):
        with pytest.raises(ProtocolError, match="queue_ms"):
            queue_ms_of(encode_json({"queue_ms": bad}))


def test_engine_specs_are_checked_before_anything_starts() -> None:
    for bad in ("gpu", "local:x", "local:0", "ray:nohost"):
        with pytest.raises(InputError):
            open_engine(bad)
    with pytest.raises(InputError, match="replicas"):
        EngineOptions(min_replicas=3, max_replicas=2)


def test_serve_refuses_bad_input_in_one_line(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")
    cases = [([str(bundle.root), "--engine", "gpu"], "unknown engine 'gpu'"),
             ([str(tmp_path / "none")], "none"),
             ([str(bundle.root), "--replicas", "3:1"], "MIN <= MAX"),
             ([str(bundle.root), "--listen", "tcp+insecure:127.0.0.1:0"],
              "--insecure-plaintext"),
             ([str(bundle.root), str(bundle.root), "--engine", "local"], "the same model")]
    for argv, said in cases:
        assert main(["serve", *argv]) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, err


# time beyond the suite's 30 s a test: a service and a daemon process start and stop (~10 s)
@pytest.mark.timeout(120)
def test_the_fleet_bench_measures_both_sides_and_draws_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "fleet.png"
    assert main(["bench", "fleet", "--engine", "local:1", "--wearables", "1", "--seconds", "1",
                 "--png", str(png), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    for side in ("service", "daemons"):
        (row,) = got[side]
        assert row["wearables"] == 1 and row["sent"] > 0, side
        assert row["answered"] == row["results_match"] == row["sent"], side
        assert row["lost"] == row["duplicated"] == 0, side
    assert got["png"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
