"""What a Session with no fixed split uses to choose one, per inference.

It wraps the planner's :class:`~wearable.planner.planner.AdaptivePlanner` with the run-time
inputs a Session sees: every transfer (passive bandwidth), probes at connection and on a timer
(RTT and bandwidth), the handheld's status and profile over the control channel, the measured
head times (DynO's load factor), the input cadence (streaming vs. one-off), and whether the
handheld is reachable at all.

With several links to the handheld (``LinkOptions.alternates``) each link has its own
:class:`~wearable.planner.adapt.LinkEstimator` (:meth:`AutoPlan.add_link`), fed by that link's
probes and transfers, and :meth:`AutoPlan.choose_link` decides link x cut x packing with
:func:`~wearable.planner.links.decide_links` over the links that are up.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from coinf.ble_protocol.messages import MsgType, ProtocolError
from coinf.device.profile import DeviceProfile, ProfileError, load_or_default
from coinf.device.status import decode_status_reply
from coinf.wearable.cadence import Cadence
from coinf.wearable.planner.adapt import LinkEstimator, ReplanTrigger
from coinf.wearable.planner.codec_costs import peer_compressors
from coinf.wearable.planner.codec_costs import peer_decoders as codec_peer_decoders
from coinf.wearable.planner.costs import Decision
from coinf.wearable.planner.links import LinkChoice, decide_links
from coinf.wearable.planner.planner import _UNSET, AdaptivePlanner, Planner, split_config
from coinf.wearable.policy import OBJECTIVES, Policy, load_policy

if TYPE_CHECKING:
    from pathlib import Path

    from coinf.ble_protocol.rpc import RpcClient
    from coinf.wearable.frame import RunStats

    from coinf.bundle import Bundle

log = logging.getLogger(__name__)

PROBE_SMALL = 16
PROBE_LARGE = 2048
STATUS_INTERVAL_S = 30.0


class AutoPlan:
    """Chooses (candidate, packing) before each run and learns from each run."""

    def __init__(
        self,
        bundle: Bundle,
        *,
        policy: Policy,
        wearable_profile: DeviceProfile,
        handheld_profile: DeviceProfile | None,
        objective: str | None,
        latency_budget_ms: Any = _UNSET,
        packings: Sequence[str] = ("auto",),
        timeout_s: float = 30.0,
        runtimes: Mapping[str, str] | None = None,
    ) -> None:
        self.bundle = bundle
        self.policy = policy
        self._handheld_profile_fixed = handheld_profile is not None
        planner = Planner(bundle, wearable_profile, handheld_profile, policy,
                          packings=tuple(packings), timeout_s=timeout_s, runtimes=runtimes)
        self.adaptive = AdaptivePlanner(planner, objective=objective,
                                        latency_budget_ms=latency_budget_ms)
        self.cadence = Cadence()
        self._forced_streaming = False
        self._last_status = 0.0
        self.offline_reason: str | None = None
        #: with several links: each link's own estimator, by link name
        self.links: dict[str, LinkEstimator] = {}
        self._choice: LinkChoice | None = None
        self._choice_key: tuple[Any, ...] = ()
        self._choice_trigger = ReplanTrigger(policy.replan_threshold)

    # -- choosing ---------------------------------------------------------------------------
    @property
    def streaming(self) -> bool:
        return self._forced_streaming or self.cadence.streaming

    def _sync_streaming(self) -> None:
        want = self.streaming or self.policy.streaming
        planner = self.adaptive.planner
        if planner.policy.streaming != want:
            planner.policy = dataclasses.replace(planner.policy, streaming=want)
            self.adaptive.decision = None  # the objective changed: decide again

    def decision(self) -> Decision:
        self._sync_streaming()
        return self.adaptive.current()

    def choose(self, offline: str | None) -> tuple[str, str]:
        """(candidate id, packing) for the next run. Offline -> wearable-only."""
        if offline is not None:
            return self.bundle.candidates[-1].id, "raw"
        return split_config(self.decision().winner)

    def link_estimate(self, link: str | None = None) -> tuple[float, float]:
        """(uplink bytes/s, RTT ms) of ``link`` (default: the one link) as measured so far:
        what ``request_timeout`` scales by."""
        est = self.estimator(link).estimate()
        return est.up_bps, est.rtt_ms

    # -- several links ------------------------------------------------------------------------
    def add_link(self, name: str, estimator: LinkEstimator) -> None:
        """Decide over link ``name`` too, as ``estimator`` (its own) measures it."""
        self.links[name] = estimator

    def estimator(self, link: str | None = None) -> LinkEstimator:
        """The estimator of ``link``; the one link's without several."""
        return self.links.get(link, self.adaptive.link) if link else self.adaptive.link

    def link_choice(self, names: Sequence[str]) -> LinkChoice:
        """:func:`decide_links` over the named links' current estimates. Decided again only
        when the links up change or an input moved by more than the re-plan threshold (like
        :meth:`AdaptivePlanner.current`); whatever resets the planner's decision (a new
        profile, the peer's decoders, streaming) resets this one too."""
        self._sync_streaming()
        ad = self.adaptive
        estimates = {n: self.links[n].estimate() for n in names}
        inputs = {k: v for k, v in ad.inputs().items()
                  if k not in ("up_bps", "down_bps", "rtt_ms")}
        for n, est in estimates.items():
            inputs.update({f"{n}.up_bps": est.up_bps, f"{n}.down_bps": est.down_bps,
                           f"{n}.rtt_ms": est.rtt_ms})
        key = tuple(names)
        if self._choice is None or ad.decision is not self._choice.decision or \
                key != self._choice_key or self._choice_trigger.should_replan(inputs):
            budget_given = ad.latency_budget_ms is not _UNSET
            self._choice = decide_links(
                ad.planner, estimates, ad.objective,
                ad.latency_budget_ms if budget_given else None, budget_given,
                wearable_status=ad.wearable_status, handheld_status=ad.handheld_status,
                load_factor=ad.load.value)
            ad.decision = self._choice.decision  # reset (None) by what invalidates it
            self._choice_key = key
            self._choice_trigger.planned(inputs)
            ad.replans += 1
        return self._choice

    def choose_link(self, names: Sequence[str]) -> tuple[str | None, str, str]:
        """(link, candidate id, packing) for the next run over the links ``names`` (those up):
        none up, or the wearable winning on every link -> (None, wearable-only, raw)."""
        if not names:
            return None, self.bundle.candidates[-1].id, "raw"
        choice = self.link_choice(names)
        cid, spec = split_config(choice.decision.winner)
        return choice.link, cid, spec

    def set_streaming(self, on: bool) -> None:
        self._forced_streaming = on

    # -- learning ---------------------------------------------------------------------------
    def started(self) -> None:
        self.cadence.start(time.perf_counter())

    def finished(self, stats: RunStats) -> None:
        self.cadence.end(time.perf_counter(), stats.total_ms / 1e3)
        cand = self.bundle.candidate(stats.candidate)
        if cand.head.file is not None and stats.head_ms > 0:
            self.adaptive.observe_head(cand.id, stats.head_ms)
        if not stats.local and not self._forced_streaming:  # pipelined frames wait in queues
            link = self.estimator(stats.link)
            half_rtt = link.estimate().rtt_ms / 2
            for nbytes, ms, way in ((stats.bytes_up, stats.transfer_ms, "up"),
                                    (stats.bytes_down, stats.return_ms, "down")):
                if ms - half_rtt > 0:
                    link.observe_transfer(nbytes, (ms - half_rtt) / 1e3, way)

    # -- control channel ----------------------------------------------------------------------
    def peer_decoders(self, hello_ack: Mapping[str, Any] | None) -> None:
        """The packings the handheld said it decodes (HELLO_ACK ``decoders``; a peer that lists
        none decodes the packings before codec packings): the planner offers no other."""
        names = codec_peer_decoders(hello_ack, self.bundle.priors_digest)
        comps = peer_compressors(hello_ack)
        planner = self.adaptive.planner
        if planner.peer_decoders != names or planner.peer_compressors != comps:
            planner.peer_decoders, planner.peer_compressors = names, comps
            planner.reset_configs()
            self.adaptive.decision = None

    async def on_connect(self, rpc: RpcClient, timeout: float, link: str | None = None) -> None:
        """Probe the link, read the handheld's status and (unless given) its profile."""
        await self.probe(rpc, timeout, link)
        await self.refresh_status(rpc, timeout)
        if not self._handheld_profile_fixed:
            try:
                reply = await rpc.request(MsgType.PROFILE, b"", timeout)
                profile = DeviceProfile.from_bytes(reply.payload)
            except (ProtocolError, ProfileError) as exc:  # the peer's data: never trusted
                log.info("handheld sent no usable profile (%s); using defaults", exc)
            else:
                planner = self.adaptive.planner
                planner.handheld = profile
                planner._base = None
                self.adaptive.decision = None

    async def probe(self, rpc: RpcClient, timeout: float, link_name: str | None = None) -> None:
        """RTT from a tiny echo, bandwidth from a larger one (each crosses twice), into the
        estimator of ``link_name`` (default: the one link)."""
        link = self.estimator(link_name)
        t0 = time.perf_counter()
        await rpc.request(MsgType.PROBE, bytes(PROBE_SMALL), timeout)
        small = time.perf_counter() - t0
        t0 = time.perf_counter()
        await rpc.request(MsgType.PROBE, bytes(PROBE_LARGE), timeout)
        large = time.perf_counter() - t0
        link.observe_rtt(small * 1e3)
        extra = large - small
        if extra > 0:
            per_direction = extra / 2
            link.observe_transfer(PROBE_LARGE, per_direction, "up")
            link.observe_transfer(PROBE_LARGE, per_direction, "down")

    async def refresh_status(self, rpc: RpcClient, timeout: float) -> None:
        self._last_status = time.monotonic()
        try:
            reply = await rpc.request(MsgType.STATUS, b"", timeout)
            self.adaptive.handheld_status = decode_status_reply(reply.payload)
            self.adaptive.handheld_queue_ms = queue_ms_of(reply.payload)
        except ProtocolError as exc:
            log.info("handheld status unusable: %s", exc)

    async def maintain(self, rpc: RpcClient, timeout: float, link: str | None = None) -> None:
        """Periodic work between runs: the probe timer (of ``link``) and the handheld's
        status."""
        if self.estimator(link).probe_due(self.policy.probe_interval_s):
            await self.probe(rpc, timeout, link)
        if time.monotonic() - self._last_status > STATUS_INTERVAL_S:
            await self.refresh_status(rpc, timeout)


