"""The wearable's GATT server on bumble: advertise, accept one handheld, pair, hand out a Link.

Security (docs/PROTOCOL.md, "Pairing and security"): LE Secure Connections only, with MITM
protection by passkey entry -- the wearable displays a 6-digit passkey (``display_passkey``, by
default the log), the handheld types it. Legacy pairing, Just Works, OOB and short keys are
refused. New bonds are accepted only while the pairing window is open
(:meth:`WearableServer.open_pairing_window`, ``pairing_window_s``); afterwards only handhelds
holding an authenticated LE SC bond are served. Every coinf characteristic and its CCCD needs
encryption with such a key (module :mod:`~coinf.ble_protocol.peripheral_security`).
``passkey=`` fixes the passkey: for tests and scripts only, a real wearable shows a fresh random
one each time.

Slots and deadlines (docs/PROTOCOL.md §2): a central that has not completed the coinf HELLO
within ``handshake_timeout`` seconds (pairing time excluded) is disconnected, and a pairing gets
``pairing_timeout`` seconds, and a central without a bond must start pairing within
``pairing_start_timeout``. While no handheld is served, a second connection is kept for a
handheld with a bond (a stranger pairing cannot lock it out) and, in the pairing window, one
more for a central without one; centrals whose connections keep failing are throttled (modules
:mod:`~coinf.ble_protocol.admission`, :mod:`~coinf.ble_protocol.peripheral_slots`). Failed
pairings end :meth:`WearableServer.accept` only as :mod:`~coinf.ble_protocol.pairing_guard`
says; once bonded, the server advertises privately (:mod:`~coinf.ble_protocol.privacy`).

On a Pi it runs over ``hci-socket:0`` (bluetoothd stopped) or a USB dongle (``usb:0``); in tests
and the demo over the emulated radio (``tcp-client:127.0.0.1:PORT``). See docs/PROTOCOL.md.

Reconnection: a :class:`~coinf.ble_protocol.gatt.GattLink` dies with its BLE connection (pending
requests fail with ``LinkClosed``; a link that fails, e.g. a silent peer, drops its connection);
the server advertises again and the next
:meth:`WearableServer.accept` (same device, same bonds) returns a fresh link when a handheld comes
back. :class:`~coinf.ble_protocol.ble_transport.PeripheralConnector` is the ``ble:HCI`` transport
of a Session: it owns one server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from bumble import hci
from bumble.device import Connection, Device
from bumble.gatt import Characteristic, CharacteristicValue, Service
from bumble.pairing import PairingConfig
from bumble.transport import open_transport
from coinf.ble_protocol import gatt
from coinf.ble_protocol.acl_pacing import AclPacer
from coinf.ble_protocol.admission import Admission
from coinf.ble_protocol.bonds import open_bond_store
from coinf.ble_protocol.gatt import Ctrl, GattLink, check_hello, ctrl_error, ctrl_json, make_hello
from coinf.ble_protocol.link import Link, LinkClosed
from coinf.ble_protocol.messages import PROTOCOL_VERSION, ErrorCode, ProtocolError
from coinf.ble_protocol.pairing_guard import FailureWatch, WindowStats
from coinf.ble_protocol.peripheral_security import (
    PAIRING_TIMEOUT,
    SECURE,
    ServerSecurity,
    _PeerState,
    _WearableDelegate,
)
from coinf.ble_protocol.peripheral_slots import CONTROLLER_TIMEOUT, ServerSlots
from coinf.ble_protocol.privacy import (
    RPA_ROTATE_S,
    advertising_payload,
    irk_path,
    local_irk,
    use_address,
)
from coinf.ble_protocol.smp_policy import SecurePairingSession, check_passkey
from coinf.ble_protocol.tasks import TaskSet

from coinf.errors import AdapterError, InputError, PairingError

log = logging.getLogger(__name__)

DEFAULT_HANDSHAKE_TIMEOUT = 5.0  # s from connection (or from the end of pairing) to HELLO
#: s a central without a bond has, from connecting, to start pairing (or encryption)
DEFAULT_PAIRING_START_TIMEOUT = 3.0

__all__ = ["DEFAULT_HANDSHAKE_TIMEOUT", "DEFAULT_PAIRING_START_TIMEOUT", "PAIRING_TIMEOUT",
           "SECURE", "WearableServer"]


class WearableServer(ServerSecurity, ServerSlots):
    """One bumble device serving the coinf service to at most one handheld at a time.

    Pairing options: ``pairing_window_s`` opens the pairing window at :meth:`start` for that many
    seconds (0, the default: only already-bonded handhelds; ``math.inf``: always -- tests);
    ``passkey`` fixes the passkey (tests, scripts; default a fresh random one per pairing);
    ``display_passkey(address, passkey)`` shows it (default: a WARNING log line);
    ``handshake_timeout`` drops a central that has not sent its HELLO in time, and
    ``pairing_timeout`` one whose pairing takes longer, and ``pairing_start_timeout`` a central
    without a bond that has not started to pair (or encrypt) that long after connecting;
    ``keystore``: the bond store (a JSON file kept 0600 in a 0700 directory; default memory).
    ``pairing_only``: a server that only bonds (``coinf wearable pair``): a bonded handheld's
    HELLO is answered with ERROR BUSY ("pairing only"), which the handheld retries later.
    ``private`` (default): once a bond is held and the window is closed, advertise from a fresh
    resolvable private address without name or service UUID (module
    :mod:`~coinf.ble_protocol.privacy`); False: always the static address, name and UUID.
    """

    def __init__(
        self,
        transport_spec: str,
        *,
        bundle_identity: str,
        name: str = "coinf-wearable",
        address: str = "C0:F1:00:00:00:01",
        keystore: str | None = None,
        window: int = gatt.DEFAULT_WINDOW,
        max_message_bytes: int = 64 * 1024 * 1024,
        reassembly_timeout: float = 30.0,
        protocol_version: int = PROTOCOL_VERSION,
        mtu: int = gatt.DEFAULT_MTU,
        max_queued_packets: int = 24,
        passkey: int | None = None,
        pairing_window_s: float = 0.0,
        display_passkey: Callable[[str, int], None] | None = None,
        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
        pairing_timeout: float = PAIRING_TIMEOUT,
        pairing_start_timeout: float = DEFAULT_PAIRING_START_TIMEOUT,
        pairing_only: bool = False,
        private: bool = True,
    ) -> None:
        if not handshake_timeout > 0:
            raise InputError(f"handshake_timeout must be > 0 s, not {handshake_timeout!r}")
        if not pairing_timeout > 0:
            raise InputError(f"pairing_timeout must be > 0 s, not {pairing_timeout!r}")
        if not pairing_start_timeout > 0:
            raise InputError(f"pairing_start_timeout must be > 0 s, not {pairing_start_timeout!r}")
        if not pairing_window_s >= 0:
            raise InputError(f"pairing_window_s must be >= 0 s, not {pairing_window_s!r}")
        self.passkey = check_passkey(passkey)
        self.pairing_window_s = pairing_window_s
        self.display_passkey = display_passkey
        self.handshake_timeout = handshake_timeout
        self.pairing_timeout = pairing_timeout
        self.pairing_start_timeout = pairing_start_timeout
        self.pairing_only = pairing_only
        self.private = private
        self._bonded_addresses: set[str] = set()
        self._watch = FailureWatch()
        self.window_stats = WindowStats()
        self.admission = Admission()
        self._pairing_until = 0.0  # time.monotonic() until which new bonds are accepted
        self._peers: dict[Connection, _PeerState] = {}
        self.bonded: asyncio.Queue[str] = asyncio.Queue()  # peer addresses of new bonds
        self.spec = transport_spec
        self.max_queued_packets = max_queued_packets
        self.bundle_identity = bundle_identity
        self.name = name
        self.address = address
        self.keystore = keystore
        self.window = window
        self.max_message_bytes = max_message_bytes
        self.reassembly_timeout = reassembly_timeout
        self.protocol_version = protocol_version
        self.mtu = mtu
        self.device: Device | None = None
        self._transport: Any = None
        #: connections up, not refused: the served one (``_active``, its link ``_link``) and
        #: those still setting up -> whether the peer held a bond when it connected
        self._conns: dict[Connection, bool] = {}
        self._since: dict[Connection, float] = {}  # when each connection in _conns came
        self._active: Connection | None = None
        self._link: GattLink | None = None
        self._advertising = False
        self._adv_lock = asyncio.Lock()
        self._accepted: asyncio.Queue[GattLink | ProtocolError] = asyncio.Queue()
        self._tasks = TaskSet()  # cancelled on close()
        self._spawn = self._tasks.spawn

    async def __aenter__(self) -> WearableServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- setup -------------------------------------------------------------------------------
    async def start(self) -> None:
        keystore = open_bond_store(self.keystore)  # BondStoreError before touching the radio
        try:
            self._transport = await open_transport(self.spec)
        except Exception as exc:
            raise AdapterError(f"cannot open HCI transport {self.spec!r}: {exc}") from None
        device = Device.with_hci(
            self.name,
            hci.Address(self.address, hci.Address.RANDOM_DEVICE_ADDRESS),
            self._transport.source,
            self._transport.sink,
        )
        device.keystore = keystore
        device.irk = await self._irk(device)  # secret, kept: bonded handhelds resolve with it
        device.pairing_config_factory = lambda conn: PairingConfig(
            sc=True,
            mitm=True,
            bonding=True,
            identity_address_type=PairingConfig.AddressType.RANDOM,  # our static address
            delegate=_WearableDelegate(self, conn),
        )
        device.smp_session_proxy = SecurePairingSession
        device.gatt_server.max_mtu = self.mtu
        props = Characteristic.Properties
        self.data_up: Characteristic[bytes] = Characteristic(
            gatt.DATA_UP_UUID,
            props.NOTIFY | props.READ,
            SECURE,
            CharacteristicValue(read=self._guard_read),
        )
        self.data_up.descriptors = (*self.data_up.descriptors, self._cccd(device, self.data_up))
        self.data_down: Characteristic[bytes] = Characteristic(
            gatt.DATA_DOWN_UUID,
            props.WRITE_WITHOUT_RESPONSE | props.WRITE,
            SECURE,
            CharacteristicValue(write=self._guard_write(self._on_data)),
        )
        self.control: Characteristic[bytes] = Characteristic(
            gatt.CONTROL_UUID,
            props.WRITE | props.NOTIFY | props.READ,
            SECURE,
            CharacteristicValue(read=self._guard_read, write=self._guard_write(self._on_control)),
        )
        self.control.descriptors = (*self.control.descriptors, self._cccd(device, self.control))
        device.add_service(Service(gatt.SERVICE_UUID, [self.data_up, self.data_down, self.control]))
        device.on("connection", self._on_connection)
        # bumble's own background work (e.g. restarting advertising after a disconnection) can
        # fail while the HCI transport is down; that is reported here, not as a stray traceback
        device.on("error", lambda exc: log.info("%s: bumble: %s", self.spec, exc))
        try:
            await asyncio.wait_for(device.power_on(), CONTROLLER_TIMEOUT)
        except Exception as exc:
            with contextlib.suppress(Exception):
                await self._transport.close()
            raise LinkClosed(f"the controller on {self.spec!r} did not start: "
                             f"{exc or type(exc).__name__}") from None
        self.device = device
        await self._load_bonds()
        if self.pairing_window_s > 0:
            self.open_pairing_window(self.pairing_window_s)
        await self._update_advertising()
        self._spawn(self._rotate_address())

    async def _rotate_address(self) -> None:
        """Advertising privately for long, take a new resolvable private address every
        :data:`~coinf.ble_protocol.privacy.RPA_ROTATE_S` (the Core specification's
        recommended 15 min), so that one address does not follow the wearable for hours."""
        while True:
            await asyncio.sleep(RPA_ROTATE_S)
            if self._advertising and not self.shows_identity:
                await self._readvertise()

    async def _irk(self, device: Device) -> bytes:
        """The IRK file's (:func:`~coinf.ble_protocol.privacy.local_irk`); but a store that
        already holds bonds and has no IRK file was made with bumble's address-derived IRK,
        which its handhelds hold: keep that one (they must pair again for a secret one)."""
        if self.keystore is not None and not irk_path(self.keystore).exists():
            with contextlib.suppress(Exception):
                if device.keystore is not None and await device.keystore.get_all():
                    log.warning("%s: bonds made before private advertising use an IRK derived "
                                "from the address: pair the handhelds again to be untrackable",
                                self.keystore)
                    return bytes(device.irk)
        return local_irk(self.keystore)

    def _wants_advertising(self) -> bool:
        """Advertise while no handheld is served, a slot is free and no bonded handheld is
        connecting (the spare slot is kept for a bonded handheld; in the pairing window there is
        one more for a central without a bond)."""
        if self._active is not None or len(self._conns) >= self.admission.slots(
                self.pairing_open):
            return False
        return not any(self._conns.values())

    async def _update_advertising(self) -> None:
        """Start or stop advertising as :meth:`_wants_advertising` says (a failure, e.g. the
        transport is gone, is logged: the next connection event tries again)."""
        async with self._adv_lock:
            device, want = self.device, self._wants_advertising()
            if device is None or want == self._advertising:
                return
            try:
                async with asyncio.timeout(CONTROLLER_TIMEOUT):
                    if want:
                        await self._advertise(device)
                    else:
                        await device.stop_advertising()
                self._advertising = want
            except Exception as exc:
                log.info("%s: cannot %s advertising: %s", self.spec, "start" if want else "stop",
                         exc or type(exc).__name__)

    @property
    def shows_identity(self) -> bool:
        """Whether advertising carries the name and service UUID (and the static address):
        not with ``private`` once a bond is held and the pairing window is closed."""
        return not (self.private and self._bonded_addresses and not self.pairing_open)

    async def _advertise(self, device: Device) -> None:
        show = self.shows_identity
        await use_address(device, private=not show)
        adv, scan_rsp = advertising_payload(self.name, show)
        await device.start_advertising(
            auto_restart=False,  # _update_advertising decides
            advertising_data=adv,
            scan_response_data=scan_rsp,
            advertising_interval_min=20,
            advertising_interval_max=20,
        )

    def _window_changed(self, seconds: float) -> None:
        """The pairing window opened (for ``seconds``) or closed: advertise as it now says,
        and again when it closes by itself."""
        if self.device is None:
            return
        self._spawn(self._readvertise())
        if 0 < seconds < math.inf:
            async def at_close() -> None:
                await asyncio.sleep(seconds)
                await self._readvertise()
            self._spawn(at_close())

    async def _readvertise(self) -> None:
        """Stop advertising (if it does) and start again as :meth:`_wants_advertising` says:
        with the address and payload :attr:`shows_identity` now gives."""
        async with self._adv_lock:
            if self._advertising and self.device is not None:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(CONTROLLER_TIMEOUT):
                        await self.device.stop_advertising()
                self._advertising = False
        await self._update_advertising()

    async def close(self) -> None:
        await self._tasks.cancel_all()
        if self._link is not None:
            await self._link.close()
        if self.device is not None and not self.transport_lost:  # no controller to answer
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.device.power_off(), CONTROLLER_TIMEOUT)
        if self._transport is not None:
            with contextlib.suppress(Exception):
                await self._transport.close()

    # --- connection lifecycle ------------------------------------------------------------
    def _on_connection(self, connection: Connection) -> None:
        # bumble restarts advertising from this connection's disconnection event; with the
        # HCI transport gone that fails: a log line, not a stray traceback
        connection.on("error", lambda exc: log.info("%s: bumble: %s", self.spec, exc))
        self._advertising = False  # a connection ends connectable advertising
        address = str(connection.peer_address)
        bonded = address in self._bonded_addresses
        if not bonded:
            self._make_room()
        others = [(str(c.peer_address), b, c is self._active) for c, b in self._conns.items()]
        why = self.admission.admit(address, bonded, others, self.pairing_open)
        if why is not None:
            log.info("refusing %s: %s", address, why)
            self.window_stats.refused += 1
            self._spawn(self._drop(connection))
        else:
            if not bonded:
                self.window_stats.connections += 1
                self.window_stats.addresses.add(address)
            self._conns[connection] = bonded
            self._since[connection] = time.monotonic()
            self._track_security(connection)
            connection.on("disconnection",
                          lambda reason: self._on_disconnection(connection, reason))
            self._spawn(self._handshake_deadline(connection))
        self._spawn(self._update_advertising())

    def _on_disconnection(self, connection: Connection, reason: int) -> None:
        self._peers.pop(connection, None)
        self._since.pop(connection, None)
        if self._conns.pop(connection, None) is None:
            return
        if connection is self._active:
            self._active = None
            link, self._link = self._link, None
            if link is not None:
                link.connection_lost(
                    f"handheld disconnected ({hci.HCI_Constant.error_name(reason)})")
        else:  # it never completed the handshake
            self.admission.failed(str(connection.peer_address))
        self._spawn(self._update_advertising())

    def _serve(self, connection: Connection, link: GattLink) -> None:
        """``connection`` completed the handshake: it is the served one; the others go."""
        self._active, self._link = connection, link
        self.admission.served(str(connection.peer_address))
        for other in [c for c in self._conns if c is not connection]:
            log.info("dropping %s: %s is served", other.peer_address, connection.peer_address)
            self._spawn(self._drop(other))
        self._spawn(self._update_advertising())

    # --- GATT writes -----------------------------------------------------------------------
    def _on_data(self, connection: Connection, value: bytes) -> None:
        if connection is self._active and self._link is not None:
            self._link.feed_data(bytes(value))

    def _on_control(self, connection: Connection, value: bytes) -> None:
        if connection is self._active:
            if self._link is not None:
                self._link.feed_control(bytes(value))
            return
        if connection not in self._conns or self._active is not None:
            return  # refused, or another handheld is served (this one is being dropped)
        try:
            kind, body = gatt.parse_ctrl(bytes(value))
            if kind != Ctrl.HELLO:
                raise ProtocolError(ErrorCode.MALFORMED, f"expected HELLO, got {kind.name}")
            if self.pairing_only:
                raise ProtocolError(ErrorCode.BUSY, "pairing only (`coinf wearable pair`): "
                                    "this wearable serves once `coinf wearable` runs")
            mtu, peer_window, peer_max = check_hello(
                body, self.bundle_identity, self.protocol_version
            )
        except ProtocolError as exc:
            self._reject(connection, exc)
            return
        mtu = min(mtu, connection.att_mtu, self.mtu)
        device = self.device
        assert device is not None
        data_up, control = self.data_up, self.control

        pacer = AclPacer(
            device.host.le_acl_packet_queue or device.host.acl_packet_queue,
            self.max_queued_packets,
            alive=lambda: connection is self._active,
        )

        async def write_data(chunk: bytes) -> None:
            await device.notify_subscriber(connection, data_up, chunk)
            await pacer.wait_for_room()

        async def write_control(frame: bytes) -> None:
            await device.notify_subscriber(connection, control, frame)

        async def disconnect() -> None:
            if connection is self._active:
                await connection.disconnect()

        link = GattLink(
            role="wearable",
            mtu=mtu,
            peer_window=peer_window,
            peer_max_message_bytes=peer_max,
            write_data=write_data,
            write_control=write_control,
            disconnect=disconnect,
            window=self.window,
            max_message_bytes=self.max_message_bytes,
            reassembly_timeout=self.reassembly_timeout,
            name=f"ble:{connection.peer_address}",
            heartbeat=gatt.peer_heartbeat(body),
            ack=gatt.peer_ack(body),
            flushed=pacer.flushed,
        )
        self._serve(connection, link)
        ack = make_hello(
            self.bundle_identity,
            mtu,
            self.window,
            self.max_message_bytes,
            self.protocol_version,
            role="wearable",
        )

        async def finish() -> None:
            try:
                await write_control(ctrl_json(Ctrl.HELLO_ACK, ack))
            except Exception as exc:
                link.connection_lost(f"handshake failed: {exc}")
                return
            self._accepted.put_nowait(link)

        self._spawn(finish())

    def _reject(self, connection: Connection, exc: ProtocolError) -> None:
        log.warning("handshake with %s failed: %s", connection.peer_address, exc)
        device = self.device
        assert device is not None

        async def tell_and_drop() -> None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(device.notify_subscriber(
                    connection, self.control, ctrl_error(exc.code, exc.text)
                ), CONTROLLER_TIMEOUT)
            await asyncio.sleep(0.2)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.disconnect(), CONTROLLER_TIMEOUT)

        self._spawn(tell_and_drop())
        if not self.pairing_only:  # nobody accepts links from a pairing-only server
            self._accepted.put_nowait(exc)

    @property
    def transport_lost(self) -> bool:
        """True once the HCI transport under this server is gone (controller unplugged, the
        radio process died): the server must be started again on a new transport."""
        terminated = getattr(getattr(self._transport, "source", None), "terminated", None)
        return terminated is not None and terminated.done()

    async def accept(self, timeout: float | None = None, *,
                     pairing_failures: int | None = None, window_rule: bool = False) -> Link:
        """Wait for a handheld to connect, pair, subscribe and complete the handshake. Raises
        :class:`LinkClosed` at once if the HCI transport is lost meanwhile. Failed pairings end
        the wait with :class:`~coinf.errors.PairingError` (instead of waiting out ``timeout``)
        as :class:`~coinf.ble_protocol.pairing_guard.FailureWatch` says: with
        ``pairing_failures=N`` at the N-th of any central; with ``window_rule`` when the
        pairing window closes without a new bond after failures were seen, or at the first
        failure when the window is closed and no bond is held (a stranger's failed pairing
        never ends the wait while the window is open)."""
        self._watch = FailureWatch(pairing_failures, window_rule,
                                   window_seen_open=self.pairing_open)
        kept = [self._accepted.get_nowait() for _ in range(self._accepted.qsize())]
        for item in kept:  # an error of an earlier wait that was reached as it ended
            if not isinstance(item, PairingError):
                self._accepted.put_nowait(item)
        watcher = self._spawn(self._watch_window()) if window_rule else None
        try:
            return await self._accept(timeout)
        finally:
            self._watch = FailureWatch()
            if watcher is not None:
                watcher.cancel()

    async def _watch_window(self) -> None:
        """While ``accept(window_rule=True)`` waits: when the pairing window closes, ask the
        watch whether that ends the wait."""
        watch = self._watch
        while True:
            while not self.pairing_open:
                await asyncio.sleep(0.1)
            watch.window_seen_open = True
            while self.pairing_open:
                await asyncio.sleep(min(0.1, max(0.0, self._pairing_until - time.monotonic())))
            error = watch.window_closed() if watch is self._watch else None
            if error is not None:
                self._accepted.put_nowait(error)
                return

    async def _accept(self, timeout: float | None) -> Link:
        getter = asyncio.ensure_future(self._accepted.get())
        waits: set[asyncio.Future[Any]] = {getter}
        terminated = getattr(getattr(self._transport, "source", None), "terminated", None)
        if terminated is not None:
            waits.add(terminated)
        try:
            done, _ = await asyncio.wait(waits, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
        if getter not in done:
            if terminated is not None and terminated.done():
                raise LinkClosed(f"HCI transport {self.spec!r} was lost")
            raise ProtocolError(
                ErrorCode.TIMEOUT, f"no handheld completed the handshake within {timeout} s"
            )
        item = getter.result()
        if isinstance(item, ProtocolError):
            raise item
        return item
