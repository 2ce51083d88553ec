"""Where the handheld gets its links from: one spec string, like bumble's ``open_transport``.

A :class:`Listener` is a per-instance async context manager that yields incoming links::

    async with open_listener("tcp:127.0.0.1:7878") as links:
        async for link in links:
            daemon.start(link)

Specs (the implementation is imported only when its scheme is used):

=========================  ==============================================================
``tcp:HOST:PORT``          wearables connect to this TCP port (port 0: any free port)
``unix:/path``             the same on a unix socket
``ble``                    connect as a GATT central to the wearable, on this machine's
                           Bluetooth stack (bleak's default backend); reconnect with backoff
``ble:HCI``                the same on a bumble host on that HCI transport
                           (``ble:tcp-client:127.0.0.1:PORT`` of ``coinf radio``, ``ble:usb:0``)
=========================  ==============================================================

Options go to the implementation, which refuses the ones it does not know: the BLE listener
needs ``bundle_identity`` and takes ``name`` (the wearable's name or address, default
``coinf-wearable``) and the options of :class:`~coinf.ble_protocol.central.Central`; the socket
listeners take ``max_links`` (connections served at once, default 16).

The consumer owns each link it receives and closes it when done (a link that failed is released
too); the listener then takes the next connection (BLE: reconnects). Leaving the listener
closes the links it handed out and everything it opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import stat
from abc import ABC, abstractmethod
from collections.abc import Coroutine
from typing import Any

from coinf.ble_protocol.link import Link
from coinf.ble_protocol.messages import Message
from coinf.ble_protocol.tasks import TaskSet

from coinf.errors import InputError, LinkClosed, ProtocolError

log = logging.getLogger(__name__)

#: scheme -> "module:class", imported on first use
SCHEMES = {
    "tcp": "coinf.ble_protocol.listen:SocketListener",
    "unix": "coinf.ble_protocol.listen:SocketListener",
    "ble": "coinf.ble_protocol.central:CentralListener",
}
ACCEPTED = "tcp:HOST:PORT, unix:/path, ble or ble:HCI"


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
    listener: Listener = cls(spec if scheme in ("tcp", "unix") else rest, **options)
    return listener


class HeldLink(Link):
    """A link a listener handed out. Closing it, or its failing, releases it: the listener's
    connection handler (socket) returns, or the BLE listener reconnects. Other attributes of
    the underlying link (``bleak_client``, ``chunk_size``...) read through."""

    def __init__(self, inner: Link) -> None:
        super().__init__()
        self.inner = inner
        self.stats = inner.stats
        self.max_message_bytes = inner.max_message_bytes
        self.released = asyncio.Event()

    def _check(self) -> None:
        if not self.inner.is_open:
            self.released.set()

    async def send(self, message: Message) -> None:
        try:
            await self.inner.send(message)
        except ProtocolError:
            self._check()
            raise

    async def receive(self) -> Message:
        try:
            return await self.inner.receive()
        except ProtocolError:
            self._check()
            raise

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

    def _offer(self, link: Link) -> HeldLink:
        """Queue ``link`` for :meth:`accept`; returns the wrapper whose ``released`` event says
        when the consumer is done with it."""
        held = HeldLink(link)
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
        item = await self._incoming.get()
        if isinstance(item, BaseException):
            self._incoming.put_nowait(item)  # every later accept fails the same way
            raise item
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


class SocketListener(Listener):
    """``tcp:HOST:PORT`` or ``unix:/path``: an asyncio server (:func:`serve_socket`); each
    connection is one link. At most ``max_links`` links are out at once: a connection beyond
    that is closed at once. A stale unix socket file is replaced, and removed on close."""

    def __init__(self, spec: str, *, max_links: int = 16, **options: Any) -> None:
        from coinf.ble_protocol.loopback import parse_address

        super().__init__()
        if options:
            raise InputError(
                f"unknown option {sorted(options)[0]!r} for listener {spec!r}: it takes max_links"
            )
        if max_links < 1:
            raise InputError(f"max_links must be >= 1, got {max_links}")
        self.max_links = max_links
        self.refused = 0
        try:
            self._kind, self._target = parse_address(spec)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        self.spec = spec
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self._made_path: str | None = None

    @property
    def address(self) -> str:
        """The spec actually listened on (``tcp:...:0`` becomes the port the OS chose)."""
        sockets = getattr(self._server, "sockets", None)  # an asyncio.Server's, once bound
        if self._kind == "tcp" and sockets:
            host, port = sockets[0].getsockname()[:2]
            return f"tcp:{host}:{port}"
        return self.spec

    @property
    def description(self) -> str:
        return self.address

    async def _open(self) -> None:
        from coinf.ble_protocol.loopback import serve_socket

        if self._kind == "unix":
            path = str(self._target)
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISSOCK(os.stat(path).st_mode):
                    os.unlink(path)  # left by a daemon that did not exit cleanly
        try:
            self._server = await serve_socket(self.spec, self._on_link)
        except OSError as exc:
            raise InputError(f"cannot listen on {self.spec}: {exc.strerror or exc}") from None
        if self._kind == "unix":
            self._made_path = str(self._target)

    async def _on_link(self, link: Link) -> None:
        """Runs in the server's task for one connection: hand the link out, wait until the
        consumer released it (serve_socket then closes it)."""
        if len(self._connections) >= self.max_links:
            self.refused += 1
            log.warning("%s: refused a connection, %d links are out (max_links)",
                        self.description, len(self._connections))
            return  # serve_socket closes it
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        held = self._offer(link)
        try:
            await held.released.wait()
        finally:
            self._forget(held)
            if task is not None:
                self._connections.discard(task)

    async def _release(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        if self._connections:  # released by aclose: each closes its socket and returns
            _, late = await asyncio.wait(list(self._connections), timeout=5.0)
            for task in late:
                task.cancel()
            if late:
                await asyncio.gather(*late, return_exceptions=True)
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5.0)
        if self._made_path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._made_path)
            self._made_path = None


__all__ = ["ACCEPTED", "SCHEMES", "HeldLink", "Listener", "SocketListener", "open_listener"]
