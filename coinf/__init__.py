"""coinf: cooperative DL inference between a wearable and the devices around it over Bluetooth LE.

The public surface is small on purpose::

    from coinf import Session, SessionOptions      # shaped like onnxruntime.InferenceSession
    from coinf import PlacementOptions, LinkOptions, PlannerOptions, EmulationOptions  # its groups
    from coinf import AsyncSession                 # the same, for asyncio programs

The packages follow the data path: ``coinf.convert`` (offline) -> ``coinf.wearable`` (API,
planner, head) -> ``coinf.ble_protocol`` (frames, packing, links) -> ``coinf.handheld`` (daemon,
tail); ``coinf.device`` holds what both sides share; ``coinf.cli`` is the command line.
Errors: :mod:`coinf.errors`. Heavy modules load only when one of these names is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

_LAZY = {
    "Session": "coinf.wearable.session",
    "SessionOptions": "coinf.wearable.options",
    "PlacementOptions": "coinf.wearable.options",
    "LinkOptions": "coinf.wearable.options",
    "AlternateLink": "coinf.wearable.options",
    "PlannerOptions": "coinf.wearable.options",
    "EmulationOptions": "coinf.wearable.options",
    "RunOptions": "coinf.wearable.options",
    "Discover": "coinf.wearable.discovery",
    "AsyncSession": "coinf.wearable.core",
    "RunStats": "coinf.wearable.frame",
    "FrameResult": "coinf.wearable.frame",
}

if TYPE_CHECKING:
    from coinf.wearable.core import AsyncSession
    from coinf.wearable.discovery import Discover
    from coinf.wearable.frame import FrameResult, RunStats
    from coinf.wearable.options import (
        AlternateLink,
        EmulationOptions,
        LinkOptions,
        PlacementOptions,
        PlannerOptions,
        RunOptions,
        SessionOptions,
    )
    from coinf.wearable.session import Session


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'coinf' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = ["AlternateLink", "AsyncSession", "Discover", "EmulationOptions", "FrameResult",
           "LinkOptions", "PlacementOptions", "PlannerOptions", "RunOptions", "RunStats", "Session",
           "SessionOptions"]
