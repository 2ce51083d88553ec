"""A bleak backend running on a bumble host, so bleak's real API runs without Bluetooth hardware.

A :class:`BumbleHost` owns one bumble :class:`~bumble.device.Device` on one HCI transport; give
it to bleak's client and scanner like any backend option. Whoever opens the host closes it::

    async with BumbleHost("tcp-client:127.0.0.1:7001") as host:
        device = await BleakScanner.find_device_by_name(
            "coinf-wearable", backend=BumbleBleakScanner, host=host)
        client = BleakClient(device, backend=BumbleBleakClient, host=host)

Scanners and successive clients (reconnections) on one host share its device and bond store.
ATT errors reach bleak users as :class:`BumbleATTError`, which carries the ATT error code.

Pairing (``pair=True``): with a stored LE Secure Connections bond for the peer the link is just
encrypted with it; otherwise the host pairs with LE Secure Connections and MITM protection,
typing the passkey the wearable displays (a keyboard-only device): ``passkey=`` gives it (a
number, for tests and scripts, or an async callable asked at pairing time, e.g. a prompt).
Keys that are not authenticated SC keys (a peer that forced Just Works or legacy pairing) are
discarded and the pairing fails. Every pairing failure is a :class:`BumblePairingError` whose
``pairing_failure`` says why (:class:`~coinf.errors.PairingFailure`); keys are never logged.
:meth:`BumbleHost.bonded_peers` lists the identities (address, IRK) of the strong bonds, which a
:class:`~coinf.ble_protocol.central.Central` reconnects to instead of any device of that name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from bleak.backends.characteristic import BleakGATTCharacteristic
from bleak.backends.client import BaseBleakClient, NotifyCallback
from bleak.backends.descriptor import BleakGATTDescriptor
from bleak.backends.device import BLEDevice
from bleak.backends.scanner import AdvertisementData, BaseBleakScanner
from bleak.backends.service import BleakGATTService, BleakGATTServiceCollection
from bleak.exc import BleakError
from bumble import hci, smp
from bumble.att import ATT_Error
from bumble.core import AdvertisingData
from bumble.core import ProtocolError as BumbleProtocolError
from bumble.device import Connection, Device, Peer
from bumble.keys import PairingKeys
from bumble.pairing import PairingConfig, PairingDelegate
from bumble.transport import open_transport
from coinf.ble_protocol.bleak_errors import PAIRING_HINTS, smp_failure
from coinf.ble_protocol.bonds import open_bond_store
from coinf.ble_protocol.tasks import TaskSet

from coinf.errors import PairingFailure

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "C0:F1:00:00:00:02"

#: What the host types when the wearable shows a passkey: a number, or an async callable
#: returning one (None: refuse).
Passkey = int | Callable[[], Awaitable[int | None]] | None


def _strong(keys: PairingKeys | None) -> bool:
    """An LE Secure Connections key made with MITM protection (see smp_policy.strong_keys)."""
    return keys is not None and keys.ltk is not None and bool(keys.ltk.authenticated)


class BumblePairingError(BleakError):
    """A pairing that failed, with why (``pairing_failure``, a
    :class:`~coinf.errors.PairingFailure`), the SMP reason byte if the peer or this side sent
    one (``smp_code``) and the peer's address (``peer``)."""

    def __init__(self, reason: PairingFailure, text: str, *, peer: str,
                 smp_code: int | None = None) -> None:
        super().__init__(f"pairing with {peer} failed: {text}")
        self.pairing_failure = reason
        self.smp_code = smp_code
        self.peer = peer


class _KeyboardDelegate(PairingDelegate):
    """The handheld types the wearable's passkey (KEYBOARD_ONLY: passkey entry, never Just
    Works against a display). ``asked_without`` records that a passkey was asked and none
    was given (the failure is then NO_PASSKEY, not a wrong passkey)."""

    def __init__(self, passkey: Passkey) -> None:
        super().__init__(PairingDelegate.IoCapability.KEYBOARD_INPUT_ONLY)
        self.passkey = passkey
        self.asked_without = False

    async def get_number(self) -> int | None:
        if self.passkey is None:
            log.warning("the wearable asks for a passkey and none was given (passkey=)")
            self.asked_without = True
            return None
        if isinstance(self.passkey, int):
            return self.passkey
        value = await self.passkey()
        if value is None or not 0 <= int(value) <= 999_999:
            self.asked_without = value is None
            return None
        return value


