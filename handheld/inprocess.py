"""The ``inprocess`` transport: a handheld daemon in this process, behind an in-process link.

Registered as the ``inprocess`` scheme of :func:`coinf.ble_protocol.transport.open_connector`
through the ``coinf.connectors`` entry point, so the wearable never imports this package. With a
:class:`~coinf.ble_protocol.shaped.Channel` the link has that bandwidth and latency.
"""

from __future__ import annotations

from coinf.ble_protocol.link import Link
from coinf.ble_protocol.loopback import InProcessLink
from coinf.ble_protocol.shaped import Channel, ShapedLink
from coinf.ble_protocol.transport import Connector
from coinf.device.emulation import DeviceEmulation
from coinf.device.profile import DeviceProfile
from coinf.handheld.daemon import HandheldDaemon

from coinf.bundle import Bundle
from coinf.errors import InputError


class InProcessConnector(Connector):
    """Each :meth:`connect` has the daemon serve the other end of a fresh link (a task the
    daemon keeps); :meth:`aclose` closes the daemon, which cancels them."""

    def __init__(self, rest: str = "", *, bundle: Bundle | None = None,
                 channel: Channel | None = None, slowdown: float = 1.0, threads: int = 0,
                 daemon: HandheldDaemon | None = None, runtime: str = "onnxruntime",
                 profile: DeviceProfile | None = None) -> None:
        if rest:
            raise InputError(f"transport 'inprocess' takes nothing after it, got {rest!r}")
        if daemon is None and bundle is None:
            raise InputError("the inprocess transport needs the bundle its handheld serves")
        self.spec = "inprocess" if channel is None else f"inprocess ({channel})"
        self.channel = channel
        self.daemon = daemon or HandheldDaemon(bundle, DeviceEmulation(slowdown, threads),  # type: ignore[arg-type]
                                               profile=profile, runtime=runtime)
        self.links = 0

    async def connect(self, timeout: float) -> Link:
        ours: Link
        theirs: Link
        if self.channel is not None:
            ours, theirs = ShapedLink.pair(self.channel)
        else:
            ours, theirs = InProcessLink.pair()
        self.daemon.start(theirs)
        self.links += 1
        return ours

    async def aclose(self) -> None:
        await self.daemon.aclose()

