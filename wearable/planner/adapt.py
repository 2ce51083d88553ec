"""Run-time adaptation helpers the Session uses (DynO §3.4).

* :class:`LinkEstimator` -- bandwidth and RTT from probes and every real transfer, kept as two
  exponential moving averages: *recent* (fast) and *historical* (slow). The recent one is used
  while transfers happened within ``recent_window_s`` (default 5 minutes); otherwise the
  historical one.
* :class:`LoadFactor` -- DynO's scaling factor SF = measured head time / predicted head time,
  smoothed; it rescales the wearable's predictions for every other candidate.
* :class:`ReplanTrigger` -- fires only when an input moved by more than a relative threshold
  (default 5%) since the last plan.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class LinkEstimate:
    """Uplink/downlink bandwidth in bytes per second and round-trip time in ms."""

    up_bps: float
    down_bps: float
    rtt_ms: float = 0.0
    source: str = "default"
    #: link-layer bytes added to every message (framing, headers), both directions
    overhead_bytes: int = 0
    #: the radio it uses (``ble`` or ``wifi``): which power figures the energy is priced at
    kind: str = "ble"
    #: extra latency of the first frame of an exchange: a Wi-Fi radio leaving power save
    wake_ms: float = 0.0
    #: how long a request waits at the peer before its tail runs: a shared tail service's
    #: queueing delay (its STATUS ``queue_ms``); latency only, no device works meanwhile
    queue_ms: float = 0.0

    def __post_init__(self) -> None:
        for k in ("up_bps", "down_bps"):
            v = getattr(self, k)
            if not v > 0 or math.isinf(v):
                raise ValueError(f"link estimate {k} must be a finite number > 0 bytes/s, got {v}")
        if not self.rtt_ms >= 0:
            raise ValueError(f"link estimate rtt_ms must be >= 0, got {self.rtt_ms}")
        if self.kind not in ("ble", "wifi"):
            raise ValueError(f"link estimate kind must be 'ble' or 'wifi', got {self.kind!r}")
        if not 0 <= self.wake_ms < 1e5:
            raise ValueError(f"link estimate wake_ms must be in [0, 1e5), got {self.wake_ms}")
        if not 0 <= self.queue_ms < 1e7:
            raise ValueError(f"link estimate queue_ms must be in [0, 1e7), got {self.queue_ms}")

    def up_ms(self, nbytes: int) -> float:
        """Time to send ``nbytes`` to the handheld (one request: half an RTT of latency)."""
        return self.rtt_ms / 2 + self.wake_ms + 1000.0 * (nbytes + self.overhead_bytes) \
            / self.up_bps

    def down_ms(self, nbytes: int) -> float:
        return self.rtt_ms / 2 + 1000.0 * (nbytes + self.overhead_bytes) / self.down_bps


#: BLE 4.2 without DLE/2M PHY, as the project measures it: ~10-36 kB/s. A mid value.
DEFAULT_LINK = LinkEstimate(20_000.0, 20_000.0, 30.0, "default (BLE 4.2 estimate)")


class _Ema:
    def __init__(self, alpha: float) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"moving-average weight must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.value: float | None = None

    def add(self, x: float) -> None:
        self.value = x if self.value is None else self.value + self.alpha * (x - self.value)


class LinkEstimator:
    """Recent + historical moving averages of bandwidth (per direction) and RTT.

    Bandwidth is averaged as *seconds per byte* (its inverse): predicted transfer time is linear
    in it, and a collapse from 1 MB/s to 1 kB/s shows up after one transfer instead of the dozen
    a plain average of bytes/s would need.
    """

    def __init__(self, initial: LinkEstimate = DEFAULT_LINK, recent_alpha: float = 0.5,
                 historical_alpha: float = 0.05, recent_window_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic,
                 min_transfer_bytes: int = 256) -> None:
        self.initial = initial
        self.recent_window_s = recent_window_s
        self.clock = clock
        self.min_transfer_bytes = min_transfer_bytes
        self._recent = {k: _Ema(recent_alpha) for k in ("up", "down", "rtt")}
        self._hist = {k: _Ema(historical_alpha) for k in ("up", "down", "rtt")}
        self._last: dict[str, float] = {}

    def _add(self, key: str, value: float) -> None:
        self._recent[key].add(value)
        self._hist[key].add(value)
        self._last[key] = self.clock()

    def observe_transfer(self, nbytes: int, seconds: float, direction: str = "up") -> None:
        """A real transfer (or probe) of ``nbytes`` took ``seconds`` (minus the RTT share if
        known). Tiny transfers are ignored: they measure latency, not bandwidth."""
        if direction not in ("up", "down"):
            raise ValueError(f"direction must be 'up' or 'down', got {direction!r}")
        if nbytes < self.min_transfer_bytes or not seconds > 0:
            return
        self._add(direction, seconds / nbytes)

    def observe_rtt(self, ms: float) -> None:
        if ms >= 0 and math.isfinite(ms):
            self._add("rtt", ms)

    def _get(self, key: str, default: float) -> tuple[float, str]:
        last = self._last.get(key)
        recent, hist = self._recent[key].value, self._hist[key].value
        if last is not None and recent is not None and \
                self.clock() - last <= self.recent_window_s:
            return recent, "recent"
        if hist is not None:
            return hist, "historical"
        return default, "default"

    def estimate(self) -> LinkEstimate:
        up_spb, s1 = self._get("up", 1.0 / self.initial.up_bps)
        down_spb, _ = self._get("down", 1.0 / self.initial.down_bps if s1 == "default" else up_spb)
        up, down = 1.0 / up_spb, 1.0 / down_spb
        rtt, _ = self._get("rtt", self.initial.rtt_ms)
        return LinkEstimate(up, down, rtt, s1, self.initial.overhead_bytes,
                            kind=self.initial.kind, wake_ms=self.initial.wake_ms)

    def probe_due(self, interval_s: float = 300.0) -> bool:
        """True when no bandwidth figure is younger than ``interval_s`` (CoINF: 5 minutes)."""
        last = self._last.get("up")
        return last is None or self.clock() - last >= interval_s


class LoadFactor:
    """Smoothed measured/predicted ratio of the wearable's head time (DynO's SF)."""

    def __init__(self, alpha: float = 0.3, lo: float = 0.2, hi: float = 20.0) -> None:
        self._ema = _Ema(alpha)
        self.lo, self.hi = lo, hi

    def observe(self, measured_ms: float, predicted_ms: float) -> None:
        """Ignore heads too short to measure reliably (< 0.5 ms predicted)."""
        if predicted_ms >= 0.5 and measured_ms > 0 and math.isfinite(measured_ms):
            self._ema.add(min(max(measured_ms / predicted_ms, self.lo), self.hi))

    @property
    def value(self) -> float:
        return 1.0 if self._ema.value is None else self._ema.value


class ReplanTrigger:
    """Fires when any input moved by more than ``threshold`` (relative) since the last plan."""

    def __init__(self, threshold: float = 0.05) -> None:
        if not threshold > 0:
            raise ValueError(f"re-plan threshold must be > 0, got {threshold}")
        self.threshold = threshold
        self._at_plan: dict[str, float] | None = None

    def changed(self, inputs: Mapping[str, float]) -> list[str]:
        """The inputs that moved more than the threshold (all of them before the first plan)."""
        if self._at_plan is None:
            return sorted(inputs)
        moved = []
        for k, v in inputs.items():
            old = self._at_plan.get(k)
            if old is None:
                moved.append(k)
            elif old == 0:
                if v != 0:
                    moved.append(k)
            elif abs(v - old) / abs(old) > self.threshold:
                moved.append(k)
        return sorted(moved)

    def should_replan(self, inputs: Mapping[str, float]) -> bool:
        return bool(self.changed(inputs))

    def planned(self, inputs: Mapping[str, float]) -> None:
        """Record the inputs a plan was made with."""
        self._at_plan = dict(inputs)
