"""Radio parameters, presets and the throughput formula (docs/PROTOCOL.md, "Timing").

One LL data PDU on air (bytes): preamble (1 at 1M, 2 at 2M) + access address 4 + header 2 +
payload + MIC 4 (encrypted, non-empty payload only) + CRC 3, at 8 µs/byte (1M) or 4 µs/byte (2M).
For bulk data in one direction, each exchange of a connection event is one full data packet, an
empty packet the other way and two T_IFS gaps::

    t_pair = t(L) + t(0) + 2 * T_IFS
    n      = min(max_packets_per_event, floor((interval + T_IFS) / t_pair))  # exchanges/event
             (the last exchange needs no trailing T_IFS before the next anchor)
    k      = ceil((att_value + 3 + 4) / L)                           # LL packets per ATT PDU
    capacity = att_value * n / (k * interval)                         # ATT payload bytes/s

where ``att_value = min(mtu - 3, 512)`` (a notification or write-without-response carries 3 bytes
of ATT header, the L2CAP header adds 4).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from bumble import hci

from coinf.errors import UserError


class RadioError(UserError):
    """Bad radio preset or parameter."""


@dataclass(frozen=True)
class RadioParams:
    """Everything the air-time model uses. All fields can be overridden per run."""

    name: str = "custom"
    phy_mbps: int = 1  # 1 or 2
    ll_payload: int = 27  # max LL data payload (27 without DLE, up to 251 with)
    interval_ms: float = 7.5  # connection interval
    max_packets_per_event: int = 6  # exchanges (central+peripheral packet pairs) per event
    t_ifs_us: float = 150.0
    encrypted: bool = True  # the formula assumes the MIC (data characteristics need encryption)
    acl_buffers: int = 16  # controller ACL buffers (host credits)
    att_mtu: int = 517  # ATT MTU both hosts request
    hci_version: int = hci.HCI_VERSION_BLUETOOTH_CORE_4_2
    time_scale: float = 1.0  # real seconds per emulated second
    # LL supervision timeout: a controller whose peer falls silent (its host and controller
    # gone, as when the process dies) reports the link lost after this long
    supervision_ms: float = 1000.0
    # Fault injection on coinf data chunks (ATT notifications / write commands whose value is a
    # chunk): the probability that one is dropped, delivered twice, corrupted (one payload byte
    # flipped) or delivered after the next one. 0 = a faultless radio (real BLE retransmits at
    # the link layer; these model a broken stack or radio for robustness tests).
    fault_drop: float = 0.0
    fault_duplicate: float = 0.0
    fault_corrupt: float = 0.0
    fault_reorder: float = 0.0
    fault_seed: int = 1

    def __post_init__(self) -> None:
        checks = [
            (self.phy_mbps in (1, 2), "phy_mbps must be 1 or 2"),
            (27 <= self.ll_payload <= 251, "ll_payload must be in [27, 251]"),
            (7.5 <= self.interval_ms <= 4000, "interval_ms must be in [7.5, 4000]"),
            (1 <= self.max_packets_per_event <= 1000, "max_packets_per_event must be >= 1"),
            (0 <= self.t_ifs_us <= 1000, "t_ifs_us must be in [0, 1000]"),
            (1 <= self.acl_buffers <= 1024, "acl_buffers must be in [1, 1024]"),
            (23 <= self.att_mtu <= 517, "att_mtu must be in [23, 517]"),
            (0 < self.time_scale <= 100, "time_scale must be in (0, 100]"),
            (100 <= self.supervision_ms <= 32000, "supervision_ms must be in [100, 32000]"),
            (all(0 <= f <= 1 for f in (self.fault_drop, self.fault_duplicate,
                                       self.fault_corrupt, self.fault_reorder)),
             "fault probabilities must be in [0, 1]"),
        ]
        for ok, text in checks:
            if not ok:
                raise RadioError(f"radio parameter error: {text}")

    @property
    def interval_s(self) -> float:
        return self.interval_ms / 1000.0

    def packet_air_time(self, payload: int, encrypted: bool) -> float:
        """Seconds on air for one LL data PDU carrying ``payload`` bytes."""
        preamble = 1 if self.phy_mbps == 1 else 2
        mic = 4 if encrypted and payload > 0 else 0
        octets = preamble + 4 + 2 + payload + mic + 3
        return octets * 8 / (self.phy_mbps * 1e6)

    @property
    def att_value(self) -> int:
        return min(self.att_mtu - 3, 512)

    def exchanges_per_event(self) -> int:
        t_pair = (
            self.packet_air_time(self.ll_payload, self.encrypted)
            + self.packet_air_time(0, False)
            + 2 * self.t_ifs_us * 1e-6
        )
        fit = math.floor((self.interval_s + self.t_ifs_us * 1e-6) / t_pair + 1e-9)
        return max(1, min(self.max_packets_per_event, fit))

    def ll_capacity_bps(self) -> float:
        """Link-layer payload bytes/s in one direction."""
        return self.ll_payload * self.exchanges_per_event() / self.interval_s

    def capacity_bps(self) -> float:
        """Theoretical ATT payload bytes/s in one direction (the formula in the module doc)."""
        k = math.ceil((self.att_value + 7) / self.ll_payload)
        return self.att_value * self.exchanges_per_event() / (k * self.interval_s)

    def describe(self) -> dict[str, Any]:
        d = asdict(self)
        d["hci_version"] = int(self.hci_version)
        d.update(
            exchanges_per_event=self.exchanges_per_event(),
            ll_capacity_bps=round(self.ll_capacity_bps(), 1),
            capacity_bps=round(self.capacity_bps(), 1),
        )
        return d


PRESETS: dict[str, RadioParams] = {
    # Pi Zero 2 W: CYW43438, HCI 4.1/4.2 controller without DLE, 1M PHY, 7.5 ms interval.
    "pi-zero-2w": RadioParams(
        name="pi-zero-2w",
        phy_mbps=1,
        ll_payload=27,
        interval_ms=7.5,
        max_packets_per_event=6,
        att_mtu=517,
        hci_version=hci.HCI_VERSION_BLUETOOTH_CORE_4_1,
    ),
    # A BLE 4.2 controller with Data Length Extension (251 B LL payload), 1M PHY.
    "ble42-dle": RadioParams(
        name="ble42-dle",
        phy_mbps=1,
        ll_payload=251,
        interval_ms=7.5,
        max_packets_per_event=6,
        att_mtu=498,
        hci_version=hci.HCI_VERSION_BLUETOOTH_CORE_4_2,
    ),
    # BLE 5 with the 2M PHY and DLE.
    "ble5-2m": RadioParams(
        name="ble5-2m",
        phy_mbps=2,
        ll_payload=251,
        interval_ms=7.5,
        max_packets_per_event=6,
        att_mtu=498,
        hci_version=hci.HCI_VERSION_BLUETOOTH_CORE_5_0,
    ),
}


def preset(name: str, **overrides: Any) -> RadioParams:
    """A preset with some fields overridden; unknown names/fields raise :class:`RadioError`."""
    if name not in PRESETS:
        raise RadioError(f"unknown radio preset {name!r}; expected one of {', '.join(PRESETS)}")
    known = {f.name for f in fields(RadioParams)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise RadioError(f"unknown radio parameter(s) {bad}; expected some of {sorted(known)}")
    return replace(PRESETS[name], **overrides)


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """``["interval_ms=15", "ll_payload=251"]`` -> typed overrides for :func:`preset`."""
    types = {f.name: f.type for f in fields(RadioParams)}
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or key not in types:
            raise RadioError(
                f"bad radio override {item!r}: expected FIELD=VALUE, FIELD in {sorted(types)}"
            )
        kind = str(types[key])
        try:
            if kind == "bool":
                out[key] = value.lower() in ("1", "true", "yes")
            elif kind == "int":
                out[key] = int(value)
            elif kind == "float":
                out[key] = float(value)
            else:
                out[key] = value
        except ValueError:
            raise RadioError(f"bad radio override {item!r}: {value!r} is not a {kind}") from None
    return out
