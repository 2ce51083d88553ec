"""Pace data chunks by the host's ACL packet queue (both sides, on bumble).

bumble queues every notification's LL packets in the host until the controller has buffers
for them. A long queue delays the ATT responses to the handheld's control writes (which carry
its credits) behind our data and stalls the credit loop, so the sender waits while more than
``limit`` packets are pending. Credits bound memory; this bounds latency (docs/PROTOCOL.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

FLUSH_POLL_S = 0.002  # how often flushed() looks at the controller's completed packets
ROOM_CHECK_S = 1.0  # longest wait for one 'flow' event before the queue is looked at again
#: LL packets a sender leaves queued in its host at most (both sides' default): a control frame
#: written next waits behind these, never behind a window of data chunks
MAX_QUEUED_PACKETS = 24


class AclPacer:
    """Waits on one connection's ACL packet queue; ``alive()`` turning false ends every wait.

    ``queue`` is bumble's ``host.le_acl_packet_queue`` (or ``acl_packet_queue``); ``None``
    (a host without one) makes every wait return at once.
    """

    def __init__(self, queue: Any, limit: int, alive: Callable[[], bool]) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1 queued packet, got {limit}")
        self._queue = queue
        self._limit = limit
        self._alive = alive

    async def wait_for_room(self) -> None:
        """Return once at most ``limit`` packets are pending (or the connection is gone)."""
        queue = self._queue
        while queue is not None and queue.pending > self._limit and self._alive():
            flowed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            def on_flow(fut: asyncio.Future[None] = flowed) -> None:
                if not fut.done():
                    fut.set_result(None)

            queue.once("flow", on_flow)
            try:
                await asyncio.wait_for(flowed, ROOM_CHECK_S)
            except TimeoutError:
                pass
            finally:
                queue.remove_listener("flow", on_flow)

    def flushed(self) -> Awaitable[None]:
        """Done when the controller has completed every packet queued now (sent on the air).
        Polls (FLUSH_POLL_S): a second 'flow' listener next to wait_for_room's would race it."""
        queue = self._queue
        target = queue.queued if queue is not None else 0

        async def wait() -> None:
            while queue is not None and queue.completed < target and self._alive():
                await asyncio.sleep(FLUSH_POLL_S)

        return wait()