class BumbleHost:
    """One powered-on bumble device on one HCI transport spec (``tcp-client:HOST:PORT`` of the
    emulated radio, ``usb:0``, ``hci-socket:0``...). An async context manager: entering opens the
    transport and powers the device on; leaving disconnects its connections, powers it off and
    closes the transport. ``keystore``: a JSON file to keep bonds in (default: memory; kept 0600
    in a 0700 directory). ``passkey``: what to type when pairing (see the module doc).
    ``timeout`` (10 s) bounds every wait on the transport and the controller outside a
    connection: opening the transport, the controller's answers to the reset and power-on, and
    starting or stopping a scan; on expiry the operation fails with a :class:`BleakError` that
    says so (a :class:`~coinf.ble_protocol.central.Central` reports it as
    :class:`~coinf.errors.AdapterError`)."""

    def __init__(
        self,
        spec: str,
        *,
        address: str = DEFAULT_ADDRESS,
        name: str = "coinf-handheld",
        keystore: str | None = None,
        passkey: Passkey = None,
        timeout: float = 10.0,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 s, got {timeout!r}")
        if passkey is not None and not callable(passkey) and (
            isinstance(passkey, bool) or not isinstance(passkey, int)
            or not 0 <= passkey <= 999_999
        ):
            raise ValueError(f"a passkey is 6 digits (0..999999), not {passkey!r}")
        self.spec = spec
        self.address = address
        self.name = name
        self.keystore = keystore
        self.passkey = passkey
        self.timeout = timeout
        self._device: Device | None = None
        self._transport: Any = None
        self._closed = False
        self._tasks = TaskSet()
        self._opening = asyncio.Lock()
        self._delegates: weakref.WeakKeyDictionary[Connection, _KeyboardDelegate] = (
            weakref.WeakKeyDictionary())

    @property
    def device(self) -> Device:
        """The powered-on device; :class:`BleakError` unless the host is open."""
        if self._device is None:
            state = "closed" if self._closed else "not open"
            raise BleakError(f"bumble host on {self.spec!r} is {state}")
        return self._device

    @property
    def is_open(self) -> bool:
        return self._device is not None

    async def open(self) -> BumbleHost:
        async with self._opening:  # concurrent opens open one device
            return await self._open()

    async def _open(self) -> BumbleHost:
        if self._device is not None:
            return self
        if self._closed:
            raise BleakError(f"bumble host on {self.spec!r} was closed; open a new one")
        try:
            async with asyncio.timeout(self.timeout):
                transport = await open_transport(self.spec)
        except TimeoutError:
            raise BleakError(f"cannot open HCI transport {self.spec!r}: no answer within "
                             f"{self.timeout:g} s") from None
        except Exception as exc:
            raise BleakError(f"cannot open HCI transport {self.spec!r}: {exc}") from None
        try:
            device = Device.with_hci(
                self.name,
                hci.Address(self.address, hci.Address.RANDOM_DEVICE_ADDRESS),
                transport.source,
                transport.sink,
            )
            device.keystore = open_bond_store(self.keystore)
            device.pairing_config_factory = self._pairing_config
            try:
                async with asyncio.timeout(self.timeout):
                    await device.power_on()  # HCI reset, then the controller's features
            except TimeoutError:
                raise BleakError(
                    f"the controller on {self.spec!r} did not answer its reset / power-on within "
                    f"{self.timeout:g} s (is it attached, powered and not used by another "
                    f"host?)") from None
        except BaseException:
            await _close_transport(transport)
            raise
        self._device, self._transport = device, transport
        return self

    def _pairing_config(self, connection: Connection) -> PairingConfig:
        delegate = _KeyboardDelegate(self.passkey)
        self._delegates[connection] = delegate
        return PairingConfig(sc=True, mitm=True, bonding=True,
                             identity_address_type=PairingConfig.AddressType.RANDOM,
                             delegate=delegate)

    def asked_without_passkey(self, connection: Connection) -> bool:
        """Whether the last pairing on ``connection`` asked for a passkey none was given for."""
        delegate = self._delegates.get(connection)
        return delegate is not None and delegate.asked_without

    async def bonded_peers(self) -> list[tuple[str, bytes | None]]:
        """The strong bonds in the store: (identity address, IRK or None) of each peer that
        paired with LE Secure Connections and MITM protection. Never logged."""
        keystore = self.device.keystore
        if keystore is None:
            return []
        return [(str(address), keys.irk.value if keys.irk is not None else None)
                for address, keys in await keystore.get_all() if _strong(keys)]

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        """Run ``coro`` as a task of this host (cancelled on :meth:`close`)."""
        return self._tasks.spawn(coro)

    async def close(self) -> None:
        """Cancel the host's tasks, disconnect every connection of the device, power it off and
        close the transport."""
        device, transport = self._device, self._transport
        self._device, self._transport, self._closed = None, None, True
        # a cancelled connection attempt waits for the controller: bounded here
        await self._tasks.cancel_all(timeout=2.0)
        if device is not None:
            for conn in list(device.connections.values()):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.disconnect(), 2.0)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(device.power_off(), 2.0)
        if transport is not None:
            await _close_transport(transport)

    async def __aenter__(self) -> BumbleHost:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _close_transport(transport: Any) -> None:
    """Close an HCI transport, at most 2 s (a transport whose peer stopped reading could keep
    its close waiting)."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(transport.close(), 2.0)


def _host(kwargs: dict[str, Any]) -> BumbleHost:
    host = kwargs.get("host")
    if not isinstance(host, BumbleHost):
        raise BleakError("the bumble backend needs host=<an open BumbleHost>")
    return host


class BumbleATTError(BleakError):
    """An ATT error response from the peer, with its code (``att_error_code``, e.g. 0x0F
    INSUFFICIENT_ENCRYPTION) so callers classify it without reading the message text."""

    def __init__(self, att_error_code: int, text: str) -> None:
        super().__init__(text)
        self.att_error_code = att_error_code


def _att_error(exc: ATT_Error) -> BumbleATTError:
    """bumble's ATT error as the BleakError bleak users expect, keeping its code."""
    return BumbleATTError(int(exc.error_code), f"ATT error: {exc}")


