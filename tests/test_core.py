"""The execution core: one link per session, bounded and cancelled waits, onnxruntime parity,
results checked against the model's outputs. Peers here are real links with a real RPC server
whose handler misbehaves on purpose."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np
import onnxruntime as ort
import pytest
from coinf.ble_protocol import rpc
from coinf.ble_protocol.link import Link
from coinf.ble_protocol.loopback import InProcessLink
from coinf.ble_protocol.messages import (
    PROTOCOL_VERSION,
    Message,
    MsgType,
    encode_json,
)
from coinf.ble_protocol.packing import pack
from coinf.ble_protocol.tensors import encode_tensors

from coinf import AsyncSession, LinkOptions, PlacementOptions, RunOptions, Session, SessionOptions
from coinf.errors import InputError, PeerResultError, ProtocolError
from tests.bundles import fixed, make_tiny_bundle, reference
from tests.wire import result_payload

X = np.random.default_rng(7).standard_normal((1, 16)).astype(np.float32)
Handler = Callable[[Message], Awaitable[Message | None]]


@pytest.fixture()
def bundle(tmp_path):
    return make_tiny_bundle(tmp_path / "tiny")


def peer(bundle, on_request: Handler, concurrent: int = 1
         ) -> tuple[Callable[[], Awaitable[Link]], list[asyncio.Task]]:
    """An async link factory whose peer answers the handshake and hands REQUESTs to
    ``on_request``; the serving tasks are returned so a test can check and stop them."""
    tasks: list[asyncio.Task] = []

    async def handle(msg: Message) -> Message | None:
        if msg.type == MsgType.HELLO:
            ack = {"protocol": PROTOCOL_VERSION, "bundle": bundle.identity, "role": "handheld",
                   "capabilities": ["raw", "packed"]}
            return Message(MsgType.HELLO_ACK, msg.request_id, encode_json(ack))
        return await on_request(msg)

    async def factory() -> Link:
        ours, theirs = InProcessLink.pair()
        tasks.append(asyncio.get_running_loop().create_task(
            rpc.serve(theirs, handle, max_concurrent=concurrent)))
        return ours

    return factory, tasks


def result(msg: Message, outputs: dict[str, np.ndarray]) -> Message:
    """The RESULT answering ``msg`` (its request id and nonce)."""
    return Message(MsgType.RESULT, msg.request_id,
                   result_payload(10, encode_tensors(outputs), msg.payload))


def test_stream_on_a_fresh_session_opens_exactly_one_link(bundle):
    frames = [{"x": X + i} for i in range(12)]
    with Session(bundle, fixed("c001", link=LinkOptions(stream_depth=4))) as sess:
        got = [r.value()[0] for r in sess.stream(frames)]
        assert sess.core.connection.links_opened == 1
        assert sess.core.connection.connector.links == 1  # the in-process connector's count
    for i, y in enumerate(got):
        np.testing.assert_allclose(y, reference(bundle, X + i), rtol=1e-5, atol=1e-6)


def test_a_hung_link_factory_is_cancelled_and_leaves_no_task(bundle):
    cancelled = asyncio.Event()

    async def hung() -> Link:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        raise AssertionError("unreachable")

    async def main() -> None:
        opts = fixed("c001", link=LinkOptions(transport=hung, timeout=0.3))
        async with AsyncSession(bundle, opts) as sess:
            (y,) = await asyncio.wait_for(sess.run(None, {"x": X}), 30)  # hang guard only
            assert sess.last_run is not None and sess.last_run.local
            assert "no link within" in (sess.last_run.fallback or "")
            assert cancelled.is_set()
            np.testing.assert_allclose(y, reference(bundle, X), rtol=1e-5, atol=1e-6)
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert left == []

    asyncio.run(main())


def test_a_hung_factory_without_fallback_raises_a_transient_link_error(bundle):
    async def hung() -> Link:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    opts = fixed("c001", link=LinkOptions(transport=hung, timeout=0.3, fallback=False))
    with Session(bundle, opts) as sess, \
            pytest.raises(ProtocolError) as info:
        sess.run(None, {"x": X})
    assert info.value.transient and "no link within" in str(info.value)


def test_a_timed_out_request_is_cancelled_on_both_sides(bundle):
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def stall(msg: Message) -> Message | None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()  # the peer received CANCEL and stopped the work
            raise
        return None

    factory, tasks = peer(bundle, stall)

    async def main() -> None:
        async with AsyncSession(bundle, fixed("c001", link=LinkOptions(transport=factory))) as sess:
            (y,) = await sess.run(None, {"x": X}, RunOptions(timeout=0.3, tag="t1"))
            stats = sess.last_run
            assert stats is not None and stats.local and stats.tag == "t1"
            assert "timeout" in (stats.fallback or "")
            np.testing.assert_allclose(y, reference(bundle, X), rtol=1e-5, atol=1e-6)
            assert started.is_set()
            await asyncio.wait_for(cancelled.wait(), 10)  # hang guard, not a timing assertion
        for t in tasks:
            await asyncio.wait_for(t, 10)  # the peer's server ended with the link

    asyncio.run(main())


def test_closing_a_stream_cancels_the_frames_in_flight(bundle):
    seen, cancelled = [], []

    async def stall(msg: Message) -> Message | None:
        seen.append(msg.request_id)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(msg.request_id)
            raise
        return None

    factory, _ = peer(bundle, stall, concurrent=3)

    async def main() -> None:
        opts = fixed("c001", link=LinkOptions(transport=factory, timeout=60))
        async with AsyncSession(bundle, opts) as sess:
            stream = sess.astream([{"x": X}] * 5, depth=3)
            first = asyncio.ensure_future(anext(stream))
            for _ in range(1000):  # hang guard: all three frames reach the peer
                if len(seen) == 3:
                    break
                await asyncio.sleep(0.01)
            assert len(seen) == 3
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            await stream.aclose()
            for _ in range(500):
                if len(cancelled) == 3:
                    break
                await asyncio.sleep(0.01)
            assert sorted(cancelled) == sorted(seen)

    asyncio.run(main())


@pytest.mark.parametrize(
    ("outputs", "problem"),
    [
        ({"y": np.zeros((1, 5), np.float32)}, "exceeds"),  # larger than the outputs: refused
        ({"y": np.zeros((1, 3), np.float32)}, "is float32"),
        ({"y": np.zeros((1, 4), np.float64)}, "exceeds"),  # 32 B where the outputs take 16
        ({"y": np.full((1, 4), np.nan, np.float32)}, "NaN"),
        ({}, "missing outputs ['y']"),
        (b"\x00" * 21, "does not decode"),  # garbage
        (encode_tensors({}, packed={"y": pack(np.zeros((4096, 4096), np.float32), "q8")}),
         "does not decode"),  # a 30-byte CONST body declaring 64 MiB: refused, not allocated
        # 14 B over the largest valid RESULT: refused from its declared size, never received
        ({"y": np.zeros((1, 4), np.float32), "z": np.zeros(0, np.float32)}, "no valid reply"),
    ],
)
def test_a_bad_result_never_reaches_the_caller(bundle, outputs, problem):
    async def lie(msg: Message) -> Message | None:
        if isinstance(outputs, bytes):  # a tensor map as raw bytes
            return Message(MsgType.RESULT, msg.request_id,
                           result_payload(10, outputs, msg.payload))
        return result(msg, outputs)

    factory, _ = peer(bundle, lie)
    with Session(bundle, fixed("c001", link=LinkOptions(transport=factory))) as sess:
        (y,) = sess.run(None, {"x": X})
        assert sess.last_run is not None and sess.last_run.local
        assert problem in (sess.last_run.fallback or "")
    np.testing.assert_allclose(y, reference(bundle, X), rtol=1e-5, atol=1e-6)
    factory, _ = peer(bundle, lie)
    opts = fixed("c001", link=LinkOptions(transport=factory, fallback=False))
    with Session(bundle, opts) as sess, \
            pytest.raises(PeerResultError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        sess.run(None, {"x": X})


def test_run_matches_onnxruntime_semantics(bundle):
    ref = ort.InferenceSession(str(bundle.model_path), providers=["CPUExecutionProvider"])
    with Session(bundle, fixed("c001")) as sess:
        for names in (None, [], ["y"]):
            ours = sess.run(names, {"x": X})
            theirs = ref.run(names, {"x": X})
            assert len(ours) == len(theirs) == 1
            np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-5, atol=1e-6)
        with pytest.raises(InputError, match="unknown output 'nope'"):
            sess.run(["nope"], {"x": X})
        with pytest.raises(InputError, match=r"coinf\.RunOptions"):
            sess.run(None, {"x": X}, ort.RunOptions())
        assert sess.get_providers() == ["CPUExecutionProvider"]
        meta = sess.get_modelmeta()
        assert meta.graph_name == ref.get_modelmeta().graph_name
        assert sess.get_session_options().placement.split == "c001"


def test_local_only_run_opens_no_link(bundle):
    with Session(bundle, fixed("c001")) as sess:
        (y,) = sess.run(None, {"x": X}, RunOptions(local_only=True))
        assert sess.last_run is not None and sess.last_run.local
        assert sess.core.connection.links_opened == 0
    np.testing.assert_allclose(y, reference(bundle, X), rtol=1e-5, atol=1e-6)


def test_the_session_keeps_the_options_object(bundle):
    opts = SessionOptions(placement=PlacementOptions(split="c000"), link=LinkOptions(timeout=5.0))
    with Session(bundle, opts) as sess:
        assert sess.options is opts and sess.get_session_options() is opts
        assert sess.options.placement.split == "c000" and sess.options.link.timeout == 5.0
    with pytest.raises(InputError, match="unknown Session option 'splitt'"):
        Session(bundle, splitt="c000")
    with pytest.raises(InputError, match="timeout must be"):
        Session(bundle, SessionOptions(link=LinkOptions(timeout=0)))
    with pytest.raises(InputError, match="unknown transport 'carrier-pigeon:1'"):
        Session(bundle, SessionOptions(link=LinkOptions(transport="carrier-pigeon:1")))
    with pytest.raises(InputError, match="not available"):
        Session(bundle, providers=["NoSuchExecutionProvider"])


def test_a_stale_or_replayed_result_never_reaches_the_caller(bundle):
    """A peer that answers each request with the RESULT of the one before (right outputs, the
    wrong nonce) gets every frame finished on the wearable, never its stale outputs."""
    first: list[Message] = []

    async def replay(msg: Message) -> Message | None:
        stale = np.full((1, 4), 7.0, np.float32)  # what the previous request "returned"
        if not first:
            first.append(result(msg, {"y": stale}))
        return Message(MsgType.RESULT, msg.request_id, first[0].payload)

    factory, _ = peer(bundle, replay)
    with Session(bundle, fixed("c001", link=LinkOptions(transport=factory))) as sess:
        first_y, = sess.run(None, {"x": X})  # answers its own request: accepted
        assert sess.last_run is not None and not sess.last_run.local
        np.testing.assert_array_equal(first_y, np.full((1, 4), 7.0, np.float32))
        y, = sess.run(None, {"x": X})  # the same bytes again: another request's nonce
        assert sess.last_run is not None and sess.last_run.local
        assert "another request" in (sess.last_run.fallback or "")
    np.testing.assert_allclose(y, reference(bundle, X), rtol=1e-5)
