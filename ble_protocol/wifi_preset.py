"""Wi-Fi link presets: what a wearable's 802.11 link carries, for planning and emulation.

The Pi Zero 2 W has a 2.4 GHz single-stream 802.11n radio on the same chip as its Bluetooth
(docs/PLANNER.md, "Links", cites every figure). A preset gives the TCP payload throughput a
user measures with iperf, the round-trip time, its jitter, the segment loss TCP repairs, and the
extra latency of the first frame after the radio slept in power save. The emulation
(:meth:`WifiParams.channel`) shapes a real TCP link with them
(:class:`~coinf.ble_protocol.throttle.ThrottledLink`): each message holds the air for its
airtime, a lost segment costs one more round trip, jitter is added to the one-way latency and
order is kept, as TCP keeps it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from coinf.ble_protocol.shaped import Channel

from coinf.errors import UserError


class WifiError(UserError):
    """Bad Wi-Fi preset or parameter."""


@dataclass(frozen=True)
class WifiParams:
    """One Wi-Fi link as the planner and the emulation see it."""

    name: str = "custom"
    throughput_bps: float = 2.5e6  # TCP payload bytes/s (iperf), each way
    rtt_ms: float = 5.0
    jitter_ms: float = 2.0  # the one-way latency varies by up to this much
    loss: float = 0.001  # TCP segments lost on air (each costs one round trip)
    wake_ms: float = 0.0  # first frame after power save: extra latency
    segment_bytes: int = 1460

    def __post_init__(self) -> None:
        checks = [
            (1e3 <= self.throughput_bps <= 1e10, "throughput_bps must be in [1e3, 1e10]"),
            (0 <= self.rtt_ms <= 1e4, "rtt_ms must be in [0, 10000]"),
            (0 <= self.jitter_ms <= 1e4, "jitter_ms must be in [0, 10000]"),
            (0 <= self.loss < 0.5, "loss must be in [0, 0.5)"),
            (0 <= self.wake_ms <= 1e4, "wake_ms must be in [0, 10000]"),
            (64 <= self.segment_bytes <= 65535, "segment_bytes must be in [64, 65535]"),
        ]
        for ok, text in checks:
            if not ok:
                raise WifiError(f"Wi-Fi parameter error: {text}")

    def channel(self, seed: int = 1) -> Channel:
        """The emulated channel (bandwidth, latency, jitter, loss) of this link."""
        return Channel(self.throughput_bps, self.rtt_ms / 2e3, overhead_bytes=0,
                       jitter_s=self.jitter_ms / 1e3, loss=self.loss,
                       segment_bytes=self.segment_bytes, seed=seed)

    def describe(self) -> dict[str, Any]:
        return asdict(self)


#: The presets (docs/PLANNER.md "Links" gives the source of each figure).
PRESETS: dict[str, WifiParams] = {
    # A Pi Zero 2 W on 2.4 GHz 802.11n (1x1, 20 MHz) a few metres from its access point.
    "pi-zero-2w-wifi": WifiParams(name="pi-zero-2w-wifi", throughput_bps=2.5e6, rtt_ms=5.0,
                                  jitter_ms=2.0, loss=0.001, wake_ms=0.0),
}


def wifi_preset(name: str, **overrides: Any) -> WifiParams:
    """A preset with some fields overridden; unknown names or fields raise :class:`WifiError`."""
    if name not in PRESETS:
        raise WifiError(f"unknown Wi-Fi preset {name!r}; expected one of {', '.join(PRESETS)}")
    known = set(WifiParams.__dataclass_fields__)
    bad = sorted(set(overrides) - known)
    if bad:
        raise WifiError(f"unknown Wi-Fi parameter(s) {bad}; expected some of {sorted(known)}")
    return replace(PRESETS[name], **overrides)
