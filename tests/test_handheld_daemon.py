"""HandheldDaemon over real in-process links: the codec off the loop, CANCEL, BUSY, lifetime."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import numpy as np
import pytest
from coinf.ble_protocol.link import LinkClosed
from coinf.ble_protocol.loopback import InProcessLink
from coinf.ble_protocol.messages import (
    PROTOCOL_VERSION,
    ErrorCode,
    Message,
    MsgType,
    ProtocolError,
    decode_json,
    encode_json,
)
from coinf.ble_protocol.rpc import RpcClient
from coinf.ble_protocol.tensors import decode_tensors, encode_tensors
from coinf.handheld.daemon import HandheldDaemon, RequestCancelled

from tests.bundles import make_tiny_bundle, reference
from tests.wire import result_blob, tail_request


def request_payload(bundle: Any, x: np.ndarray) -> bytes:
    """A REQUEST for the handheld-only candidate: the model input crosses as is."""
    return tail_request(bundle, "c000", encode_tensors({"x": x}))


def result_of(reply: Message) -> np.ndarray:
    assert reply.type == MsgType.RESULT
    return decode_tensors(result_blob(reply.payload))["y"]


class Recording(HandheldDaemon):
    """Records the thread each codec step ran on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.threads: dict[str, int] = {}

    def decode(self, request: Any, blob: Any) -> Any:
        self.threads["decode"] = threading.get_ident()
        return super().decode(request, blob)

    def encode(self, outputs: Any, elapsed: float, nonce: int = 0) -> bytes:
        self.threads["encode"] = threading.get_ident()
        return super().encode(outputs, elapsed, nonce)


