"""The wearable's GATT server on bumble: advertise, accept one handheld, pair, hand out a Link.

Security (docs/PROTOCOL.md, "Pairing and security"): LE Secure Connections only, with MITM
protection by passkey entry -- the wearable displays a 6-digit passkey (``display_passkey``, by
default the log), the handheld types it. Legacy pairing, Just Works, OOB and short keys are
refused. New bonds are accepted only while the pairing window is open
(:meth:`WearableServer.open_pairing_window`, ``pairing_window_s``); afterwards only handhelds
holding an authenticated LE SC bond are served. Every coinf characteristic and its CCCD needs
encryption with such a key. A central that has not completed the coinf HELLO within
``handshake_timeout`` seconds (pairing time excluded) is disconnected. ``passkey=`` fixes the
passkey: for tests and scripts only, a real wearable shows a fresh random one each time.

On a Pi it runs over ``hci-socket:0`` (bluetoothd stopped) or a USB dongle (``usb:0``); in tests
and the demo over the emulated radio (``tcp-client:127.0.0.1:PORT``). See docs/PROTOCOL.md.

Reconnection: a :class:`~coinf.ble_protocol.gatt.GattLink` dies with its BLE connection (pending
requests fail with ``LinkClosed``); the server keeps advertising and the next
:meth:`WearableServer.accept` (same device, same bonds) returns a fresh link when a handheld comes
back. :class:`~coinf.ble_protocol.ble_transport.PeripheralConnector` is the ``ble:HCI`` transport
of a Session: it owns one server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from collections.abc import Callable
from typing import Any

from bumble import hci, smp
from bumble.att import ATT_Error, AttributeValueV2
from bumble.att import ErrorCode as AttErrorCode
from bumble.core import UUID, AdvertisingData
from bumble.device import Connection, Device
from bumble.gatt import (
    GATT_CLIENT_CHARACTERISTIC_CONFIGURATION_DESCRIPTOR,
    Characteristic,
    CharacteristicValue,
    Descriptor,
    Service,
)
from bumble.keys import PairingKeys
from bumble.pairing import PairingConfig, PairingDelegate
from bumble.transport import open_transport
from coinf.ble_protocol import gatt
from coinf.ble_protocol.acl_pacing import AclPacer
from coinf.ble_protocol.bonds import open_bond_store
from coinf.ble_protocol.gatt import Ctrl, GattLink, check_hello, ctrl_error, ctrl_json, make_hello
from coinf.ble_protocol.link import Link, LinkClosed
from coinf.ble_protocol.messages import PROTOCOL_VERSION, ErrorCode, ProtocolError
from coinf.ble_protocol.smp_policy import SecurePairingSession, check_passkey, strong_keys
from coinf.ble_protocol.tasks import TaskSet

from coinf.errors import AdapterError, InputError

log = logging.getLogger(__name__)

_P = Characteristic.Permissions
#: bumble's own checks (encryption; its ``authenticated`` flag is set by any completed pairing,
#: Just Works included, so :meth:`WearableServer._check` adds the real test: the key is an
#: LE Secure Connections key made with MITM protection).
SECURE = (
    _P.READ_REQUIRES_ENCRYPTION
    | _P.WRITE_REQUIRES_ENCRYPTION
    | _P.READ_REQUIRES_AUTHENTICATION
    | _P.WRITE_REQUIRES_AUTHENTICATION
)

DEFAULT_HANDSHAKE_TIMEOUT = 5.0  # s from connection (or from the end of pairing) to HELLO
PAIRING_TIMEOUT = 60.0  # s a passkey pairing may take (a person types the passkey)


class _WearableDelegate(PairingDelegate):
    """The wearable shows a passkey (DISPLAY_ONLY) and accepts pairing only in the window."""

    def __init__(self, server: WearableServer, connection: Connection) -> None:
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


class WearableServer:
    """One bumble device serving the coinf service to at most one handheld at a time.

    Pairing options: ``pairing_window_s`` opens the pairing window at :meth:`start` for that many
    seconds (0, the default: only already-bonded handhelds; ``math.inf``: always -- tests);
    ``passkey`` fixes the passkey (tests, scripts; default a fresh random one per pairing);
    ``display_passkey(address, passkey)`` shows it (default: a WARNING log line);
    ``handshake_timeout`` drops a central that has not sent its HELLO in time;
    ``keystore``: the bond store (a JSON file kept 0600 in a 0700 directory; default memory).
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
    ) -> None:
        if not handshake_timeout > 0:
            raise InputError(f"handshake_timeout must be > 0 s, not {handshake_timeout!r}")
        if not pairing_window_s >= 0:
            raise InputError(f"pairing_window_s must be >= 0 s, not {pairing_window_s!r}")
        self.passkey = check_passkey(passkey)
        self.pairing_window_s = pairing_window_s
        self.display_passkey = display_passkey
        self.handshake_timeout = handshake_timeout
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
        self._active: Connection | None = None
        self._link: GattLink | None = None
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
        await device.power_on()
        self.device = device
        if self.pairing_window_s > 0:
            self.open_pairing_window(self.pairing_window_s)
        await self._advertise()

    # --- pairing and security ---------------------------------------------------------------
    def open_pairing_window(self, seconds: float) -> None:
        """Accept new bonds (passkey pairing) for ``seconds`` (``math.inf``: until closed)."""
        if not seconds > 0:
            raise InputError(f"a pairing window lasts > 0 s, not {seconds!r}")
        self._pairing_until = math.inf if math.isinf(seconds) else time.monotonic() + seconds
        log.info("pairing window open for %s s", seconds)

    def close_pairing_window(self) -> None:
        self._pairing_until = 0.0

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
                self.bonded.put_nowait(str(connection.peer_address))
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

        def on_encryption_change() -> None:
            if state.pairing is None or state.pairing.done():
                state.strong = None  # re-encrypted with a stored key: checked on next access

        connection.on(connection.EVENT_PAIRING_START, on_pairing_start)
        connection.on(connection.EVENT_PAIRING, on_pairing)
        connection.on(connection.EVENT_PAIRING_FAILURE, on_pairing_failure)
        connection.on(connection.EVENT_CONNECTION_ENCRYPTION_CHANGE, on_encryption_change)

    async def _forget_and_drop(self, connection: Connection) -> None:
        device = self.device
        if device is not None and device.keystore is not None:
            with contextlib.suppress(Exception):
                await device.keystore.delete(str(connection.peer_address))
        with contextlib.suppress(Exception):
            await connection.disconnect(hci.HCI_ErrorCode.AUTHENTICATION_FAILURE_ERROR)

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
                await asyncio.wait_for(asyncio.shield(state.pairing), PAIRING_TIMEOUT)
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

    async def _advertise(self) -> None:
        assert self.device is not None
        adv = bytes(
            AdvertisingData(
                [
                    (AdvertisingData.FLAGS, bytes([0x06])),
                    (AdvertisingData.COMPLETE_LOCAL_NAME, self.name.encode()[:20]),
                ]
            )
        )
        scan_rsp = bytes(
            AdvertisingData(
                [
                    (
                        AdvertisingData.COMPLETE_LIST_OF_128_BIT_SERVICE_CLASS_UUIDS,
                        bytes(UUID(gatt.SERVICE_UUID).to_bytes()),
                    )
                ]
            )
        )
        await self.device.start_advertising(
            auto_restart=True,
            advertising_data=adv,
            scan_response_data=scan_rsp,
            advertising_interval_min=20,
            advertising_interval_max=20,
        )

    async def close(self) -> None:
        await self._tasks.cancel_all()
        if self._link is not None:
            await self._link.close()
        if self.device is not None:
            with contextlib.suppress(Exception):
                await self.device.power_off()
        if self._transport is not None:
            with contextlib.suppress(Exception):
                await self._transport.close()

    # --- connection lifecycle ------------------------------------------------------------
    def _on_connection(self, connection: Connection) -> None:
        # bumble restarts advertising from this connection's disconnection event; with the
        # HCI transport gone that fails: a log line, not a stray traceback
        connection.on("error", lambda exc: log.info("%s: bumble: %s", self.spec, exc))
        if self._active is not None:
            log.info("refusing a second handheld %s", connection.peer_address)
            self._spawn(
                connection.disconnect(
                    hci.HCI_ErrorCode.CONNECTION_REJECTED_DUE_TO_LIMITED_RESOURCES_ERROR
                )
            )
            return
        self._active = connection
        self._track_security(connection)
        connection.on("disconnection", lambda reason: self._on_disconnection(connection, reason))
        self._spawn(self._handshake_deadline(connection))

    async def _handshake_deadline(self, connection: Connection) -> None:
        """Disconnect ``connection`` unless its HELLO arrives within ``handshake_timeout`` s
        (the time a pairing takes is not counted: a person types the passkey)."""
        deadline = time.monotonic() + self.handshake_timeout
        while connection is self._active and self._link is None:
            state = self._peers.get(connection)
            if state is not None and state.pairing is not None and not state.pairing.done():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(state.pairing), PAIRING_TIMEOUT)
                deadline = time.monotonic() + self.handshake_timeout
                if state.pairing is not None and not state.pairing.done():
                    break  # pairing stalled: drop it
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await asyncio.sleep(min(left, 0.1))
        else:
            return
        if connection is self._active and self._link is None:
            log.warning("dropping %s: no coinf handshake within %.1f s", connection.peer_address,
                        self.handshake_timeout)
            with contextlib.suppress(Exception):
                await connection.disconnect()

    def _on_disconnection(self, connection: Connection, reason: int) -> None:
        self._peers.pop(connection, None)
        if connection is not self._active:
            return
        self._active = None
        link, self._link = self._link, None
        if link is not None:
            link.connection_lost(f"handheld disconnected ({hci.HCI_Constant.error_name(reason)})")

    # --- GATT writes -----------------------------------------------------------------------
    def _on_data(self, connection: Connection, value: bytes) -> None:
        if connection is self._active and self._link is not None:
            self._link.feed_data(bytes(value))

    def _on_control(self, connection: Connection, value: bytes) -> None:
        if connection is not self._active:
            return
        if self._link is not None:
            self._link.feed_control(bytes(value))
            return
        try:
            kind, body = gatt.parse_ctrl(bytes(value))
            if kind != Ctrl.HELLO:
                raise ProtocolError(ErrorCode.MALFORMED, f"expected HELLO, got {kind.name}")
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
            flushed=pacer.flushed,
        )
        self._link = link
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
                await device.notify_subscriber(
                    connection, self.control, ctrl_error(exc.code, exc.text)
                )
            await asyncio.sleep(0.2)
            with contextlib.suppress(Exception):
                await connection.disconnect()

        self._spawn(tell_and_drop())
        self._accepted.put_nowait(exc)

    @property
    def transport_lost(self) -> bool:
        """True once the HCI transport under this server is gone (controller unplugged, the
        radio process died): the server must be started again on a new transport."""
        terminated = getattr(getattr(self._transport, "source", None), "terminated", None)
        return terminated is not None and terminated.done()

    async def accept(self, timeout: float | None = None) -> Link:
        """Wait for a handheld to connect, pair, subscribe and complete the handshake. Raises
        :class:`LinkClosed` at once if the HCI transport is lost meanwhile."""
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
