"""The bandwidth of each link a plan sends over, measured from the frames that cross it.

A link's bandwidth is the bytes of one message over the time the link took to carry it: from
when it could start (it was sent, or the message before it on the same link was taken: links
are FIFO, and waiting behind earlier frames is queueing, not transfer) until the link took it
(BLE: ``delivered``, when it left this device's buffers; others: ``sent``). For the links
between helpers, each helper reports the bytes it handed on and how long that took (its
RESULT's ``send_us``).

A send shorter than :data:`MIN_SEND_S` cannot be timed (a fast link took it at once): it only
says the link is *at least* that fast, and raises the estimate to that bound if it was lower.
Only timed sends can show a link to be slower than thought, so a loaded machine whose sockets
answer late once in a while does not talk the planner out of a fast link.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

#: a send shorter than this (s) is not timed, only bounds the bandwidth from below
MIN_SEND_S = 5e-4
MAX_BANDWIDTH_BPS = 1e10
#: weight of a new measurement in the running average
EWMA = 0.3


class Ewma:
    """A running average (None until the first value, unless a prior is given)."""

    def __init__(self, prior: float | None = None) -> None:
        self.value = prior

    def add(self, x: float) -> None:
        self.value = x if self.value is None else (1 - EWMA) * self.value + EWMA * x


@dataclass(eq=False)
class Pending:
    """A message on a link, sent at ``t0`` (``time.perf_counter``), not answered yet."""

    t0: float
    nbytes: int
    marks: Mapping[str, float]


class LinkMeter:
    """Bandwidth estimates (B/s) of the links into named devices (module docstring);
    ``priors``: each device's configured bandwidth, or None."""

    def __init__(self, priors: Mapping[str, float | None] | None = None) -> None:
        self._bw: dict[str, Ewma] = {n: Ewma(p) for n, p in (priors or {}).items()}
        #: sends timed per device (lower bounds not counted)
        self.timed: dict[str, int] = {}
        self._last_end: dict[str, float] = {}
        #: devices whose estimate is only a lower bound (no send into them was timed since)
        self._bound: set[str] = set()
        #: messages on each link still waiting for their reply, in issue order
        self._pending: dict[str, list[Pending]] = {}
        self._delivers: set[str] = set()  # links that report when the radio carried a message
        self._untimed: dict[str, int] = {}  # bytes delivered with the message before

    def value(self, device: str) -> float | None:
        """The estimate for the link into ``device`` (its prior until measured), or None."""
        est = self._bw.get(device)
        return None if est is None else est.value

    def service_time(self, device: str, t0: float, marks: Mapping[str, float]) -> float:
        """Seconds the link into ``device`` took to carry the message sent at ``t0``, from the
        request's ``marks`` (:meth:`coinf.ble_protocol.rpc.RpcClient.request`)."""
        sent = marks.get("delivered", marks.get("sent", t0))  # BLE: on the air, not buffered
        start = max(t0, self._last_end.get(device, 0.0))
        self._last_end[device] = max(sent, self._last_end.get(device, 0.0))
        return max(sent - start, 0.0)

    def assume(self, device: str, bps: float | None) -> None:
        """Take ``bps`` as the estimate of the link into ``device`` until measured again."""
        self._bw.setdefault(device, Ewma()).value = bps
        self._bound.discard(device)

    def last_end(self, device: str) -> float:
        """When the link into ``device`` last finished carrying a message (0: never)."""
        return self._last_end.get(device, 0.0)

    def observe(self, device: str, nbytes: float, seconds: float) -> None:
        """``nbytes`` crossed the link into ``device`` in ``seconds``."""
        if nbytes <= 0:
            return
        est = self._bw.setdefault(device, Ewma())
        if seconds > MIN_SEND_S:
            bps = min(nbytes / seconds, MAX_BANDWIDTH_BPS)
            if device in self._bound:  # a bound is no measurement: the first one replaces it
                self._bound.discard(device)
                est.value = bps
            else:
                est.add(bps)
            self.timed[device] = self.timed.get(device, 0) + 1
        elif est.value is None or est.value < nbytes / MIN_SEND_S:
            # too short to time (a fast link took it at once): at least this fast
            est.value = min(nbytes / MIN_SEND_S, MAX_BANDWIDTH_BPS)
            self._bound.add(device)

    def sending(self, device: str, nbytes: int, t0: float,
                marks: Mapping[str, float]) -> Pending:
        """A message of ``nbytes`` went to the link into ``device`` at ``t0`` (its request's
        ``marks`` fill in as the link takes it): it counts for :meth:`current` until
        :meth:`finished`."""
        entry = Pending(t0, nbytes, marks)
        self._pending.setdefault(device, []).append(entry)
        return entry

    def finished(self, device: str, entry: Pending) -> None:
        """The request of ``entry`` ended (answered, failed or cancelled)."""
        pending = self._pending.get(device, [])
        if entry in pending:
            pending.remove(entry)

    def sent(self, device: str, nbytes: int, t0: float, marks: Mapping[str, float]) -> float:
        """A message of ``nbytes`` sent at ``t0`` came back (``marks``: its request's):
        observe the time the link took to carry it. Over BLE (``delivered`` marks) a message
        the link took with the one before it shares that one's air time: its bytes are
        carried over to the next timed send. The seconds the link took."""
        seconds = self.service_time(device, t0, marks)
        if "delivered" in marks:
            self._delivers.add(device)
            nbytes += self._untimed.pop(device, 0)
            if seconds <= MIN_SEND_S:
                self._untimed[device] = nbytes
                return seconds
        self.observe(device, nbytes, seconds)
        return seconds

    def current(self, device: str, default: float) -> float:
        """The estimate (``default`` while there is none), lowered at once when a message is
        overdue: one on the wire for ``elapsed`` s without being taken shows the link carries
        at most ``bytes / elapsed``, so a drop is seen while the first slow message is still
        sending, not after its round trip (2x the expected time: no reaction to jitter)."""
        est = self.value(device) or default
        prev_end = self.last_end(device)
        now = time.perf_counter()
        for entry in self._pending.get(device, ()):
            marks = entry.marks
            done = marks.get("delivered") if device in self._delivers else \
                marks.get("delivered", marks.get("sent"))
            if done is not None:
                prev_end = max(prev_end, done)
                continue
            elapsed = now - max(entry.t0, prev_end)
            if elapsed > 2 * entry.nbytes / est:
                return min(est, entry.nbytes / elapsed)
            break
        return est

    def forget(self, device: str) -> None:
        """``device`` left: its next link starts unqueued."""
        self._last_end.pop(device, None)


__all__ = ["EWMA", "MAX_BANDWIDTH_BPS", "MIN_SEND_S", "Ewma", "LinkMeter", "Pending"]
