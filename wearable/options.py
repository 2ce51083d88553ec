"""Settings of a :class:`~coinf.wearable.session.Session`, grouped like onnxruntime's options.

``SessionOptions`` is to ``coinf.Session`` what ``onnxruntime.SessionOptions`` is to
``InferenceSession``: every knob in one validated object. ``RunOptions`` bounds one ``run``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnxruntime as ort
from coinf.ble_protocol.packing import PackSpec
from coinf.wearable.planner.planner import _UNSET

from coinf.errors import InputError

UNSET: Any = _UNSET  # "take the policy's value" (a budget of None means "no budget")


@dataclass
class SessionOptions:
    """Where to split, how to reach the handheld, how to plan, how long to wait.

    Placement:
        split: candidate id (``c007``, ``handheld-only``, ``wearable-only``) to fix the split;
            ``None`` lets the planner choose before every run (docs/PLANNER.md).
        packing: how crossing tensors travel when the split is fixed: ``raw``, ``f32``, ``f16``,
            ``q1``..``q16`` (docs/PACKING.md).
        packings: what the planner may choose from (``("auto",)``: every calibrated packing).
    Link:
        transport: a link spec (``inprocess``, ``tcp:HOST:PORT``, ``unix:/path``,
            ``ble:hci-socket:0``, ``ble:tcp-client:HOST:PORT`` of ``coinf radio``), a
            :class:`~coinf.ble_protocol.shaped.Channel` (in-process handheld behind a shaped
            link), a :class:`~coinf.ble_protocol.link.Link`, or an async factory returning one.
            The older ``transport="socket", handheld=ADDR`` and ``transport="ble", hci=SPEC``
            forms are accepted too.
        transport_options: options of the transport (BLE: ``name``, ``keystore``, ``mtu``...).
        timeout: seconds one offloaded inference may take before it is cancelled (on both
            sides) and, with ``fallback``, finished on the wearable. The planner never picks a
            configuration predicted to need more than half of it; a request larger than the
            link can carry in it gets ``request_timeout``'s stretched deadline (docs/PLANNER.md,
            "Timeouts and feasibility").
        connect_timeout: seconds to open a link and handshake (default: ``timeout``); after the
            first connection a lost handheld is awaited at most ``reconnect_timeout``.
        fallback: finish an inference locally when the handheld is unreachable, slow or failing
            (transient :class:`~coinf.errors.LinkError`), then retry after a backoff (0.5 s
            doubling to ``max_backoff_s``). Configuration errors always raise.
    Planning: objective, latency_budget_ms, policy, wearable_profile, handheld_profile.
    Emulation: slowdown, threads (this wearable), handheld_slowdown, handheld_threads
        (an in-process handheld).
    Runtime (per stage): runtime runs this wearable's slices (heads, and tails it finishes
        itself) with ``onnxruntime``, ``litert`` (the bundle's verified TFLite slices; a slice
        left out of the TFLite set stays on onnxruntime) or ``auto`` (the faster of the two for
        each slice, as ``coinf profile`` measured it in ``wearable_profile``);
        handheld_runtime the same for an in-process handheld's tails (a remote handheld
        chooses with ``coinf handheld --runtime``). docs/BUNDLE.md, "TFLite slices".
    """

    split: str | None = None
    packing: str = "raw"
    packings: Sequence[str] = ("auto",)
    transport: Any = "inprocess"
    transport_options: Mapping[str, Any] = field(default_factory=dict)
    handheld: str | None = None  # legacy: transport="socket", handheld="tcp:..."
    hci: str | None = None  # legacy: transport="ble", hci="hci-socket:0"
    ble_options: Mapping[str, Any] | None = None  # legacy name of transport_options for BLE
    timeout: float = 30.0
    connect_timeout: float | None = None
    reconnect_timeout: float = 3.0
    fallback: bool = True
    max_backoff_s: float = 30.0
    objective: str | None = None
    latency_budget_ms: Any = UNSET
    policy: Any = None
    wearable_profile: Any = None
    handheld_profile: Any = None
    slowdown: float = 1.0
    threads: int = 0
    handheld_slowdown: float = 1.0
    handheld_threads: int = 0
    head_cache: int = 4
    runtime: str = "onnxruntime"
    handheld_runtime: str = "onnxruntime"
    stream_depth: int = 3

    def replace(self, **changes: Any) -> SessionOptions:
        """A copy with ``changes``; unknown names raise :class:`InputError`."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise InputError(
                f"unknown Session option {unknown[0]!r}; the options are {sorted(known)}"
            )
        return dataclasses.replace(self, **changes)

    def validate(self) -> SessionOptions:
        """Check ranges and normalise the legacy transport forms; returns self."""
        for name in ("timeout", "reconnect_timeout", "max_backoff_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value > 0):
                raise InputError(f"{name} must be a number of seconds > 0, got {value!r}")
        if self.connect_timeout is not None and not self.connect_timeout > 0:
            raise InputError(f"connect_timeout must be > 0 s, got {self.connect_timeout!r}")
        for name in ("runtime", "handheld_runtime"):
            if getattr(self, name) not in ("onnxruntime", "litert", "auto"):
                raise InputError(f"{name} must be 'onnxruntime', 'litert' or 'auto', got "
                                 f"{getattr(self, name)!r}")
        if self.head_cache < 1 or self.stream_depth < 1:
            raise InputError("head_cache and stream_depth must be >= 1")
        if self.transport == "socket":
            if not self.handheld:
                raise InputError("transport='socket' needs handheld='unix:/path' or "
                                 "'tcp:HOST:PORT'")
            self.transport = self.handheld
        elif self.transport == "ble":
            if not self.hci:
                raise InputError("transport='ble' needs hci='hci-socket:0', 'usb:0' or "
                                 "'tcp-client:HOST:PORT' (coinf radio); or transport='ble:SPEC'")
            self.transport = f"ble:{self.hci}"
        if self.ble_options:
            self.transport_options = {**self.ble_options, **self.transport_options}
        return self

    @property
    def effective_connect_timeout(self) -> float:
        return self.connect_timeout if self.connect_timeout is not None else self.timeout


@dataclass(frozen=True)
class RunOptions:
    """Per-call settings of ``Session.run`` (onnxruntime has ``RunOptions`` too; this one is
    coinf's and is the only kind accepted).

    timeout: seconds for this inference's offloaded part (default: the session's ``timeout``).
    tag: a label copied into ``last_run.tag`` (like onnxruntime's ``run_tag``).
    local_only: run this inference entirely on the wearable (no link use).
    """

    timeout: float | None = None
    tag: str = ""
    local_only: bool = False

    def __post_init__(self) -> None:
        if self.timeout is not None and not self.timeout > 0:
            raise InputError(f"RunOptions.timeout must be > 0 s, got {self.timeout!r}")


def request_timeout(configured: float, request_bytes: int, up_bps: float | None = None,
                    rtt_ms: float | None = None, explicit: bool = False) -> float:
    """The deadline of one offloaded request, in seconds.

    ``max(configured, TIMEOUT_MARGIN x (RTT/2 + request_bytes / up_bps))`` with the measured
    uplink bandwidth (default: the planner's 20 kB/s, 30 ms estimate): a request the link cannot
    carry within the configured timeout gets twice its predicted airtime instead of failing
    every time. A plan the planner chose never needs the stretch (it excludes configurations
    whose exchange x the margin exceeds the timeout); a split fixed by the caller may. An
    ``explicit`` per-call ``RunOptions.timeout`` is a hard bound and is never stretched."""
    from coinf.wearable.planner.adapt import DEFAULT_LINK
    from coinf.wearable.planner.costs import TIMEOUT_MARGIN

    if explicit:
        return configured
    bps = up_bps if up_bps and up_bps > 0 else DEFAULT_LINK.up_bps
    rtt = DEFAULT_LINK.rtt_ms if rtt_ms is None else rtt_ms
    predicted_s = rtt / 2e3 + request_bytes / bps
    return max(configured, TIMEOUT_MARGIN * predicted_s)


def check_run_options(run_options: object | None) -> RunOptions:
    """``None`` -> defaults; a :class:`RunOptions` as is; anything else is refused."""
    if run_options is None:
        return RunOptions()
    if isinstance(run_options, RunOptions):
        return run_options
    raise InputError(
        f"run_options must be coinf.RunOptions (timeout, tag, local_only), got "
        f"{type(run_options).__module__}.{type(run_options).__name__}; onnxruntime's "
        "RunOptions has no meaning for a split session"
    )


def parse_packing(packing: str | PackSpec) -> PackSpec:
    """A packing spec (``q8``, ``f16``...) as a PackSpec; a bad one is an InputError."""
    if isinstance(packing, PackSpec):
        return packing
    try:
        return PackSpec.parse(packing)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def check_providers(providers: Sequence[str] | None) -> list[str]:
    """onnxruntime execution providers by name (default CPU); unknown ones are refused."""
    if providers is None:
        return ["CPUExecutionProvider"]
    available = ort.get_available_providers()
    names = [p if isinstance(p, str) else p[0] for p in providers]
    bad = [p for p in names if p not in available]
    if bad or not names:
        raise InputError(f"execution provider(s) {bad or names} not available; this "
                         f"onnxruntime has {available}")
    return names
