"""End-user policies (CoINF §III-D): energy weights, battery/charging rules, named profiles.

The policy file is JSON at ``$COINF_CONFIG`` or ``~/.config/coinf/policy.json``::

    {"profile": "balanced", "latency_budget_ms": 200}

``profile`` picks a named preset; any other key overrides that preset's field. Rules, applied in
this order when the device status is known:

* **R1 battery-aware** (``battery_aware``): each side's weight is multiplied by
  ``max(0.05, (100 - battery_pct) / 100)`` -- the emptier battery counts more.
* **R2 handheld charging** (``charging_rule``): when the handheld is charging, ``Ww = 1, Wh = 0``
  -- its energy is free.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from coinf.device.config import config_path
from coinf.device.status import DeviceStatus
from coinf.wearable.planner.schedulers import (
    Constraint,
    Target,
    constraint_from_json,
    target_from_json,
)

from coinf.errors import UserError
from coinf.files import write_atomically

OBJECTIVES = ("auto", "latency", "energy", "throughput", "neurosurgeon-latency",
              "neurosurgeon-energy", "dyno")
MIN_BATTERY_WEIGHT = 0.05
MAX_POLICY_BYTES = 64 * 1024


class PolicyError(UserError):
    """The policy file or a policy setting is invalid."""


@dataclass(frozen=True)
class Policy:
    """Trade-off settings an end user controls."""

    profile: str = "balanced"
    w_wearable: float = 1.0
    w_handheld: float = 1.0
    battery_aware: bool = True
    charging_rule: bool = True
    objective: str = "auto"
    latency_budget_ms: float | None = None
    streaming: bool = False
    constraints: tuple[str, ...] = ()
    targets: tuple[str, ...] = ("latency",)
    replan_threshold: float = 0.05
    probe_interval_s: float = 300.0
    #: lossy packings whose calibrated accuracy drop exceeds this are never chosen (DynO)
    accuracy_tolerance_pp: float = 1.0
    notes: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for name in ("w_wearable", "w_handheld"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0 <= v <= 1000 or math.isnan(v):
                raise PolicyError(f"policy {name} must be a number in [0, 1000], got {v!r}")
        if self.objective not in OBJECTIVES:
            raise PolicyError(f"policy objective {self.objective!r} is not one of "
                              f"{', '.join(OBJECTIVES)}")
        b = self.latency_budget_ms
        if b is not None and (not isinstance(b, (int, float)) or b < 0 or math.isnan(b)):
            raise PolicyError(f"policy latency_budget_ms must be >= 0 or null, got {b!r}")
        if not 0 < self.replan_threshold < 10:
            raise PolicyError("policy replan_threshold must be in (0, 10), e.g. 0.05 for 5%")
        t = self.accuracy_tolerance_pp
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 100:
            raise PolicyError(f"policy accuracy_tolerance_pp must be in [0, 100], got {t!r}")
        if not 1 <= self.probe_interval_s <= 86400:
            raise PolicyError("policy probe_interval_s must be in [1, 86400] seconds")
        try:
            self.dyno_constraints()
            self.dyno_targets()
        except ValueError as exc:
            raise PolicyError(f"policy: {exc}") from None

    def dyno_constraints(self) -> list[Constraint]:
        return [constraint_from_json(c) for c in self.constraints]

    def dyno_targets(self) -> list[Target]:
        return [target_from_json(t) for t in self.targets]

    def weights(self, wearable: DeviceStatus | None = None,
                handheld: DeviceStatus | None = None) -> tuple[float, float, list[str]]:
        """Effective ``(Ww, Wh, reasons)`` after the end-user rules."""
        ww, wh = float(self.w_wearable), float(self.w_handheld)
        why: list[str] = [f"{self.profile}: Ww={ww:g}, Wh={wh:g}"]
        if self.battery_aware:
            for side, st in (("wearable", wearable), ("handheld", handheld)):
                if st is not None and st.battery_pct is not None:
                    f = max(MIN_BATTERY_WEIGHT, (100.0 - st.battery_pct) / 100.0)
                    if side == "wearable":
                        ww *= f
                    else:
                        wh *= f
                    why.append(f"R1 {side} battery {st.battery_pct:.0f}% -> x{f:.2f}")
        if self.charging_rule and handheld is not None and handheld.charging:
            ww, wh = 1.0, 0.0
            why.append("R2 handheld charging -> Ww=1, Wh=0")
        return ww, wh, why

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["constraints"] = list(self.constraints)
        d["targets"] = list(self.targets)
        d.pop("notes")
        return d


PROFILES: dict[str, Policy] = {
    "balanced": Policy("balanced", notes="both batteries count; R1 and R2 on"),
    "save-wearable": Policy("save-wearable", 1.0, 0.0, battery_aware=False, charging_rule=False,
                            notes="only the wearable's battery counts"),
    "save-handheld": Policy("save-handheld", 0.2, 0.8, battery_aware=False, charging_rule=False,
                            notes="the handheld's battery is running out (CoINF's 0.2/0.8)"),
    "performance": Policy("performance", objective="latency", notes="fastest inference"),
    "streaming": Policy("streaming", objective="throughput", streaming=True,
                        notes="pipelined frames: best throughput"),
}


_FIELDS = {f.name: f for f in fields(Policy) if f.name != "notes"}


def _coerce(key: str, value: Any) -> Any:
    """Turn a JSON or command-line value into the field's type, naming what was expected."""
    if key not in _FIELDS:
        raise PolicyError(f"unknown policy key {key!r}; expected one of {', '.join(_FIELDS)}")
    kind = _FIELDS[key].type
    try:
        if kind == "bool":
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                    raise ValueError(value)
                return value.lower() in ("true", "1", "yes", "on")
            if not isinstance(value, bool):
                raise ValueError(value)
            return value
        if kind == "float":
            return float(value)
        if kind == "float | None":
            return None if value in (None, "none", "null", "") else float(value)
        if kind == "tuple[str, ...]":
            if isinstance(value, str):
                return tuple(v.strip() for v in value.split(",") if v.strip())
            if not isinstance(value, list):
                raise ValueError(value)
            return tuple(_item_str(v) for v in value)
        return str(value)
    except (TypeError, ValueError):
        raise PolicyError(f"policy {key}: bad value {value!r} (expected {kind})") from None


