"""The wearable server's slots and deadlines (docs/PROTOCOL.md §2, "Slots and deadlines"): who
keeps a connection while setting up, and for how long. :class:`ServerSlots` is a part of
:class:`~coinf.ble_protocol.peripheral.WearableServer`; the admission decisions themselves are
:class:`~coinf.ble_protocol.admission.Admission`'s."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from bumble import hci
from bumble.device import Connection
from coinf.ble_protocol.admission import UNBONDED_SLOTS_IN_WINDOW, Admission
from coinf.ble_protocol.pairing_guard import WindowStats

log = logging.getLogger("coinf.ble_protocol.peripheral")

#: s a controller gets to answer at start-up and shut-down, and a disconnect
CONTROLLER_TIMEOUT = 5.0


class ServerSlots:
    """Making room in the pairing window, and the per-connection deadlines."""

    admission: Admission
    window_stats: WindowStats
    handshake_timeout: float
    pairing_timeout: float
    pairing_start_timeout: float
    #: connections up, not refused -> whether the peer held a bond when it connected
    _conns: dict[Connection, bool]
    _since: dict[Connection, float]
    _active: Connection | None
    _peers: dict[Connection, Any]
    _spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]]

    @property
    def pairing_open(self) -> bool:
        raise NotImplementedError

    def _make_room(self) -> None:
        """In the pairing window, with every slot for a central without a bond taken, a new
        one takes the slot of one whose pairing failed (it can reach nothing), else of the one
        that has held its slot longest, if that is over ``pairing_timeout / 2``: each
        connection gets that long to pair, and strangers with several radios cannot keep a
        newcomer out by stalling their pairings. (Outside the window a central without a bond
        cannot pair: nothing to make room for.)"""
        if not self.pairing_open or self._active is not None:
            return
        unbonded = [c for c, b in self._conns.items() if not b]
        if len(unbonded) < UNBONDED_SLOTS_IN_WINDOW:
            return
        now = time.monotonic()
        failed = [c for c in unbonded if self._pairing_failed_on(c)]
        victim = min(failed or unbonded, key=lambda c: self._since.get(c, 0.0))
        held = now - self._since.get(victim, 0.0)
        if not failed and held < self.pairing_timeout / 2:
            return
        log.warning("dropping %s: %s, and another central is connecting", victim.peer_address,
                    "its pairing failed" if failed else f"held a slot {held:.0f} s unbonded")
        self._conns.pop(victim, None)
        self._since.pop(victim, None)
        self.admission.failed(str(victim.peer_address))
        self.window_stats.preempted += 1
        self._spawn(self._drop(victim))

    def _pairing_failed_on(self, connection: Connection) -> bool:
        """Its last pairing ended without a strong key and no other has started."""
        state = self._peers.get(connection)
        pairing = getattr(state, "pairing", None)
        return pairing is not None and pairing.done() and getattr(state, "strong", None) is False

    async def _drop(self, connection: Connection) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(connection.disconnect(
                hci.HCI_ErrorCode.CONNECTION_REJECTED_DUE_TO_LIMITED_RESOURCES_ERROR),
                CONTROLLER_TIMEOUT)

    async def _handshake_deadline(self, connection: Connection) -> None:
        """Disconnect ``connection`` unless its HELLO arrives within ``handshake_timeout`` s
        (the time a pairing takes, at most ``pairing_timeout``, is not counted: a person types
        the passkey), or, for a central without a bond, unless it starts to pair or encrypt
        within ``pairing_start_timeout`` s of connecting."""
        start = time.monotonic()
        deadline = start + self.handshake_timeout
        unbonded = not self._conns.get(connection, True)
        while connection in self._conns and connection is not self._active:
            state = self._peers.get(connection)
            if state is not None and state.pairing is not None and not state.pairing.done():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(state.pairing), self.pairing_timeout)
                deadline = time.monotonic() + self.handshake_timeout
                if state.pairing is not None and not state.pairing.done():
                    log.warning("dropping %s: pairing took over %.0f s",
                                connection.peer_address, self.pairing_timeout)
                    self.window_stats.stalled_drops += unbonded
                    break
                continue
            now = time.monotonic()
            idle = (unbonded and (state is None or state.pairing is None)
                    and not connection.encryption)
            if idle and now - start >= self.pairing_start_timeout:
                log.warning("dropping %s: no bond, and no pairing started within %.1f s",
                            connection.peer_address, self.pairing_start_timeout)
                self.window_stats.idle_drops += 1
                break
            if deadline - now <= 0:
                log.warning("dropping %s: no coinf handshake within %.1f s",
                            connection.peer_address, self.handshake_timeout)
                break
            await asyncio.sleep(0.1)
        else:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(connection.disconnect(), CONTROLLER_TIMEOUT)


__all__ = ["CONTROLLER_TIMEOUT", "ServerSlots"]
