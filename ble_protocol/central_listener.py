"""The ``ble`` / ``ble:HCI`` listener of :func:`~coinf.ble_protocol.listen.open_listener`: the
handheld as a GATT central (:class:`~coinf.ble_protocol.central.Central`) that connects to the
wearable, hands out the link, and connects again once it is released."""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

from coinf.ble_protocol.central import FATAL_CODES, Central
from coinf.ble_protocol.listen import Listener
from coinf.ble_protocol.messages import ProtocolError

from coinf.errors import AdapterError, InputError

log = logging.getLogger(__name__)


class CentralListener(Listener):
    """The ``ble`` / ``ble:HCI`` listener: connects to the wearable as a central, hands out the
    link, and once that link is released connects again, with exponential backoff while the
    wearable is unreachable. A fault in :data:`FATAL_CODES` stops it: :meth:`accept` raises it.

    Options: ``bundle_identity`` (required), ``name`` (the wearable's advertised name or
    address; default ``coinf-wearable``; None: the first device advertising the service) and
    the keyword options of :class:`Central`.
    """

    def __init__(
        self,
        hci: str = "",
        *,
        bundle_identity: str | None = None,
        name: str | None = "coinf-wearable",
        **options: Any,
    ) -> None:
        super().__init__()
        if not bundle_identity:
            raise InputError("the ble listener needs bundle_identity= (checked in the handshake)")
        known = set(inspect.signature(Central.__init__).parameters) - {
            "self", "target", "bundle_identity", "hci", "host", "backend_kwargs"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise InputError(
                f"unknown ble listener option {unknown[0]!r}; expected one of "
                f"{sorted(known | {'name'})}"
            )
        self.spec = f"ble:{hci}" if hci else "ble"
        self.central = Central(name, bundle_identity=bundle_identity, hci=hci or None, **options)

    @property
    def description(self) -> str:
        return self.central.description

    async def _open(self) -> None:
        await self.central.open()
        self._spawn(self._run())

    async def _run(self) -> None:
        delay = self.central.backoff
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                link = await self.central.connect()
            except AdapterError as exc:
                self._fail(exc)
                return
            except ProtocolError as exc:
                if exc.code in FATAL_CODES:
                    self._fail(exc)
                    return
                delay = self.central._next_delay(delay, loop.time() - started)
                log.warning("wearable unreachable (%s); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.central.max_backoff)
                continue
            except Exception as exc:  # never end silently: whoever accepts learns why
                log.error("the BLE listener stopped: %s: %s", type(exc).__name__, exc)
                self._fail(exc)
                return
            delay = self.central.backoff
            held = self._offer(link)
            try:
                await held.released.wait()
            finally:
                self._forget(held)
                await link.close()

    async def _release(self) -> None:
        await self.central.aclose()


__all__ = ["CentralListener"]
