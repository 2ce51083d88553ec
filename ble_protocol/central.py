"""The handheld's GATT central on bleak: scan, connect, pair, subscribe, handshake -> Link.

:class:`Central` runs on the laptop's own stack (BlueZ, CoreBluetooth, WinRT) by default, or on a
bumble host (``hci="tcp-client:..."``, which the central opens and closes, or ``host=`` a
:class:`~coinf.ble_protocol.bleak_bumble.BumbleHost` the caller owns) for tests and the demo::

    async with Central("coinf-wearable", bundle_identity=bundle.identity) as central:
        link = await central.connect()
        # or, forever with backoff: await central.serve_with_reconnect(daemon.serve)

:class:`~coinf.ble_protocol.central_listener.CentralListener` (the ``ble`` / ``ble:HCI`` scheme of
:func:`~coinf.ble_protocol.listen.open_listener`) hands out its links. Known traps handled here:

* BlueZ reports an MTU of 23 until it is acquired: we call the backend's ``_acquire_mtu()``.
* Bulk writes are ``response=False`` (write without response); control writes use responses so
  credits and handshakes are never silently dropped.
* On BlueZ notifications use ``use_start_notify=False`` (AcquireNotify: a socket, not D-Bus).
* Disconnects fail the link (``LinkClosed``); :meth:`Central.serve_with_reconnect` and the
  listener reconnect with exponential backoff.
* Whether a failed handshake write is worth retrying is decided from typed fields of the
  error (the ATT code of the bumble backend, the D-Bus error name on BlueZ), never its text.
* A wearable that is not there (yet) is retried; a local adapter or stack that cannot be used
  at all (no adapter, no BlueZ on the D-Bus system bus, an HCI transport that does not open) is
  :class:`~coinf.errors.AdapterError` at once (:func:`adapter_fault`).
* A failed pairing is classified (:func:`~coinf.ble_protocol.bleak_errors.pairing_failure`) and
  ends in :class:`~coinf.errors.PairingError`: at once when retrying cannot help
  (:data:`FINAL_PAIRING_FAILURES`), else after ``pairing_attempts`` failed pairings in a row.
* Mutual authentication (bumble host): a peer whose pairing gives no MITM protection is refused
  before any GATT write; once the host holds a strong bond, a name or ``None`` target is looked
  for among the bonded identities only (the identity address, or a resolvable private address
  that a bonded IRK resolves), so an impostor advertising the wearable's name is never
  connected to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from coinf.ble_protocol import gatt
from coinf.ble_protocol.acl_pacing import MAX_QUEUED_PACKETS, AclPacer
from coinf.ble_protocol.bleak_errors import (
    adapter_fault,
    classify_bleak_error,
    pairing_failure,
)
from coinf.ble_protocol.gatt import Ctrl, GattLink, check_hello, ctrl_json, make_hello
from coinf.ble_protocol.link import Link, LinkClosed
from coinf.ble_protocol.messages import PROTOCOL_VERSION, ErrorCode, ProtocolError
from coinf.ble_protocol.scan import MAC as _MAC
from coinf.ble_protocol.scan import find as _find
from coinf.ble_protocol.tasks import TaskSet

from coinf.errors import AdapterError, InputError, PairingError, PairingFailure

if TYPE_CHECKING:
    from coinf.ble_protocol.bleak_bumble import BumbleHost

log = logging.getLogger(__name__)

#: Handshake faults that reconnecting does not mend: the user must fix the setup.
FATAL_CODES = frozenset({
    ErrorCode.BAD_VERSION,
    ErrorCode.BUNDLE_MISMATCH,
    ErrorCode.INSUFFICIENT_ENCRYPTION,  # PairingError too
})

#: Pairing failures that no retry mends (the user must act): the central stops at the first.
FINAL_PAIRING_FAILURES = frozenset({
    PairingFailure.WINDOW_CLOSED,
    PairingFailure.WEAK,
    PairingFailure.UNAUTHENTICATED_PEER,
    PairingFailure.NO_PASSKEY,
    PairingFailure.BOND_LOST,
    PairingFailure.REPEATED_ATTEMPTS,
})
#: Failed pairings in a row after which any other failure (a wrong passkey, a timeout) is final
PAIRING_ATTEMPTS = 3


class Central:
    """Connects this handheld, as a GATT central, to one wearable; hands out :class:`GattLink`
    objects. An async context manager: leaving it closes the links it made and the bumble host
    it opened (``hci=``), and cancels every task it started.

    ``target``: a MAC/UUID address, an advertised name, or None (the first device advertising
    the coinf service). ``hci``: open a bumble host on this HCI transport spec; ``host``: use
    this open :class:`~coinf.ble_protocol.bleak_bumble.BumbleHost` (the caller closes it);
    neither: bleak's default backend (the OS stack), or ``backend``. ``own_address`` and
    ``keystore`` configure the host opened for ``hci``, and ``passkey`` (the wearable's passkey,
    a number or an async callable; see :mod:`~coinf.ble_protocol.bleak_bumble`). Extra keyword
    arguments go to the bleak backend. Connection attempts are retried ``attempts`` times with
    exponential backoff; handshake errors are not retried; a pairing failure is final at once
    (:data:`FINAL_PAIRING_FAILURES`) or after ``pairing_attempts`` in a row
    (:class:`~coinf.errors.PairingError`).
    """

    def __init__(
        self,
        target: str | None = "coinf-wearable",
        *,
        bundle_identity: str,
        hci: str | None = None,
        host: BumbleHost | None = None,
        own_address: str | None = None,
        keystore: str | None = None,
        passkey: Any = None,
        backend: Any = None,
        scanner_backend: Any = None,
        timeout: float = 20.0,
        attempts: int = 3,
        pairing_attempts: int = PAIRING_ATTEMPTS,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        pair: bool = True,
        mtu: int = gatt.DEFAULT_MTU,
        window: int = gatt.DEFAULT_WINDOW,
        max_message_bytes: int = 64 * 1024 * 1024,
        reassembly_timeout: float = 30.0,
        protocol_version: int = PROTOCOL_VERSION,
        **backend_kwargs: Any,
    ) -> None:
        if hci is not None and host is not None:
            raise InputError("give the central hci= (it opens a host) or host=, not both")
        if (own_address is not None or keystore is not None or passkey is not None) and hci is None:
            raise InputError("own_address, keystore and passkey configure the host opened for "
                             "hci= (on the OS stack its Bluetooth agent asks for the passkey)")
        self.target = target
        self.bundle_identity = bundle_identity
        self.hci = hci
        self.host = host
        self._own_host = hci is not None
        self._host_options: dict[str, Any] = {
            k: v
            for k, v in (("address", own_address), ("keystore", keystore), ("passkey", passkey))
            if v is not None
        }
        self.backend = backend
        self.scanner_backend = scanner_backend
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.pairing_attempts = max(1, pairing_attempts)
        self._pairing_failures = 0  # failed pairings in a row, over connect() calls
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.pair = pair
        self.mtu = mtu
        self.window = window
        self.max_message_bytes = max_message_bytes
        self.reassembly_timeout = reassembly_timeout
        self.protocol_version = protocol_version
        self.backend_kwargs = backend_kwargs
        self._links: set[Link] = set()
        self._tasks = TaskSet()
        self._closed = False
        self._opening = asyncio.Lock()

    @property
    def description(self) -> str:
        spec = self.hci or (self.host.spec if self.host is not None else None)
        where = f"bumble host on {spec}" if spec else "OS stack"
        return f"BLE central to {self.target or 'the coinf service'} ({where})"

    # --- lifetime ----------------------------------------------------------------------------
    async def open(self) -> Central:
        """Open the bumble host (``hci=``); :meth:`connect` does it on first use."""
        if self._closed:
            raise LinkClosed("this central was closed")
        async with self._opening:  # concurrent first connects open one host
            if self._own_host and self.host is None:
                from bleak.exc import BleakError
                from coinf.ble_protocol.bleak_bumble import BumbleHost

                assert self.hci is not None
                host = BumbleHost(self.hci, timeout=self.timeout, **self._host_options)
                try:
                    await host.open()
                except BleakError as exc:  # the transport (adapter, radio) does not open at all
                    raise AdapterError(f"{exc} (check --hci)") from None
                self.host = host
        return self

    async def aclose(self) -> None:
        """Cancel this central's tasks, close the links it made and the host it opened."""
        self._closed = True
        await self._tasks.cancel_all(timeout=10.0)  # a connection attempt unwinds within 5 s
        for link in list(self._links):
            with contextlib.suppress(Exception):
                await link.close()
        self._links.clear()
        if self._own_host and self.host is not None:
            host, self.host = self.host, None
            await host.close()

    async def __aenter__(self) -> Central:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        return self._tasks.spawn(coro)

    def _backends(self) -> tuple[Any, Any, dict[str, Any]]:
        backend, scanner, kwargs = self.backend, self.scanner_backend, dict(self.backend_kwargs)
        if self.host is not None:
            from coinf.ble_protocol.bleak_bumble import BumbleBleakClient, BumbleBleakScanner

            backend = backend or BumbleBleakClient
            scanner = scanner or BumbleBleakScanner
            kwargs["host"] = self.host
        elif backend is not None and scanner is None:
            from coinf.ble_protocol.bleak_bumble import BumbleBleakClient, BumbleBleakScanner

            if issubclass(backend, BumbleBleakClient):
                scanner = BumbleBleakScanner
        return backend, scanner, kwargs

    # --- connecting --------------------------------------------------------------------------
    async def connect(self) -> Link:
        """Connect to the wearable and return a handshaken :class:`GattLink`. Raises
        :class:`LinkClosed` when no attempt connected, :class:`ProtocolError` when the
        handshake failed (``code`` says why; :data:`FATAL_CODES` will not mend by retrying)."""
        await self.open()
        self._links = {link for link in self._links if link.is_open}
        try:
            return await self._spawn(self._connect())
        except asyncio.CancelledError:
            # bumble cancels a pending GATT request when its connection drops (the wearable went
            # away mid-handshake, e.g. while it restarted): that is a lost link, not our own
            # cancellation, and must not end a reconnect loop.
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            raise LinkClosed("the wearable disconnected during connection set-up") from None

    async def _connect(self) -> Link:
        from bleak import BleakClient

        backend, scanner, kwargs = self._backends()
        target: Any = self.target
        last: Exception | None = None
        for attempt in range(self.attempts):
            if attempt:
                await asyncio.sleep(min(self.backoff * 2 ** (attempt - 1), 8.0))
            client = None
            try:
                bonds = await self.host.bonded_peers() if self.host is not None else []
                if self.target is None or not _MAC.match(self.target):
                    target = await _find(self.target, scanner, self.timeout, kwargs, bonds)
                else:  # a bonded identity advertises from resolvable private addresses
                    mine = [b for b in bonds if b[0].upper() == self.target.upper() and b[1]]
                    if mine:
                        target = await _find(None, scanner, self.timeout, kwargs, mine)
                link_box: list[GattLink] = []
                client = BleakClient(
                    target,
                    backend=backend,
                    timeout=self.timeout,
                    pair=self.pair,
                    disconnected_callback=_on_disconnect(link_box),
                    **kwargs,
                )
                # the backend bounds connect, pairing and discovery by ``timeout`` each; this
                # bounds them together, whatever the backend
                async with asyncio.timeout(3 * self.timeout):
                    await client.connect()
                break
            except asyncio.CancelledError:
                if client is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(client.disconnect(), 5.0)
                raise
            except LinkClosed as exc:
                last = exc
            except Exception as exc:  # bleak raises BleakError, TimeoutError, OSError...
                if client is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(client.disconnect(), 5.0)
                self._pairing_failed(exc, target)
                fault = adapter_fault(exc) if self.host is None else None
                if fault is not None:  # retrying cannot help: say so once
                    raise AdapterError(
                        f"{fault}: this machine has no Bluetooth to reach the wearable with "
                        f"(plug in an adapter / start bluetoothd, or use --hci)") from None
                last = exc
                log.info("connect attempt %d failed: %s", attempt + 1, exc)
        else:
            raise LinkClosed(f"cannot connect to {self.target or 'a wearable'}: {last}")

        try:
            link = await _handshake(
                client,
                link_box,
                self.bundle_identity,
                self.mtu,
                self.window,
                self.max_message_bytes,
                self.reassembly_timeout,
                self.protocol_version,
                self.timeout,
            )
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.disconnect(), 5.0)
            raise
        self._pairing_failures = 0
        self._links.add(link)
        return link

    def _pairing_failed(self, exc: BaseException, target: Any) -> None:
        """Count a failed pairing; raise :class:`PairingError` when it is final. Other
        failures return (the caller retries them)."""
        reason = pairing_failure(exc)
        if reason is None:
            return
        self._pairing_failures += 1
        peer = getattr(exc, "peer", None) or str(getattr(target, "address", target))
        log.warning("pairing with %s failed (%s), %d in a row", peer, reason.value,
                    self._pairing_failures)
        if reason in FINAL_PAIRING_FAILURES or self._pairing_failures >= self.pairing_attempts:
            attempts, self._pairing_failures = self._pairing_failures, 0
            raise PairingError(reason, f"{exc} (after {attempts} attempt(s))", peer=peer,
                               attempts=attempts, smp_code=getattr(exc, "smp_code", None)
                               ) from None

    async def serve_with_reconnect(
        self,
        serve: Callable[[Link], Awaitable[Any]],
        *,
        stop: asyncio.Event | None = None,
    ) -> None:
        """Connect, run ``serve(link)`` (e.g. ``daemon.serve``) until the link drops, reconnect
        with exponential backoff; until ``stop`` is set (or this is cancelled). Faults in
        :data:`FATAL_CODES` are raised."""
        stopped = stop or asyncio.Event()
        delay = self.backoff
        loop = asyncio.get_running_loop()
        while not stopped.is_set():
            started = loop.time()
            try:
                link = await _unless(stopped, self.connect())
            except ProtocolError as exc:
                if exc.code in FATAL_CODES:
                    raise
                delay = self._next_delay(delay, loop.time() - started)
                log.warning("wearable unreachable (%s); retrying in %.1f s", exc, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopped.wait(), delay)
                delay = min(delay * 2, self.max_backoff)
                continue
            if link is None:
                return
            delay = self.backoff
            try:
                await _unless(stopped, serve(link))
            finally:
                await link.close()


    def _next_delay(self, delay: float, took: float) -> float:
        """The wait before the next attempt: an attempt that itself waited a scan out is
        followed by the shortest one (the wearable is found the moment it advertises again),
        a quick failure by ``delay`` (which doubles up to ``max_backoff``)."""
        return self.backoff if took >= self.timeout else delay


