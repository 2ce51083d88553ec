"""Real-time sources for streams, and the streaming paper's effective accuracy.

The pipeline itself is :meth:`coinf.wearable.core.AsyncSession.astream`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

#: what :func:`puller`'s awaitable returns when the feeds are exhausted
END = object()


@dataclass
class RealtimeSource:
    """Frames that arrive at ``rate_hz`` whether or not the pipeline is ready.

    Iterating returns the newest frame that has arrived; frames that arrived while the pipeline was
    busy are dropped (counted in :attr:`dropped`), never queued. Frames are pulled lazily from
    ``frames`` (a frame that is dropped is still taken from it).
    """

    frames: Iterable[Mapping[str, Any]]
    rate_hz: float
    limit: int | None = None
    delivered: int = 0
    dropped: int = 0
    started: float | None = None
    _it: Iterator[Mapping[str, Any]] | None = field(default=None, repr=False)
    _next: int = 0

    def __post_init__(self) -> None:
        if not self.rate_hz > 0:
            raise ValueError(f"rate_hz must be > 0, got {self.rate_hz}")

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        self._it = iter(self.frames)
        self.started = time.perf_counter()
        self._next = 0
        return self

    def __next__(self) -> Mapping[str, Any]:
        assert self._it is not None and self.started is not None, "iterate with iter() first"
        now = time.perf_counter()
        arrived = int((now - self.started) * self.rate_hz) + 1  # frames that exist by now
        if self.limit is not None:
            arrived = min(arrived, self.limit)
        if self._next >= arrived:
            if self.limit is not None and self._next >= self.limit:
                raise StopIteration
            time.sleep(max(self.started + self._next / self.rate_hz - now, 0.0))
            arrived = self._next + 1
        frame: Mapping[str, Any] | None = None
        while self._next < arrived:  # keep the newest frame, drop the older ones
            try:
                frame = next(self._it)
            except StopIteration:
                if frame is None:
                    raise
                break
            self._next += 1
        assert frame is not None
        self.delivered += 1
        self.dropped = self._next - self.delivered
        return frame

    @property
    def offered(self) -> int:
        return self._next


def effective_accuracy(throughput_fps: float, accuracy: float, input_rate_hz: float) -> float:
    """Streaming paper §III: throughput x accuracy / input rate (capped by accuracy)."""
    return min(throughput_fps / input_rate_hz, 1.0) * accuracy


def puller(feeds: AsyncIterable[Mapping[str, Any]] | Iterable[Mapping[str, Any]]
            ) -> Callable[[], Any]:
    """An awaitable 'next feed or END' over an async or a (possibly blocking) sync iterable."""
    if isinstance(feeds, AsyncIterable):
        agen = aiter(feeds)

        async def next_async() -> Any:
            try:
                return await anext(agen)
            except StopAsyncIteration:
                return END

        return next_async
    it = iter(feeds)

    async def next_sync() -> Any:
        if isinstance(feeds, list | tuple):  # in memory: no thread needed
            return next(it, END)
        return await asyncio.to_thread(next, it, END)

    return next_sync
