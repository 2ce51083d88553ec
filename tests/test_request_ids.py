"""Duplicate request ids (docs/PROTOCOL.md §6.4): a message whose id is in flight is dropped
unanswered, so every id gets exactly one reply; a completed id is free again."""

from __future__ import annotations

import asyncio

from coinf.ble_protocol.loopback import InProcessLink
from coinf.ble_protocol.messages import Message, MsgType
from coinf.ble_protocol.rpc import ServeStats, serve


def test_an_id_in_flight_gets_one_reply_and_a_completed_id_is_free() -> None:
    async def main() -> None:
        wearable, handheld = InProcessLink.pair()
        release = asyncio.Event()
        stats = ServeStats()

        async def handler(msg: Message) -> Message:
            if msg.payload == b"first":
                await release.wait()
            return Message(MsgType.RESULT, msg.request_id, b"done " + msg.payload)

        server = asyncio.ensure_future(serve(handheld, handler, max_pending=4, stats=stats))
        await wearable.send(Message(MsgType.REQUEST, 5, b"first"))
        await wearable.send(Message(MsgType.REQUEST, 5, b"again"))  # while 5 is in flight
        await wearable.send(Message(MsgType.PROBE, 5, b"echo?"))  # the same id: no echo
        await wearable.send(Message(MsgType.PROBE, 6, b"marker"))
        marker = await asyncio.wait_for(wearable.receive(), 10)  # hang guards only
        assert (marker.request_id, marker.payload) == (6, b"marker")  # nothing for 5 yet
        assert stats.duplicates == 2 and stats.admitted == 1
        release.set()
        reply = await asyncio.wait_for(wearable.receive(), 10)
        assert (reply.type, reply.request_id, reply.payload) == (MsgType.RESULT, 5, b"done first")
        await wearable.send(Message(MsgType.REQUEST, 5, b"reused"))  # 5 completed: a new one
        reply = await asyncio.wait_for(wearable.receive(), 10)
        assert (reply.request_id, reply.payload) == (5, b"done reused")
        await wearable.send(Message(MsgType.PROBE, 7, b"last"))
        assert (await asyncio.wait_for(wearable.receive(), 10)).request_id == 7  # no stray
        assert stats.replied == 2 and stats.duplicates == 2
        await wearable.close()
        await asyncio.wait_for(server, 10)

    asyncio.run(main())
