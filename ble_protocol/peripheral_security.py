"""The wearable server's pairing and security (docs/PROTOCOL.md, "Pairing and security"): the
pairing window, the passkey, and the check every coinf characteristic and CCCD access applies (an
LE Secure Connections key with MITM protection). :class:`ServerSecurity` is a part of
:class:`~coinf.ble_protocol.peripheral.WearableServer`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from collections.abc import Callable, Coroutine
from typing import Any

from bumble import hci, smp
from bumble.att import ATT_Error, AttributeValueV2
from bumble.att import ErrorCode as AttErrorCode
from bumble.device import Connection, Device
from bumble.gatt import (
    GATT_CLIENT_CHARACTERISTIC_CONFIGURATION_DESCRIPTOR,
    Characteristic,
    Descriptor,
)
from bumble.keys import PairingKeys
from bumble.pairing import PairingDelegate
from coinf.ble_protocol.pairing_guard import FailureWatch, WindowStats
from coinf.ble_protocol.smp_policy import strong_keys

from coinf.errors import InputError

log = logging.getLogger("coinf.ble_protocol.peripheral")

_P = Characteristic.Permissions
#: bumble's own checks (encryption; its ``authenticated`` flag is set by any completed pairing,
#: Just Works included, so :meth:`ServerSecurity._check` adds the real test: the key is an
#: LE Secure Connections key made with MITM protection).
SECURE = (
    _P.READ_REQUIRES_ENCRYPTION
    | _P.WRITE_REQUIRES_ENCRYPTION
    | _P.READ_REQUIRES_AUTHENTICATION
    | _P.WRITE_REQUIRES_AUTHENTICATION
)

#: s a passkey pairing may take, from its start (a person reads and types the passkey; the Core
#: specification's SMP timeout is 30 s too); then the connection is dropped
PAIRING_TIMEOUT = 30.0
#: s a connection whose pairing failed is kept before it is dropped
FAILED_LINGER_S = 0.5


class _WearableDelegate(PairingDelegate):
    """The wearable shows a passkey (DISPLAY_ONLY) and accepts pairing only in the window."""

    def __init__(self, server: ServerSecurity, connection: Connection) -> None:
        super().__init__(PairingDelegate.IoCapability.DISPLAY_OUTPUT_ONLY)
        self.server, self.connection = server, connection

    async def accept(self) -> bool:
        if self.server.pairing_open:
            return True
        log.warning("refusing pairing with %s: the pairing window is closed "
                    "(`coinf wearable pair` opens it)", self.connection.peer_address)
        return False

    async def generate_passkey(self) -> int:
        fixed = self.server.passkey
        return fixed if fixed is not None else secrets.randbelow(1_000_000)

    async def display_number(self, number: int, digits: int) -> None:
        self.server._show_passkey(self.connection, number)


class _PeerState:
    """What the server knows of one connection's security."""

    def __init__(self) -> None:
        self.pairing: asyncio.Future[None] | None = None  # set while a pairing runs
        self.strong: bool | None = None  # None: not yet checked for the current encryption


