"""Device status where the OS offers it: CPU load, frequency and governor, battery, charging.

:func:`read_status` uses psutil and Linux sysfs; every field is ``None`` when unavailable (a
laptop on mains has no battery level; a container has no cpufreq). The handheld sends its status
as JSON (:meth:`DeviceStatus.to_json`) and the wearable parses it with
:meth:`DeviceStatus.from_json`, which trusts nothing.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from coinf.errors import ErrorCode, ProtocolError
from coinf.jsonobject import decode_json

MAX_STATUS_BYTES = 4096


@dataclass(frozen=True)
class DeviceStatus:
    """A snapshot. ``cpu_load`` is the busy fraction of all CPUs in [0, 1]; frequencies in MHz;
    ``battery_pct`` in [0, 100]."""

    cpu_load: float | None = None
    freq_mhz: float | None = None
    max_freq_mhz: float | None = None
    governor: str | None = None
    battery_pct: float | None = None
    charging: bool | None = None

    def speed_factor(self) -> float:
        """How much slower than at full clock and idle this device runs now (>= 1).

        ``max_freq / freq`` for a throttled or powersave CPU, times ``1 + load`` for the share
        of the CPU other work takes. A heuristic: the run-time load factor (measured / predicted
        head time, :class:`wearable.planner.adapt.LoadFactor`) corrects what it gets wrong.
        """
        f = 1.0
        if self.freq_mhz and self.max_freq_mhz and self.freq_mhz > 0:
            f *= max(1.0, self.max_freq_mhz / self.freq_mhz)
        if self.cpu_load is not None:
            f *= 1.0 + min(max(self.cpu_load, 0.0), 1.0)
        return f

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Any) -> DeviceStatus:
        """Validate a status dict (from the peer): every field optional, every bound checked."""
        if not isinstance(obj, dict):
            raise ValueError("device status must be a JSON object")
        unknown = set(obj) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"device status has unknown fields {sorted(unknown)}")

        def num(key: str, lo: float, hi: float) -> float | None:
            v = obj.get(key)
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise ValueError(f"device status {key} must be a number in [{lo}, {hi}], got {v!r}")
            return float(v)

        gov = obj.get("governor")
        if gov is not None and (not isinstance(gov, str) or len(gov) > 32):
            raise ValueError("device status governor must be a short string")
        ch = obj.get("charging")
        if ch is not None and not isinstance(ch, bool):
            raise ValueError("device status charging must be true, false or null")
        return cls(num("cpu_load", 0, 1), num("freq_mhz", 0, 1e5), num("max_freq_mhz", 0, 1e5),
                   gov, num("battery_pct", 0, 100), ch)

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json()).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> DeviceStatus:
        if len(raw) > MAX_STATUS_BYTES:
            raise ValueError(f"device status is {len(raw)} bytes; limit {MAX_STATUS_BYTES}")
        try:
            return cls.from_json(json.loads(raw))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"device status is not valid JSON: {exc}") from None


def decode_status_reply(payload: bytes) -> DeviceStatus:
    """A peer's STATUS reply (``{"device": {...}, ...}``, docs/PROTOCOL.md) -> its device
    status. Anything invalid is a :class:`~coinf.errors.ProtocolError` (MALFORMED)."""
    obj = decode_json(payload, what="STATUS reply")
    device = obj.get("device", {})
    try:
        return DeviceStatus.from_json(device)
    except (ValueError, TypeError) as exc:
        raise ProtocolError(ErrorCode.MALFORMED, f"STATUS reply: {exc}") from None


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def read_status(sample_s: float = 0.0) -> DeviceStatus:
    """The current status of this machine. ``sample_s > 0`` blocks that long to measure load;
    0 uses psutil's figure since its previous call (the first call reads the 1-minute load)."""
    import psutil

    load: float | None
    try:
        if sample_s > 0:
            load = psutil.cpu_percent(interval=sample_s) / 100.0
        else:
            load = psutil.getloadavg()[0] / (psutil.cpu_count() or 1)
        load = min(max(load, 0.0), 1.0)
    except (OSError, AttributeError):
        load = None
    freq = max_freq = None
    try:
        cf = psutil.cpu_freq()
        if cf is not None:
            freq = float(cf.current) or None
            max_freq = float(cf.max) or None
    except (OSError, NotImplementedError, FileNotFoundError):
        pass
    governor = _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    battery = charging = None
    try:
        b = psutil.sensors_battery()
        if b is not None:
            battery = float(b.percent)
            charging = bool(b.power_plugged)
    except (OSError, AttributeError, NotImplementedError):
        pass
    return DeviceStatus(load, freq, max_freq, governor[:32] if governor else None, battery,
                        charging)
