"""The ``ble:HCI`` link scheme of :func:`~coinf.ble_protocol.transport.open_connector`: this
wearable's GATT server (:class:`~coinf.ble_protocol.peripheral.WearableServer`) on one bumble HCI
transport, restarted when the transport is lost."""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

from coinf.ble_protocol.link import Link, LinkClosed
from coinf.ble_protocol.messages import ErrorCode, ProtocolError
from coinf.ble_protocol.peripheral import WearableServer
from coinf.ble_protocol.transport import Connector

from coinf.errors import AdapterError, InputError

log = logging.getLogger(__name__)


class PeripheralConnector(Connector):
    """The ``ble:HCI`` transport: this wearable's GATT server on one controller. The server is
    started on the first :meth:`connect` and kept (advertising, bonds) until :meth:`aclose`;
    each ``connect`` waits for the next handheld to connect, pair and handshake (``passive``:
    the handheld reconnects by itself; this side can only wait for it).

    Until a first link is made, failed pairings end the wait with
    :class:`~coinf.errors.PairingError` when the pairing window closes without a new bond, or at
    the first one when the window is closed and no bond is held (``accept(window_rule=True)``;
    a stranger's failed pairing never ends it while the window is open); ``pairing_failures=N``
    also ends it at the N-th failure of any central. Once linked, no failed pairing ends a
    wait."""

    passive = True

    def __init__(self, hci_spec: str, *, bundle: Any = None, bundle_identity: str | None = None,
                 pairing_failures: int | None = None, **options: Any) -> None:
        if not hci_spec:
            raise InputError("transport 'ble:' needs an HCI transport: ble:hci-socket:0, "
                             "ble:usb:0 or ble:tcp-client:HOST:PORT (coinf radio)")
        identity = bundle_identity or (bundle.identity if bundle is not None else None)
        if identity is None:
            raise InputError("the ble transport needs the bundle (its identity is checked in "
                             "the handshake)")
        known = set(inspect.signature(WearableServer.__init__).parameters) - {
            "self", "transport_spec", "bundle_identity"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise InputError(f"unknown ble transport option {unknown[0]!r}; expected one of "
                             f"{sorted(known)}")
        self.spec = f"ble:{hci_spec}"
        self.hint = ("is `coinf handheld --transport ble` running, in range (or on the same "
                     "`coinf radio`), and paired with this wearable?")
        self._make = functools.partial(WearableServer, hci_spec, bundle_identity=identity,
                                       **options)
        self.server = self._make()
        self._started = self._ever_started = False
        self.pairing_failures = pairing_failures
        self._linked = False

    async def connect(self, timeout: float) -> Link:
        if self._started and self.server.transport_lost:
            log.warning("%s: HCI transport lost; starting the GATT server again", self.spec)
            await self.aclose()
            self.server = self._make()  # bonds live in the keystore file, if one is set
        if not self._started:
            try:
                await self.server.start()
            except (AdapterError, LinkClosed) as exc:
                if not self._ever_started:  # a wrong spec or no controller: the user must act
                    raise AdapterError(f"{exc} (check the HCI spec after 'ble:')") from None
                # it worked before: the transport is down for now (transient)
                raise LinkClosed(str(exc)) from None
            self._started = self._ever_started = True
        try:
            first = not self._linked
            link = await self.server.accept(
                timeout, pairing_failures=self.pairing_failures if first else None,
                window_rule=first)
            self._linked = True
            return link
        except ProtocolError as exc:
            if exc.code == ErrorCode.TIMEOUT:
                raise LinkClosed(f"no handheld connected within {timeout:.0f} s ({self.hint})"
                                 ) from None
            raise

    async def aclose(self) -> None:
        if self._started:
            self._started = False
            await self.server.close()