class ServerSecurity:
    """Pairing window, passkey display and the security check of a wearable server."""

    passkey: int | None
    display_passkey: Callable[[str, int], None] | None
    pairing_timeout: float
    device: Device | None
    bonded: asyncio.Queue[str]
    _pairing_until: float
    _peers: dict[Connection, _PeerState]
    #: identity addresses holding a strong bond (the slot kept for a bonded handheld)
    _bonded_addresses: set[str]
    _spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]]
    _accepted: asyncio.Queue[Any]
    #: failed pairings since the running accept() began, and when they end it
    _watch: FailureWatch
    #: the current (or last) pairing window, every central without a bond together
    window_stats: WindowStats

    async def _load_bonds(self) -> None:
        """The addresses of the strong bonds in the keystore (at start)."""
        device = self.device
        if device is None or device.keystore is None:
            return
        with contextlib.suppress(Exception):
            for address, keys in await device.keystore.get_all():
                if strong_keys(keys):
                    self._bonded_addresses.add(str(address))

    def open_pairing_window(self, seconds: float) -> None:
        """Accept new bonds (passkey pairing) for ``seconds`` (``math.inf``: until closed)."""
        if not seconds > 0:
            raise InputError(f"a pairing window lasts > 0 s, not {seconds!r}")
        self._pairing_until = math.inf if math.isinf(seconds) else time.monotonic() + seconds
        self.window_stats = WindowStats()
        self._watch.window_seen_open = True
        log.info("pairing window open for %s s", seconds)
        self._window_changed(seconds)

    def close_pairing_window(self) -> None:
        self._pairing_until = 0.0
        self._window_changed(0.0)

    def _window_changed(self, seconds: float) -> None:
        """Hook: the window opened for ``seconds`` or closed (0)."""

    @property
    def pairing_open(self) -> bool:
        return time.monotonic() < self._pairing_until

    def _show_passkey(self, connection: Connection, passkey: int) -> None:
        address = str(connection.peer_address)
        if self.display_passkey is not None:
            self.display_passkey(address, passkey)
        elif self.passkey is not None:  # fixed by whoever configured it: they know it
            log.info("pairing with %s using the configured fixed passkey", address)
        else:
            log.warning("pairing with %s: passkey %06d (type it on the handheld)", address,
                        passkey)

    def _state(self, connection: Connection) -> _PeerState:
        state = self._peers.get(connection)
        if state is None:
            state = self._peers[connection] = _PeerState()
        return state

    def _track_security(self, connection: Connection) -> None:
        state = self._state(connection)

        def on_pairing_start() -> None:
            state.strong = False
            if state.pairing is None or state.pairing.done():
                state.pairing = asyncio.get_running_loop().create_future()

        def pairing_ended() -> None:
            if state.pairing is not None and not state.pairing.done():
                state.pairing.set_result(None)

        def on_pairing(keys: PairingKeys) -> None:
            state.strong = strong_keys(keys)
            pairing_ended()
            if state.strong:
                log.info("bonded with %s (LE Secure Connections, passkey)",
                         connection.peer_address)
                self._bonded_addresses.add(str(connection.peer_address))
                self.bonded.put_nowait(str(connection.peer_address))
                self._watch.bonds += 1
                self.window_stats.bonds += 1
            else:  # SecurePairingSession should have refused it: never keep such a bond
                log.warning("pairing with %s gave unauthenticated keys: dropped",
                            connection.peer_address)
                self._spawn(self._forget_and_drop(connection))

        def on_pairing_failure(reason: int) -> None:
            state.strong = False
            pairing_ended()
            try:
                why = smp.ErrorCode(reason).name
            except ValueError:
                why = str(reason)
            log.warning("pairing with %s failed: %s", connection.peer_address, why)
            self._pairing_failed(str(connection.peer_address), reason)
            self._spawn(self._drop_after_failure(connection))

        def on_encryption_change() -> None:
            if state.pairing is None or state.pairing.done():
                state.strong = None  # re-encrypted with a stored key: checked on next access

        connection.on(connection.EVENT_PAIRING_START, on_pairing_start)
        connection.on(connection.EVENT_PAIRING, on_pairing)
        connection.on(connection.EVENT_PAIRING_FAILURE, on_pairing_failure)
        connection.on(connection.EVENT_CONNECTION_ENCRYPTION_CHANGE, on_encryption_change)

    def _pairing_failed(self, address: str, reason: int) -> None:
        """A pairing failed: count it; if it ends the running :meth:`accept` (its
        :class:`~coinf.ble_protocol.pairing_guard.FailureWatch`), that accept fails with
        :class:`~coinf.errors.PairingError`."""
        self.window_stats.pairing_failures += 1
        error = self._watch.failed(address, reason, pairing_open=self.pairing_open,
                                   any_bond=bool(self._bonded_addresses))
        if error is not None:
            self._accepted.put_nowait(error)
            self._watch = FailureWatch()

    async def _drop_after_failure(self, connection: Connection) -> None:
        """A connection whose pairing failed can reach nothing: it goes (after
        :data:`FAILED_LINGER_S`, so that the peer reads the Pairing Failed first) instead of
        holding its slot until the handshake deadline."""
        await asyncio.sleep(FAILED_LINGER_S)
        state = self._peers.get(connection)
        if state is None or state.strong or (state.pairing is not None
                                             and not state.pairing.done()):
            return  # gone already, or pairing again
        with contextlib.suppress(Exception):
            await asyncio.wait_for(connection.disconnect(
                hci.HCI_ErrorCode.AUTHENTICATION_FAILURE_ERROR), 5.0)

    async def _forget_and_drop(self, connection: Connection) -> None:
        self._bonded_addresses.discard(str(connection.peer_address))
        device = self.device
        if device is not None and device.keystore is not None:
            with contextlib.suppress(Exception):
                await device.keystore.delete(str(connection.peer_address))
        with contextlib.suppress(Exception):  # bounded: the controller may never answer
            await asyncio.wait_for(connection.disconnect(
                hci.HCI_ErrorCode.AUTHENTICATION_FAILURE_ERROR), 5.0)

    def _is_secure_now(self, connection: Connection | None) -> bool:
        """Known (without waiting) to be encrypted with a strong key."""
        if connection is None or not connection.encryption:
            return False
        state = self._peers.get(connection)
        return state is not None and state.strong is True

    async def _check(self, connection: Connection | None) -> None:
        """Raise the ATT error for a connection not encrypted with an LE SC, MITM-protected
        key: INSUFFICIENT_ENCRYPTION (pair or encrypt first), INSUFFICIENT_AUTHENTICATION
        (encrypted, but with a key that is not authenticated)."""
        if connection is None:
            raise ATT_Error(AttErrorCode.INSUFFICIENT_ENCRYPTION)
        state = self._state(connection)
        if state.pairing is not None and not state.pairing.done():
            # the peer's first request may overtake the end of pairing on this side
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(state.pairing), self.pairing_timeout)
        if not connection.encryption:
            raise ATT_Error(AttErrorCode.INSUFFICIENT_ENCRYPTION)
        if state.strong is None:
            device = self.device
            keys = None
            if device is not None and device.keystore is not None:
                keys = await device.keystore.get(str(connection.peer_address))
            state.strong = strong_keys(keys)
        if not state.strong:
            log.warning("refusing %s: not encrypted with an authenticated LE Secure "
                        "Connections key", connection.peer_address)
            raise ATT_Error(AttErrorCode.INSUFFICIENT_AUTHENTICATION)

    async def _guard_read(self, connection: Connection | None) -> bytes:
        await self._check(connection)
        return b""

    def _guard_write(
        self, handler: Callable[[Connection, bytes], None]
    ) -> Callable[[Connection, bytes], Any]:
        def write(connection: Connection, value: bytes) -> Any:
            if self._is_secure_now(connection):  # the fast path: no await, order kept
                handler(connection, value)
                return None

            async def checked() -> None:
                await self._check(connection)
                handler(connection, value)

            return checked()

        return write

    def _cccd(self, device: Device, characteristic: Characteristic[bytes]) -> Descriptor:
        """A CCCD that needs the same security as its characteristic (bumble's default one
        lets anybody subscribe)."""
        server = device.gatt_server

        def bearer_connection(bearer: Any) -> Connection | None:
            conn = getattr(bearer, "connection", bearer)
            return conn if isinstance(conn, Connection) else None

        async def read(bearer: Any) -> bytes:
            await self._check(bearer_connection(bearer))
            return server.read_cccd(bearer, characteristic)

        async def write(bearer: Any, value: bytes) -> None:
            await self._check(bearer_connection(bearer))
            server.write_cccd(bearer, characteristic, value)

        return Descriptor(
            GATT_CLIENT_CHARACTERISTIC_CONFIGURATION_DESCRIPTOR,
            SECURE,
            AttributeValueV2(read, write=write),
        )
