"""The wearable side: :class:`Session` (the public API), head execution, emulation."""

from coinf.wearable.session import NodeArg, RunStats, Session

__all__ = ["NodeArg", "RunStats", "Session"]
