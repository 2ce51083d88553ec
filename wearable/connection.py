"""The session's link to one helper device: connect once, handshake, back off, come back.

However many frames are in flight, there is at most one link per :class:`Connection`: the first
caller connects while the others wait on the same attempt. A failed exchange marks the helper
offline; while offline, inferences finish on the wearable. How it comes back depends on who
dials:

* a connector that dials (``tcp:``, ``unix:``, in-process): offline for a backoff (0.5 s
  doubling to ``max_backoff_s``); the next request after it reconnects;
* a passive connector (``ble:``, the wearable's GATT server: the handheld reconnects, the
  wearable cannot): the next link is awaited in the background at once, and offline ends the
  moment a handheld has reconnected and handshaken, whatever the backoff. A connector that
  fails at once (its HCI transport is down) is retried every 0.25 s doubling to
  :data:`PASSIVE_RETRY_MAX_S`.

Every wait is bounded and every bound cancels what it waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from coinf.ble_protocol.messages import PROTOCOL_VERSION, MsgType, decode_json, encode_json
from coinf.ble_protocol.negotiate import decodable
from coinf.ble_protocol.rpc import RpcClient
from coinf.ble_protocol.transport import Connector, connect_within

from coinf.errors import LinkClosed, LinkError

log = logging.getLogger(__name__)

OnConnect = Callable[[RpcClient, float], Awaitable[None]]

#: a passive connector that failed at once is asked again after at most this long (s)
PASSIVE_RETRY_MAX_S = 1.0
#: one background wait of a passive connector for its peer (then it waits again)
PASSIVE_WAIT_S = 60.0


class Connection:
    """One helper device behind a :class:`Connector`, with the handshake and offline state."""

    def __init__(
        self,
        connector: Connector,
        bundle_identity: str,
        *,
        connect_timeout: float,
        reconnect_timeout: float,
        request_timeout: float,
        max_backoff_s: float,
        on_connect: OnConnect | None = None,
    ) -> None:
        self.connector = connector
        self.bundle_identity = bundle_identity
        self.connect_timeout = connect_timeout
        self.reconnect_timeout = reconnect_timeout
        self.request_timeout = request_timeout
        self.max_backoff_s = max_backoff_s
        self.on_connect = on_connect
        self.info: dict[str, Any] | None = None  # the helper's HELLO_ACK
        self.rtt_ms = 0.0
        self.links_opened = 0
        self._rpc: RpcClient | None = None
        self._lock: asyncio.Lock | None = None
        self._backoff_s = 0.0
        self._offline_until = 0.0
        self._offline_reason = ""
        #: a passive connector's background wait for the next link (see the module doc)
        self._rejoin: asyncio.Task[None] | None = None
        self.rejoined = 0  # links a passive connector brought back in the background
        self._closed = False

    # -- state ------------------------------------------------------------------------------
    @property
    def passive(self) -> bool:
        """The peer comes to this side (see the module doc); any object with ``connect`` may
        be the connector, so a missing attribute means no."""
        return bool(getattr(self.connector, "passive", False))

    @property
    def rpc_client(self) -> RpcClient | None:
        """The open RPC client, if connected."""
        rpc = self._rpc
        return rpc if rpc is not None and rpc.link.is_open else None

    @property
    def offline(self) -> str | None:
        """Why offloading is paused right now, or None."""
        return self._offline_reason if time.monotonic() < self._offline_until else None

    async def went_offline(self, exc: BaseException, quiet: bool = False) -> None:
        """A transient failure: pause offloading and drop the link; for the next backoff, or
        (passive connector) until the peer has reconnected. ``quiet``: the caller reports it
        (a Session with several links: once per link, not per failure), so log at INFO."""
        if self.passive:
            self._offline_until = math.inf
            self._offline_reason = (f"handheld unavailable ({exc}); resuming as soon as it "
                                    f"reconnects")
        else:
            self._backoff_s = min(max(self._backoff_s * 2, 0.5), self.max_backoff_s)
            self._offline_until = time.monotonic() + self._backoff_s
            self._offline_reason = (f"handheld unavailable ({exc}); retry in "
                                    f"{self._backoff_s:.1f} s")
        log.log(logging.INFO if quiet else logging.WARNING, "offloading paused: %s",
                self._offline_reason)
        rpc, self._rpc = self._rpc, None
        if rpc is not None:  # a link that failed is never reused
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):
                    await rpc.close()
        if self.passive and not self._closed and (
                self._rejoin is None or self._rejoin.done()):
            self._rejoin = asyncio.get_running_loop().create_task(self._wait_for_peer())

    async def _wait_for_peer(self) -> None:
        """A passive connector's next link, in the background: handshake it and leave the
        offline state at once."""
        delay = 0.0
        while not self._closed:
            if delay:
                await asyncio.sleep(delay)
            t0 = time.monotonic()
            try:
                async with self._connecting():
                    rpc = await self._open(PASSIVE_WAIT_S)
            except LinkError as exc:
                quick = time.monotonic() - t0 < 0.5 * PASSIVE_WAIT_S
                delay = min(max(delay * 2, 0.25), PASSIVE_RETRY_MAX_S) if quick else 0.0
                log.info("waiting for the handheld: %s", exc)
                continue
            except Exception as exc:  # never end silently: offline says why
                self._offline_reason = f"handheld unavailable ({type(exc).__name__}: {exc})"
                log.error("waiting for the handheld failed: %s", self._offline_reason)
                delay = PASSIVE_RETRY_MAX_S
                continue
            self._rpc, self._offline_until, self._backoff_s = rpc, 0.0, 0.0
            self.rejoined += 1
            log.info("offloading resumed: the handheld reconnected")
            await self._connected(rpc)
            return

    def succeeded(self) -> None:
        self._backoff_s = 0.0

    # -- connecting -------------------------------------------------------------------------
    async def client(self) -> RpcClient:
        """The open RPC client; connects (once, whatever the concurrency) when there is none.
        A passive connector that was connected before never waits here: its link dropped, so
        the next one is awaited in the background (:meth:`went_offline`) and this raises
        :class:`LinkClosed` at once."""
        rpc = self.rpc_client
        if rpc is not None:
            return rpc
        if self.passive and self.info is not None:
            rejoin = self._rejoin
            if rejoin is None or rejoin.done():
                await self.went_offline(LinkClosed("the link dropped"))
            raise LinkClosed(f"{self.connector.description}: the link dropped; waiting for the "
                             f"handheld to reconnect")
        async with self._connecting():
            rpc = self.rpc_client
            if rpc is not None:
                return rpc
            timeout = (self.connect_timeout if self.links_opened == 0
                       else min(self.connect_timeout, self.reconnect_timeout))
            rpc = await self._open(timeout)
            self._rpc = rpc
        await self._connected(rpc)
        return rpc

    def _connecting(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def _open(self, timeout: float) -> RpcClient:
        """A new link within ``timeout`` and its handshake (within ``connect_timeout``)."""
        stale, self._rpc = self._rpc, None
        if stale is not None:
            await stale.close()
        link = await connect_within(self.connector, timeout)
        self.links_opened += 1
        rpc = RpcClient(link)
        try:
            async with asyncio.timeout(self.connect_timeout):
                await self._handshake(rpc)
        except BaseException as exc:
            await rpc.close()
            if isinstance(exc, TimeoutError):
                raise LinkClosed(f"handshake with {link.description} took over "
                                 f"{self.connect_timeout:.1f} s") from None
            raise
        return rpc

    async def _connected(self, rpc: RpcClient) -> None:
        if self.on_connect is not None:
            try:
                await self.on_connect(rpc, self.request_timeout)
            except LinkError as exc:
                log.info("link probe at connection failed: %s", exc)

    async def _handshake(self, rpc: RpcClient) -> None:
        hello = {
            "protocol": PROTOCOL_VERSION,
            "bundle": self.bundle_identity,
            "role": "wearable",
            "capabilities": ["raw", "packed"],
            "decoders": decodable(),
        }
        t0 = time.perf_counter()
        reply = await rpc.request(MsgType.HELLO, encode_json(hello), self.connect_timeout)
        rtt = (time.perf_counter() - t0) * 1e3
        for _ in range(2):  # the idle round trip: the smallest of a few tiny echoes
            t0 = time.perf_counter()
            await rpc.request(MsgType.PROBE, b"", self.connect_timeout)
            rtt = min(rtt, (time.perf_counter() - t0) * 1e3)
        self.rtt_ms = rtt
        self.info = decode_json(reply.payload)

    async def close(self) -> None:
        self._closed = True
        if self._rejoin is not None:
            self._rejoin.cancel()
            await asyncio.gather(self._rejoin, return_exceptions=True)
        rpc, self._rpc = self._rpc, None
        if rpc is not None:
            with contextlib.suppress(Exception):
                await rpc.close()
        await self.connector.aclose()


class ShapedConnector(Connector):
    """The inner connector's links, with their sending side shaped (emulation)."""

    def __init__(self, inner: Connector, channel: Any) -> None:
        self.inner, self.channel = inner, channel
        self.spec, self.hint = inner.spec, inner.hint
        self.passive = bool(getattr(inner, "passive", False))

    async def connect(self, timeout: float) -> Any:
        from coinf.ble_protocol.throttle import ThrottledLink

        return ThrottledLink(await self.inner.connect(timeout), self.channel)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _connector_options(helper: Any, spec: str) -> dict[str, Any]:
    """A helper config's options for a connector to ``spec`` (``allow_insecure``)."""
    options = getattr(helper, "connector_options", None)
    return dict(options(spec)) if options is not None else {}


def helper_connection(helper: Any, bundle: Any, *, connect_timeout: float,
                      request_timeout: float, max_backoff_s: float,
                      ble_options: Mapping[str, Any] | None = None) -> Connection:
    """A connection to ``helper`` (a :class:`~coinf.wearable.pipeline_config.HelperConfig`)
    as this wearable reaches it: over BLE (this wearable's GATT server, ``ble_options``; the
    radio shapes the link) or at its address, shaped as configured (emulation)."""
    from coinf.ble_protocol.transport import open_connector

    spec = helper.wearable_spec
    if helper.over_ble:
        connector = open_connector(spec, bundle=bundle, **dict(ble_options or {}))
    else:
        pin = getattr(helper, "fingerprint", None)
        connector = (open_connector(spec, bundle=bundle) if spec.startswith("inprocess")
                     else open_connector(spec, fingerprint=pin) if pin and spec.startswith("tcp:")
                     else open_connector(spec, **_connector_options(helper, spec)))
        if helper.channel is not None:
            connector = ShapedConnector(connector, helper.channel)
    return Connection(connector, bundle.identity, connect_timeout=connect_timeout,
                      reconnect_timeout=connect_timeout, request_timeout=request_timeout,
                      max_backoff_s=max_backoff_s)
