"""An in-process link with a simple radio model: bandwidth, one shared air channel, latency.

This is the fast stand-in for the BLE stack when a benchmark needs many runs at a known
bandwidth (planner sweeps, streaming). Each message occupies the shared channel for
``(len(payload) + overhead) / bandwidth`` seconds -- both directions share the air, as BLE's
connection events do -- and is delivered ``latency`` seconds after it left. The real BLE stack
with connection-event timing lives in ``ble_protocol.radio``.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from coinf.ble_protocol.link import Link, LinkClosed
from coinf.ble_protocol.messages import Message


@dataclass(frozen=True)
class Channel:
    """Payload bytes/s shared by both directions, one-way latency, per-message overhead; for a
    Wi-Fi link (:mod:`ble_protocol.wifi_preset`) also the latency's jitter and the share of
    ``segment_bytes`` segments lost on air, each repaired by one more round trip (TCP's fast
    retransmit). Jitter and loss are drawn from a generator seeded with ``seed``."""

    bandwidth_bps: float
    latency_s: float = 0.0075
    overhead_bytes: int = 16
    jitter_s: float = 0.0
    loss: float = 0.0
    segment_bytes: int = 1460
    seed: int = 1

    def airtime(self, nbytes: int) -> float:
        return (nbytes + self.overhead_bytes) / self.bandwidth_bps

    def repair_s(self, nbytes: int, rng: random.Random) -> float:
        """Extra air time of one message: a round trip per lost segment."""
        if self.loss <= 0:
            return 0.0
        segments = max(1, -(-(nbytes + self.overhead_bytes) // self.segment_bytes))
        lost = sum(rng.random() < self.loss for _ in range(min(segments, 100_000)))
        return lost * 2 * self.latency_s

    def jitter(self, rng: random.Random) -> float:
        return rng.uniform(0.0, self.jitter_s) if self.jitter_s > 0 else 0.0


class _Air:
    """The shared medium: one message on air at a time, FIFO."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.lock = asyncio.Lock()
        self.busy_s = 0.0


class ShapedLink(Link):
    """One end of a shaped in-process pipe. Build both ends with :meth:`pair`."""

    def __init__(self, air: _Air, inbox: asyncio.Queue[Message | None]) -> None:
        super().__init__()
        self._air = air
        self._inbox = inbox
        self.peer: ShapedLink | None = None
        self._open = True

    @classmethod
    def pair(cls, channel: Channel) -> tuple[ShapedLink, ShapedLink]:
        if not channel.bandwidth_bps > 0:
            raise ValueError(f"bandwidth must be > 0 B/s, got {channel.bandwidth_bps}")
        air = _Air(channel)
        a, b = cls(air, asyncio.Queue()), cls(air, asyncio.Queue())
        a.peer, b.peer = b, a
        return a, b

    @property
    def channel(self) -> Channel:
        return self._air.channel

    def retune(self, channel: Channel) -> None:
        """Change the radio conditions of both ends from now on (tests, benches)."""
        if not channel.bandwidth_bps > 0:
            raise ValueError(f"bandwidth must be > 0 B/s, got {channel.bandwidth_bps}")
        self._air.channel = channel

    @property
    def description(self) -> str:
        c = self._air.channel
        return f"shaped link {c.bandwidth_bps / 1000:.1f} kB/s, {c.latency_s * 1e3:.1f} ms"

    async def send(self, message: Message) -> None:
        peer = self.peer
        if not self._open or peer is None or not peer._open:
            raise LinkClosed("shaped link closed")
        airtime = self._air.channel.airtime(len(message.payload))
        async with self._air.lock:
            t0 = time.perf_counter()
            await asyncio.sleep(airtime)
            self._air.busy_s += time.perf_counter() - t0
        self.stats.count_sent(len(message.payload))
        loop = asyncio.get_running_loop()
        loop.call_later(self._air.channel.latency_s, peer._inbox.put_nowait, message)

    async def receive(self) -> Message:
        if not self._open:
            raise LinkClosed("shaped link closed")
        msg = await self._inbox.get()
        if msg is None:
            self._open = False
            raise LinkClosed("peer closed the shaped link")
        self.stats.count_received(len(msg.payload))
        return msg

    async def close(self) -> None:
        if self._open:
            self._open = False
            self._inbox.put_nowait(None)
            if self.peer is not None and self.peer._open:
                self.peer._inbox.put_nowait(None)

    @property
    def is_open(self) -> bool:
        return self._open