async def _unless(stop: asyncio.Event, aw: Awaitable[Any]) -> Any:
    """Await ``aw`` unless ``stop`` is set first: then ``aw`` is cancelled and None returned.
    Nothing started here outlives the call."""
    work = asyncio.ensure_future(aw)
    waiter = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait({work, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (work, waiter):
            if not task.done():
                task.cancel()
        await asyncio.gather(work, waiter, return_exceptions=True)
    return work.result() if work in done else None


def _peer_identity(client: Any) -> str:
    """The wearable's address for logs and link names: its identity address when the bumble
    host resolved the resolvable private address it connected to, else the address."""
    conn = getattr(getattr(client, "_backend", None), "_connection", None)
    peer = getattr(conn, "peer_address", None)
    return str(peer) if peer is not None else str(client.address)


def _on_disconnect(link_box: list[GattLink]) -> Callable[[Any], None]:
    def callback(_client: Any) -> None:
        if link_box:
            link_box[0].connection_lost("wearable disconnected")

    return callback


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
    await _acquire_mtu(client, timeout)
    negotiated = min(mtu, int(client.mtu_size))
    data_up, data_down, control = _coinf_characteristics(client)
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

    hello = make_hello(bundle_identity, negotiated, window, max_message_bytes, protocol_version,
                       "handheld")
    await _subscribe_and_hello(client, control, data_up, on_control, on_data, hello, timeout)
    body = await _hello_ack(reply, timeout)
    peer_mtu, peer_window, peer_max = check_hello(body, bundle_identity, protocol_version)

    pacer = _acl_pacer(client)

    async def write_data(chunk: bytes) -> None:
        await client.write_gatt_char(data_down, chunk, response=False)
        if pacer is not None:  # keep the stack's queue short: control frames overtake data
            await pacer.wait_for_room()

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
        name=f"ble:{_peer_identity(client)}",
        heartbeat=gatt.peer_heartbeat(body),
        ack=gatt.peer_ack(body),
    )
    link.bleak_client = client  # type: ignore[attr-defined]
    link_box.append(link)
    for is_data, value in early:
        (link.feed_data if is_data else link.feed_control)(value)
    early.clear()
    if not client.is_connected:
        link.connection_lost("wearable disconnected during the handshake")
    return link


async def _acquire_mtu(client: Any, timeout: float) -> None:
    """On BlueZ, acquire the MTU (it reads 23 until then); best effort, other backends skip."""
    acquire = getattr(getattr(client, "_backend", None), "_acquire_mtu", None)
    if acquire is not None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(acquire(), timeout)


def _coinf_characteristics(client: Any) -> tuple[Any, Any, Any]:
    """The peer's DATA_UP, DATA_DOWN and CONTROL characteristics (MALFORMED if one is missing)."""
    services = client.services
    data_up = services.get_characteristic(gatt.DATA_UP_UUID)
    data_down = services.get_characteristic(gatt.DATA_DOWN_UUID)
    control = services.get_characteristic(gatt.CONTROL_UUID)
    if data_up is None or data_down is None or control is None:
        raise ProtocolError(ErrorCode.MALFORMED, "peer does not expose the coinf GATT service")
    return data_up, data_down, control


async def _subscribe_and_hello(client: Any, control: Any, data_up: Any,
                               on_control: Callable[[Any, bytearray], None],
                               on_data: Callable[[Any, bytearray], None],
                               hello: dict[str, Any], timeout: float) -> None:
    """Subscribe to CONTROL and DATA_UP, then write the HELLO, all within ``timeout``."""
    from bleak import BleakError

    bluez = {"use_start_notify": False}
    try:
        async with asyncio.timeout(timeout):
            await client.start_notify(control, on_control, bluez=bluez)
            await client.start_notify(data_up, on_data, bluez=bluez)
            await client.write_gatt_char(control, ctrl_json(Ctrl.HELLO, hello), response=True)
    except BleakError as exc:
        raise ProtocolError(classify_bleak_error(exc), f"handshake write failed: {exc}") from None
    except TimeoutError:
        raise ProtocolError(ErrorCode.TIMEOUT, f"subscribing and writing the handshake took "
                            f"over {timeout} s") from None


async def _hello_ack(reply: asyncio.Future[tuple[Ctrl, Any]], timeout: float) -> Any:
    """The body of the peer's HELLO_ACK; its ERROR raised, anything else MALFORMED."""
    try:
        kind, body = await asyncio.wait_for(reply, timeout)
    except TimeoutError:
        raise ProtocolError(ErrorCode.TIMEOUT, f"no handshake reply within {timeout} s") from None
    if kind == Ctrl.ERROR:
        raise body
    if kind != Ctrl.HELLO_ACK:
        raise ProtocolError(ErrorCode.MALFORMED, f"expected HELLO_ACK, got {kind.name}")
    return body


def _acl_pacer(client: Any) -> AclPacer | None:
    """A pacer on the ACL packet queue under a bleak client on the bumble backend (None on
    another backend: BlueZ and CoreBluetooth do not show their queue). Without it every data
    chunk the credits allow is queued in the host at once, and a control frame (a PONG, a
    CREDIT) written next waits behind up to a window of them (docs/PROTOCOL.md §5)."""
    conn = getattr(getattr(client, "_backend", None), "_connection", None)
    host = getattr(getattr(conn, "device", None), "host", None)
    queue = getattr(host, "le_acl_packet_queue", None) or getattr(host, "acl_packet_queue", None)
    if queue is None:
        return None
    return AclPacer(queue, MAX_QUEUED_PACKETS, alive=lambda: bool(client.is_connected))


__all__ = ["FATAL_CODES", "FINAL_PAIRING_FAILURES", "PAIRING_ATTEMPTS", "Central",
           "adapter_fault", "classify_bleak_error"]
