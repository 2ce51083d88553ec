"""rpc.serve over real in-process links: bounded admission, CANCEL, and no task outliving it."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from coinf.ble_protocol.loopback import InProcessLink
from coinf.ble_protocol.messages import ErrorCode, Message, MsgType, ProtocolError, decode_error
from coinf.ble_protocol.rpc import RpcClient, ServeStats, serve


def test_flood_beyond_max_pending_is_answered_busy_without_reaching_the_handler() -> None:
    async def main() -> None:
        wearable, handheld = InProcessLink.pair(depth=64)
        release = asyncio.Event()
        started: list[int] = []

        async def handler(msg: Message) -> Message:
            started.append(msg.request_id)
            await release.wait()
            return Message(MsgType.RESULT, msg.request_id, b"done")

        stats = ServeStats()
        server = asyncio.create_task(
            serve(handheld, handler, max_concurrent=1, max_pending=3, stats=stats)
        )
        for rid in range(1, 9):
            await wearable.send(Message(MsgType.REQUEST, rid, b"x"))
        refused = [await asyncio.wait_for(wearable.receive(), 10) for _ in range(5)]
        assert [m.request_id for m in refused] == [4, 5, 6, 7, 8]
        for m in refused:
            assert m.type == MsgType.ERROR
            err = decode_error(m.payload)
            assert err.code == ErrorCode.BUSY and err.transient
        # 1 runs, 2 and 3 wait for the execution slot: admitted, but not started
        assert started == [1]
        assert (stats.admitted, stats.busy) == (3, 5)
        release.set()
        done = [await asyncio.wait_for(wearable.receive(), 10) for _ in range(3)]
        assert sorted(m.request_id for m in done) == [1, 2, 3]
        assert all(m.type == MsgType.RESULT for m in done)
        assert sorted(started) == [1, 2, 3]  # the refused never reached the handler
        assert stats.replied == 3
        # the admitted ones finished: there is room again
        await wearable.send(Message(MsgType.REQUEST, 9, b"x"))
        assert (await asyncio.wait_for(wearable.receive(), 10)).type == MsgType.RESULT
        await wearable.close()
        await asyncio.wait_for(server, 10)

    asyncio.run(main())


def test_rpc_client_sees_busy_as_a_transient_protocol_error() -> None:
    async def main() -> None:
        wearable, handheld = InProcessLink.pair(depth=64)
        release = asyncio.Event()

        async def handler(msg: Message) -> Message:
            await release.wait()
            return Message(MsgType.RESULT, msg.request_id, msg.payload)

        server = asyncio.create_task(serve(handheld, handler, max_pending=2))
        client = RpcClient(wearable)
        calls = [
            asyncio.create_task(client.request(MsgType.REQUEST, bytes([i]), timeout=30))
            for i in range(6)
        ]
        busy = 0
        while busy < 4:  # four come back BUSY while two are held by the handler
            done, _ = await asyncio.wait(calls, timeout=10, return_when=asyncio.FIRST_COMPLETED)
            assert done, "no reply within 10 s"
            for call in done:
                calls.remove(call)
                with pytest.raises(ProtocolError) as info:
                    call.result()
                assert info.value.code == ErrorCode.BUSY and info.value.transient
                busy += 1
        release.set()
        replies = await asyncio.wait_for(asyncio.gather(*calls), 10)
        assert all(r.type == MsgType.RESULT for r in replies) and len(replies) == 2
        await client.close()
        await asyncio.wait_for(server, 10)

    asyncio.run(main())


def test_timed_out_request_is_cancelled_on_both_sides_and_gets_no_reply() -> None:
    async def main() -> None:
        wearable, handheld = InProcessLink.pair()
        entered = asyncio.Event()
        unwound = asyncio.Event()

        async def handler(msg: Message) -> Message:
            entered.set()
            try:
                await asyncio.Event().wait()  # never set: only a cancel ends this
            except asyncio.CancelledError:
                unwound.set()
                raise
            raise AssertionError("unreachable")

        stats = ServeStats()
        cancelled: list[int] = []
        server = asyncio.create_task(
            serve(handheld, handler, stats=stats, on_cancel=cancelled.append)
        )
        client = RpcClient(wearable)
        late: list[Message] = []
        client.on_unsolicited = late.append
        with pytest.raises(ProtocolError) as info:
            await client.request(MsgType.REQUEST, b"slow", timeout=0.3)
        assert info.value.code == ErrorCode.TIMEOUT
        assert entered.is_set()  # it was in flight when the client gave up
        await asyncio.wait_for(unwound.wait(), 10)  # ... and the serving side cancelled it
        assert cancelled == [1] and stats.cancelled == 1
        # links are ordered: had anything been sent for request 1, it would precede the echo
        probe = await client.request(MsgType.PROBE, b"ping", timeout=10)
        assert probe.payload == b"ping"
        assert late == [] and stats.replied == 0
        await client.close()
        await asyncio.wait_for(server, 10)

    asyncio.run(main())


def test_cancel_of_a_request_waiting_for_its_slot_and_of_unknown_ids() -> None:
    async def main() -> None:
        wearable, handheld = InProcessLink.pair(depth=16)
        release = asyncio.Event()
        started: list[int] = []

        async def handler(msg: Message) -> Message:
            started.append(msg.request_id)
            await release.wait()
            return Message(MsgType.RESULT, msg.request_id)

        stats = ServeStats()
        server = asyncio.create_task(serve(handheld, handler, max_pending=4, stats=stats))
        await wearable.send(Message(MsgType.REQUEST, 1))
        await wearable.send(Message(MsgType.REQUEST, 2))  # waits for the one slot
        await wearable.send(Message(MsgType.CANCEL, 2))
        await wearable.send(Message(MsgType.CANCEL, 77))  # nothing in flight: ignored
        await wearable.send(Message(MsgType.PROBE, 5, b"sync"))
        assert (await asyncio.wait_for(wearable.receive(), 10)).type == MsgType.PROBE
        assert stats.cancelled == 1
        release.set()
        reply = await asyncio.wait_for(wearable.receive(), 10)
        assert (reply.type, reply.request_id) == (MsgType.RESULT, 1)
        await wearable.send(Message(MsgType.PROBE, 6, b"sync"))
        assert (await asyncio.wait_for(wearable.receive(), 10)).request_id == 6
        assert started == [1]  # request 2 never ran
        await wearable.close()
        await asyncio.wait_for(server, 10)

    asyncio.run(main())


@pytest.mark.parametrize("how", ["cancelled", "peer closed"])
def test_no_task_outlives_serve(how: str) -> None:
    async def main() -> None:
        wearable, handheld = InProcessLink.pair()
        entered: list[int] = []
        unwound: list[int] = []

        async def handler(msg: Message) -> Message:
            entered.append(msg.request_id)
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                unwound.append(msg.request_id)
                raise
            raise AssertionError("unreachable")

        server = asyncio.create_task(serve(handheld, handler, max_concurrent=2))
        for rid in (1, 2):
            await wearable.send(Message(MsgType.REQUEST, rid))
        await wearable.send(Message(MsgType.PROBE, 3))
        await asyncio.wait_for(wearable.receive(), 10)  # both requests were admitted
        while len(entered) < 2:
            await asyncio.sleep(0)
        before = asyncio.all_tasks()
        if how == "cancelled":
            server.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await server
        else:
            await wearable.close()
            await asyncio.wait_for(server, 10)
        # serve awaited its handlers before returning: both unwound, no task of it is left
        assert sorted(unwound) == [1, 2]
        assert not [t for t in before & asyncio.all_tasks() if t is not asyncio.current_task()]

    asyncio.run(main())