#: the largest queueing delay a STATUS may report, ms (an hour)
MAX_QUEUE_MS = 3.6e6


def queue_ms_of(payload: bytes) -> float:
    """A STATUS reply's ``queue_ms`` (a tail service's queueing delay; docs/PROTOCOL.md §6.6):
    0 when absent; MALFORMED unless a number in [0, :data:`MAX_QUEUE_MS`]."""
    from coinf.ble_protocol.messages import ErrorCode, decode_json

    value = decode_json(payload, what="STATUS reply").get("queue_ms", 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 <= value <= MAX_QUEUE_MS:
        raise ProtocolError(ErrorCode.MALFORMED, f"STATUS reply: queue_ms must be a number of ms "
                            f"in [0, {MAX_QUEUE_MS:g}], got {str(value)[:40]}")
    return float(value)


def build_autoplan(bundle: Bundle, policy: Policy | str | Path | None, objective: str | None,
                   latency_budget_ms: Any,
                   wearable_profile: DeviceProfile | str | Path | None,
                   handheld_profile: DeviceProfile | str | Path | None,
                   packings: Sequence[str], *, slowdown: float, timeout_s: float,
                   runtimes: Mapping[str, str]) -> AutoPlan:
    """A Session's :class:`AutoPlan` from its options: the policy, profiles and objective
    given (or configured), a profile measured on this machine scaled to the ``slowdown`` it
    plays."""
    from coinf.errors import InputError

    pol = policy if isinstance(policy, Policy) else load_policy(policy)[0]
    if objective is not None and objective not in OBJECTIVES:
        raise InputError(f"unknown objective {objective!r}; expected one of "
                         f"{', '.join(OBJECTIVES)}")
    wprof = (wearable_profile if isinstance(wearable_profile, DeviceProfile)
             else load_or_default("wearable", wearable_profile))
    measured_here = bool(wprof.models) or wprof.predictor is not None
    if measured_here and slowdown != 1.0 and wprof.slowdown == 1.0:
        # a profile measured on this machine, which now plays a K x slower wearable
        wprof = dataclasses.replace(wprof, slowdown=slowdown)
    hprof = (handheld_profile if isinstance(handheld_profile, DeviceProfile)
             else load_or_default("handheld", handheld_profile)
             if handheld_profile is not None else None)
    return AutoPlan(bundle, policy=pol, wearable_profile=wprof, handheld_profile=hprof,
                    objective=objective, latency_budget_ms=latency_budget_ms,
                    packings=packings, timeout_s=timeout_s, runtimes=runtimes)