def policy_from_json(obj: Any) -> Policy:
    if not isinstance(obj, dict):
        raise PolicyError("policy must be a JSON object")
    name = obj.get("profile", "balanced")
    if name not in PROFILES:
        raise PolicyError(f"unknown policy profile {name!r}; expected one of "
                          f"{', '.join(PROFILES)}")
    base = PROFILES[name]
    overrides = {k: _coerce(k, v) for k, v in obj.items() if k != "profile"}
    return replace(base, **overrides)


def _item_str(v: Any) -> str:
    """``[metric, op, thr]`` -> ``"metric<=thr"``; ``[metric, goal]`` -> ``"metric:goal"``."""
    if isinstance(v, str):
        return v
    if isinstance(v, list) and len(v) == 3:
        return f"{v[0]}{v[1]}{v[2]}"
    if isinstance(v, list) and len(v) == 2:
        return f"{v[0]}:{v[1]}"
    raise ValueError(v)


def load_policy(path: str | Path | None = None) -> tuple[Policy, Path, bool]:
    """The configured policy, the file it came from, and whether that file exists."""
    p = Path(path) if path else config_path()
    if not p.is_file():
        return PROFILES["balanced"], p, False
    raw = p.read_bytes()
    if len(raw) > MAX_POLICY_BYTES:
        raise PolicyError(f"{p} is {len(raw)} bytes; a policy file is at most {MAX_POLICY_BYTES}")
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PolicyError(f"{p} is not valid JSON: {exc}") from None
    return policy_from_json(obj), p, True


def set_policy(settings: dict[str, str], path: str | Path | None = None) -> tuple[Policy, Path]:
    """Merge ``settings`` into the policy file (validated before writing) and return it."""
    p = Path(path) if path else config_path()
    current: dict[str, Any] = {}
    if p.is_file():
        try:
            current = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise PolicyError(f"{p} is not valid JSON: {exc}") from None
    if "profile" in settings:  # a new profile resets the overrides
        current = {}
    for k, v in settings.items():
        if k == "profile":
            current[k] = v
        else:
            val = _coerce(k, v)
            current[k] = list(val) if isinstance(val, tuple) else val
    policy = policy_from_json(current)
    write_atomically(p, (json.dumps(current, indent=1, sort_keys=True) + "\n").encode())
    return policy, p
