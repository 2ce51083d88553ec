"""The ``inprocess`` transport: a handheld daemon in this process, behind an in-process link.

Registered as the ``inprocess`` scheme of :func:`coinf.ble_protocol.transport.open_connector`
through the ``coinf.connectors`` entry point, so the wearable never imports this package. With a
:class:`~coinf.ble_protocol.shaped.Channel` the link has that bandwidth and latency.
"""

from __future__ import annotations

import asyncio
import contextlib

from coinf.ble_protocol.link import Link
from coinf.ble_protocol.loopback import InProcessLink
from coinf.ble_protocol.shaped import Channel, ShapedLink
from coinf.ble_protocol.transport import Connector
from coinf.convert.bundle import Bundle
from coinf.device.emulation import DeviceEmulation
from coinf.handheld.daemon import HandheldDaemon

from coinf.errors import InputError


class InProcessConnector(Connector):
    """Each :meth:`connect` starts a daemon task serving the other end of a fresh link; every
    such task is kept and cancelled by :meth:`aclose`."""

    def __init__(self, rest: str = "", *, bundle: Bundle | None = None,
                 channel: Channel | None = None, slowdown: float = 1.0, threads: int = 0,
                 daemon: HandheldDaemon | None = None) -> None:
        if rest:
            raise InputError(f"transport 'inprocess' takes nothing after it, got {rest!r}")
        if daemon is None and bundle is None:
            raise InputError("the inprocess transport needs the bundle its handheld serves")
        self.spec = "inprocess" if channel is None else f"inprocess ({channel})"
        self.channel = channel
        self.daemon = daemon or HandheldDaemon(bundle, DeviceEmulation(slowdown, threads))  # type: ignore[arg-type]
        self.links = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def connect(self, timeout: float) -> Link:
        ours: Link
        theirs: Link
        if self.channel is not None:
            ours, theirs = ShapedLink.pair(self.channel)
        else:
            ours, theirs = InProcessLink.pair()
        task = asyncio.get_running_loop().create_task(self._serve(theirs))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self.links += 1
        return ours

    async def _serve(self, link: Link) -> None:
        try:
            await self.daemon.serve(link)
        finally:
            await link.close()

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._tasks, return_exceptions=True)

