"""The one interface every transport implements (loopback, socket, emulated radio, bleak, bumble).

A :class:`Link` is an ordered, reliable, message-oriented pipe between the wearable and the
handheld. Framing, chunking, flow control and integrity are the implementation's business; above
it, :mod:`ble_protocol.rpc` only sees whole :class:`~ble_protocol.messages.Message` objects.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable
from dataclasses import dataclass, field

from coinf.ble_protocol.messages import Message

from coinf.errors import LinkClosed

__all__ = ["Link", "LinkClosed", "LinkStats"]


@dataclass
class LinkStats:
    """Counters every link keeps; the planner reads them for passive bandwidth estimates."""

    messages_sent: int = 0
    messages_received: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    created: float = field(default_factory=time.monotonic)
    #: the message being sent, for progress displays (links that send in chunks keep these;
    #: ``sending_total`` is 0 when no message is under way): its payload size, the payload
    #: bytes the transport took so far, and when it started (``time.monotonic``)
    sending_total: int = 0
    sending_done: int = 0
    sending_since: float = 0.0

    def sending(self) -> tuple[int, int, float] | None:
        """``(done, total, seconds)`` of the message being sent, or None. Safe to call from
        another thread (a snapshot of three counters; good enough for a progress line)."""
        total, done, since = self.sending_total, self.sending_done, self.sending_since
        if total <= 0:
            return None
        return min(done, total), total, time.monotonic() - since

    def count_sent(self, nbytes: int) -> None:
        self.messages_sent += 1
        self.bytes_sent += nbytes

    def count_received(self, nbytes: int) -> None:
        self.messages_received += 1
        self.bytes_received += nbytes


class Link(ABC):
    """Ordered, reliable, bidirectional pipe of messages. Async; one reader, one writer."""

    #: Largest payload this link accepts in one message (memory cap on the receiving side).
    max_message_bytes: int = 64 * 1024 * 1024

    def __init__(self) -> None:
        self.stats = LinkStats()

    @abstractmethod
    async def send(self, message: Message) -> None:
        """Queue ``message`` for delivery; returns once the link has taken it (back-pressure)."""

    @abstractmethod
    async def receive(self) -> Message:
        """Wait for the next message. Raises :class:`LinkClosed` when the peer is gone."""

    @abstractmethod
    async def close(self) -> None:
        """Close the link; pending and future receives raise :class:`LinkClosed`."""

    def delivered(self) -> Awaitable[None] | None:
        """An awaitable done once what was sent *so far* has left this device (BLE: the
        controller completed its packets; call it right after ``send``, it counts what is
        queued now); ``None`` when the link cannot tell (it only knows it took the message)."""
        return None

    @property
    @abstractmethod
    def is_open(self) -> bool:
        """False once either side closed or the connection dropped."""

    @property
    def description(self) -> str:
        """Human-readable name of the link (for logs and ``session.plan()``)."""
        return type(self).__name__

    async def __aenter__(self) -> Link:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
