"""Detect whether inferences arrive back to back (a stream) or sparsely (one-off requests).

When inputs arrive back to back, throughput matters more than one frame's latency, so the planner
scores candidates by their slowest stage instead of the sum of stages (CoINF §III-E). The detector
is a small hysteresis on the idle gap between the end of one inference and the start of the next.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Cadence:
    """Streaming after ``enter`` consecutive short gaps; sparse again after ``leave`` long ones.

    A gap is short when it is below ``short_fraction`` of the last inference's latency (or below
    ``short_ms``, whichever is larger); long when above ``long_fraction`` of it.
    """

    enter: int = 3
    leave: int = 2
    short_fraction: float = 0.25
    short_ms: float = 2.0
    long_fraction: float = 2.0
    streaming: bool = False
    _last_end: float | None = field(default=None, repr=False)
    _last_latency: float = field(default=0.0, repr=False)
    _short: int = field(default=0, repr=False)
    _long: int = field(default=0, repr=False)

    def start(self, now: float) -> bool:
        """Note an inference starting at ``now`` (seconds); returns the current mode."""
        if self._last_end is not None:
            gap = now - self._last_end
            if gap <= max(self.short_fraction * self._last_latency, self.short_ms / 1e3):
                self._short += 1
                self._long = 0
            elif gap >= self.long_fraction * self._last_latency:
                self._long += 1
                self._short = 0
            if not self.streaming and self._short >= self.enter:
                self.streaming = True
            elif self.streaming and self._long >= self.leave:
                self.streaming = False
        return self.streaming

    def end(self, now: float, latency_s: float) -> None:
        """Note that the inference finished at ``now`` after ``latency_s``."""
        self._last_end = now
        self._last_latency = latency_s
