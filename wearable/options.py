"""Settings of a :class:`~coinf.wearable.session.Session`, grouped like onnxruntime's options.

``SessionOptions`` is to ``coinf.Session`` what ``onnxruntime.SessionOptions`` is to
``InferenceSession``: every knob in one object, in four frozen groups -- where the model runs
(:class:`PlacementOptions`), how the handheld is reached (:class:`LinkOptions`), how the split is
chosen (:class:`PlannerOptions`) and what devices are emulated (:class:`EmulationOptions`)::

    SessionOptions(placement=PlacementOptions(split="c007", packing="q8"),
                   link=LinkOptions(transport="tcp:127.0.0.1:7878", timeout=5.0))

Each group checks its values when it is built; nothing changes afterwards (``replace`` makes a
copy). An option given in the wrong place raises an :class:`~coinf.errors.InputError` naming the
group it belongs to. ``RunOptions`` bounds one ``run``.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, cast

import onnxruntime as ort
from coinf.ble_protocol.packing import PackSpec
from coinf.device.profile import DeviceProfile
from coinf.wearable.planner.planner import _UNSET
from coinf.wearable.policy import OBJECTIVES, Policy

from coinf.errors import InputError

UNSET: Any = _UNSET  # "take the policy's value" (a budget of None means "no budget")
RUNTIMES = ("onnxruntime", "litert", "auto")

#: options that no longer exist -> what replaces them
_GONE = {
    "handheld": 'LinkOptions(transport="unix:/path" | "tcp:HOST:PORT")',
    "hci": 'LinkOptions(transport="ble:hci-socket:0")',
    "ble_options": "LinkOptions(transport_options=...)",
}
_GONE_TRANSPORTS = {"socket": _GONE["handheld"], "ble": _GONE["hci"]}


class _Options:
    """What the groups and :class:`SessionOptions` share: a keyword given to the wrong class
    (or that no longer exists) is an :class:`InputError` naming where it lives now."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        own = _fields(cls)
        for name in kwargs:
            if name not in own:
                raise InputError(misplaced(name))
        return super().__new__(cls)

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` (checked like the constructor's keywords)."""
        return dataclasses.replace(cast(Any, self), **changes)

    if not TYPE_CHECKING:  # keeps mypy checking attribute names
        def __getattr__(self, name: str) -> Any:
            group = _GROUP_OF.get(name)
            if group is None or name.startswith("__"):
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            raise AttributeError(f"{name} is a {group} option: read options.{group}.{name} (set "
                                 f"by SessionOptions({group}={_GROUPS[group].__name__}"
                                 f"({name}=...)))")


def _fields(cls: Any) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _fail(obj: object, name: str, expected: str) -> InputError:
    return InputError(f"{type(obj).__name__}.{name} must be {expected}, got "
                      f"{getattr(obj, name)!r}")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_packing(obj: object, name: str, spec: object, allow_auto: bool = False) -> None:
    if allow_auto and spec == "auto":
        return
    if isinstance(spec, PackSpec):
        return
    try:
        PackSpec.parse(spec)  # type: ignore[arg-type]
    except (ValueError, TypeError, AttributeError) as exc:
        raise InputError(f"{type(obj).__name__}.{name}: {exc}"
                         + (", or auto (every calibrated packing)" if allow_auto else "")
                         ) from None


@dataclass(frozen=True, kw_only=True)
class PlacementOptions(_Options):
    """Where the model runs.

    split: candidate id (``c007``, ``handheld-only``, ``wearable-only``) to fix the split;
        ``None`` lets the planner choose before every run (docs/PLANNER.md).
    packing: how crossing tensors travel when the split is fixed: ``raw``, ``f32``, ``f16``,
        ``q1``..``q16`` (docs/PACKING.md).
    packings: what the planner may choose from (``("auto",)``: every calibrated packing).
    runtime: what runs this wearable's slices (heads, and tails it finishes itself):
        ``onnxruntime``, ``litert`` (the bundle's verified TFLite slices; a slice left out of the
        TFLite set stays on onnxruntime) or ``auto`` (the faster of the two for each slice, as
        ``coinf profile`` measured it in ``PlannerOptions.wearable_profile``).
    handheld_runtime: the same for an in-process handheld's tails (a remote handheld chooses
        with ``coinf handheld --runtime``). docs/BUNDLE.md, "TFLite slices".
    head_cache: heads kept loaded when the split changes (the slice cache holds this many
        plus 2, for tails finished here).
    plan: a fixed plan of any number of stages, instead of ``split``: a
        :class:`~coinf.wearable.plan.Plan`, its JSON object, or a JSON file (``coinf plan
        --json`` prints one under ``plan``). Stages name their devices: ``handheld`` is reached
        by ``LinkOptions.transport``, any other by ``helpers``.
    helpers: the helper devices a plan may name: :class:`~coinf.wearable.pipeline_config.
        HelperConfig` objects, a pipeline config file (docs/PIPELINE.md), or a
        :class:`~coinf.wearable.discovery.Discover`: the helpers announced on the network
        (DNS-SD) that serve the bundle, found when the Session starts.
    """

    split: str | None = None
    packing: str = "raw"
    packings: Sequence[str] = ("auto",)
    runtime: str = "onnxruntime"
    handheld_runtime: str = "onnxruntime"
    head_cache: int = 4
    plan: Any = None
    helpers: Any = ()

    def fixed_plan(self, bundle: Any) -> Any:
        """The fixed plan over ``bundle`` (checked against it), or None."""
        from coinf.wearable.plan import Plan

        if self.plan is None or isinstance(self.plan, Plan):
            return self.plan
        obj = self.plan
        if isinstance(obj, str | Path):
            import json

            try:
                obj = json.loads(Path(obj).read_text())
            except (OSError, ValueError) as exc:
                raise InputError(f"PlacementOptions.plan {str(self.plan)!r}: cannot read a "
                                 f"JSON plan: {exc}") from None
            if isinstance(obj, dict) and isinstance(obj.get("plan"), dict):
                obj = obj["plan"]  # the output of `coinf plan --json`
        return Plan.from_json(obj, bundle)

    def helper_configs(self, bundle: Any = None) -> list[Any]:
        """The helpers as :class:`~coinf.wearable.pipeline_config.HelperConfig` objects;
        with ``Discover``, those found now serving ``bundle`` (a Bundle; default: the
        ``Discover``'s ``bundle_identity``)."""
        from coinf.wearable.discovery import Discover
        from coinf.wearable.pipeline_config import HelperConfig, load_helpers

        if isinstance(self.helpers, str | Path):
            return load_helpers(self.helpers)
        if isinstance(self.helpers, Discover):
            return self.helpers.helper_configs(bundle)
        return [h for h in self.helpers if isinstance(h, HelperConfig)]

    def __post_init__(self) -> None:
        if self.split is not None and not (isinstance(self.split, str) and self.split):
            raise _fail(self, "split", "a candidate id (c007, handheld-only, wearable-only) "
                        "or None (the planner chooses)")
        _check_packing(self, "packing", self.packing)
        if isinstance(self.packings, str) or not isinstance(self.packings, Sequence) \
                or not self.packings:
            raise _fail(self, "packings", 'a non-empty sequence of packings (("auto",), '
                        '("raw", "q8"))')
        for spec in self.packings:
            _check_packing(self, "packings", spec, allow_auto=True)
        object.__setattr__(self, "packings", tuple(self.packings))
        for name in ("runtime", "handheld_runtime"):
            if getattr(self, name) not in RUNTIMES:
                raise _fail(self, name, "'onnxruntime', 'litert' or 'auto'")
        if not (_is_int(self.head_cache) and self.head_cache >= 1):
            raise _fail(self, "head_cache", "an int >= 1")
        if self.plan is not None and self.split is not None:
            raise InputError("PlacementOptions: give split or plan, not both")
        if not isinstance(self.plan, str | Path | Mapping | type(None)) and \
                type(self.plan).__name__ != "Plan":
            raise _fail(self, "plan", "a Plan, its JSON object or a JSON file")
        from coinf.wearable.discovery import Discover

        if not isinstance(self.helpers, str | Path | Discover):
            from coinf.wearable.pipeline_config import HelperConfig

            if not isinstance(self.helpers, Sequence) or \
                    not all(isinstance(h, HelperConfig) for h in self.helpers):
                raise _fail(self, "helpers", "HelperConfig objects, a pipeline config file or "
                            "Discover(...)")
            object.__setattr__(self, "helpers", tuple(self.helpers))


@dataclass(frozen=True, kw_only=True)
class LinkOptions(_Options):
    """How the handheld is reached, and how long it is waited for.

    transport: a link spec (``inprocess``, ``tcp:HOST:PORT``, ``unix:/path``,
        ``ble:hci-socket:0``, ``ble:tcp-client:HOST:PORT`` of ``coinf radio``), a
        :class:`~coinf.ble_protocol.shaped.Channel` (in-process handheld behind a shaped link),
        a :class:`~coinf.ble_protocol.link.Link`, or an async factory returning one. The
        scheme is checked when the Session opens its connector.
    transport_options: options of the transport (BLE: ``name``, ``keystore``, ``mtu``...;
        ``tcp:``: ``fingerprint``; ``tcp+insecure:`` needs ``allow_insecure=True``).
    helper_ble_options: the same for the helpers this wearable reaches over BLE (a helper whose
        ``wearable_link`` is ``ble:...``: this wearable's GATT server pairs with it, so
        ``keystore``, ``passkey``, ``pairing_window_s``...).
    timeout: seconds one offloaded inference may take before it is cancelled (on both sides)
        and, with ``fallback``, finished on the wearable. The planner never picks a
        configuration predicted to need more than half of it; a request larger than the link
        can carry in it gets ``request_timeout``'s stretched deadline (docs/PLANNER.md,
        "Timeouts and feasibility").
    connect_timeout: seconds to open a link and handshake (default: ``timeout``); after the
        first connection a lost handheld is awaited at most ``reconnect_timeout``.
    fallback: finish an inference locally when the handheld is unreachable, slow or failing
        (transient :class:`~coinf.errors.LinkError`), then retry after a backoff (0.5 s
        doubling to ``max_backoff_s``). Configuration errors always raise.
    stream_depth: frames in flight at once in ``Session.stream`` (default of its ``depth``).
    alternates: more links to the same handheld, by name: a spec string (``{"wifi":
        "tcp:HOST:PORT"}``) or an :class:`AlternateLink`. The planner then chooses link x cut
        x packing per frame over the links that are up (docs/PLANNER.md, "Several links at run
        time"); a frame whose link fails is re-sent on another. The transport's own link is
        named after its kind (``ble`` for ``ble:`` specs, ``wifi`` for ``tcp:`` ones, else
        ``handheld``); no alternate may take that name.
    """

    transport: Any = "inprocess"
    transport_options: Mapping[str, Any] = field(default_factory=dict)
    helper_ble_options: Mapping[str, Any] = field(default_factory=dict)
    timeout: float = 30.0
    connect_timeout: float | None = None
    reconnect_timeout: float = 3.0
    fallback: bool = True
    max_backoff_s: float = 30.0
    stream_depth: int = 3
    alternates: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.transport, str) and self.transport in _GONE_TRANSPORTS:
            raise InputError(f"transport={self.transport!r} is gone; use "
                             f"{_GONE_TRANSPORTS[self.transport]}")
        if self.transport == "" or self.transport is None:
            raise _fail(self, "transport", "a link spec (inprocess, tcp:HOST:PORT, unix:/path, "
                        "ble:hci-socket:0), a Channel, a Link or an async link factory")
        for name in ("transport_options", "helper_ble_options"):
            if not isinstance(getattr(self, name), Mapping):
                raise _fail(self, name, "a mapping of the transport's options")
            object.__setattr__(self, name, dict(getattr(self, name)))
        for name in ("timeout", "reconnect_timeout", "max_backoff_s"):
            if not (_is_number(getattr(self, name)) and getattr(self, name) > 0):
                raise _fail(self, name, "a number of seconds > 0")
        if self.connect_timeout is not None and not (_is_number(self.connect_timeout)
                                                     and self.connect_timeout > 0):
            raise _fail(self, "connect_timeout", "a number of seconds > 0 or None (= timeout)")
        if not isinstance(self.fallback, bool):
            raise _fail(self, "fallback", "True or False")
        if not (_is_int(self.stream_depth) and self.stream_depth >= 1):
            raise _fail(self, "stream_depth", "an int >= 1")
        object.__setattr__(self, "alternates", self._checked_alternates())

    def _checked_alternates(self) -> dict[str, AlternateLink]:
        if not isinstance(self.alternates, Mapping):
            raise _fail(self, "alternates", 'a mapping of link name to a spec or an '
                        'AlternateLink ({"wifi": "tcp:HOST:PORT"})')
        own = self.link_name
        out: dict[str, AlternateLink] = {}
        for name, alt in self.alternates.items():
            if not (isinstance(name, str) and _LINK_NAME.fullmatch(name)):
                raise InputError(f"LinkOptions.alternates: link name {name!r} must be lower "
                                 "case letters, digits, - or _ (starting with a letter)")
            if name == own:
                raise InputError(f"LinkOptions.alternates: {name!r} is the name of the "
                                 f"transport's own link ({self.transport!r}); name the "
                                 "alternate otherwise")
            if isinstance(alt, str):
                alt = AlternateLink(transport=alt)
            if not isinstance(alt, AlternateLink):
                raise InputError(f"LinkOptions.alternates[{name!r}] must be a spec string "
                                 f"(tcp:HOST:PORT) or an AlternateLink, got "
                                 f"{type(alt).__name__}")
            out[name] = alt
        return out

    @property
    def effective_connect_timeout(self) -> float:
        return self.connect_timeout if self.connect_timeout is not None else self.timeout

    @property
    def link_name(self) -> str:
        """The name of the transport's own link: ``ble`` (``ble:`` specs), ``wifi``
        (``tcp:``, ``tcp+insecure:``), else ``handheld``."""
        scheme = self.transport.partition(":")[0] if isinstance(self.transport, str) else ""
        return {"ble": "ble", "tcp": "wifi", "tcp+insecure": "wifi"}.get(scheme, "handheld")

    @property
    def link_kind(self) -> str:
        """The radio of the transport's own link: ``ble`` for ``ble:`` specs, else ``wifi``."""
        return default_kind(self.transport)


_LINK_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")


def default_kind(transport: Any) -> str:
    """``ble`` for a ``ble:`` spec, ``wifi`` for any other (tcp:, the emulations)."""
    return "ble" if isinstance(transport, str) and transport.startswith("ble:") else "wifi"


@dataclass(frozen=True, kw_only=True)
class AlternateLink(_Options):
    """One more link to the same handheld (``LinkOptions.alternates``).

    transport: its spec (``tcp:HOST:PORT``: TLS 1.3 pinned to the paired handheld, as
        helpers are; ``tcp+insecure:HOST:PORT``: plain TCP, with ``transport_options=
        {"allow_insecure": True}`` only; ``ble:HCI``...).
    kind: the radio it uses, ``ble`` or ``wifi`` (default: ``ble`` for ``ble:`` specs,
        ``wifi`` otherwise): how the planner prices its energy and its first estimate.
    transport_options: options of that transport (``fingerprint="sha256:..."`` pins one
        certificate on a ``tcp:`` link; BLE: ``keystore``...).
    channel: emulation only: shape this link's sending side with a
        :class:`~coinf.ble_protocol.shaped.Channel`, e.g. ``wifi_preset("pi-zero-2w-wifi")
        .channel()``.
    """

    transport: str
    kind: str | None = None
    transport_options: Mapping[str, Any] = field(default_factory=dict)
    channel: Any = None

    def __post_init__(self) -> None:
        if not (isinstance(self.transport, str) and self.transport.strip()):
            raise _fail(self, "transport", "a link spec string (tcp:HOST:PORT, "
                        "tcp+insecure:HOST:PORT, ble:HCI)")
        if self.kind is None:
            object.__setattr__(self, "kind", default_kind(self.transport))
        if self.kind not in ("ble", "wifi"):
            raise _fail(self, "kind", "'ble', 'wifi' or None (from the spec)")
        if not isinstance(self.transport_options, Mapping):
            raise _fail(self, "transport_options", "a mapping of the transport's options")
        object.__setattr__(self, "transport_options", dict(self.transport_options))
        from coinf.ble_protocol.shaped import Channel

        if self.channel is not None and not isinstance(self.channel, Channel):
            raise _fail(self, "channel", "a coinf.ble_protocol.shaped.Channel or None")


@dataclass(frozen=True, kw_only=True)
class PlannerOptions(_Options):
    """How the split is chosen when ``PlacementOptions.split`` is None (docs/PLANNER.md).

    objective: one of :data:`~coinf.wearable.policy.OBJECTIVES` (default: the policy's).
    latency_budget_ms: a bound on the predicted latency (default: the policy's; None: none).
    policy: a :class:`~coinf.wearable.policy.Policy` or the path of one (default: the
        configured policy, ``coinf policy``).
    wearable_profile: a :class:`~coinf.device.profile.DeviceProfile` or the path of one
        (default: the one ``coinf profile`` stored here, else the built-in default).
    handheld_profile: the same for the handheld (default: the one it sends when it connects).
    input_fps: with helpers, the stream's input rate (frames/s) each hop's packing is chosen
        against (None: as fast as the plan computes; docs/PIPELINE.md).
    """

    objective: str | None = None
    latency_budget_ms: Any = UNSET
    policy: Any = None
    wearable_profile: Any = None
    handheld_profile: Any = None
    input_fps: float | None = None

    def __post_init__(self) -> None:
        if self.objective is not None and self.objective not in OBJECTIVES:
            raise _fail(self, "objective", f"one of {', '.join(OBJECTIVES)} or None")
        budget = self.latency_budget_ms
        if budget is not UNSET and budget is not None and not (_is_number(budget)
                                                               and budget > 0):
            raise _fail(self, "latency_budget_ms", "a number of ms > 0, or None (no budget)")
        if not isinstance(self.policy, Policy | str | Path | None):
            raise _fail(self, "policy", "a Policy, the path of one, or None")
        for name in ("wearable_profile", "handheld_profile"):
            if not isinstance(getattr(self, name), DeviceProfile | str | Path | None):
                raise _fail(self, name, "a DeviceProfile, the path of one, or None")
        if self.input_fps is not None and not (_is_number(self.input_fps)
                                               and 0 < self.input_fps < 1e9):
            raise _fail(self, "input_fps", "a rate in frames/s > 0, or None")


#: built-in profiles an emulated wearable may be timed by (EmulationOptions.compute_profile)
COMPUTE_PROFILES = (None, "pi-zero-2w")


@dataclass(frozen=True, kw_only=True)
class EmulationOptions(_Options):
    """Devices played by this machine: ``slowdown`` (>= 1: a K x slower wearable) and
    ``threads`` (onnxruntime threads, 0 = its default) of this wearable; ``handheld_slowdown``
    and ``handheld_threads`` of an in-process handheld. ``compute_profile`` (a built-in
    wearable profile's name, ``pi-zero-2w``) times each of the wearable's model slices as that
    profile's op rates predict instead of stretching it ``slowdown`` x, so the emulated
    wearable spends time across layers as that device does (packing is still stretched)."""

    slowdown: float = 1.0
    threads: int = 0
    handheld_slowdown: float = 1.0
    handheld_threads: int = 0
    compute_profile: str | None = None

    def __post_init__(self) -> None:
        if self.compute_profile not in COMPUTE_PROFILES:
            raise _fail(self, "compute_profile",
                        f"None or one of {', '.join(p for p in COMPUTE_PROFILES if p)}")
        for name in ("slowdown", "handheld_slowdown"):
            if not (_is_number(getattr(self, name)) and getattr(self, name) >= 1):
                raise _fail(self, name, "a number >= 1 (1 = this machine's speed)")
        for name in ("threads", "handheld_threads"):
            if not (_is_int(getattr(self, name)) and getattr(self, name) >= 0):
                raise _fail(self, name, "an int >= 0 (0 = onnxruntime's default)")


@dataclass(frozen=True, kw_only=True)
class SessionOptions(_Options):
    """Every setting of a Session, in four groups (module docstring)."""

    placement: PlacementOptions = field(default_factory=PlacementOptions)
    link: LinkOptions = field(default_factory=LinkOptions)
    planner: PlannerOptions = field(default_factory=PlannerOptions)
    emulation: EmulationOptions = field(default_factory=EmulationOptions)

    def __post_init__(self) -> None:
        for name, cls in _GROUPS.items():
            if not isinstance(getattr(self, name), cls):
                raise InputError(f"SessionOptions.{name} must be a {cls.__name__}, got "
                                 f"{type(getattr(self, name)).__name__}")


_GROUPS: dict[str, type[_Options]] = {"placement": PlacementOptions, "link": LinkOptions,
                                      "planner": PlannerOptions, "emulation": EmulationOptions}
#: every option -> the name of its group
_GROUP_OF = {name: group for group, cls in _GROUPS.items() for name in _fields(cls)}


def misplaced(name: str) -> str:
    """The one-line message for an option ``name`` given where it does not belong."""
    if name in _GONE:
        return f"{name}= is gone; use {_GONE[name]}"
    group = _GROUP_OF.get(name)
    if group is not None:
        return (f"{name} is a {group} option: "
                f"SessionOptions({group}={_GROUPS[group].__name__}({name}=...))")
    if name in _GROUPS:
        return (f"{name} is a SessionOptions group: Session(bundle, "
                f"SessionOptions({name}={_GROUPS[name].__name__}(...)))")
    close = difflib.get_close_matches(name, list(_GROUP_OF), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    listing = "; ".join(f"{g}: {', '.join(_fields(c))}" for g, c in _GROUPS.items())
    return f"unknown Session option {name!r}{hint}; the options are {listing}"


def session_options(sess_options: object, misplaced_options: Mapping[str, Any]) -> SessionOptions:
    """The options of ``Session(bundle, sess_options, providers, **misplaced_options)``: only
    a :class:`SessionOptions` (or None); any other keyword is refused, naming its group."""
    if misplaced_options:
        raise InputError(misplaced(next(iter(misplaced_options))))
    if sess_options is None:
        return SessionOptions()
    if isinstance(sess_options, SessionOptions):
        return sess_options
    wrap = next((f"; wrap it: SessionOptions({g}={c.__name__}(...))"
                 for g, c in _GROUPS.items() if isinstance(sess_options, c)), "")
    raise InputError(f"sess_options must be coinf.SessionOptions, got "
                     f"{type(sess_options).__module__}.{type(sess_options).__name__}{wrap}")


@dataclass(frozen=True)
class RunOptions:
    """Per-call settings of ``Session.run`` (onnxruntime has ``RunOptions`` too; this one is
    coinf's and is the only kind accepted).

    timeout: seconds for this inference's offloaded part (default: ``LinkOptions.timeout``).
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
