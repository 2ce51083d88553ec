"""What failed pairings do to the wearable's wait for a handheld (docs/PROTOCOL.md §2, "Pairing
failures"), and what one pairing window saw.

A stranger in range can always make a pairing fail (it only has to connect and guess), so a
failure by itself must not end the wait while the pairing window is open: the user's handheld
may still pair. :class:`FailureWatch` decides when the failures seen during one
``WearableServer.accept()`` end it:

* ``bound=N`` (library callers): at the N-th failed pairing of any central;
* ``window_rule`` (the Session's ``ble:HCI`` transport until its first link): when the pairing
  window closes and no new bond was made while failures were seen during it; or at the first
  failure when the window is closed and the wearable holds no bond at all (nothing could ever be
  served).

:class:`WindowStats` counts, for one pairing window, the connections of centrals without a bond
and how they ended, over every address together (LE random addresses rotate freely).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from coinf.ble_protocol.bleak_errors import PAIRING_HINTS, smp_failure

from coinf.errors import PairingError, PairingFailure

#: addresses named in a report (the rest are counted)
NAMED = 3


@dataclass
class FailureWatch:
    """The failed pairings of one accept() wait and whether they end it (module docstring)."""

    bound: int | None = None
    window_rule: bool = False
    failures: int = 0
    by_address: Counter[str] = field(default_factory=Counter)
    last: tuple[str, int] | None = None  # (address, SMP reason)
    window_seen_open: bool = False
    bonds: int = 0  # new bonds during the wait

    def summary(self) -> str:
        """``3 failed pairing(s) from 2 address(es): A x2, B x1``."""
        named = ", ".join(f"{a} x{n}" for a, n in self.by_address.most_common(NAMED))
        more = len(self.by_address) - NAMED
        tail = f" and {more} more" if more > 0 else ""
        return (f"{self.failures} failed pairing(s) from {len(self.by_address)} address(es): "
                f"{named}{tail}")

    def _error(self, why: str) -> PairingError:
        address, reason = self.last if self.last is not None else ("?", 0)
        failure = smp_failure(reason)
        return PairingError(failure, f"{why}; {self.summary()}; the last with {address} "
                            f"(SMP {reason:#04x}: {PAIRING_HINTS[failure]})", peer=address,
                            attempts=self.failures, smp_code=reason)

    def failed(self, address: str, reason: int, *, pairing_open: bool,
               any_bond: bool) -> PairingError | None:
        """Count a failed pairing; the error that ends the wait, if it does."""
        self.failures += 1
        self.by_address[address] += 1
        self.last = (address, reason)
        if self.bound is not None and self.failures >= self.bound:
            return self._error(f"{self.failures} failed pairing(s) ended the wait")
        if self.window_rule and not pairing_open and not any_bond and not self.window_seen_open:
            return self._error("the pairing window is closed and this wearable holds no bond "
                               "(nothing can be served)")
        return None

    def window_closed(self) -> PairingError | None:
        """The pairing window closed during the wait: the error that ends it, if it does."""
        if not self.window_rule or self.bonds or not self.failures:
            return None
        return self._error("the pairing window closed without a new bond")


@dataclass
class WindowStats:
    """One pairing window, all centrals without a bond together (reset when a window opens)."""

    connections: int = 0  # admitted connections of centrals without a bond
    refused: int = 0  # connections refused (no slot, throttled)
    pairing_failures: int = 0
    idle_drops: int = 0  # dropped for not starting to pair in time
    stalled_drops: int = 0  # dropped at the pairing deadline
    preempted: int = 0  # dropped to make room for a newcomer (held over pairing_timeout / 2)
    bonds: int = 0
    addresses: set[str] = field(default_factory=set)

    def as_dict(self) -> dict[str, int]:
        return {"connections": self.connections, "refused": self.refused,
                "pairing_failures": self.pairing_failures, "idle_drops": self.idle_drops,
                "stalled_drops": self.stalled_drops, "preempted": self.preempted,
                "bonds": self.bonds,
                "addresses": len(self.addresses)}


__all__ = ["FailureWatch", "PairingFailure", "WindowStats"]
