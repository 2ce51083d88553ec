"""The Session given helpers that the pipeline benches run (``bench pipeline``, its
``--bandwidth-kbps-schedule`` mode)."""

from __future__ import annotations

from typing import Any


def pipeline_session(bundle: Any, helpers: list[Any], slowdown: float,
                     profiles: list[Any] | None = None, input_fps: float | None = None,
                     connect_timeout: float = 5.0, **link: Any) -> Any:
    """The Session given ``helpers`` that the pipeline benches run (a stream: throughput), this
    process playing a ``slowdown`` x slower wearable (``profiles``: the wearable's and the
    helpers' device profiles, else the defaults until measured)."""
    from coinf.wearable.core import AsyncSession
    from coinf.wearable.options import (
        EmulationOptions,
        LinkOptions,
        PlacementOptions,
        PlannerOptions,
        SessionOptions,
    )

    wear, hand = (profiles[0], profiles[1]) if profiles else (None, None)
    return AsyncSession(bundle, SessionOptions(
        placement=PlacementOptions(helpers=helpers),
        planner=PlannerOptions(objective="throughput", wearable_profile=wear,
                               handheld_profile=hand, input_fps=input_fps),
        link=LinkOptions(timeout=10.0, connect_timeout=connect_timeout, **link),
        emulation=EmulationOptions(slowdown=slowdown, threads=1)))


__all__ = ["pipeline_session"]
