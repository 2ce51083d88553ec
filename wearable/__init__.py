"""The wearable side: the ``Session`` API (sync) over the ``AsyncSession`` core, the planner,
head execution, connections to helpers.

Modules: ``session`` (the onnxruntime-shaped front), ``core`` (the per-frame function and the
stream pipeline), ``connection`` (one link per helper: handshake, backoff), ``plan`` (stages and
links), ``frame`` (feed/result checks, timings), ``options``, ``autoplan`` + ``planner/``
(choosing the split), ``policy``, ``cadence``, ``stream`` (real-time sources), ``loop``.
"""

from coinf.wearable.core import AsyncSession
from coinf.wearable.frame import FrameResult, NodeArg, RunStats
from coinf.wearable.options import (
    EmulationOptions,
    LinkOptions,
    PlacementOptions,
    PlannerOptions,
    RunOptions,
    SessionOptions,
)
from coinf.wearable.session import Session

__all__ = ["AsyncSession", "EmulationOptions", "FrameResult", "LinkOptions", "NodeArg",
           "PlacementOptions", "PlannerOptions", "RunOptions", "RunStats", "Session",
           "SessionOptions"]
