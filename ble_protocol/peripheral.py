"""The wearable's GATT server on bumble: advertise, accept one handheld, pair, hand out a Link.

On a Pi it runs over ``hci-socket:0`` (bluetoothd stopped) or a USB dongle (``usb:0``); in tests
and the demo over the emulated radio (``tcp-client:127.0.0.1:PORT``). See docs/PROTOCOL.md.

Reconnection: a :class:`~coinf.ble_protocol.gatt.GattLink` dies with its BLE connection (pending
requests fail with ``LinkClosed``); the server keeps advertising and the next
:meth:`WearableServer.accept` (same device, same bonds) returns a fresh link when a handheld comes
back. :class:`PeripheralConnector` is the ``ble:HCI`` transport of a Session: it owns one server.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
from typing import Any

from bumble import hci
from bumble.core import UUID, AdvertisingData
from bumble.device import Connection, Device
from bumble.gatt import Characteristic, CharacteristicValue, Service
from bumble.keys import JsonKeyStore, MemoryKeyStore
from bumble.pairing import PairingConfig, PairingDelegate
from bumble.transport import open_transport
from coinf.ble_protocol import gatt
from coinf.ble_protocol.gatt import Ctrl, GattLink, check_hello, ctrl_error, ctrl_json, make_hello
from coinf.ble_protocol.link import Link, LinkClosed
from coinf.ble_protocol.messages import PROTOCOL_VERSION, ErrorCode, ProtocolError
from coinf.ble_protocol.tasks import TaskSet
from coinf.ble_protocol.transport import Connector

from coinf.errors import AdapterError, InputError

log = logging.getLogger(__name__)

ENCRYPTED = (
    Characteristic.Permissions.READ_REQUIRES_ENCRYPTION
    | Characteristic.Permissions.WRITE_REQUIRES_ENCRYPTION
)


class WearableServer:
    """One bumble device serving the coinf service to at most one handheld at a time."""

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
    ) -> None:
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
        try:
            self._transport = await open_transport(self.spec)
        except Exception as exc:
            raise LinkClosed(f"cannot open HCI transport {self.spec!r}: {exc}") from None
        device = Device.with_hci(
            self.name,
            hci.Address(self.address, hci.Address.RANDOM_DEVICE_ADDRESS),
            self._transport.source,
            self._transport.sink,
        )
        device.keystore = JsonKeyStore(None, self.keystore) if self.keystore else MemoryKeyStore()
        device.pairing_config_factory = lambda _conn: PairingConfig(
            sc=True,
            mitm=False,  # the wearable has no display or keyboard: LE SC Just Works
            bonding=True,
            delegate=PairingDelegate(PairingDelegate.IoCapability.NO_OUTPUT_NO_INPUT),
        )
        device.gatt_server.max_mtu = self.mtu
        props = Characteristic.Properties
        self.data_up: Characteristic[bytes] = Characteristic(
            gatt.DATA_UP_UUID,
            props.NOTIFY | props.READ,
            ENCRYPTED,
            CharacteristicValue(read=lambda _c: b""),
        )
        self.data_down: Characteristic[bytes] = Characteristic(
            gatt.DATA_DOWN_UUID,
            props.WRITE_WITHOUT_RESPONSE | props.WRITE,
            ENCRYPTED,
            CharacteristicValue(write=self._on_data),
        )
        self.control: Characteristic[bytes] = Characteristic(
            gatt.CONTROL_UUID,
            props.WRITE | props.NOTIFY | props.READ,
            ENCRYPTED,
            CharacteristicValue(read=lambda _c: b"", write=self._on_control),
        )
        device.add_service(Service(gatt.SERVICE_UUID, [self.data_up, self.data_down, self.control]))
        device.on("connection", self._on_connection)
        await device.power_on()
        self.device = device
        await self._advertise()

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
        if self._active is not None:
            log.info("refusing a second handheld %s", connection.peer_address)
            self._spawn(
                connection.disconnect(
                    hci.HCI_ErrorCode.CONNECTION_REJECTED_DUE_TO_LIMITED_RESOURCES_ERROR
                )
            )
            return
        self._active = connection
        connection.on("disconnection", lambda reason: self._on_disconnection(connection, reason))

    def _on_disconnection(self, connection: Connection, reason: int) -> None:
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

        queue = device.host.le_acl_packet_queue or device.host.acl_packet_queue
        limit = self.max_queued_packets

        async def write_data(chunk: bytes) -> None:
            await device.notify_subscriber(connection, data_up, chunk)
            # Keep the host's ACL queue short: ATT responses to the handheld's control writes
            # (which carry its credits) queue behind our data, and a long queue would stall
            # the credit loop. Credits bound memory; this bounds latency.
            while queue is not None and queue.pending > limit and connection is self._active:
                flowed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

                def on_flow(fut: asyncio.Future[None] = flowed) -> None:
                    if not fut.done():
                        fut.set_result(None)

                queue.once("flow", on_flow)
                try:
                    await asyncio.wait_for(flowed, 1.0)
                except TimeoutError:
                    pass
                finally:
                    queue.remove_listener("flow", on_flow)

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


class PeripheralConnector(Connector):
    """The ``ble:HCI`` transport: this wearable's GATT server on one controller. The server is
    started on the first :meth:`connect` and kept (advertising, bonds) until :meth:`aclose`;
    each ``connect`` waits for the next handheld to connect, pair and handshake."""

    def __init__(self, hci_spec: str, *, bundle: Any = None, bundle_identity: str | None = None,
                 **options: Any) -> None:
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

    async def connect(self, timeout: float) -> Link:
        if self._started and self.server.transport_lost:
            log.warning("%s: HCI transport lost; starting the GATT server again", self.spec)
            await self.aclose()
            self.server = self._make()  # bonds live in the keystore file, if one is set
        if not self._started:
            try:
                await self.server.start()
            except LinkClosed as exc:
                if not self._ever_started:  # a wrong spec or no controller: the user must act
                    raise AdapterError(f"{exc} (check the HCI spec after 'ble:')") from None
                raise  # it worked before: the transport is down for now (transient)
            self._started = self._ever_started = True
        try:
            return await self.server.accept(timeout)
        except ProtocolError as exc:
            if exc.code == ErrorCode.TIMEOUT:
                raise LinkClosed(f"no handheld connected within {timeout:.0f} s ({self.hint})"
                                 ) from None
            raise

    async def aclose(self) -> None:
        if self._started:
            self._started = False
            await self.server.close()
