"""What a pipeline plan is and what one frame through it did (:mod:`.pipeline`): stages over
devices with the split's predicted times, and per-frame measurements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from coinf.ble_protocol.request import Hop
from coinf.wearable.plan import Stage
from coinf.wearable.planner.compress_select import CompressionOption, option_label
from coinf.wearable.planner.pipeline_dp import PipelineSplit


@dataclass(frozen=True)
class PipelinePlan:
    """Stages over devices (the first is this wearable) and the split's predicted times."""

    devices: tuple[str, ...]
    split: PipelineSplit
    stages: tuple[Stage, ...]

    @property
    def cuts(self) -> tuple[str, ...]:
        return self.split.cuts

    @property
    def hops(self) -> tuple[Hop, ...]:
        """The route the first helper receives (every stage after the wearable's)."""
        return tuple(Hop(s.start, s.end, s.device) for s in self.stages[1:])

    def rows(self, options: Sequence[CompressionOption | str] | str = "raw"
             ) -> list[dict[str, Any]]:
        """One row per stage, for ``coinf plan``: device, slice, compute, link to the next and
        what that link carries (``options``: one per link, e.g. :meth:`PipelineSession.
        link_choices`; a string: the first link's packing, the others raw)."""
        if isinstance(options, str):
            options = [options] + ["raw"] * (len(self.split.link_s) - 1)
        out = []
        for i, st in enumerate(self.stages):
            link = self.split.link_s[i] * 1e3 if i < len(self.split.link_s) else None
            opt = options[i] if link is not None else None
            out.append({"device": st.device, "slice": st.slice, "runtime": st.runtime,
                        "compute_ms": round(self.split.compute_s[i] * 1e3, 3),
                        "link_ms": None if link is None else round(link, 3),
                        "compressor": option_label(opt) if opt is not None else None,
                        "link_bytes": int(opt.nbytes)
                        if isinstance(opt, CompressionOption) else None})
        return out

    def __str__(self) -> str:
        return " -> ".join(map(str, self.stages))


@dataclass
class PipelineStats:
    """What one frame did: the plan's devices, each device's compute and each link's time."""

    devices: tuple[str, ...] = ()
    cuts: tuple[str, ...] = ()
    compute_ms: list[float] = field(default_factory=list)
    link_ms: list[float] = field(default_factory=list)
    total_ms: float = 0.0
    retries: int = 0
    local: bool = False
    packing: list[str] = field(default_factory=list)  # per link
    first_link: str = ""  # the connector the wearable reached the first helper with
    #: per link, the compressor's gamma (1: none; ``packing`` then applies to its code)
    gamma: list[int] = field(default_factory=list)

    @property
    def options(self) -> list[str]:
        """Per link, what it carried: ``raw``, ``q8``, ``g4``, ``g4+q8``."""
        return [option_label(CompressionOption(g, p, 1.0, 1.0))
                for g, p in zip(self.gamma or [1] * len(self.packing), self.packing,
                                strict=True)]


__all__ = ["PipelinePlan", "PipelineStats"]
