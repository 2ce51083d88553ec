"""Opening links from one spec string, like bumble's ``open_transport("tcp-client:...")``.

A :class:`Connector` is how one side obtains links to its peer, again after a drop: a per-instance
async context manager (``async with open_connector(spec) as c: link = await c.connect(5.0)``)
that owns whatever it opened (a socket, a GATT server on a controller, an in-process handheld)
and releases it on :meth:`Connector.aclose`.

Specs (the implementation is imported only when its scheme is used):

=========================  ==============================================================
``tcp:HOST:PORT``          a ``coinf handheld`` daemon listening on TCP, over TLS 1.3 with
                           pinned certificates (:mod:`coinf.ble_protocol.tls`)
``tcp+insecure:HOST:PORT`` the same in plain TCP (tests, loopback; needs ``allow_insecure=True``)
``unix:/path``             the same on a unix socket (plain: one machine)
``ble:HCI``                this wearable's GATT server on a bumble HCI transport
                           (``ble:hci-socket:0`` on a Pi, ``ble:usb:0``,
                           ``ble:tcp-client:127.0.0.1:PORT`` of ``coinf radio``)
``inprocess``              a handheld daemon in this process (tests, demos, benchmarks)
=========================  ==============================================================

More schemes come from the ``coinf.connectors`` entry-point group (``inprocess`` is one: the
handheld package provides it, so this package never imports the handheld's).
"""

from __future__ import annotations

import asyncio
import importlib
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from importlib.metadata import entry_points
from typing import Any

from coinf.ble_protocol.link import Link

from coinf.errors import InputError, LinkClosed

LinkFactory = Callable[[], Awaitable[Link]]

#: Built-in schemes -> "module:class" (imported on first use).
_BUILTIN = {
    "tcp": "coinf.ble_protocol.transport:SocketConnector",
    "tcp+insecure": "coinf.ble_protocol.transport:SocketConnector",
    "unix": "coinf.ble_protocol.transport:SocketConnector",
    "ble": "coinf.ble_protocol.ble_transport:PeripheralConnector",
}
ENTRY_POINT_GROUP = "coinf.connectors"


class Connector(ABC):
    """Obtains links to one peer. ``connect`` may be called again after a link dropped."""

    spec: str = ""
    #: What to check when no link comes (appended to the timeout error).
    hint: str = ""
    #: Links come to this side (a BLE peripheral: the peer reconnects, this side only waits);
    #: a :class:`~coinf.wearable.connection.Connection` then waits for the next one in the
    #: background instead of retrying after a backoff.
    passive: bool = False

    @abstractmethod
    async def connect(self, timeout: float) -> Link:
        """A fresh, open link within ``timeout`` seconds, else :class:`~coinf.errors.LinkError`
        (the attempt is cancelled, nothing is left running)."""

    async def aclose(self) -> None:  # noqa: B027 - most connectors hold nothing
        """Release what this connector holds (servers, devices, in-process peers)."""

    @property
    def description(self) -> str:
        return self.spec or type(self).__name__

    async def __aenter__(self) -> Connector:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class SocketConnector(Connector):
    """``tcp:HOST:PORT`` (TLS), ``tcp+insecure:HOST:PORT`` or ``unix:/path`` of a ``coinf
    handheld`` daemon. Options: ``fingerprint`` (``sha256:...``: the helper's pinned
    certificate; default: any paired peer's), ``tls`` (True, False: plain, or a
    :class:`~coinf.ble_protocol.tls_store.TlsStore`; default: the device's store) and
    ``allow_insecure`` (plain TCP, ``tcp+insecure:`` or ``tls=False``, is refused without it;
    with it, each connector logs a WARNING when made)."""

    def __init__(self, spec: str, *, bundle: Any = None, fingerprint: str | None = None,
                 tls: Any = None, allow_insecure: bool = False, **options: Any) -> None:
        from coinf.ble_protocol.loopback import parse_address
        from coinf.ble_protocol.tls import is_plain_tcp, resolve_store, warn_insecure
        from coinf.ble_protocol.tls_store import parse_fingerprint

        _no_options(spec, options)
        try:
            parse_address(spec)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        self.spec = spec
        self.store = resolve_store(spec, tls, allow_insecure)
        if is_plain_tcp(spec, tls):
            warn_insecure(spec, "connector to")
        self.fingerprint = parse_fingerprint(fingerprint) if fingerprint is not None else None
        if self.fingerprint is not None and self.store is None:
            raise InputError(f"{spec}: a fingerprint is checked on TLS links (tcp:HOST:PORT)")
        self.hint = f"is `coinf handheld --listen {spec}` running?"

    async def connect(self, timeout: float) -> Link:
        from coinf.ble_protocol.loopback import dial_socket

        return await dial_socket(self.spec, timeout, self.store, self.fingerprint)


class FactoryConnector(Connector):
    """Links from a caller's ``async def factory() -> Link``."""

    def __init__(self, factory: LinkFactory) -> None:
        self._factory = factory
        self.spec = getattr(factory, "__name__", "link factory")

    async def connect(self, timeout: float) -> Link:
        return await self._factory()


class LinkConnector(Connector):
    """A link the caller opened; it cannot be re-opened once it dropped."""

    def __init__(self, link: Link) -> None:
        self._link = link
        self.spec = link.description

    async def connect(self, timeout: float) -> Link:
        if not self._link.is_open:
            raise LinkClosed(f"{self._link.description} is closed and cannot be reopened")
        return self._link

    async def aclose(self) -> None:
        await self._link.close()


def schemes() -> dict[str, str]:
    """Every known scheme -> its implementation (``module:attribute``)."""
    found = dict(_BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.value)
    return found


def open_connector(spec: Any, **options: Any) -> Connector:
    """A :class:`Connector` for ``spec``: a spec string (module docstring), a :class:`Link`, an
    async link factory, or a Connector (returned as is). ``options`` go to the implementation,
    which refuses the ones it does not know; every implementation accepts ``bundle`` (the
    bundle this side serves or runs, for handshakes and in-process peers)."""
    if isinstance(spec, Connector):
        return spec
    if not isinstance(spec, str):
        options.pop("bundle", None)
        _no_options(repr(spec), options)
        if isinstance(spec, Link):
            return LinkConnector(spec)
        if callable(spec):
            return FactoryConnector(spec)
        raise InputError(f"a transport is a spec string, a Link or an async link factory, "
                         f"got {type(spec).__name__}")
    scheme, _, rest = spec.partition(":")
    known = schemes()
    target = known.get(scheme)
    if target is None:
        raise InputError(f"unknown transport {spec!r}: expected one of "
                         f"{', '.join(f'{s}:...' if s != 'inprocess' else s for s in known)}")
    module, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    return cls(spec if scheme in ("tcp", "tcp+insecure", "unix") else rest, **options)


def _no_options(spec: str, options: dict[str, Any]) -> None:
    if options:
        raise InputError(f"transport {spec!r} takes no options, got {sorted(options)}")


async def connect_within(connector: Connector, timeout: float) -> Link:
    """``connector.connect`` bounded by ``timeout``: on expiry the attempt is cancelled and a
    transient :class:`~coinf.errors.LinkError` (TIMEOUT) is raised."""
    from coinf.errors import ErrorCode, ProtocolError

    try:
        async with asyncio.timeout(timeout):
            return await connector.connect(timeout)
    except TimeoutError:
        hint = f" ({connector.hint})" if connector.hint else ""
        raise ProtocolError(ErrorCode.TIMEOUT, f"{connector.description}: no link within "
                            f"{timeout:.1f} s{hint}") from None
