"""Where the handheld gets its links from: one spec string, like bumble's ``open_transport``.

A :class:`Listener` is a per-instance async context manager that yields incoming links::

    async with open_listener("tcp:127.0.0.1:7878") as links:
        async for link in links:
            daemon.start(link)

Specs (the implementation is imported only when its scheme is used):

=========================  ==============================================================
``tcp:HOST:PORT``          wearables connect to this TCP port (port 0: any free port), over
                           TLS 1.3: only the devices of this one's trust store get through
                           (:mod:`coinf.ble_protocol.tls`)
``tcp+insecure:HOST:PORT`` the same in plain TCP, anyone gets through (needs the option
                           ``allow_insecure=True``; each start logs a WARNING)
``unix:/path``             the same on a unix socket (plain: one machine)
``ble``                    connect as a GATT central to the wearable, on this machine's
                           Bluetooth stack (bleak's default backend); reconnect with backoff
``ble:HCI``                the same on a bumble host on that HCI transport
                           (``ble:tcp-client:127.0.0.1:PORT`` of ``coinf radio``, ``ble:usb:0``)
=========================  ==============================================================

Options go to the implementation, which refuses the ones it does not know: the BLE listener
needs ``bundle_identity`` and takes ``name`` (the wearable's name or address, default
``coinf-wearable``) and the options of :class:`~coinf.ble_protocol.central.Central`; the socket
listeners take ``tls`` (tcp: only; True, False or a
:class:`~coinf.ble_protocol.tls_store.TlsStore`; default the device's store),
``allow_insecure`` (plain TCP is refused without it) and the bounds of
:class:`~coinf.ble_protocol.socket_listener.SocketListener`:
``max_links`` (16 connections at once),
``max_links_per_peer`` (4 per source address), ``handshake_timeout`` (5 s to complete the
TLS handshake and the HELLO), ``idle_timeout`` (120 s of silence), ``frame_timeout`` and
``min_rate_bps`` (a frame must move 16 kB/s over every 10 s: slowloris),
``max_message_bytes`` (64 MiB; ``coinf handheld`` gives its bundle's
:func:`~coinf.handheld.daemon.request_bound`), ``max_buffered_bytes`` (12 MiB of incoming
frames over all links at once) and ``handshake_max_bytes`` (64 KiB per frame before the
HELLO_ACK).

The consumer owns each link it receives and closes it when done (a link that failed is released
too); the listener then takes the next connection (BLE: reconnects). Leaving the listener
closes the links it handed out and everything it opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine
from typing import Any

from coinf.ble_protocol.link import Link
from coinf.ble_protocol.messages import Message, MsgType
from coinf.ble_protocol.tasks import TaskSet

from coinf.errors import InputError, LinkClosed, ProtocolError

#: scheme -> "module:class", imported on first use
SCHEMES = {
    "tcp": "coinf.ble_protocol.socket_listener:SocketListener",
    "tcp+insecure": "coinf.ble_protocol.socket_listener:SocketListener",
    "unix": "coinf.ble_protocol.socket_listener:SocketListener",
    "ble": "coinf.ble_protocol.central_listener:CentralListener",
}
ACCEPTED = "tcp:HOST:PORT, tcp+insecure:HOST:PORT, unix:/path, ble or ble:HCI"


def open_listener(spec: str, **options: Any) -> Listener:
    """A :class:`Listener` for ``spec`` (module docstring). Not started: use ``async with``.
    An unknown scheme or option raises :class:`~coinf.errors.InputError`."""
    if not isinstance(spec, str):
        raise InputError(f"a listener spec is a string ({ACCEPTED}), got {type(spec).__name__}")
    scheme, _, rest = spec.partition(":")
    target = SCHEMES.get(scheme)
    if target is None:
        raise InputError(f"unknown listener {spec!r}: expected {ACCEPTED}")
    module, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    listener: Listener = cls(spec if scheme in ("tcp", "tcp+insecure", "unix") else rest,
                             **options)
    return listener


class HeldLink(Link):
    """A link a listener handed out. Closing it, or its failing, releases it: the listener's
    connection handler (socket) returns, or the BLE listener reconnects. Other attributes of
    the underlying link (``bleak_client``, ``chunk_size``...) read through.

    It also keeps what a listener's deadlines look at: ``handshaken`` (a HELLO_ACK went out on
    it), ``last_sent`` and the requests of the peer still waiting for their reply."""

    #: the most in-flight request ids remembered (the consumer bounds them far lower: BUSY)
    MAX_TRACKED = 1024

    def __init__(self, inner: Link) -> None:
        super().__init__()
        self.inner = inner
        self.stats = inner.stats
        self.max_message_bytes = inner.max_message_bytes
        self.released = asyncio.Event()
        self.handshaken = False
        self.last_sent = time.monotonic()
        self._inflight: set[int] = set()
        self._on_handshake: Callable[[], None] | None = None

    @property
    def waiting(self) -> int:
        """Requests received on this link whose reply has not been sent yet."""
        return len(self._inflight)

    def _check(self) -> None:
        if not self.inner.is_open:
            self.released.set()

    async def send(self, message: Message) -> None:
        try:
            await self.inner.send(message)
        except ProtocolError:
            self._check()
            raise
        self.last_sent = time.monotonic()
        self._inflight.discard(message.request_id)
        if message.type == MsgType.HELLO_ACK and not self.handshaken:
            self.handshaken = True
            if self._on_handshake is not None:
                self._on_handshake()

    async def receive(self) -> Message:
        try:
            msg = await self.inner.receive()
        except ProtocolError:
            self._check()
            raise
        if msg.type == MsgType.CANCEL:
            self._inflight.discard(msg.request_id)
        elif msg.type != MsgType.PROBE and len(self._inflight) < self.MAX_TRACKED:
            self._inflight.add(msg.request_id)
        return msg

    async def close(self) -> None:
        try:
            await self.inner.close()
        finally:
            self.released.set()

    @property
    def is_open(self) -> bool:
        return self.inner.is_open

    @property
    def description(self) -> str:
        return self.inner.description

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (during __init__)
            raise AttributeError(name)
        return getattr(self.inner, name)


class Listener(ABC):
    """Yields incoming links (``accept`` or ``async for``). Every task it starts is kept and
    cancelled on :meth:`aclose`, which also closes the links it handed out."""

    spec: str = ""

    def __init__(self) -> None:
        self._incoming: asyncio.Queue[HeldLink | BaseException] = asyncio.Queue()
        self._tasks = TaskSet()
        self._held: set[HeldLink] = set()
        self._started = False
        self._closed = False

    # --- for implementations -------------------------------------------------------------
    @abstractmethod
    async def _open(self) -> None:
        """Bind / open what the listener needs (called once, by :meth:`start`)."""

    async def _release(self) -> None:  # noqa: B027 - most listeners hold nothing more
        """Release what :meth:`_open` opened (called once, by :meth:`aclose`, after the tasks
        were cancelled and the handed-out links closed)."""

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        return self._tasks.spawn(coro)

    def _offer(self, link: Link, held: HeldLink | None = None) -> HeldLink:
        """Queue ``link`` for :meth:`accept` (``held``: its wrapper, made earlier); returns the
        wrapper whose ``released`` event says when the consumer is done with it."""
        held = held if held is not None else HeldLink(link)
        self._held.add(held)
        self._incoming.put_nowait(held)
        return held

    def _forget(self, held: HeldLink) -> None:
        self._held.discard(held)

    def _fail(self, exc: BaseException) -> None:
        """A fault the listener cannot get past: every later :meth:`accept` raises ``exc``."""
        self._incoming.put_nowait(exc)

    # --- for consumers -------------------------------------------------------------------
    @property
    def description(self) -> str:
        return self.spec or type(self).__name__

    async def start(self) -> Listener:
        if self._closed:
            raise LinkClosed(f"listener {self.description} is closed")
        if not self._started:
            self._started = True
            try:
                await self._open()
            except BaseException:
                await self.aclose()
                raise
        return self

    async def accept(self) -> Link:
        """The next incoming link. Raises :class:`~coinf.errors.LinkClosed` once the listener is
        closed, or the fault that stopped it (e.g. BUNDLE_MISMATCH from the wearable)."""
        await self.start()
        while True:
            item = await self._incoming.get()
            if isinstance(item, BaseException):
                self._incoming.put_nowait(item)  # every later accept fails the same way
                raise item
            if not item.released.is_set():  # else: closed (timed out, evicted) while queued
                return item

    def __aiter__(self) -> Listener:
        return self

    async def __anext__(self) -> Link:
        try:
            return await self.accept()
        except LinkClosed:
            if self._closed:
                raise StopAsyncIteration from None
            raise

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._tasks.cancel_all()
        for held in list(self._held):
            with contextlib.suppress(Exception):
                await held.close()
        self._held.clear()
        await self._release()
        while not self._incoming.empty():  # offered but never accepted: already closed above
            self._incoming.get_nowait()
        self._incoming.put_nowait(LinkClosed(f"listener {self.description} closed"))

    async def __aenter__(self) -> Listener:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


__all__ = ["ACCEPTED", "SCHEMES", "HeldLink", "Listener", "open_listener"]
