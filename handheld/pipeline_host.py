"""Helpers of a pipeline hosted in this process, each on its own TCP port (tests, benchmarks).

Each :class:`LocalHelper` is a real :class:`~coinf.handheld.daemon.HandheldDaemon` with the
forward role, behind a real TCP listener; only the process is shared. :meth:`LocalHelper.kill`
makes one vanish mid-stream (its listener and every link it holds close at once), as a crashed
helper would. ``coinf handheld --pipeline CONFIG --name NAME`` runs the same thing as its own
process.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from coinf.ble_protocol.listen import Listener, open_listener
from coinf.ble_protocol.shaped import Channel
from coinf.device.emulation import DeviceEmulation
from coinf.handheld.daemon import HandheldDaemon
from coinf.handheld.forward import Forwarder, Peer

from coinf.bundle import Bundle


@dataclass
class LocalHelper:
    name: str
    address: str
    daemon: HandheldDaemon
    listener: Listener
    serving: Any = field(default=None, repr=False)
    alive: bool = True
    #: a new daemon like the first (:meth:`revive`)
    make: Callable[[], HandheldDaemon] | None = field(default=None, repr=False)

    async def kill(self) -> None:
        """Vanish: stop serving, close every link (peers see them drop)."""
        if not self.alive:
            return
        self.alive = False
        await self.listener.aclose()
        await self.daemon.aclose()

    async def revive(self) -> None:
        """Come back at the same address with a fresh daemon, as a restarted helper would."""
        if self.alive or self.make is None:
            return
        self.listener = open_listener(self.address)
        await self.listener.start()
        self.daemon = self.make()
        self.serving = self.daemon.spawn(self.daemon.serve_listener(self.listener))
        self.alive = True


@contextlib.asynccontextmanager
async def local_helpers(bundle: Bundle, names: Sequence[str],
                        slowdowns: Mapping[str, float] | None = None,
                        channels: Mapping[str, Channel] | None = None, *, threads: int = 1,
                        max_pending: int = 16) -> AsyncIterator[list[LocalHelper]]:
    """Start one helper per name on ``tcp:127.0.0.1:0``; ``channels[name]`` shapes the links
    other helpers open to it. Yields them (with their addresses) and stops them on exit. The
    helpers and the caller's wearable are one machine: for the block, the default TLS store is
    a one-off one that trusts itself (:func:`~coinf.ble_protocol.tls_store.one_machine_env`),
    never the device's own."""
    from coinf.ble_protocol.tls_store import one_machine_env

    slowdowns, channels = dict(slowdowns or {}), dict(channels or {})
    helpers: list[LocalHelper] = []
    with one_machine_env():
        async with _hosting(bundle, names, slowdowns, channels, threads, max_pending,
                            helpers) as hosted:
            yield hosted


@contextlib.asynccontextmanager
async def _hosting(bundle: Bundle, names: Sequence[str], slowdowns: dict[str, float],
                   channels: dict[str, Channel], threads: int, max_pending: int,
                   helpers: list[LocalHelper]) -> AsyncIterator[list[LocalHelper]]:
    try:
        listeners = []
        for _name in names:
            listener = open_listener("tcp:127.0.0.1:0")
            listeners.append(listener)
            await listener.start()
        addresses = {n: lst.description for n, lst in zip(names, listeners, strict=True)}
        for name, listener in zip(names, listeners, strict=True):
            peers = {n: Peer(n, addresses[n], channels.get(n)) for n in names if n != name}
            emulation = DeviceEmulation(slowdowns.get(name, 1.0), threads)

            def make(name: str = name, peers: dict[str, Peer] = peers,
                     emulation: DeviceEmulation = emulation) -> HandheldDaemon:
                forward = Forwarder(bundle, name, peers, emulation=emulation)
                return HandheldDaemon(bundle, emulation, max_pending=max_pending,
                                      forward=forward)

            daemon = make()
            helper = LocalHelper(name, addresses[name], daemon, listener, make=make)
            helper.serving = daemon.spawn(daemon.serve_listener(listener))
            helpers.append(helper)
        yield helpers
    finally:
        for helper in helpers:
            await helper.kill()
        for listener in listeners:
            await listener.aclose()


__all__ = ["LocalHelper", "local_helpers"]
