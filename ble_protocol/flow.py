"""Credit-based flow control for chunk streams (docs/PROTOCOL.md, "Flow control").

Notifications and write-without-response have no back-pressure on BlueZ or CoreBluetooth, so a
sender may only put a data chunk on the air while it holds a *credit*. The receiver announces its
window (in chunks) in the handshake and returns credits on the control characteristic as it
consumes chunks, in batches, and only while its inbox of complete messages is below a cap.
"""

from __future__ import annotations

import asyncio
from collections import deque

from coinf.ble_protocol.link import LinkClosed

MAX_WINDOW = 1024


def fresh(exc: BaseException) -> BaseException:
    """A new exception equal to ``exc``. Raising one shared instance from many places chains
    its tracebacks and contexts without bound, so every waiter gets its own copy."""
    from coinf.ble_protocol.messages import ProtocolError

    if isinstance(exc, LinkClosed):
        return LinkClosed(exc.text)
    if isinstance(exc, ProtocolError):
        return ProtocolError(exc.code, exc.text)
    return exc


class CreditGate:
    """Sender side: ``await acquire()`` before each chunk; ``grant(n)`` when credits arrive."""

    def __init__(self, credits: int = 0) -> None:
        if credits < 0:
            raise ValueError("credits must be >= 0")
        self.credits = credits
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed: BaseException | None = None
        self.granted_total = credits

    def grant(self, n: int) -> None:
        if n <= 0 or n > MAX_WINDOW:
            raise ValueError(f"credit grant {n} outside [1, {MAX_WINDOW}]")
        self.credits += n
        self.granted_total += n
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.credits > 0:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                self.credits -= 1

    async def acquire(self) -> None:
        if self._closed is not None:
            raise fresh(self._closed)
        if self.credits > 0 and not self._waiters:
            self.credits -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.credits += 1  # we were granted a credit but leave without using it
                self._wake()
            raise

    def close(self, exc: BaseException | None = None) -> None:
        self._closed = exc or LinkClosed("flow control closed")
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(fresh(self._closed))


class CreditLedger:
    """Receiver side: counts consumed chunks and decides when to return credits.

    ``counted`` is every chunk this side charged a credit for; :meth:`sync` sets it to the
    sender's own count (SENT / SYNC frames, module ``arq``), so the credits of chunks lost on the
    way come back, and chunks counted twice stop being charged. ``slack`` chunks beyond the
    window are tolerated (a chunk overtaken by the sync that counted it is charged twice until
    the next sync); 0 without syncs."""

    def __init__(self, window: int, batch: int | None = None, slack: int = 0) -> None:
        if not 1 <= window <= MAX_WINDOW:
            raise ValueError(f"window {window} outside [1, {MAX_WINDOW}]")
        self.window = window
        self.batch = batch or max(1, window // 4)
        self.slack = slack
        self.owed = 0
        self.outstanding = window  # credits the sender may still use
        self.counted = 0
        self._synced: int | None = None

    def on_chunk(self) -> None:
        """A chunk arrived. A sender exceeding its credits breaks the protocol."""
        if self.outstanding <= -self.slack:
            from coinf.ble_protocol.messages import ErrorCode, ProtocolError

            raise ProtocolError(ErrorCode.MALFORMED, "peer sent a chunk without holding a credit")
        self.outstanding -= 1
        self.owed += 1
        self.counted += 1

    def uncount(self) -> None:
        """The chunk just counted was a duplicate (radio or resend): it is not charged."""
        self.outstanding += 1
        self.owed -= 1
        self.counted -= 1

    def sync(self, sent: int) -> int:
        """The sender has written ``sent`` chunks (mod 2**32) on this link in all; returns the
        correction (> 0: chunks lost on the way, now owed back). An older sync is ignored."""
        if self._synced is not None and not 0 < (sent - self._synced) % (1 << 32) < 1 << 31:
            return 0
        self._synced = sent
        delta = (sent - self.counted + (1 << 31)) % (1 << 32) - (1 << 31)
        self.counted += delta
        self.owed += delta
        self.outstanding -= delta
        return delta

    def take_grant(self, allowed: bool = True, force: bool = False) -> int:
        """Credits to return now (0 if none): once ``batch`` are owed, or any when ``force``."""
        if not allowed or self.owed <= 0 or (self.owed < self.batch and not force):
            return 0
        n, self.owed = self.owed, 0
        self.outstanding += n
        return n
