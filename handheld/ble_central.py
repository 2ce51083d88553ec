"""The handheld's GATT central on bleak: scan, connect, pair, subscribe, handshake -> Link.

Runs on the laptop's own stack (BlueZ, CoreBluetooth, WinRT) with ``backend=None``, or on a
bumble host with ``backend=BumbleBleakClient, hci="tcp-client:..."`` (tests, demo). Known traps
handled here:

* BlueZ reports an MTU of 23 until it is acquired: we call the backend's ``_acquire_mtu()``.
* Bulk writes are ``response=False`` (write without response); control writes use responses so
  credits and handshakes are never silently dropped.
* On BlueZ notifications use ``use_start_notify=False`` (AcquireNotify: a socket, not D-Bus).
* Disconnects fail the link (``LinkClosed``); :func:`serve_with_reconnect` reconnects with
  exponential backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from coinf.ble_protocol import gatt
from coinf.ble_protocol.gatt import Ctrl, GattLink, check_hello, ctrl_json, make_hello
from coinf.ble_protocol.link import Link, LinkClosed
from coinf.ble_protocol.messages import PROTOCOL_VERSION, ErrorCode, Message, ProtocolError

log = logging.getLogger(__name__)

_MAC = re.compile(r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$|^[0-9A-Fa-f-]{36}$")


async def _find(
    address_or_name: str | None, scanner_backend: Any, timeout: float, kwargs: dict[str, Any]
) -> Any:
    from bleak import BleakScanner

    if address_or_name is None:
        found = await BleakScanner.find_device_by_filter(
            lambda _d, ad: gatt.SERVICE_UUID in [u.lower() for u in ad.service_uuids],
            timeout=timeout,
            backend=scanner_backend,
            **kwargs,
        )
        what = "a device advertising the coinf service"
    else:
        found = await BleakScanner.find_device_by_name(
            address_or_name, timeout=timeout, backend=scanner_backend, **kwargs
        )
        what = f"a device named {address_or_name!r}"
    if found is None:
        raise LinkClosed(f"scan found no {what} within {timeout:.0f} s")
    return found


def _on_disconnect(link_box: list[GattLink]) -> Callable[[Any], None]:
    def callback(_client: Any) -> None:
        if link_box:
            link_box[0].connection_lost("wearable disconnected")

    return callback


async def connect_link(
    address_or_name: str | None,
    *,
    bundle_identity: str,
    backend: Any = None,
    scanner_backend: Any = None,
    timeout: float = 20.0,
    attempts: int = 3,
    backoff: float = 0.5,
    pair: bool = True,
    mtu: int = gatt.DEFAULT_MTU,
    window: int = gatt.DEFAULT_WINDOW,
    max_message_bytes: int = 64 * 1024 * 1024,
    reassembly_timeout: float = 30.0,
    protocol_version: int = PROTOCOL_VERSION,
    **backend_kwargs: Any,
) -> Link:
    """Connect to the wearable and return a handshaken :class:`GattLink`.

    ``address_or_name``: a MAC/UUID address, an advertised name, or None (first device
    advertising the coinf service). Extra keyword arguments go to the bleak backend (e.g.
    ``hci=...`` for :class:`~ble_protocol.bleak_bumble.BumbleBleakClient`). Connection attempts
    are retried ``attempts`` times with exponential backoff; handshake errors are not retried.
    """
    from bleak import BleakClient

    if backend is not None and scanner_backend is None:
        from coinf.ble_protocol.bleak_bumble import BumbleBleakClient, BumbleBleakScanner

        if issubclass(backend, BumbleBleakClient):
            scanner_backend = BumbleBleakScanner
    target: Any = address_or_name
    last: Exception | None = None
    for attempt in range(max(1, attempts)):
        if attempt:
            await asyncio.sleep(min(backoff * 2 ** (attempt - 1), 8.0))
        try:
            if address_or_name is None or not _MAC.match(address_or_name):
                target = await _find(address_or_name, scanner_backend, timeout, backend_kwargs)
            link_box: list[GattLink] = []
            client = BleakClient(
                target,
                backend=backend,
                timeout=timeout,
                pair=pair,
                disconnected_callback=_on_disconnect(link_box),
                **backend_kwargs,
            )
            await client.connect()
            break
        except LinkClosed as exc:
            last = exc
        except Exception as exc:  # bleak raises BleakError, TimeoutError, OSError...
            last = exc
            log.info("connect attempt %d failed: %s", attempt + 1, exc)
    else:
        raise LinkClosed(f"cannot connect to {address_or_name or 'a wearable'}: {last}")

    try:
        return await _handshake(
            client,
            link_box,
            bundle_identity,
            mtu,
            window,
            max_message_bytes,
            reassembly_timeout,
            protocol_version,
            timeout,
        )
    except BaseException:
        with contextlib.suppress(Exception):
            await client.disconnect()
        raise


async def _handshake(
    client: Any,
    link_box: list[GattLink],
    bundle_identity: str,
    mtu: int,
    window: int,
    max_message_bytes: int,
    reassembly_timeout: float,
    protocol_version: int,
    timeout: float,
) -> GattLink:
    from bleak import BleakError

    backend = getattr(client, "_backend", None)
    acquire = getattr(backend, "_acquire_mtu", None)  # BlueZ: MTU is 23 until acquired
    if acquire is not None:
        with contextlib.suppress(Exception):
            await acquire()
    negotiated = min(mtu, int(client.mtu_size))
    services = client.services
    data_up = services.get_characteristic(gatt.DATA_UP_UUID)
    data_down = services.get_characteristic(gatt.DATA_DOWN_UUID)
    control = services.get_characteristic(gatt.CONTROL_UUID)
    if data_up is None or data_down is None or control is None:
        raise ProtocolError(ErrorCode.MALFORMED, "peer does not expose the coinf GATT service")
    reply: asyncio.Future[tuple[Ctrl, Any]] = asyncio.get_running_loop().create_future()

    # The wearable may send chunks and credits right after its HELLO_ACK, before this task has
    # resumed and built the link: keep them (at most one window) and replay them in order.
    early: list[tuple[bool, bytes]] = []

    def on_control(_char: Any, value: bytearray) -> None:
        if link_box:
            link_box[0].feed_control(bytes(value))
        elif not reply.done():
            try:
                reply.set_result(gatt.parse_ctrl(bytes(value)))
            except ProtocolError as exc:
                reply.set_exception(exc)
        elif len(early) <= 2 * window:
            early.append((False, bytes(value)))

    def on_data(_char: Any, value: bytearray) -> None:
        if link_box:
            link_box[0].feed_data(bytes(value))
        elif reply.done() and len(early) <= 2 * window:
            early.append((True, bytes(value)))

    bluez = {"use_start_notify": False}
    try:
        await client.start_notify(control, on_control, bluez=bluez)
        await client.start_notify(data_up, on_data, bluez=bluez)
        hello = make_hello(
            bundle_identity, negotiated, window, max_message_bytes, protocol_version, "handheld"
        )
        await client.write_gatt_char(control, ctrl_json(Ctrl.HELLO, hello), response=True)
    except BleakError as exc:
        text = str(exc)
        code = (
            ErrorCode.INSUFFICIENT_ENCRYPTION
            if "encrypt" in text.lower() or "authentic" in text.lower()
            else ErrorCode.DISCONNECTED
        )
        raise ProtocolError(code, f"handshake write failed: {text}") from None
    try:
        kind, body = await asyncio.wait_for(reply, timeout)
    except TimeoutError:
        raise ProtocolError(ErrorCode.TIMEOUT, f"no handshake reply within {timeout} s") from None
    if kind == Ctrl.ERROR:
        raise body
    if kind != Ctrl.HELLO_ACK:
        raise ProtocolError(ErrorCode.MALFORMED, f"expected HELLO_ACK, got {kind.name}")
    peer_mtu, peer_window, peer_max = check_hello(body, bundle_identity, protocol_version)

    async def write_data(chunk: bytes) -> None:
        await client.write_gatt_char(data_down, chunk, response=False)

    async def write_control(frame: bytes) -> None:
        await client.write_gatt_char(control, frame, response=True)

    link = GattLink(
        role="handheld",
        mtu=min(negotiated, peer_mtu),
        peer_window=peer_window,
        peer_max_message_bytes=peer_max,
        write_data=write_data,
        write_control=write_control,
        disconnect=client.disconnect,
        window=window,
        max_message_bytes=max_message_bytes,
        reassembly_timeout=reassembly_timeout,
        name=f"ble:{client.address}",
    )
    link.bleak_client = client  # type: ignore[attr-defined]
    link_box.append(link)
    for is_data, value in early:
        (link.feed_data if is_data else link.feed_control)(value)
    early.clear()
    if not client.is_connected:
        link.connection_lost("wearable disconnected during the handshake")
    return link


async def serve_with_reconnect(
    address_or_name: str | None,
    handler: Callable[[Message], Awaitable[Message | None]],
    *,
    bundle_identity: str,
    max_backoff: float = 30.0,
    stop: asyncio.Event | None = None,
    **opts: Any,
) -> None:
    """Connect, serve RPC until the link drops, reconnect with exponential backoff; forever
    (or until ``stop`` is set). Handshake mismatches (BAD_VERSION, BUNDLE_MISMATCH) are raised."""
    from coinf.ble_protocol.rpc import serve

    delay = 0.5
    while stop is None or not stop.is_set():
        try:
            link = await connect_link(address_or_name, bundle_identity=bundle_identity, **opts)
        except ProtocolError as exc:
            if exc.code in (ErrorCode.BAD_VERSION, ErrorCode.BUNDLE_MISMATCH):
                raise
            log.warning("wearable unreachable (%s); retrying in %.1f s", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_backoff)
            continue
        delay = 0.5
        try:
            await serve(link, handler)
        finally:
            await link.close()
