"""onnxruntime session options every slice on a device shares (a leaf: imports nothing of coinf)."""

from __future__ import annotations

from typing import Any

#: onnxruntime's intra-op workers spin after each run by default, waiting for the next; a
#: device that runs one slice per frame (a wearable on a battery, a handheld beside other
#: work) pays that in CPU time for nothing, and on a busy core the spinning slows the run
#: itself. Every slice session has the workers sleep instead (docs/DEPLOY.md §6, "Threads").
NO_SPINNING = ("session.intra_op.allow_spinning", "0")


def quiet_workers(opts: Any) -> Any:
    """``opts`` (``onnxruntime.SessionOptions``) with the intra-op workers sleeping between
    runs (:data:`NO_SPINNING`)."""
    opts.add_session_config_entry(*NO_SPINNING)
    return opts


__all__ = ["NO_SPINNING", "quiet_workers"]