class BumbleBleakClient(BaseBleakClient):
    """:class:`bleak.backends.client.BaseBleakClient` on a bumble host."""

    def __init__(self, address_or_ble_device: BLEDevice | str, **kwargs: Any) -> None:
        super().__init__(
            address_or_ble_device,
            disconnected_callback=kwargs.pop("disconnected_callback", None),
            timeout=kwargs.pop("timeout", 10.0),
        )
        self._host = _host(kwargs)
        self._want_mtu = int(kwargs.get("mtu", 517))
        self._connection: Connection | None = None
        self._peer: Peer | None = None
        self._subscribers: dict[int, Any] = {}

    @property
    def name(self) -> str:
        return str(self.address)

    @property
    def mtu_size(self) -> int:
        return self._connection.att_mtu if self._connection is not None else 23

    @property
    def is_connected(self) -> bool:
        return self._connection is not None and self._connection.handle in (
            self._connection.device.connections
        )

    async def connect(self, pair: bool, **kwargs: Any) -> None:
        device = self._host.device
        attempt = self._host.spawn(
            device.connect(
                hci.Address(str(self.address), hci.Address.RANDOM_DEVICE_ADDRESS),
                timeout=self._timeout,
            )
        )
        # bumble's own timeout cancels the connection attempt, which a controller may never
        # confirm; do not wait for that (the host keeps the attempt and reaps it on close).
        try:
            done, _ = await asyncio.wait({attempt}, timeout=self._timeout + 1.0)
        except asyncio.CancelledError:
            attempt.cancel()
            raise
        if not done:
            attempt.cancel()
            raise BleakError(f"cannot connect to {self.address}: not reachable (timeout)")
        try:
            self._connection = attempt.result()
        except Exception as exc:
            raise BleakError(f"cannot connect to {self.address}: {exc}") from None
        conn = self._connection
        lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_disconnection(_reason: int) -> None:
            if not lost.done():
                lost.set_result(None)
            self._on_disconnection(conn)

        conn.on("disconnection", on_disconnection)
        try:
            if pair:  # pair() bounds the pairing itself (TIMEOUT); the guard sees a drop
                await self._guard(self.pair(), lost, self._timeout + 1.0)
            await self._guard(self._setup(conn), lost)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.disconnect(), 2.0)
            raise

    async def _setup(self, conn: Connection) -> None:
        self._peer = Peer(conn)
        with contextlib.suppress(Exception):
            await self._peer.request_mtu(self._want_mtu)
        await self._discover()

    async def _guard(self, coro: Any, lost: asyncio.Future[None],
                     timeout: float | None = None) -> None:
        """Run ``coro`` but fail at once if the link drops or ``timeout`` passes (bumble's
        pairing and GATT requests would otherwise wait for their own long timeouts). The work
        is cancelled (and awaited) whenever this returns early or is cancelled."""
        task = asyncio.ensure_future(coro)
        try:
            done, _ = await asyncio.wait(
                {task, lost}, timeout=timeout or self._timeout,
                return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if task in done:
            task.result()
            return
        if lost.done():
            raise BleakError(f"{self.address} disconnected while connecting")
        raise BleakError(f"connection set-up with {self.address} timed out")

    def _on_disconnection(self, conn: Connection) -> None:
        if conn is self._connection:
            self._connection = None
            self._peer = None
            if self._disconnected_callback is not None:
                self._disconnected_callback()

    async def _discover(self) -> None:
        assert self._peer is not None
        collection = BleakGATTServiceCollection()
        for svc in await self._peer.discover_services():
            service = BleakGATTService(svc, svc.handle, str(svc.uuid).lower())
            collection.add_service(service)
            for ch in await svc.discover_characteristics():
                props = [
                    p.name.lower() for p in type(ch.properties) if p.name and p in ch.properties
                ]
                char = BleakGATTCharacteristic(
                    ch,
                    ch.handle,
                    str(ch.uuid).lower(),
                    props,  # type: ignore[arg-type]
                    lambda: self.mtu_size - 3,
                    service,
                )
                collection.add_characteristic(char)
                for d in await ch.discover_descriptors():
                    collection.add_descriptor(
                        BleakGATTDescriptor(d, d.handle, str(d.type).lower(), char)
                    )
        self.services = collection

    async def disconnect(self) -> None:
        conn = self._connection
        if conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.disconnect(), 5.0)

    async def pair(self, *args: Any, **kwargs: Any) -> None:
        """Encrypt with the stored bond if there is an LE SC one, else pair (passkey entry).
        A failure is a :class:`BumblePairingError` that says why; the pairing itself is bounded
        by the client's timeout (then ``TIMEOUT``)."""
        conn = self._connection
        if conn is None:
            raise BleakError("not connected")
        keystore = conn.device.keystore
        address = str(conn.peer_address)
        refused_bond = False
        if keystore is not None and _strong(await keystore.get(address)):
            try:
                await conn.encrypt()
                return
            except Exception as exc:
                if self._connection is not conn:
                    raise BumblePairingError(
                        PairingFailure.BOND_LOST, "the peer refused the stored bond and "
                        "disconnected", peer=address) from None
                log.info("the stored bond with %s was refused (%s); pairing again", address,
                         type(exc).__name__)
                refused_bond = True
        made: list[PairingKeys] = []
        conn.once("pairing", made.append)
        try:
            async with asyncio.timeout(self._timeout):
                await conn.pair()
        except TimeoutError:
            raise BumblePairingError(PairingFailure.TIMEOUT, f"no result within "
                                     f"{self._timeout:g} s", peer=address) from None
        except BumbleProtocolError as exc:
            code = exc.error_code if exc.error_namespace == "smp" else None
            reason = smp_failure(code)
            if self._host.asked_without_passkey(conn):
                reason = PairingFailure.NO_PASSKEY
            elif refused_bond and reason == PairingFailure.WINDOW_CLOSED:
                reason = PairingFailure.BOND_LOST
            name = (smp.ErrorCode(code).name if code is not None
                    and code in smp.ErrorCode._value2member_map_ else str(code))
            raise BumblePairingError(reason, f"{PAIRING_HINTS[reason]} (SMP {name})",
                                     peer=address, smp_code=code) from None
        except Exception as exc:
            raise BumblePairingError(PairingFailure.OTHER, f"{type(exc).__name__}: {exc}",
                                     peer=address) from None
        if not (made and _strong(made[0])):
            if keystore is not None:
                with contextlib.suppress(Exception):
                    await keystore.delete(str(conn.peer_address))
            raise BumblePairingError(
                PairingFailure.UNAUTHENTICATED_PEER, "the peer did not pair with LE Secure "
                "Connections and passkey entry (no MITM protection): "
                + PAIRING_HINTS[PairingFailure.UNAUTHENTICATED_PEER], peer=address)

    async def unpair(self) -> None:
        if self._connection is not None and self._connection.device.keystore is not None:
            with contextlib.suppress(Exception):
                await self._connection.device.keystore.delete(str(self.address))

    def _client(self) -> Any:
        if self._peer is None:
            raise BleakError("not connected")
        return self._peer.gatt_client

    async def read_gatt_char(
        self, characteristic: BleakGATTCharacteristic, **kwargs: Any
    ) -> bytearray:
        try:
            return bytearray(await self._client().read_value(characteristic.obj))
        except ATT_Error as exc:
            raise _att_error(exc) from exc

    async def read_gatt_descriptor(
        self, descriptor: BleakGATTDescriptor, **kwargs: Any
    ) -> bytearray:
        try:
            return bytearray(await self._client().read_value(descriptor.obj))
        except ATT_Error as exc:
            raise _att_error(exc) from exc

    async def write_gatt_char(
        self, characteristic: BleakGATTCharacteristic, data: Any, response: bool
    ) -> None:
        try:
            await self._client().write_value(
                characteristic.obj, bytes(data), with_response=response
            )
        except ATT_Error as exc:
            raise _att_error(exc) from exc

    async def write_gatt_descriptor(self, descriptor: BleakGATTDescriptor, data: Any) -> None:
        try:
            await self._client().write_value(descriptor.obj, bytes(data), with_response=True)
        except ATT_Error as exc:
            raise _att_error(exc) from exc

    async def start_notify(
        self, characteristic: BleakGATTCharacteristic, callback: NotifyCallback, **kwargs: Any
    ) -> None:
        def subscriber(value: bytes) -> None:
            callback(bytearray(value))

        try:
            await self._client().subscribe(characteristic.obj, subscriber, prefer_notify=True)
        except ATT_Error as exc:
            raise _att_error(exc) from exc
        self._subscribers[characteristic.handle] = subscriber

    async def stop_notify(self, characteristic: BleakGATTCharacteristic) -> None:
        sub = self._subscribers.pop(characteristic.handle, None)
        with contextlib.suppress(Exception):
            await self._client().unsubscribe(characteristic.obj, sub)


