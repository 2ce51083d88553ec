"""Who gets the wearable's connection slots (docs/PROTOCOL.md §2, "Slots and deadlines").

The wearable serves one handheld at a time, but keeps **two** slots while no handheld is served:
a central that has not completed the coinf handshake -- a stranger pairing, or an idle central --
cannot lock out a handheld that holds a bond, which may connect in the second slot (the wearable
keeps advertising while a stranger holds the first). The first connection to complete the
handshake is served and the other one is dropped.

A central whose connections keep failing (each ended without a completed handshake: a stalled
or refused pairing, no HELLO in time, a refused HELLO) is throttled: after
:data:`FREE_FAILURES` failures in a row its next connections are refused for
``THROTTLE_BASE_S * 2 ** (failures - FREE_FAILURES)`` seconds, at most :data:`THROTTLE_MAX_S`,
counted from its last failure. A served connection forgives its address.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

#: connections at once while none is served (one of them for a bonded handheld)
MAX_CONNECTIONS = 2
#: connections without a bond at once while the pairing window is open (outside it: one)
UNBONDED_SLOTS_IN_WINDOW = 2
#: failed connections in a row an address may have before it is throttled
FREE_FAILURES = 4
THROTTLE_BASE_S = 2.0
THROTTLE_MAX_S = 60.0
#: addresses whose failures are remembered (the oldest is forgotten first)
REMEMBERED = 256


@dataclass
class _Record:
    failures: int = 0
    last: float = 0.0


class Admission:
    """The slot and throttle decisions, without any radio (the server applies them).

    ``admit(address, bonded, others, pairing_open)``: None to accept a new connection, else why
    it is refused; ``others`` are the (address, bonded, served) of the connections already up,
    ``pairing_open`` whether the pairing window is open (one more slot for a central without a
    bond)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.clock = clock
        self.max_connections = max_connections
        self._records: OrderedDict[str, _Record] = OrderedDict()
        self.refused = 0  # connections refused (no slot, or throttled)
        self.throttled = 0  # of which throttled

    def throttled_for(self, address: str) -> float:
        """Seconds ``address`` is still refused (0: not throttled)."""
        rec = self._records.get(address)
        if rec is None or rec.failures < FREE_FAILURES:
            return 0.0
        penalty = min(THROTTLE_BASE_S * 2 ** (rec.failures - FREE_FAILURES), THROTTLE_MAX_S)
        return max(0.0, rec.last + penalty - self.clock())

    def slots(self, pairing_open: bool) -> int:
        """Connections at once while none is served."""
        return self.max_connections + (UNBONDED_SLOTS_IN_WINDOW - 1 if pairing_open else 0)

    def admit(self, address: str, bonded: bool, others: list[tuple[str, bool, bool]],
              pairing_open: bool = False) -> str | None:
        why = self._why_not(address, bonded, others, pairing_open)
        if why is not None:
            self.refused += 1
        return why

    def _why_not(self, address: str, bonded: bool, others: list[tuple[str, bool, bool]],
                 pairing_open: bool) -> str | None:
        wait = self.throttled_for(address)
        if wait > 0:
            self.throttled += 1
            failures = self._records[address].failures
            return f"throttled for {wait:.0f} s more after {failures} failed connections"
        if not others:
            return None
        if any(served for _, _, served in others):
            return "a handheld is being served"
        if len(others) >= self.slots(pairing_open):
            return "no free slot"
        unbonded = sum(1 for _, b, _ in others if not b)
        if not bonded and unbonded >= (UNBONDED_SLOTS_IN_WINDOW if pairing_open else 1):
            return "the spare slot is kept for a bonded handheld"
        if any(b for _, b, _ in others):
            return "a bonded handheld is already connecting"
        return None

    def failed(self, address: str) -> None:
        """A connection from ``address`` ended without being served."""
        rec = self._records.pop(address, None) or _Record()
        rec.failures += 1
        rec.last = self.clock()
        self._records[address] = rec
        while len(self._records) > REMEMBERED:
            self._records.popitem(last=False)

    def served(self, address: str) -> None:
        """A connection from ``address`` completed the handshake: its failures are forgiven."""
        self._records.pop(address, None)


__all__ = ["FREE_FAILURES", "MAX_CONNECTIONS", "THROTTLE_BASE_S", "THROTTLE_MAX_S",
           "UNBONDED_SLOTS_IN_WINDOW", "Admission"]
