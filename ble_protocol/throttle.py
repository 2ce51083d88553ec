"""Shape any link's sending side: a bandwidth and a one-way latency (emulated helper links).

:class:`~ble_protocol.shaped.ShapedLink` is an in-process pair; helpers of a pipeline talk over
TCP between processes, so this wraps a real link instead: each message holds the sender's
"air" for ``(len(payload) + overhead) / bandwidth`` seconds (one message at a time), then goes
to the inner link after ``latency`` seconds without holding the air (later messages do not wait
for it). Receiving is the inner link's. ``send`` returns once the air time has passed, so a
caller timing ``send`` measures the link's bandwidth.

Links given one ``air`` lock share one medium (devices on one Wi-Fi network); with
``shape_receive`` a received message also holds the air for its airtime and arrives
``latency`` later, so a link shaped from one end only (a benchmark's side) shapes both ways.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from coinf.ble_protocol.link import Link
from coinf.ble_protocol.messages import Message
from coinf.ble_protocol.shaped import Channel
from coinf.ble_protocol.tasks import TaskSet

from coinf.errors import LinkClosed, ProtocolError


class ThrottledLink(Link):
    """``inner`` with its sends shaped by ``channel`` (bandwidth shared by this side's sends)."""

    def __init__(self, inner: Link, channel: Channel, *, air: asyncio.Lock | None = None,
                 shape_receive: bool = False) -> None:
        super().__init__()
        if not channel.bandwidth_bps > 0:
            raise ValueError(f"bandwidth must be > 0 B/s, got {channel.bandwidth_bps}")
        self.inner = inner
        self.channel = channel
        self.stats = inner.stats
        self.max_message_bytes = inner.max_message_bytes
        self._air = air if air is not None else asyncio.Lock()
        self.shape_receive = shape_receive
        self._order = asyncio.Lock()
        self._late: TaskSet | None = None
        self._failed: ProtocolError | None = None
        self._rng = random.Random(channel.seed)
        self._queue: asyncio.Queue[tuple[float, Message]] = asyncio.Queue()

    @property
    def description(self) -> str:
        c = self.channel
        return (f"{self.inner.description} shaped to {c.bandwidth_bps / 1000:.1f} kB/s, "
                f"{c.latency_s * 1e3:.1f} ms")

    async def send(self, message: Message) -> None:
        if self._failed is not None:
            raise self._failed
        if not self.inner.is_open:
            raise LinkClosed(f"{self.inner.description} closed")
        c, n = self.channel, len(message.payload)
        async with self._air:
            await asyncio.sleep(c.airtime(n) + c.repair_s(n, self._rng))
        if c.latency_s <= 0 and c.jitter_s <= 0:
            async with self._order:
                await self.inner.send(message)
            return
        at = asyncio.get_running_loop().time() + c.latency_s + c.jitter(self._rng)
        self._queue.put_nowait((at, message))
        if self._late is None:
            self._late = TaskSet()
            self._late.spawn(self._pump())

    async def _pump(self) -> None:
        """Deliver the queued messages one by one, each at its time: FIFO, whatever the
        jitter drew (a later message waits for the one before it, as TCP's stream does)."""
        loop = asyncio.get_running_loop()
        while True:
            at, message = await self._queue.get()
            await asyncio.sleep(max(at - loop.time(), 0.0))
            async with self._order:
                try:
                    await self.inner.send(message)
                except ProtocolError as exc:
                    self._failed = exc

    async def receive(self) -> Message:
        message = await self.inner.receive()
        if self.shape_receive:
            async with self._air:
                await asyncio.sleep(self.channel.airtime(len(message.payload)))
            await asyncio.sleep(self.channel.latency_s)
        return message

    async def close(self) -> None:
        if self._late is not None:
            await self._late.cancel_all()
        await self.inner.close()

    @property
    def is_open(self) -> bool:
        return self.inner.is_open and self._failed is None

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
