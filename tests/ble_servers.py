"""Wearable GATT servers for tests: ``accept_link`` starts one (per call) and returns the next
handheld's link; ``close_servers`` closes every server this module started."""

from __future__ import annotations

from typing import Any

from coinf.ble_protocol.link import Link
from coinf.ble_protocol.peripheral import WearableServer

_started: list[WearableServer] = []


async def accept_link(spec: str, *, bundle_identity: str, timeout: float | None = None,
                      **options: Any) -> Link:
    server = WearableServer(spec, bundle_identity=bundle_identity, **options)
    _started.append(server)
    await server.start()
    return await server.accept(timeout)


async def close_servers() -> None:
    while _started:
        await _started.pop().close()
