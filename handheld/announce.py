"""A helper announces itself on DNS-SD (``coinf handheld --announce``; docs/PIPELINE.md,
"Discovery"), and may find its pipeline peers the same way.

:class:`Announcer` registers ``NAME._coinf._tcp.local.`` for this helper's TCP listener (its
port, its IPv4 addresses, the TXT record of :func:`coinf.ble_protocol.mdns.txt_record`: name,
bundle identity, protocol version, optional speed) while its ``async with`` block runs, and
unregisters it on the way out (goodbye packets, so browsers forget it at once; Ctrl-C and
SIGTERM leave the block too). Given a :class:`~coinf.handheld.forward.Forwarder` (a helper with
no pipeline config), it also browses for the other helpers serving the same bundle and keeps the
forwarder's peers to them (:meth:`Forwarder.set_peers`), so a wearable that discovered several
helpers can run a pipeline through them. Nothing in a record is trusted beyond what
:mod:`coinf.ble_protocol.mdns` checks: the record carries this helper's TLS fingerprint
(``fp``), a peer is only kept when its fingerprint is pinned here (paired), and every peer link
checks it in the TLS handshake and the bundle in its HELLO.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Sequence
from typing import Any

from coinf.ble_protocol.loopback import parse_address
from coinf.ble_protocol.mdns import (
    SERVICE_TYPE,
    Browser,
    Found,
    open_zeroconf,
    split_paired,
    txt_record,
    zeroconf_module,
)

from coinf.errors import InputError

log = logging.getLogger(__name__)


def announced_addresses(address: str, interfaces: Sequence[str] | None = None) -> list[str]:
    """The IPv4 addresses to announce for a ``tcp:HOST:PORT`` listener: HOST itself (a name is
    resolved), or, for ``0.0.0.0``, the mDNS interfaces' addresses (``interfaces``, else every
    interface's, loopback only when there is nothing else). Not TCP, or IPv6: InputError."""
    try:
        kind, target = parse_address(address)
    except ValueError as exc:
        raise InputError(f"--announce: {exc}") from None
    if kind != "tcp" or not isinstance(target, tuple):
        raise InputError(f"--announce needs a TCP listener (tcp:HOST:PORT), not {address}")
    host = target[0]
    if host in ("", "0.0.0.0"):
        if interfaces:
            return sorted(set(interfaces))
        import ifaddr  # python-zeroconf's own dependency

        ips = sorted({str(ip.ip) for adapter in ifaddr.get_adapters() for ip in adapter.ips
                      if isinstance(ip.ip, str)})
        routable = [ip for ip in ips if not ipaddress.IPv4Address(ip).is_loopback]
        return routable or ips
    try:
        return [str(ipaddress.IPv4Address(host))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError as exc:
        raise InputError(f"--announce: cannot resolve {host!r} to an IPv4 address: "
                         f"{exc.strerror or exc}") from None
    return sorted({str(info[4][0]) for info in infos})


class Announcer:
    """Announces one helper while its ``async with`` block runs (module docstring).

    ``address``: the TCP listener's actual ``tcp:HOST:PORT`` (port 0 resolved);
    ``fingerprint``: its TLS certificate's, announced as ``fp``;
    ``interfaces``: IPv4 addresses of the interfaces mDNS uses (None: all); ``forwarder``: keep
    its peers to the helpers found (``allow``: only those the allow-list names)."""

    def __init__(self, name: str, bundle_identity: str, address: str, *,
                 interfaces: Sequence[str] | None = None, speed_gflops: float | None = None,
                 forwarder: Any = None, allow: Sequence[str] = (),
                 fingerprint: str | None = None) -> None:
        self.name = name
        self.bundle_identity = bundle_identity
        self.txt = txt_record(name, bundle_identity, speed_gflops, fingerprint)
        kind_port = address.rpartition(":")[2]
        self.port = int(kind_port) if kind_port.isdigit() else 0
        if not 0 < self.port < 65536:
            raise InputError(f"--announce: {address} has no port to announce")
        self.addresses = announced_addresses(address, interfaces)
        self.interfaces = list(interfaces or [])
        self.forwarder = forwarder
        self.allow = tuple(allow)
        self.instance = ""  # the registered instance name (zeroconf may rename on a clash)
        self._aiozc: Any = None
        self._info: Any = None
        self._browser: Browser | None = None
        self._updates: set[asyncio.Task[None]] = set()

    @property
    def description(self) -> str:
        return (f"{self.name} on {SERVICE_TYPE.rstrip('.')} at "
                f"{', '.join(self.addresses)} port {self.port}")

    async def __aenter__(self) -> Announcer:
        zc = zeroconf_module("coinf handheld --announce")
        self._aiozc = open_zeroconf(self.interfaces, "coinf handheld --announce")
        try:
            self._info = zc.AsyncServiceInfo(
                SERVICE_TYPE, f"{self.name}.{SERVICE_TYPE}",
                addresses=[socket.inet_aton(ip) for ip in self.addresses], port=self.port,
                properties=self.txt, server=f"coinf-{self.name}.local.")
            await (await self._aiozc.async_register_service(self._info,
                                                            allow_name_change=True))
            self.instance = self._info.name
            if self.forwarder is not None:
                self._browser = Browser(self._aiozc, self.bundle_identity, self.allow,
                                        on_change=self._peers_changed)
                await self._browser.start()
        except BaseException:
            await self._close()
            raise
        log.info("announced %s", self.description)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._close()

    async def _close(self) -> None:
        if self._browser is not None:
            browser, self._browser = self._browser, None
            await browser.aclose()
        for task in list(self._updates):
            task.cancel()
        await asyncio.gather(*self._updates, return_exceptions=True)
        aiozc, self._aiozc = self._aiozc, None
        if aiozc is None:
            return
        try:
            if self._info is not None and self.instance:
                await (await aiozc.async_unregister_service(self._info))
        except Exception as exc:  # the goodbye is best effort: the records expire anyway
            log.warning("could not unregister %s: %s", self.instance, exc)
        finally:
            with contextlib.suppress(Exception):
                await aiozc.async_close()

    def _peers_changed(self, found: Found) -> None:
        from coinf.handheld.forward import Peer

        found = split_paired(found)
        peers = {a.name: Peer(a.name, a.address, fingerprint=a.fingerprint)
                 for a in found.announcements if a.name != self.name}
        if peers == self.forwarder.peers:
            return
        log.info("peers: %s", ", ".join(f"{p.name} at {p.address}" for p in peers.values())
                 or "none")
        task = asyncio.ensure_future(self.forwarder.set_peers(peers))
        self._updates.add(task)
        task.add_done_callback(self._updates.discard)


__all__ = ["Announcer", "announced_addresses"]
