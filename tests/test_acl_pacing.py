"""AclPacer on bumble's real host-side ACL queue (packets go to a list instead of a controller)."""

from __future__ import annotations

import asyncio

import pytest
from bumble import hci
from bumble.host import DataPacketQueue
from coinf.ble_protocol.acl_pacing import AclPacer

HANDLE = 0x40


def _queue(sent: list[hci.HCI_Packet], in_flight: int = 4) -> DataPacketQueue:
    return DataPacketQueue(max_packet_size=27, max_in_flight=in_flight, send=sent.append)


def _enqueue(queue: DataPacketQueue, n: int) -> None:
    for _ in range(n):
        queue.enqueue(hci.HCI_AclDataPacket(HANDLE, 0, 0, 1, b"x"), HANDLE)


def test_wait_for_room_blocks_while_too_many_packets_are_pending() -> None:
    async def main() -> None:
        sent: list[hci.HCI_Packet] = []
        queue = _queue(sent)
        pacer = AclPacer(queue, limit=3, alive=lambda: True)
        _enqueue(queue, 6)  # 4 in flight, 2 waiting in the host: 6 pending
        waiter = asyncio.ensure_future(pacer.wait_for_room())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        queue.on_packets_completed(2, HANDLE)  # 4 pending: still above 3
        await asyncio.sleep(0.01)
        assert not waiter.done()
        queue.on_packets_completed(1, HANDLE)  # 3 pending
        await asyncio.wait_for(waiter, 1.0)
        assert queue.pending == 3

    asyncio.run(main())


def test_wait_for_room_ends_when_the_connection_is_gone() -> None:
    async def main() -> None:
        queue = _queue([])
        alive = [True]
        pacer = AclPacer(queue, limit=1, alive=lambda: alive[0])
        _enqueue(queue, 5)
        waiter = asyncio.ensure_future(pacer.wait_for_room())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        alive[0] = False
        queue.on_packets_completed(1, HANDLE)  # a 'flow' event makes it look again
        await asyncio.wait_for(waiter, 1.0)
        assert queue.pending == 4

    asyncio.run(main())


def test_flushed_waits_for_the_packets_queued_when_it_was_asked() -> None:
    async def main() -> None:
        queue = _queue([], in_flight=8)
        pacer = AclPacer(queue, limit=24, alive=lambda: True)
        _enqueue(queue, 3)
        done = asyncio.ensure_future(pacer.flushed())
        _enqueue(queue, 2)  # queued later: not waited for
        queue.on_packets_completed(2, HANDLE)
        await asyncio.sleep(0.02)
        assert not done.done()
        queue.on_packets_completed(1, HANDLE)
        await asyncio.wait_for(done, 1.0)
        assert queue.pending == 2

    asyncio.run(main())


def test_a_host_without_a_queue_never_waits_and_a_bad_limit_is_refused() -> None:
    pacer = AclPacer(None, limit=1, alive=lambda: True)
    asyncio.run(asyncio.wait_for(pacer.wait_for_room(), 1.0))
    asyncio.run(asyncio.wait_for(pacer.flushed(), 1.0))
    with pytest.raises(ValueError, match="at least 1"):
        AclPacer(None, limit=0, alive=lambda: True)
