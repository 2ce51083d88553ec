"""``AsyncSession``: the execution core. One inference is one call of :meth:`AsyncSession._frame`.

    opts = SessionOptions(link=LinkOptions(transport="ble:hci-socket:0"))
    async with AsyncSession("bundles/lenet", opts) as sess:
        (logits,) = await sess.run(None, {"x": x})
        async for frame in sess.astream(frames):
            ...

Per frame: choose a :class:`~coinf.wearable.plan.Plan` (the planner, the fixed split, a
fixed plan of any number of stages, or, given helpers, the plan over the helpers alive now:
:class:`~coinf.wearable.replan.Replanner`) and hand it to the one
:class:`~coinf.wearable.executor.Executor`: the first stage here (head thread), the crossing
tensors packed (codec thread) and sent as one request naming every later stage to the next
stage's device over its :class:`~coinf.wearable.connection.Connection`, the result checked
against the model's outputs. A transient link error, a timeout or a bad result finishes that
frame on the wearable instead (given helpers, the device at fault is also left out of the next
frames' plans). With several links to the handheld (``LinkOptions.alternates``) the planner
also chooses the link per frame, and a frame whose link fails is re-sent on another one that is
up (:mod:`~coinf.wearable.links_runtime`). Streaming runs the
same function for up to ``depth`` frames at once: the single head thread computes frame n+2
while frame n+1 is packed and frame n crosses the link, and results come back in order.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Never

import numpy as np
from coinf.ble_protocol.packing import PackSpec
from coinf.ble_protocol.rpc import RpcClient
from coinf.ble_protocol.shaped import Channel
from coinf.ble_protocol.transport import open_connector
from coinf.convert.compressors import CodecRunner
from coinf.device.emulation import DeviceEmulation, compute_rates
from coinf.device.litert import check_runtime, resolve
from coinf.device.profile import DeviceProfile, profile_for_runtime
from coinf.device.runtime import SliceRunner
from coinf.wearable.autoplan import AutoPlan, build_autoplan
from coinf.wearable.connection import Connection
from coinf.wearable.discovery import Discover
from coinf.wearable.executor import Executor
from coinf.wearable.frame import (
    FrameResult,
    ModelMetadata,
    NodeArg,
    RunStats,
    check_feed,
    check_output_names,
)
from coinf.wearable.helper_links import HelperLinks
from coinf.wearable.links_runtime import SessionLink, open_links
from coinf.wearable.options import (
    UNSET,
    RunOptions,
    SessionOptions,
    check_providers,
    check_run_options,
    parse_packing,
    request_timeout,
    session_options,
)
from coinf.wearable.plan import HANDHELD, Plan
from coinf.wearable.planner.codec_costs import CODEC_SLOWDOWN, check_decodable, peer_decoders
from coinf.wearable.planner.costs import Decision
from coinf.wearable.planner.planner import parse_config_spec
from coinf.wearable.policy import Policy
from coinf.wearable.replan import Replanner, failed_device
from coinf.wearable.stream import END, puller

from coinf.bundle import Bundle, Candidate, Compressor
from coinf.errors import BundleError, InputError, LinkClosed, LinkError, RemoteError

log = logging.getLogger(__name__)


class AsyncSession:
    """Runs ``bundle`` split between this wearable and the devices around it, from asyncio.

    ``sess_options`` (a frozen :class:`SessionOptions`) configures it; ``providers`` are the
    onnxruntime execution providers of this wearable's slices. Any other keyword is refused,
    naming the options group it belongs to. Constructing does no I/O on the link: it connects on
    first use (or :meth:`connect`).
    """

    def __init__(
        self,
        bundle: str | Path | Bundle,
        sess_options: SessionOptions | None = None,
        providers: Sequence[str] | None = None,
        **misplaced: Never,
    ) -> None:
        self.options = opts = session_options(sess_options, misplaced)
        place, link, planner, emu = opts.placement, opts.link, opts.planner, opts.emulation
        self.bundle = bundle if isinstance(bundle, Bundle) else Bundle.load(bundle)
        self._providers = check_providers(providers)
        self.emulation = DeviceEmulation(emu.slowdown, emu.threads,
                                         rates=compute_rates(emu.compute_profile))
        self._profiles = {role: profile_for_runtime(role, rt, prof) for role, rt, prof in (
            ("wearable", place.runtime, planner.wearable_profile),
            ("handheld", place.handheld_runtime, planner.handheld_profile))}
        self._slices = SliceRunner(self.bundle, self.emulation, capacity=place.head_cache + 2,
                                   providers=self._providers, runtime=place.runtime,
                                   profile=self._profiles["wearable"])
        self._packing = parse_packing(place.packing)
        self.executor = Executor(self.bundle, self._slices,
                                 CodecRunner(self.bundle, self.emulation.session_options()),
                                 self.emulation, DeviceEmulation(min(emu.slowdown,
                                                                     CODEC_SLOWDOWN)))
        #: a fixed plan of any number of stages (PlacementOptions.plan), else None
        self._fixed_plan = place.fixed_plan(self.bundle)
        #: the helpers a plan may name (PlacementOptions.helpers), each reached on first use
        self.helpers = HelperLinks(
            self.bundle, place.helper_configs(self.bundle),
            place.helpers if isinstance(place.helpers, Discover) else None, link)
        self._plans: dict[tuple[Any, ...], Plan] = {}
        #: with helpers and no fixed split or plan: the plan over the helpers alive, chosen
        #: again when one leaves or joins (wearable/replan.py)
        self.replanner: Replanner | None = None
        self._replan_off: Replanner | None = None  # while set_split fixes the split
        self._compressor: Compressor | None = None  # chosen with the packing (planner configs)
        self.autoplan: AutoPlan | None = None
        self._planner_off: AutoPlan | None = None
        split = place.split if self._fixed_plan is None else self._fixed_plan.candidate.id
        if split is None:
            self.autoplan = self._make_autoplan(planner.objective, planner.latency_budget_ms,
                                                planner.policy, planner.wearable_profile,
                                                planner.handheld_profile, place.packings)
            split = self.autoplan.choose(None)[0]
            if self.helpers:  # local, a split or a pipeline
                objective = self.autoplan.adaptive.objective
                if objective not in ("throughput", "energy"):
                    objective = "latency"
                self.replanner = Replanner(self.bundle, self.autoplan.adaptive.planner,
                                           list(self.helpers.configs.values()), objective,
                                           link.max_backoff_s, planner.input_fps)
                log.info("strategy: %s", self.replanner.why)
                self.autoplan, split = None, self.replanner.plan.candidate.id
        self._candidate = self.bundle.candidate(split)
        transport, transport_options = link.transport, dict(link.transport_options)
        if isinstance(transport, Channel):
            transport, transport_options["channel"] = "inprocess", transport
        if transport == "inprocess":
            transport_options.setdefault("slowdown", emu.handheld_slowdown)
            transport_options.setdefault("threads", emu.handheld_threads)
            # the in-process handheld runs here: its LiteRT must be installed here too
            check_runtime(place.handheld_runtime, self.bundle, "handheld_runtime")
            transport_options.setdefault("runtime", place.handheld_runtime)
            transport_options.setdefault("profile", self._profiles["handheld"])
        self._handheld_here = transport == "inprocess"
        if link.alternates and self.helpers:
            raise InputError("LinkOptions.alternates are links to the handheld; with "
                             "PlacementOptions.helpers the Session plans over the helpers: "
                             "give one or the other")
        #: every link to the handheld: the transport's, then LinkOptions.alternates
        self.handheld_links = open_links(
            self.bundle, link, open_connector(transport, bundle=self.bundle, **transport_options),
            lambda name: functools.partial(self._on_connect, link=name))
        self.connection = self.handheld_links.primary.conn
        if self.autoplan is not None:
            self.handheld_links.register(self.autoplan)
        self._meta: ModelMetadata | None = None
        self.last_run: RunStats | None = None
        self._closed = False

    # -- onnxruntime's surface ------------------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return [NodeArg.of(t) for t in self.bundle.inputs]

    def get_outputs(self) -> list[NodeArg]:
        return [NodeArg.of(t) for t in self.bundle.outputs]

    def get_providers(self) -> list[str]:
        return list(self._providers)

    def get_session_options(self) -> SessionOptions:
        return self.options

    def get_modelmeta(self) -> ModelMetadata:
        if self._meta is None:
            self._meta = ModelMetadata.of(self.bundle)
        return self._meta

    async def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        run_options: RunOptions | None = None,
    ) -> list[np.ndarray]:
        """One inference; the requested outputs (all of them for ``None`` or ``[]``)."""
        ro = check_run_options(run_options)
        names = check_output_names(self.bundle, output_names)
        feeds = check_feed(self.bundle, input_feed)
        if self.autoplan is not None:
            self.autoplan.started()
        outputs, _ = await self._frame(feeds, ro, alone=True)
        return [outputs[n] for n in names]

    async def astream(
        self,
        feeds: AsyncIterable[Mapping[str, Any]] | Iterable[Mapping[str, Any]],
        output_names: Sequence[str] | None = None,
        *,
        depth: int | None = None,
        pipelined: bool = True,
    ) -> AsyncGenerator[FrameResult, None]:
        """Run a stream of inputs; one :class:`FrameResult` per input, in order.

        At most ``depth`` frames are in flight and ``feeds`` is pulled only when there is room
        (back-pressure; a blocking iterator is pulled on a worker thread). A failing frame
        yields a result whose ``error`` is set; later frames go on. Closing the iterator
        cancels the frames in flight (and their requests, on both sides).
        """
        depth = depth if depth is not None else self.options.link.stream_depth
        if depth < 1:
            raise InputError(f"depth must be >= 1, got {depth}")
        if not pipelined:
            depth = 1
        names = check_output_names(self.bundle, output_names)
        pull = puller(feeds)
        inflight: deque[tuple[int, asyncio.Task[tuple[dict[str, np.ndarray], RunStats]]]] = deque()
        loop = asyncio.get_running_loop()
        index, exhausted = 0, False
        if self.autoplan is not None:
            self.autoplan.set_streaming(depth > 1)
        try:
            while True:
                while not exhausted and len(inflight) < depth:
                    feed = await pull()
                    if feed is END:
                        exhausted = True
                        break
                    inflight.append((index, loop.create_task(self._checked_frame(feed))))
                    index += 1
                if not inflight:
                    return
                i, task = inflight.popleft()
                try:
                    outputs, stats = await task
                except Exception as exc:
                    yield FrameResult(i, None, exc, None)
                else:
                    yield FrameResult(i, [outputs[n] for n in names], None, stats)
        finally:
            for _, task in inflight:
                task.cancel()
            await asyncio.gather(*(t for _, t in inflight), return_exceptions=True)
            if self.autoplan is not None:
                self.autoplan.set_streaming(False)

    # -- the per-frame function ----------------------------------------------------------------
    async def _checked_frame(self, feed: Any) -> tuple[dict[str, np.ndarray], RunStats]:
        return await self._frame(check_feed(self.bundle, feed), RunOptions())

    async def _frame(
        self, feeds: dict[str, np.ndarray], ro: RunOptions, alone: bool = False
    ) -> tuple[dict[str, np.ndarray], RunStats]:
        """Everything one inference does, whoever asked for it (run or a stream). ``alone``:
        no other frame is in flight, so a head known to be short may run on the loop itself."""
        if self._closed:
            raise InputError("this session is closed")
        plan, version, link = await self._next_plan(ro)
        stats = RunStats(candidate=plan.candidate.id, packing=str(plan.packing), tag=ro.tag,
                         runtimes=tuple(s.runtime for s in plan.stages), strategy=plan.strategy,
                         plan=str(plan), plan_version=version,
                         devices=tuple(s.device for s in plan.stages),
                         cuts=tuple(s.end for s in plan.stages[:-1]),
                         packings=tuple(s.packing for s in plan.stages[:-1]))
        t_start = time.perf_counter()
        crossing = await self.executor.first_stage(plan, feeds, stats, alone)
        if plan.local:
            outputs, stats.local = crossing, True
            if self.replanner is not None:  # the wearable's speed, measured on its own too
                self.replanner.observed(plan, stats)
        else:
            outputs = await self._offload_or_finish(plan, crossing, stats, ro, link)
        stats.total_ms = (time.perf_counter() - t_start) * 1e3
        self.last_run = stats
        if self.autoplan is not None:
            self.autoplan.finished(stats)
        return outputs, stats

    async def _next_plan(self, ro: RunOptions) -> tuple[Plan, int, SessionLink | None]:
        """The plan of the frame starting now, its version (0: no re-planning) and the link
        to the handheld it goes over (None: to helpers, or no link is up)."""
        if self.replanner is not None:
            self.helpers.tend(self.replanner)
            plan, version = self.replanner.take()
            if ro.local_only and not plan.local:
                plan = Plan.for_candidate(self.bundle, self.bundle.candidate("wearable-only"))
            return plan, version, None
        if self.handheld_links.multi:
            if not ro.local_only:
                await self.handheld_links.ready()  # the first frame: every link's first probe
                self.handheld_links.tend()  # later: links due for a probe, in the background
        elif self.autoplan is not None and not ro.local_only and self.connection.offline is None:
            await self._probe_link()  # the planner must know the link before deciding
        links = self.handheld_links
        plan, chosen = self._planned(ro)
        if not links.multi:
            return plan, 0, links.primary
        if self.autoplan is None:  # a split fixed by the caller: the fastest link up for it
            return plan, 0, links.fixed_link(plan.candidate.crossing_bytes)
        return plan, 0, links.get(chosen) if chosen is not None else None

    def _planned(self, ro: RunOptions) -> tuple[Plan, str | None]:
        """The plan, and the link the planner chose for it (several links only)."""
        chosen = None
        if self.autoplan is not None:
            if self.handheld_links.multi:
                up = [lk.name for lk in self.handheld_links.up()]
                chosen, cid, spec = self.autoplan.choose_link(up)
            else:
                cid, spec = self.autoplan.choose(self.connection.offline)
            gamma, spec = parse_config_spec(spec)  # a compressor's code: c003~g4+q8
            if cid != self._candidate.id:
                self._candidate = self.bundle.candidate(cid)
            if str(self._packing) != spec:
                self._packing = PackSpec.parse(spec)
            self._compressor = self.bundle.compressor(cid, gamma) if gamma else None
        cand = self.bundle.candidate("wearable-only") if ro.local_only else self._candidate
        if self._fixed_plan is not None and cand is self._fixed_plan.candidate:
            return self._fixed_plan, chosen
        gamma = self._compressor.gamma if self._compressor is not None and \
            cand is self._candidate else 0
        runtimes = self.stage_runtimes(cand)
        key = (cand.id, str(self._packing), gamma, runtimes)
        plan = self._plans.get(key)
        if plan is None:  # built (and checked) once per configuration, not per frame
            if len(self._plans) >= 256:
                self._plans.clear()
            plan = self._plans[key] = Plan.for_candidate(self.bundle, cand, self._packing,
                                                         runtimes=runtimes, gamma=gamma)
        return plan, chosen

    @property
    def links(self) -> dict[str, dict[str, Any]]:
        """Every link to the handheld by name: ``kind``, ``transport``, ``state``, ``why`` it
        is out, ``frames`` carried (:meth:`~coinf.wearable.links_runtime.SessionLinks.summary`)."""
        return self.handheld_links.summary()

    @property
    def strategies(self) -> dict[str, Any] | None:
        """With helpers and no fixed split or plan: every strategy compared now, the chosen
        one (``chosen``, ``why``), its ``plan`` and ``version``, the helpers ``left_out`` and
        the ``history`` of plan changes (:class:`~coinf.wearable.replan.Replanner`)."""
        rp = self.replanner or self._replan_off
        return None if rp is None else rp.summary()

    def connection_to(self, device: str) -> Connection:
        """The connection to ``device``: the handheld, or a helper (reached on first use)."""
        return self.connection if device == HANDHELD else self.helpers.connection_to(device)

    def stage_runtimes(self, cand: Candidate) -> tuple[str, str]:
        """The runtimes of ``cand``'s head (here) and tail (on the handheld, as configured)."""
        return (self._slices.runtime_of(cand, "head"),
                resolve(self.options.placement.handheld_runtime, self.bundle, cand, "tail",
                        self._profiles["handheld"],
                        have_litert=None if self._handheld_here else True))

    async def _probe_link(self) -> None:
        if self.connection.rpc_client is not None:
            return
        try:
            await self.connection.client()
        except LinkError as exc:
            if not (self.options.link.fallback and exc.transient):
                raise
            await self.connection.went_offline(exc)

    async def _offload_or_finish(
        self, plan: Plan, crossing: dict[str, np.ndarray], stats: RunStats, ro: RunOptions,
        link: SessionLink | None = None,
    ) -> dict[str, np.ndarray]:
        multi = self.handheld_links.multi and self.replanner is None
        if multi and link is None:  # a split fixed by the caller, and no link up
            return await self.executor.finish_here(plan.candidate, crossing, stats,
                                                   self.handheld_links.offline or "no link is up")
        conn = link.conn if multi and link is not None else \
            self.connection_to(plan.stages[1].device)
        if conn.offline is not None and not multi:
            return await self.executor.finish_here(plan.candidate, crossing, stats, conn.offline)
        timeout = ro.timeout if ro.timeout is not None else self.options.link.timeout
        explicit, t0 = ro.timeout is not None, time.monotonic()
        name = link.name if link is not None else None
        try:
            if multi and link is not None and not link.up:  # it went down since the plan
                raise LinkClosed(f"it went down before the frame was sent ({link.down})")
            outputs = await self._exchange_on(plan, conn, name, crossing, stats, timeout,
                                              explicit)
        except LinkError as caught:
            exc: LinkError = caught
        else:
            conn.succeeded()
            if self.replanner is not None:
                self.replanner.observed(plan, stats)
            if link is not None and plan.stages[1].device == HANDHELD:
                stats.link = link.name
                self.handheld_links.carried_by(link)
            elif self.replanner is not None:
                stats.link = conn.connector.spec
            return outputs
        at = exc.hop if isinstance(exc, RemoteError) and exc.hop is not None else 0
        if multi and link is not None and exc.transient and at == 0:
            # re-sent on another link up, within what is left of the frame's timeout
            deadline = t0 + request_timeout(timeout, stats.bytes_up, *self._estimate(link.name),
                                            explicit=explicit)

            async def resend(alt: SessionLink, left: float) -> dict[str, np.ndarray]:
                return await self._exchange_on(plan, alt.conn, alt.name, crossing, stats,
                                               left, True)

            moved = await self.handheld_links.fail_over(link, exc, stats, deadline, resend)
            if moved is not None:
                return moved
            if not self.options.link.fallback:
                raise exc
            assert stats.failover is not None
            return await self.executor.finish_here(plan.candidate, crossing, stats,
                                                   stats.failover)
        if not (self.options.link.fallback and exc.transient):
            raise exc
        if self.replanner is not None:  # leave the device out; the next frames re-plan
            dead = failed_device(exc, plan)
            if dead is not None and self.replanner.failed(dead, exc):
                await self.helpers.drop(dead, conn if dead == plan.stages[1].device else None)
            why = str(exc) if len(plan.remote) == 1 else \
                f"{plan.remote[min(at, len(plan.remote) - 1)].device}: {exc}"
            return await self.executor.finish_here(plan.candidate, crossing, stats, why)
        if at == 0:  # the next device itself failed (a device further on: only this frame)
            await conn.went_offline(exc)
        why = conn.offline or str(exc)
        if len(plan.remote) > 1:
            why = f"{plan.remote[min(at, len(plan.remote) - 1)].device}: {why}"
        return await self.executor.finish_here(plan.candidate, crossing, stats, why)

    async def _exchange_on(self, plan: Plan, conn: Connection, link: str | None,
                           crossing: dict[str, np.ndarray], stats: RunStats, timeout: float,
                           explicit: bool) -> dict[str, np.ndarray]:
        """One offloaded exchange over ``conn`` (``link``: its name, several links only)."""
        rpc = await conn.client()
        decoders = peer_decoders(conn.info, self.bundle.priors_digest)
        check_decodable(plan.packing, decoders)  # a standard codec it lacks: refused
        if self.autoplan is not None:
            await self.autoplan.maintain(rpc, timeout, link)
        payload = await self.executor.encode(plan, crossing, stats, decoders)
        # a request the link cannot carry within the timeout gets 2x its airtime (options)
        timeout = request_timeout(timeout, len(payload), *self._estimate(link),
                                  explicit=explicit)
        # the request's timeout cancels it here and, by CANCEL, on the peer
        marks: dict[str, float] = {}
        exchange = self.executor.exchange(plan, rpc, payload, stats, timeout, conn.rtt_ms, marks)
        if self.replanner is None:
            return await exchange
        return await self.replanner.timed(exchange, plan.stages[1].device, len(payload), marks,
                                          stats)

    def _estimate(self, link: str | None) -> tuple[float | None, float | None]:
        """(uplink bytes/s, RTT ms) of ``link`` as measured, if anything measures it."""
        if link is not None and self.handheld_links.multi:
            est = self.handheld_links.get(link).estimator.estimate()
            return est.up_bps, est.rtt_ms
        return self.autoplan.link_estimate(link) if self.autoplan else (None, None)

    # -- planning ---------------------------------------------------------------------------
    @property
    def split(self) -> Candidate:
        """The candidate the next run uses."""
        return self._candidate

    @property
    def packing(self) -> PackSpec:
        return self._packing

    @property
    def compressor(self) -> Compressor | None:
        """The compressor whose code the next offloaded run sends (None: the tensors)."""
        return self._compressor

    @property
    def offline(self) -> str | None:
        """Why offloading is paused right now, or None when the helper is in use (several
        links: when one is up, or none has been tried yet)."""
        links = self.handheld_links
        return links.offline if links.multi else self.connection.offline

    def set_split(self, split: str | None, packing: str | PackSpec | None = None) -> None:
        """Fix the split (and packing, to the handheld) from now on; ``None`` hands the choice
        back to the planner, or to the plan over the helpers (only for a session created
        without ``split``)."""
        if split is None:
            if self._replan_off is not None:  # back to the plan over the helpers
                self.replanner, self._replan_off = self._replan_off, None
                return
            if self._planner_off is None:
                raise InputError("this session was created with a fixed split; it has no "
                                 "planner")
            self.autoplan, self._planner_off = self._planner_off, None
            return
        if self.replanner is not None:  # the caller's split, to the handheld, from now on
            self._replan_off, self.replanner = self.replanner, None
        cand = self.bundle.candidate(split)
        comp = None  # a fixed split sends its crossing tensors as they are, or a compressor's
        if isinstance(packing, str):  # code: c013~g5+latent (a learned bottleneck's, coded)
            gamma, packing = parse_config_spec(packing)
            if gamma:
                try:
                    comp = self.bundle.compressor(cand.id, gamma)
                except BundleError as exc:
                    raise InputError(str(exc)) from None
        self._candidate, self._compressor = cand, comp
        if packing is not None:
            self._packing = parse_packing(packing)
        if self.autoplan is not None:
            self._planner_off, self.autoplan = self.autoplan, None

    def plan(self) -> Decision:
        """The planner's current decision: every candidate's predicted costs, the winner, why."""
        auto = self.autoplan or self._planner_off
        if auto is None:
            auto = self._planner_off = self._make_autoplan(None, UNSET, None, None, None,
                                                           ("auto",))
            self.handheld_links.register(auto)
        if self.handheld_links.multi:
            return self.handheld_links.decision(auto, None if self.autoplan is not None
                                       else f"split fixed by the caller at {self._candidate.id}")
        decision = auto.decision()
        if self.offline is not None:
            decision.notes.append(
                f"offline: runs complete on the wearable (wearable-only) - {self.offline}")
        if self.autoplan is None:
            decision.notes.append(f"split fixed by the caller at {self._candidate.id}")
        return decision

    def _make_autoplan(self, objective: str | None, latency_budget_ms: Any,
                       policy: Policy | str | Path | None,
                       wearable_profile: DeviceProfile | str | Path | None,
                       handheld_profile: DeviceProfile | str | Path | None,
                       packings: Sequence[str]) -> AutoPlan:
        place = self.options.placement
        return build_autoplan(self.bundle, policy, objective, latency_budget_ms,
                              wearable_profile, handheld_profile, packings,
                              slowdown=self.emulation.slowdown,
                              timeout_s=self.options.link.timeout,
                              runtimes={"wearable": place.runtime,
                                        "handheld": place.handheld_runtime})

    async def _on_connect(self, rpc: RpcClient, timeout: float, link: str) -> None:
        if self.autoplan is not None:
            self.autoplan.peer_decoders(self.handheld_links.get(link).conn.info)
            multi = self.handheld_links.multi
            await self.autoplan.on_connect(rpc, timeout, link if multi else None)

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def handheld_info(self) -> dict[str, Any] | None:
        """The helper's handshake reply, once connected."""
        return self.connection.info

    async def connect(self) -> dict[str, Any]:
        """Connect and handshake now (otherwise done on the first offloaded run). A transient
        failure raises, and (with ``fallback``) also starts the offline backoff, like a run.
        Several links: every one is probed; the first link up's handshake reply, or the first
        link's error when none is up."""
        if self.handheld_links.multi:
            return await self.handheld_links.connect()
        try:
            await self.connection.client()
        except LinkError as exc:
            if self.options.link.fallback and exc.transient:
                await self.connection.went_offline(exc)
            raise
        assert self.connection.info is not None
        return self.connection.info

    async def close(self) -> None:
        """Close the link and whatever the transport opened; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.helpers.close()
            await self.handheld_links.close()
        finally:
            self.executor.close()

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


__all__ = ["AsyncSession", "FrameResult", "ModelMetadata", "NodeArg", "RunStats"]
