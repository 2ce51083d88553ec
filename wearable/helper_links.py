"""A Session's links to its helpers (``PlacementOptions.helpers``): one
:class:`~coinf.wearable.connection.Connection` each, opened on first use, and the background
work that keeps the plan's view of them current (re-probing a helper left out, browsing for new
ones with ``Discover``). What to do with a helper is the :class:`~coinf.wearable.replan.
Replanner`'s to decide; this module only reaches them."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Coroutine
from typing import Any

from coinf.wearable.connection import Connection, helper_connection
from coinf.wearable.discovery import Discover
from coinf.wearable.pipeline_config import HelperConfig
from coinf.wearable.replan import Replanner

from coinf.errors import InputError, LinkError

log = logging.getLogger(__name__)


class HelperLinks:
    """The helpers a plan may name, their links, and the probes and browses under way."""

    def __init__(self, bundle: Any, helpers: list[HelperConfig], discover: Discover | None,
                 link: Any) -> None:
        self.bundle = bundle
        self.configs = {h.name: h for h in helpers}
        self.discover = discover
        self.link = link  # LinkOptions: the timeouts every helper link uses
        self.conns: dict[str, Connection] = {}
        self._next_browse = time.monotonic() + (discover.rebrowse_s if discover else 0.0)
        self._background: set[asyncio.Task[None]] = set()

    def __bool__(self) -> bool:
        return bool(self.configs) or self.discover is not None

    def connection_to(self, device: str) -> Connection:
        """The link to helper ``device``, opened on first use."""
        conn = self.conns.get(device)
        if conn is None:
            helper = self.configs.get(device)
            if helper is None:
                raise InputError(f"the plan sends to {device!r}, which is neither 'handheld' "
                                 f"nor a helper of PlacementOptions.helpers "
                                 f"({', '.join(self.configs) or 'none given'})")
            link = self.link
            conn = self.conns[device] = helper_connection(
                helper, self.bundle, connect_timeout=link.effective_connect_timeout,
                request_timeout=link.timeout, max_backoff_s=link.max_backoff_s,
                ble_options=link.helper_ble_options)
        return conn

    def retune(self, name: str, bandwidth_bps: float) -> None:
        """Emulation: from now on the link into helper ``name`` (a ``shape=True`` helper)
        carries ``bandwidth_bps`` B/s, its open link included (a bandwidth schedule). What the
        plan assumes of it is measured, not told."""
        from coinf.ble_protocol.throttle import ThrottledLink
        from coinf.wearable.connection import ShapedConnector

        helper = self.configs[name] = dataclasses.replace(self.configs[name],
                                                          bandwidth_bps=bandwidth_bps)
        conn, channel = self.conns.get(name), helper.channel
        if conn is None or channel is None:
            return
        if isinstance(conn.connector, ShapedConnector):
            conn.connector.channel = channel
        rpc = conn.rpc_client
        if rpc is not None and isinstance(rpc.link, ThrottledLink):
            rpc.link.channel = channel

    async def drop(self, name: str, conn: Connection | None = None) -> None:
        """Close the link to helper ``name`` (only ``conn``, if given: a frame that saw an old
        link fail must not close the new one)."""
        current = self.conns.get(name)
        if current is not None and (conn is None or conn is current):
            del self.conns[name]
            await current.close()

    def tend(self, rp: Replanner) -> None:
        """Start what the helpers need, in the background (never delaying a frame): a probe of
        each helper whose backoff has passed, and a new browse when ``Discover`` is due."""
        for name in rp.due():
            rp.probing.add(name)
            self._spawn(self._probe(rp, name))
        if self.discover is not None and self.discover.rebrowse_s and \
                time.monotonic() >= self._next_browse:
            self._next_browse = math.inf  # one browse at a time
            self._spawn(self._browse(rp))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _probe(self, rp: Replanner, name: str) -> None:
        try:
            await self.connection_to(name).client()
        except LinkError as exc:
            await self.drop(name)
            rp.still_out(name, exc)
            return
        except Exception as exc:  # never end silently: the helper stays out, saying why
            await self.drop(name)
            rp.still_out(name, exc)
            log.error("probing helper %s failed: %s", name, exc)
            return
        rp.back(name)

    async def _browse(self, rp: Replanner) -> None:
        assert self.discover is not None
        try:
            found = await self.discover.abrowse(self.bundle)
        except Exception as exc:
            log.warning("browsing for helpers failed: %s", exc)
            found = []
        finally:
            self._next_browse = time.monotonic() + self.discover.rebrowse_s
        for name in rp.merge(found):
            self.configs[name] = rp.helpers[name]
            await self.drop(name)  # a changed address: the old link goes

    async def close(self) -> None:
        """Cancel the probes and browses under way, then close every helper link."""
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        for conn in list(self.conns.values()):
            await conn.close()
        self.conns.clear()


__all__ = ["HelperLinks"]
