"""Device profiles: how fast a device computes, what its power draw is, and per-model timings.

A profile is JSON (``coinf-device-profile``, version 1)::

    {"format": "coinf-device-profile", "version": 1, "name": "pi-zero-2w", "role": "wearable",
     "threads": 4, "slowdown": 1.0, "gflops": 1.0,
     "power": {"cpu_active_w": 2.0, "cpu_idle_w": 0.6, "ble_tx_w": 0.15, "ble_rx_w": 0.12},
     "predictor": {... coinf-predictor ...} | null,
     "models": {"<bundle identity>": {"nodes": {"conv1": 3.2, ...},
                                      "candidates": {"c003": {"head_ms": 12.0, "tail_ms": 4.1,
                                                              "head_ms_litert": 9.5, ...}},
                                      "node_sum_error": {...}}},
     "host": {"node": "raspberrypi", "machine": "aarch64", "system": "Linux"} | null}

``host`` is the machine the timings were measured on (``coinf profile`` refuses to overwrite
another machine's profile without ``--force``).

Compute time of one side of a cut, best source first: the measured slice
(``models[id].candidates``), the sum of measured per-node times, the layer predictor on the
model's nodes, and last ``flops / gflops``. Every time is multiplied by ``slowdown`` (emulation:
one machine playing a slower device). ``*_ms_litert`` are the same slices' times with LiteRT
(the bundle's TFLite twins, when it has them): ``runtime="auto"`` picks the faster one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from coinf.device.config import config_path
from coinf.device.defaults import LAPTOP_RATES, PI_ZERO_2W_RATES, OpRates
from coinf.device.predict import Predictor
from coinf.device.slicepred import SlicePredictor

from coinf.errors import ProtocolError, UserError
from coinf.files import write_atomically
from coinf.jsonobject import decode_json

FORMAT = "coinf-device-profile"
VERSION = 1
MAX_PROFILE_BYTES = 8 * 1024 * 1024  # a profile that arrives over the control channel


class ProfileError(UserError):
    """A device profile is missing, malformed or does not fit."""


@dataclass(frozen=True)
class PowerModel:
    """Power draw in watts (ms x W = mJ). Radio figures are the *extra* draw while the radio
    moves data, on top of the idle CPU; ``wifi_wake_mj`` is the extra energy of one exchange
    over Wi-Fi beyond its airtime (leaving power save, and the radio's awake tail after the
    last frame). Profiles written before Wi-Fi was modelled load with the defaults below."""

    cpu_active_w: float
    cpu_idle_w: float
    ble_tx_w: float
    ble_rx_w: float
    wifi_tx_w: float = 0.45
    wifi_rx_w: float = 0.25
    wifi_wake_mj: float = 30.0

    def __post_init__(self) -> None:
        for k, v in asdict(self).items():
            top = 1e5 if k.endswith("_mj") else 1000
            if not isinstance(v, (int, float)) or not 0 <= v < top:
                unit = "mJ" if k.endswith("_mj") else "watts"
                raise ProfileError(f"power model: {k} must be a number of {unit} in [0, {top:g}),"
                                   f" got {v!r}")

    def radio(self, kind: str) -> tuple[float, float, float]:
        """(send W, receive W, mJ per exchange) of the radio a link of ``kind`` uses
        (``ble`` or ``wifi``)."""
        if kind == "wifi":
            return self.wifi_tx_w, self.wifi_rx_w, self.wifi_wake_mj
        return self.ble_tx_w, self.ble_rx_w, 0.0

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> PowerModel:
        need = ("cpu_active_w", "cpu_idle_w", "ble_tx_w", "ble_rx_w")
        try:
            return cls(**{k: float(obj[k]) for k in cls.__dataclass_fields__
                          if k in need or k in obj})
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileError(f"power model needs {list(need)} (and may give "
                               f"{[k for k in cls.__dataclass_fields__ if k not in need]}): "
                               f"{exc}") from None


# Defaults. Every number is an estimate from public measurements; see docs/PLANNER.md "Energy".
PI_ZERO_2W_POWER = PowerModel(cpu_active_w=2.0, cpu_idle_w=0.6, ble_tx_w=0.15, ble_rx_w=0.12)
LAPTOP_POWER = PowerModel(cpu_active_w=15.0, cpu_idle_w=4.0, ble_tx_w=0.05, ble_rx_w=0.05,
                          wifi_tx_w=0.8, wifi_rx_w=0.5, wifi_wake_mj=0.0)


@dataclass
class ModelProfile:
    """Timings of one bundle on one device (ms), keyed by node name and candidate id."""

    nodes: dict[str, float] = field(default_factory=dict)
    candidates: dict[str, dict[str, float]] = field(default_factory=dict)
    node_sum_error: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ModelProfile:
        nodes = {str(k): _ms(v, f"node {k}") for k, v in obj.get("nodes", {}).items()}
        cands = {str(c): {str(k): _ms(v, f"candidate {c} {k}") for k, v in d.items()}
                 for c, d in obj.get("candidates", {}).items()}
        err = {str(k): float(v) for k, v in obj.get("node_sum_error", {}).items()}
        return cls(nodes, cands, err)


def _ms(v: Any, what: str) -> float:
    if not isinstance(v, (int, float)) or not 0 <= v < 1e7:
        raise ProfileError(f"profile: {what} must be a time in ms >= 0, got {v!r}")
    return float(v)


@dataclass
class DeviceProfile:
    """What the planner knows about one device."""

    name: str
    role: str
    power: PowerModel
    threads: int = 1
    slowdown: float = 1.0
    gflops: float = 1.0
    predictor: Predictor | None = None
    models: dict[str, ModelProfile] = field(default_factory=dict)
    #: the machine it was measured on (:func:`this_host`), None for defaults and old profiles
    host: dict[str, str] | None = None
    #: built-in per-op-type compute estimates (:mod:`.defaults`), used when nothing measured
    #: covers a part; ``gflops`` stays the last resort
    rates: OpRates | None = None
    #: the wearable's memory budget for a head (MB), a hard planner constraint; None = default
    memory_budget_mb: float | None = None

    def __post_init__(self) -> None:
        if self.memory_budget_mb is not None and not 0 < self.memory_budget_mb < 1e7:
            raise ProfileError(f"profile memory_budget_mb must be in (0, 1e7) MB, got "
                               f"{self.memory_budget_mb}")
        if self.role not in ("wearable", "handheld"):
            raise ProfileError(f"profile role must be 'wearable' or 'handheld', got {self.role!r}")
        if not 0 < self.slowdown < 1e4:
            raise ProfileError(f"profile slowdown must be in (0, 10000), got {self.slowdown}")
        if not 0 < self.gflops < 1e6:
            raise ProfileError(f"profile gflops must be in (0, 1e6), got {self.gflops}")
        if not 1 <= self.threads <= 256:
            raise ProfileError(f"profile threads must be in [1, 256], got {self.threads}")

    # -- defaults ---------------------------------------------------------------------------
    @classmethod
    def pi_zero_2w(cls) -> DeviceProfile:
        """Raspberry Pi Zero 2 W: 4x Cortex-A53 @ 1 GHz; per-op-type rates
        :data:`~coinf.device.defaults.PI_ZERO_2W_RATES` and :data:`PI_ZERO_2W_POWER` (estimates
        from published figures, docs/PLANNER.md)."""
        return cls("pi-zero-2w", "wearable", PI_ZERO_2W_POWER, threads=4, gflops=2.0,
                   rates=PI_ZERO_2W_RATES)

    @classmethod
    def laptop(cls) -> DeviceProfile:
        """A laptop-class handheld: per-op-type rates :data:`~coinf.device.defaults.LAPTOP_RATES`
        and :data:`LAPTOP_POWER` (estimates, docs/PLANNER.md)."""
        return cls("laptop", "handheld", LAPTOP_POWER, threads=4, gflops=30.0,
                   rates=LAPTOP_RATES)

    @property
    def is_builtin(self) -> bool:
        """Nothing measured: only the built-in estimates."""
        return not self.models and self.predictor is None and self.host is None

    @classmethod
    def default(cls, role: str) -> DeviceProfile:
        return cls.pi_zero_2w() if role == "wearable" else cls.laptop()

    # -- compute time -----------------------------------------------------------------------
    def part_ms(self, identity: str, cid: str, side: str, node_names: tuple[str, ...],
                flops: int, node_predictions: Callable[[], dict[str, float]] | None = None,
                ) -> tuple[float, str]:
        """Time (ms) of one side (``head``/``tail``) of candidate ``cid`` and where it came from."""
        if not node_names and flops == 0:
            return 0.0, "empty"
        mp = self.models.get(identity)
        if mp is not None:
            measured = mp.candidates.get(cid, {}).get(f"{side}_ms")
            if measured is not None:
                return measured * self.slowdown, "measured slice"
            if node_names and mp.nodes:
                # the profile covers the whole model: a node it lacks was optimised away
                return sum(mp.nodes.get(n, 0.0) for n in node_names) * self.slowdown, \
                    "measured nodes"
        if (self.predictor is not None or self.rates is not None) and \
                node_predictions is not None and node_names:
            pred = node_predictions()
            if all(n in pred for n in node_names):
                how = "predicted nodes" if self.predictor is not None else "default op rates"
                return sum(pred[n] for n in node_names) * self.slowdown, how
        return flops / (self.gflops * 1e6) * self.slowdown, "flops/gflops"

    def node_ms(self, identity: str, feats: list[Any], style: str = "coinf") -> dict[str, float]:
        """Per-node time (ms) for every featurised node: measured, else predicted, else flops."""
        mp = self.models.get(identity)
        out = {}
        for f in feats:
            if mp is not None and f.name in mp.nodes:
                ms = mp.nodes[f.name]
            elif self.predictor is not None:
                ms = self.predictor.predict(f, style)
            elif self.rates is not None:
                ms = self.rates.node_ms(f)
            else:
                ms = f.flops / (self.gflops * 1e6)
            out[f.name] = ms * self.slowdown
        return out

    # -- JSON -------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "name": self.name, "role": self.role,
                "threads": self.threads, "slowdown": self.slowdown, "gflops": self.gflops,
                "power": asdict(self.power),
                "predictor": self.predictor.to_json() if self.predictor else None,
                "models": {k: m.to_json() for k, m in self.models.items()},
                "host": self.host, "rates": self.rates.to_json() if self.rates else None,
                "memory_budget_mb": self.memory_budget_mb}

    @classmethod
    def from_json(cls, obj: Any) -> DeviceProfile:
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise ProfileError("not a coinf device profile (format must be 'coinf-device-profile')")
        if obj.get("version") != VERSION:
            raise ProfileError(f"device profile version {obj.get('version')}; this coinf reads "
                               f"{VERSION} (re-run `coinf profile`)")
        try:
            pred = Predictor.from_json(obj["predictor"]) if obj.get("predictor") else None
            if pred is not None and pred.meta.get("slice_model") is not None:
                SlicePredictor.from_json(pred.meta["slice_model"])  # in-context, validated
            return cls(str(obj["name"]), str(obj["role"]), PowerModel.from_json(obj["power"]),
                       int(obj.get("threads", 1)), float(obj.get("slowdown", 1.0)),
                       float(obj.get("gflops", 1.0)), pred,
                       {str(k): ModelProfile.from_json(v)
                        for k, v in obj.get("models", {}).items()},
                       _host(obj.get("host")),
                       OpRates.from_json(obj["rates"]) if obj.get("rates") else None,
                       None if obj.get("memory_budget_mb") is None
                       else float(obj["memory_budget_mb"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProfileError(f"device profile is malformed: {exc}") from None

    @classmethod
    def from_bytes(cls, raw: bytes) -> DeviceProfile:
        """Parse a profile received from the peer (size-capped, JSON only)."""
        if len(raw) > MAX_PROFILE_BYTES:
            raise ProfileError(f"device profile is {len(raw)} bytes; the limit is "
                               f"{MAX_PROFILE_BYTES}")
        try:
            obj = decode_json(raw, MAX_PROFILE_BYTES, what="device profile")
            return cls.from_json(obj)
        except ProfileError:
            raise
        except (ProtocolError, ValueError, TypeError, KeyError, OverflowError) as exc:
            raise ProfileError(f"device profile is not valid: {exc}") from None

    def save(self, path: str | Path) -> None:
        write_atomically(path, (json.dumps(self.to_json(), indent=1) + "\n").encode())

    @classmethod
    def load(cls, path: str | Path) -> DeviceProfile:
        path = Path(path)
        if not path.is_file():
            raise ProfileError(f"no device profile at {path} (make one with `coinf profile`)")
        return cls.from_bytes(path.read_bytes())


# -- profiling ------------------------------------------------------------------------------
def profile_nodes(model_path: str | Path, threads: int = 1, warmup: int = 2,
                  repeats: int = 5, level: str = "basic") -> dict[str, float]:
    """Per-node latency (ms, median over ``repeats`` runs after ``warmup``) from onnxruntime's
    profiler. ``basic`` keeps every node's name (no fusion); ``all`` is how slices really run:
    fused kernels are attributed to the node they were folded into
    (:func:`coinf.device.incontext.attribute`), so fused followers are absent (cost 0)."""
    from coinf.device.incontext import attribute, kernel_times

    from coinf.bundle import open_slice

    open_slice(model_path)  # a damaged file: BundleError naming it
    kern, ops, _ = kernel_times(model_path, level, threads, warmup, repeats)
    if level == "basic":
        return kern
    import onnx

    return attribute(onnx.load(str(model_path)), kern, ops)[0]


def profile_bundle(bundle: Any, threads: int = 1, warmup: int = 2, repeats: int = 5,
                   slices: bool = True, progress: Callable[[str], None] | None = None,
                   ) -> ModelProfile:
    """Per-node times of the whole model plus directly measured head/tail slice times (each at
    least ``repeats`` runs filling :data:`~coinf.device.sweep.SLICE_MIN_S`, their
    :data:`~coinf.device.sweep.SLICE_STAT`, as the in-context predictor's training slices are
    timed)."""
    from coinf.convert.codec_speed import codec_times
    from coinf.device.litert import litert_times
    from coinf.device.sweep import make_session, random_feeds, time_slice

    # at the level slices run, so node sums include fusion (fused followers cost 0)
    mp = ModelProfile(nodes=profile_nodes(bundle.model_path, threads, warmup, repeats, "all"))
    if not slices:
        return mp
    for i, cand in enumerate(bundle.candidates):
        entry: dict[str, float] = {}
        for side, part in (("head", cand.head), ("tail", cand.tail)):
            if part.file is None:
                entry[f"{side}_ms"] = 0.0
                continue
            sess = make_session(str(bundle.path(part.file)), threads)
            entry[f"{side}_ms"] = time_slice(sess, random_feeds(sess), warmup, repeats, 5.0)
            entry.update(litert_times(bundle, cand, side, random_feeds(sess), threads, warmup,
                                      repeats))  # {side}_ms_litert when a TFLite twin ships
            node_sum = sum(mp.nodes.get(n, 0.0) for n in part.nodes)
            if entry[f"{side}_ms"] > 0:
                mp.node_sum_error[f"{cand.id}.{side}"] = node_sum / entry[f"{side}_ms"] - 1.0
        entry.update(codec_times(cand, repeats))
        mp.candidates[cand.id] = entry
        if progress:
            progress(f"{i + 1}/{len(bundle.candidates)} {cand.id}: head "
                     f"{entry['head_ms']:.2f} ms, tail {entry['tail_ms']:.2f} ms")
    return mp


def _host(obj: Any) -> dict[str, str] | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise ProfileError(f"device profile host must be an object, got {obj!r}")
    return {str(k): str(v) for k, v in obj.items()}


def this_host() -> dict[str, str]:
    """The machine a profile is measured on: host name and CPU architecture."""
    import platform

    return {"node": platform.node(), "machine": platform.machine(),
            "system": platform.system()}


def same_host(a: dict[str, str], b: dict[str, str]) -> bool:
    return a.get("node") == b.get("node") and a.get("machine") == b.get("machine")


def describe_host(host: dict[str, str] | None) -> str:
    if not host:
        return "an unrecorded machine"
    return f"{host.get('node') or '?'} ({host.get('machine') or '?'})"


def _board_model() -> str:
    for path in ("/proc/device-tree/model", "/sys/firmware/devicetree/base/model"):
        try:
            return Path(path).read_bytes().rstrip(b"\0").decode("utf-8", "replace")
        except OSError:
            continue
    return ""


def detect_role() -> str | None:
    """``wearable`` on a Raspberry Pi, ``handheld`` on a PC (x86, or macOS / Windows), None when
    this machine could be either (another ARM board): then the caller must be told."""
    import platform

    if _board_model().startswith("Raspberry Pi"):
        return "wearable"
    if platform.system() in ("Darwin", "Windows"):
        return "handheld"
    if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
        return "handheld"
    return None


def default_profile_path(role: str) -> Path:
    """``<config dir>/<role>-profile.json`` next to the policy file."""
    return config_path().parent / f"{role}-profile.json"


def load_or_default(role: str, path: str | Path | None = None) -> DeviceProfile:
    """The saved profile for ``role`` if there is one, else the built-in default."""
    p = Path(path) if path else default_profile_path(role)
    if p.is_file():
        prof = DeviceProfile.load(p)
        if prof.role != role:
            raise ProfileError(f"{p} is a {prof.role} profile; expected {role}")
        return prof
    return DeviceProfile.default(role)


def profile_for_runtime(role: str, runtime: str, profile: Any) -> DeviceProfile | None:
    """The profile ``runtime="auto"`` chooses each slice's runtime from (a profile, a path or
    None for this device's own or the default); None unless ``runtime`` is ``auto``."""
    if runtime != "auto":
        return None
    if isinstance(profile, DeviceProfile):
        return profile
    return load_or_default(role, profile)
