"""The fleet service's dynamic batcher: frames of many wearables in, batches out, fairly.

One :class:`TailQueue` per bundle. A frame waits in its link's own queue; the dispatcher takes
frames round-robin over the links (one from each in turn), so a wearable that keeps its queue
full never pushes the others' frames back by more than one frame per batch. A batch leaves
when an engine slot is free and either it is full (``max_batch``) or its oldest frame has waited
``max_wait_s``. How long frames waited (enqueue to dispatch) is kept for STATUS (``queue_ms``).

The bound on each link's queue is rpc.serve's admission (``max_pending`` in flight per link,
the rest refused with BUSY before anything is queued).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from coinf.ble_protocol.tasks import TaskSet

#: (payloads) -> one outcome per payload; raises when the whole batch failed
RunBatch = Callable[[Sequence[bytes]], Awaitable[Sequence[Any]]]


@dataclass
class _Frame:
    payload: bytes
    future: asyncio.Future[Any]
    queued: float = field(default_factory=time.monotonic)


@dataclass
class QueueStats:
    """Counters of one queue: frames and batches dispatched, frames whose batch failed."""

    frames: int = 0
    batches: int = 0
    failed: int = 0
    #: the last frames' waits in seconds (enqueue to dispatch)
    waits: deque[float] = field(default_factory=lambda: deque(maxlen=512))

    def queue_ms(self) -> float:
        """Median wait of the last frames, ms (0 before any)."""
        return round(statistics.median(self.waits) * 1e3, 2) if self.waits else 0.0


class TailQueue:
    """Batches the frames of one bundle for ``run_batch`` (module docstring)."""

    def __init__(self, run_batch: RunBatch, *, max_batch: int = 32, max_wait_s: float = 0.005,
                 slots: int = 2) -> None:
        if max_batch < 1 or slots < 1 or not 0 <= max_wait_s <= 10:
            raise ValueError("max_batch and slots must be >= 1, max_wait_s in [0, 10]")
        self.run_batch = run_batch
        self.max_batch, self.max_wait_s = max_batch, max_wait_s
        self.stats = QueueStats()
        self._links: OrderedDict[Any, deque[_Frame]] = OrderedDict()
        self._count = 0
        self._arrived = asyncio.Event()
        self._slots = asyncio.Semaphore(slots)
        self._tasks = TaskSet()
        self._dispatcher: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        return self._count

    async def submit(self, link: Any, payload: bytes) -> Any:
        """Queue one frame of ``link``; its outcome once its batch ran. Cancelling the caller
        takes the frame out of the queue if it was not dispatched yet."""
        if self._dispatcher is None:
            self._dispatcher = self._tasks.spawn(self._dispatch())
        frame = _Frame(payload, asyncio.get_running_loop().create_future())
        self._links.setdefault(link, deque()).append(frame)
        self._count += 1
        self._arrived.set()
        return await frame.future  # cancelled with the caller: _take skips it

    def forget(self, link: Any) -> None:
        """``link`` went away: drop its queue (its frames' callers are cancelled already)."""
        gone = self._links.pop(link, None)
        if gone:
            self._count -= len(gone)

    async def aclose(self) -> None:
        await self._tasks.cancel_all()
        for q in self._links.values():
            for frame in q:
                frame.future.cancel()
        self._links.clear()
        self._count = 0

    async def _dispatch(self) -> None:
        while True:
            while self._count == 0:
                self._arrived.clear()
                await self._arrived.wait()
            await self._slots.acquire()
            try:
                await self._fill()
                batch = self._take()
            except BaseException:
                self._slots.release()
                raise
            if not batch:
                self._slots.release()
                continue
            self._tasks.spawn(self._run(batch))

    async def _fill(self) -> None:
        """Wait until a batch is full or its oldest frame waited ``max_wait_s``."""
        oldest = min((q[0].queued for q in self._links.values() if q), default=time.monotonic())
        while self._count < self.max_batch:
            left = oldest + self.max_wait_s - time.monotonic()
            if left <= 0:
                return
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), left)

    def _take(self) -> list[_Frame]:
        """Up to ``max_batch`` live frames, one per link in turn."""
        batch: list[_Frame] = []
        now = time.monotonic()
        while len(batch) < self.max_batch and self._links:
            link, q = next(iter(self._links.items()))
            self._links.move_to_end(link)  # the next frame comes from the next link
            frame = q.popleft()
            self._count -= 1
            if not q:
                del self._links[link]
            if frame.future.done():  # its caller gave up (CANCEL, link closed)
                continue
            batch.append(frame)
            self.stats.waits.append(now - frame.queued)
        return batch

    async def _run(self, batch: list[_Frame]) -> None:
        try:
            outcomes = await self.run_batch([f.payload for f in batch])
            if len(outcomes) != len(batch):
                raise RuntimeError(f"engine returned {len(outcomes)} outcomes for "
                                   f"{len(batch)} frames")
        except asyncio.CancelledError:
            for f in batch:
                f.future.cancel()
            raise
        except Exception as exc:
            self.stats.failed += len(batch)
            for f in batch:
                if not f.future.done():
                    f.future.set_exception(exc)
            return
        finally:
            self._slots.release()
        self.stats.frames += len(batch)
        self.stats.batches += 1
        for f, outcome in zip(batch, outcomes, strict=True):
            if not f.future.done():
                f.future.set_result(outcome)


__all__ = ["QueueStats", "RunBatch", "TailQueue"]