class Gated(HandheldDaemon):
    """Each job waits, inside its decode step (so in the executor), until ``gate`` opens."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.stopped: list[str] = []

    def decode(self, request: Any, blob: Any) -> Any:
        self.entered.set()
        if not self.gate.wait(30):
            raise RuntimeError("gate never opened")
        return super().decode(request, blob)

    def run(self, request: Any, blob: Any, cancel: threading.Event | None = None) -> Any:
        try:
            return super().run(request, blob, cancel)
        except RequestCancelled as exc:
            self.stopped.append(str(exc))
            raise


async def until(condition: Any, tries: int = 3000) -> None:
    """Let the loop run until ``condition()`` holds (bounded by a number of turns)."""
    for _ in range(tries):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never held")


async def wait_thread_event(event: threading.Event) -> None:
    """Wait for a threading.Event without blocking the loop."""
    ok = await asyncio.get_running_loop().run_in_executor(None, event.wait, 30)
    assert ok


def test_request_codec_and_tail_run_off_the_loop_in_one_job(tmp_path, caplog) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")
    x = np.random.default_rng(1).standard_normal((1, 16)).astype(np.float32)

    async def main() -> Recording:
        wearable, handheld = InProcessLink.pair()
        async with Recording(bundle) as daemon:
            daemon.start(handheld)
            client = RpcClient(wearable)
            hello = {"protocol": PROTOCOL_VERSION, "bundle": bundle.identity}
            ack = await client.request(MsgType.HELLO, encode_json(hello), 10)
            assert decode_json(ack.payload)["bundle"] == bundle.identity
            reply = await client.request(MsgType.REQUEST, request_payload(bundle, x), 30)
            np.testing.assert_allclose(result_of(reply), reference(bundle, x), rtol=1e-5)
            assert daemon.requests == 1
            await client.close()
        return daemon

    caplog.set_level(logging.INFO, logger="coinf.handheld.daemon")
    daemon = asyncio.run(main())
    loop_thread = threading.get_ident()  # asyncio.run ran the loop on this thread
    assert set(daemon.threads) == {"decode", "encode"}
    assert daemon.threads["decode"] != loop_thread
    assert daemon.threads["decode"] == daemon.threads["encode"]  # one executor job
    lines = [r.getMessage() for r in caplog.records if r.name == "coinf.handheld.daemon"]
    assert any(line.startswith("wearable connected") for line in lines)
    assert any(line.startswith("request 2 c000..c002: ") and " B in, " in line for line in lines)
    assert any("went away" in line for line in lines)


def test_timed_out_request_is_cancelled_in_the_daemon_and_its_tail_never_runs(tmp_path) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")
    x = np.ones((1, 16), np.float32)

    async def main() -> None:
        wearable, handheld = InProcessLink.pair()
        async with Gated(bundle) as daemon:
            daemon.start(handheld)
            client = RpcClient(wearable)
            late: list[Message] = []
            client.on_unsolicited = late.append
            call = asyncio.create_task(
                client.request(MsgType.REQUEST, request_payload(bundle, x), 1.0))
            await wait_thread_event(daemon.entered)  # the job is in the executor
            with pytest.raises(ProtocolError) as info:
                await call
            assert info.value.code == ErrorCode.TIMEOUT
            # the CANCEL the client sent precedes this probe on the ordered link
            await client.request(MsgType.PROBE, b"sync", 10)
            assert daemon.cancelled == 1
            daemon.gate.set()  # let the job go on: it stops before the tail
            await until(lambda: daemon.stopped)
            assert len(daemon.stopped) == 1 and "c000.." in daemon.stopped[0]
            assert daemon.tails.loaded == []  # no tail session was even loaded
            assert daemon.requests == 0
            await client.request(MsgType.PROBE, b"sync", 10)
            assert late == []  # nothing was sent back for the cancelled request
            # the daemon still serves
            reply = await client.request(MsgType.REQUEST, request_payload(bundle, x), 30)
            np.testing.assert_allclose(result_of(reply), reference(bundle, x), rtol=1e-5)
            await client.close()

    asyncio.run(main())


def test_a_flood_of_requests_is_refused_busy(tmp_path) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")
    x = np.ones((1, 16), np.float32)

    async def main() -> None:
        wearable, handheld = InProcessLink.pair(depth=32)
        async with Gated(bundle, max_pending=2) as daemon:
            daemon.start(handheld)
            client = RpcClient(wearable)
            calls = [
                asyncio.create_task(client.request(MsgType.REQUEST, request_payload(bundle, x), 60))
                for _ in range(6)
            ]
            await wait_thread_event(daemon.entered)
            await client.request(MsgType.PROBE, b"sync", 10)  # all six were answered or admitted
            assert daemon.busy == 4
            daemon.gate.set()
            outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 30)
            refused = [o for o in outcomes if isinstance(o, ProtocolError)]
            served = [o for o in outcomes if isinstance(o, Message)]
            assert len(refused) == 4 and all(e.code == ErrorCode.BUSY for e in refused)
            assert len(served) == 2
            for reply in served:
                np.testing.assert_allclose(result_of(reply), reference(bundle, x), rtol=1e-5)
            assert daemon.requests == 2
            status = decode_json((await client.request(MsgType.STATUS, b"", 10)).payload)
            assert (status["requests"], status["busy"], status["cancelled"]) == (2, 4, 0)
            await client.close()

    asyncio.run(main())


def test_leaving_the_daemon_cancels_its_tasks_and_closes_their_links(tmp_path) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")

    async def main() -> None:
        wearable, handheld = InProcessLink.pair()
        async with HandheldDaemon(bundle) as daemon:
            task = daemon.start(handheld)
            await RpcClient(wearable).request(MsgType.PROBE, b"up", 10)
        assert task.cancelled()
        assert not handheld.is_open
        with pytest.raises(LinkClosed):
            await asyncio.wait_for(wearable.receive(), 10)

    asyncio.run(main())


def test_hostile_requests_get_errors_not_crashes(tmp_path) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")

    async def main() -> None:
        wearable, handheld = InProcessLink.pair()
        async with HandheldDaemon(bundle, max_request_bytes=4096) as daemon:
            daemon.start(handheld)
            client = RpcClient(wearable)
            cases = [
                (b"\x01", ErrorCode.TRUNCATED),
                (b"\x09" + b"c000", ErrorCode.MALFORMED),  # no such request kind
                (b"\x01\x01\x01",  # STAGES, a nonce cut short
                 ErrorCode.TRUNCATED),
                (b"\x01" + bytes(4) + b"\x02\x00\x04c000\x04c003\x00\x00",  # 1 of 2 hops
                 ErrorCode.TRUNCATED),
                (b"\x01" + bytes(4) + b"\x01\x00\x04c0:0\x04c003\x00\x00",  # not a name
                 ErrorCode.MALFORMED),
                (tail_request(bundle, "c000", b"\x01\x00"), ErrorCode.TRUNCATED),
                (b"\x00" * 5000, ErrorCode.TOO_LARGE),
                (tail_request(bundle, "c9", encode_tensors({})), ErrorCode.UNKNOWN_CANDIDATE),
            ]
            for payload, code in cases:
                with pytest.raises(ProtocolError) as info:
                    await client.request(MsgType.REQUEST, payload, 10)
                assert info.value.code == code, payload
            assert daemon.requests == 0
            await client.close()

    asyncio.run(main())