class BumbleBleakScanner(BaseBleakScanner):
    """:class:`bleak.backends.scanner.BaseBleakScanner` on a bumble host (active scan)."""

    def __init__(
        self,
        detection_callback: Any,
        service_uuids: list[str] | None,
        scanning_mode: str = "active",
        **kwargs: Any,
    ) -> None:
        super().__init__(detection_callback, service_uuids)
        self._host = _host(kwargs)
        self._device: Device | None = None

    async def start(self) -> None:
        self.seen_devices = {}
        self._device = self._host.device
        self._device.on("advertisement", self._on_advertisement)
        try:
            async with asyncio.timeout(self._host.timeout):
                await self._device.start_scanning(active=True, filter_duplicates=False)
        except TimeoutError:
            self._device.remove_listener("advertisement", self._on_advertisement)
            raise BleakError(f"the controller on {self._host.spec!r} did not start scanning "
                             f"within {self._host.timeout:g} s") from None

    async def stop(self) -> None:
        if self._device is not None:
            self._device.remove_listener("advertisement", self._on_advertisement)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._device.stop_scanning(), self._host.timeout)

    def _on_advertisement(self, adv: Any) -> None:
        data: AdvertisingData = adv.data
        name = data.get(AdvertisingData.COMPLETE_LOCAL_NAME) or data.get(
            AdvertisingData.SHORTENED_LOCAL_NAME
        )
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        uuids = [
            str(u).lower()
            for tag in (
                AdvertisingData.COMPLETE_LIST_OF_128_BIT_SERVICE_CLASS_UUIDS,
                AdvertisingData.INCOMPLETE_LIST_OF_128_BIT_SERVICE_CLASS_UUIDS,
            )
            for u in (data.get(tag) or [])
        ]
        address = str(adv.address).split("/")[0]
        prev = self.seen_devices.get(address)
        if prev is not None:
            name = name or prev[1].local_name
            uuids = sorted(set(uuids) | set(prev[1].service_uuids))
        if not self.is_allowed_uuid(uuids):
            return
        ad = AdvertisementData(
            local_name=name,
            manufacturer_data={},
            service_data={},
            service_uuids=uuids,
            tx_power=None,
            rssi=adv.rssi,
            platform_data=(adv,),
        )
        device = self.create_or_update_device(address, address, name, adv, ad)
        self.call_detection_callbacks(device, ad)
