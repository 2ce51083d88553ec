"""``PipelineSession``: stream a model through the wearable and n-1 helpers (docs/PIPELINE.md).

    helpers = load_helpers("pipeline.json")
    async with PipelineSession("bundles/vgg", helpers) as sess:
        outputs = await sess.run({"x": x})
        async for frame in sess.astream(frames, depth=6):
            ...

The wearable runs the first slice (the head of cut s1) and sends its crossing tensors to the
first helper with the route of the remaining hops (:mod:`ble_protocol.route`); each helper runs
its slice and forwards straight to the next, and the result comes back along the chain. The
split is :func:`~coinf.wearable.planner.pipeline_dp.split_dp` over the devices alive, from their
measured speeds (FLOP/s: each slice's FLOPs over its measured compute time, the wearable's own
and every hop's, reported in the RESULT) and link bandwidths (bytes over the time a sender took
to hand them to its link); it is re-made when one of them moves by more than
``replan_threshold``. A helper that fails (its link drops, it stops answering, or the hop before
it reports it unreachable) is left out and the frame runs again on the remaining devices, so no
frame is lost; with no helper left the wearable runs the whole model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from coinf.ble_protocol.packing import PackSpec
from coinf.convert.compressors import CodecRunner
from coinf.device.emulation import DeviceEmulation
from coinf.device.runtime import SliceRunner
from coinf.wearable.connection import Connection, ShapedConnector, helper_connection
from coinf.wearable.executor import Executor
from coinf.wearable.frame import RunStats, check_feed
from coinf.wearable.link_meter import MIN_SEND_S, Ewma, LinkMeter
from coinf.wearable.pipeline_config import DEFAULT_BANDWIDTH_BPS, HelperConfig, load_helpers
from coinf.wearable.pipeline_stages import PipelinePlan, PipelineStats
from coinf.wearable.plan import WEARABLE, Plan, Stage
from coinf.wearable.planner.codec_costs import CODEC_SLOWDOWN, peer_decoders
from coinf.wearable.planner.compress_select import (
    DP_TOLERANCE,
    OVERHEAD_BYTES,
    CompressionOption,
    link_options,
    lookup,
    option_label,
    priced,
    thresholds,
)
from coinf.wearable.planner.pipeline_dp import (
    CutPoint,
    PipelineSplit,
    ResplitTrigger,
    cut_points,
    device_verdict,
    evaluate,
    split_dp,
    split_prefix,
)
from coinf.wearable.stream import END, puller

from coinf.bundle import Bundle
from coinf.errors import ErrorCode, InputError, LinkError, ProtocolError, RemoteError

log = logging.getLogger(__name__)
#: a slice's time says little about a device's speed when fixed costs dominate it: only slices
#: with at least this share of the model's FLOPs update the device's speed
MIN_SHARE = 0.05
#: one more device is used only when it shortens the bottleneck this much (relative)
MORE_MARGIN = 0.05


class PipelineSession:
    """Runs ``bundle`` as a pipeline over this wearable and ``helpers`` (module docstring)."""

    def __init__(self, bundle: str | Path | Bundle, helpers: Sequence[HelperConfig], *,
                 slowdown: float = 1.0, threads: int = 0, timeout: float = 10.0,
                 connect_timeout: float = 5.0, packing: str = "raw",
                 replan_threshold: float = 0.2, dead_retry_s: float = 30.0,
                 wearable_speed_flops: float | None = None,
                 input_fps: float | None = None,
                 ble_options: Mapping[str, Any] | None = None,
                 cuts: Sequence[str] | None = None) -> None:
        self.bundle = bundle if isinstance(bundle, Bundle) else Bundle.load(bundle)
        if not helpers:
            raise InputError("a pipeline needs at least one helper")
        self.helpers = {h.name: h for h in helpers}
        if len(self.helpers) != len(helpers):
            raise InputError("helper names must be unique")
        #: ``packing="auto"``: the first link's packing is chosen per frame from its measured
        #: bandwidth by the thresholds of the bundle's calibration (S3, compress_select)
        self.auto_packing = packing == "auto"
        self.input_fps = input_fps
        try:
            self.packing = PackSpec.parse("raw" if self.auto_packing else packing)
            self.emulation = DeviceEmulation(slowdown, threads)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        self._tables: dict[tuple[str, float], list[tuple[float, CompressionOption]]] = {}
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        #: options of this wearable's GATT server for helpers with a ``ble:`` wearable_link
        #: (``passkey``, ``keystore``, ``pairing_window_s``, ...: ``WearableServer``)
        self.ble_options = dict(ble_options or {})
        self.dead_retry_s = dead_retry_s
        self.points = cut_points(self.bundle)
        #: with ``packing="auto"`` the DP prices a cut by its smallest option whose accuracy is
        #: within this (relative) of the cut's most accurate option
        self.dp_tolerance = DP_TOLERANCE
        self._flops: dict[str, float] = {c.id: float(c.head.flops) for c in self.bundle.candidates}
        self._slices = SliceRunner(self.bundle, self.emulation, capacity=8)
        self.codecs = CodecRunner(self.bundle, self.emulation.session_options())
        #: the one executor (the same as a Session's): runs each frame's plan
        self.executor = Executor(self.bundle, self._slices, self.codecs, self.emulation,
                                 DeviceEmulation(min(self.emulation.slowdown, CODEC_SLOWDOWN)))
        self._result_bytes = sum(t.nbytes for t in self.bundle.outputs)
        self._speed: dict[str, Ewma] = {WEARABLE: Ewma(wearable_speed_flops)}
        self._speed.update({h.name: Ewma(h.speed_flops) for h in helpers})
        #: the links into the helpers (bandwidth measured from the frames that cross them)
        self.links = LinkMeter({h.name: h.bandwidth_bps for h in helpers})
        self._trigger = ResplitTrigger(replan_threshold)
        self._conns: dict[str, Connection] = {}
        self._dead: dict[str, float] = {}
        #: requests on the wearable's own links still waiting for their reply, in issue order
        self._pending: dict[str, list[tuple[float, int, dict[str, float]]]] = {}
        self._delivers: set[str] = set()  # links that report when the radio carried a message
        self._untimed: dict[str, int] = {}  # bytes delivered with the message before
        self._min_flops = MIN_SHARE * max(self.bundle.candidates[-1].head.flops, 1)
        self._plan: PipelinePlan | None = None
        self.replans = 0
        #: re-split when a measurement moves past the threshold (False: only when devices
        #: come or go, e.g. to measure one split's throughput)
        self.adaptive = True
        #: use at most this many devices (the wearable included; None: every helper alive)
        self.max_devices: int | None = None
        #: weigh slices by their in-context time on this device (one profiled run), not FLOPs
        self.weigh_by_time = True
        #: use every device the cuts allow, even when fewer would have a shorter bottleneck
        #: (tests and benchmarks of a K-device pipeline)
        self.all_devices = False
        #: ``cuts``: a fixed split (one cut per link) used whenever that many devices are alive;
        #: otherwise the DP splits (paper 002, §IV-D: split once, let the thresholds move)
        self.fixed_cuts = tuple(cuts) if cuts else None
        if self.fixed_cuts is not None:
            n = len(self.fixed_cuts)
            evaluate(self.points, self.fixed_cuts, [1.0] * (n + 1), [1.0] * n)  # checks them
        self._frozen: dict[tuple[tuple[str, ...], bool], PipelinePlan] = {}
        self.last: PipelineStats | None = None
        self._closed = False

    # -- planning -------------------------------------------------------------------------
    def alive(self) -> list[str]:
        now = time.monotonic()
        return [h for h in self.helpers if self._dead.get(h, 0.0) <= now]

    def _speeds(self, devices: Sequence[str]) -> list[float]:
        if self._speed[WEARABLE].value is None:  # measure this wearable once: the whole model
            self._measure_wearable()
        base = self._speed[WEARABLE].value or 1e9
        # a helper with no prior and no measurement yet: as fast as this wearable, until its
        # first frames measure it
        return [self._speed[d].value or base for d in devices]

    def _bandwidths(self, devices: Sequence[str]) -> list[float]:
        return [self.links.value(d) or DEFAULT_BANDWIDTH_BPS for d in devices[1:]]

    def _weigh_slices(self) -> None:
        """Weigh each cut by measured time, not FLOPs: one profiled run of the whole model on
        this device gives every node's time in context (:mod:`coinf.device.incontext`); a cut's
        work is the model's FLOPs times its head's share of that time. A convolution can run
        several times faster per FLOP than another, so FLOPs alone balance stages badly; the
        devices' speeds are then measured in these units too."""
        from coinf.device.incontext import profile_in_context

        try:
            nodes = profile_in_context(self.bundle.model_path, "all", 1, 2, 5).nodes
        except Exception as exc:
            log.info("pipeline: slices weighed by FLOPs (profiling failed: %s)", exc)
            return
        total_ms = sum(nodes.values())
        total_flops = float(self.bundle.candidates[-1].head.flops)
        if not total_ms > 0 or not total_flops > 0:
            return
        self._flops = {c.id: total_flops * sum(nodes.get(n, 0.0) for n in c.head.nodes)
                       / total_ms for c in self.bundle.candidates}
        self._flops[self.bundle.candidates[-1].id] = total_flops

    def _measure_wearable(self) -> None:
        if self.weigh_by_time:
            self._weigh_slices()
        cand = self.bundle.candidates[-1]
        rng = np.random.default_rng(0)
        feeds = {t.name: rng.standard_normal(t.shape).astype(t.dtype)
                 if np.dtype(t.dtype).kind == "f" else np.zeros(t.shape, t.dtype)
                 for t in self.bundle.inputs}
        self._slices.run_slice(cand, "head", feeds)  # warm-up (session creation)
        _, elapsed = self._slices.run_slice(cand, "head", feeds)
        self._speed[WEARABLE].add(self._flops[cand.id] / max(elapsed, 1e-6))

    def priced_points(self) -> list[CutPoint]:
        """The DP's cuts, each weighed by its measured work (:meth:`_weigh_slices`). With
        ``packing="auto"`` each cut costs its cheapest encoding within
        ``dp_tolerance`` of its most accurate one (a packing or a compressor's code), so a slow
        link draws the cut to where a compressor shrinks it; else its raw bytes."""
        points = [dataclasses.replace(p, flops=self._flops.get(p.id, p.flops))
                  for p in self.points]
        if not self.auto_packing:
            return points
        return priced(self.bundle, points, self.dp_tolerance)

    def plan(self, force: bool = False) -> PipelinePlan | None:
        """The split in use (re-made when the devices or their measurements moved); ``None``
        when no helper is left (the wearable runs everything)."""
        devices = (WEARABLE, *self.alive())[:self.max_devices]
        if len(devices) == 1:
            return None
        key = (devices, self.all_devices)
        if not self.adaptive and not force and key in self._frozen:
            self._plan = self._frozen[key]  # frozen: the last split over these devices
            return self._plan
        speeds, bws = self._speeds(devices), self._bandwidths(devices)
        current = self._plan
        if (not force and current is not None and self._frozen.get(key) is current
                and (not self.adaptive or not self._trigger.moved(speeds, bws))):
            return current
        n = len(devices)
        split: PipelineSplit | None
        points = self.priced_points()
        if self.fixed_cuts is not None and n == len(self.fixed_cuts) + 1:
            split = evaluate(points, self.fixed_cuts, speeds, bws, self._result_bytes)
        else:
            split = self._every_device(points, speeds, bws) if self.all_devices else None
            split = split or split_prefix(points, speeds, bws, self._result_bytes, MORE_MARGIN)
        if split is None:
            raise InputError("this bundle has no cut to split it between devices")
        n = len(split.compute_s)
        devices = devices[:n]
        ids = [self.points[0].id, *split.cuts, self.points[-1].id]
        stages = tuple(Stage(d, a, b) for d, a, b
                       in zip(devices, ids, ids[1:], strict=False))
        self._plan = self._frozen[key] = PipelinePlan(tuple(devices), split, stages)
        self._trigger.planned(speeds, bws)
        if current is not None:
            self.replans += 1
            log.info("pipeline re-split: %s", self._plan)
        return self._plan

    def _every_device(self, points: Sequence[CutPoint], speeds: Sequence[float],
                      bws: Sequence[float]) -> PipelineSplit | None:
        try:
            return split_dp(points, speeds, bws, self._result_bytes)
        except InputError:  # too few nested cuts for them all
            return None

    def verdict(self) -> dict[str, object]:
        """How many of the devices alive a stream should use now, and why (the stage that
        bounds it): :func:`~coinf.wearable.planner.pipeline_dp.device_verdict`."""
        devices = (WEARABLE, *self.alive())[:self.max_devices]
        return device_verdict(self.priced_points(), self._speeds(devices),
                              self._bandwidths(devices), devices, self._result_bytes,
                              MORE_MARGIN)

    # -- frames ---------------------------------------------------------------------------
    async def run(self, input_feed: Mapping[str, Any]) -> dict[str, np.ndarray]:
        outputs, _ = await self._frame(check_feed(self.bundle, input_feed))
        return outputs

    async def astream(self, feeds: Iterable[Mapping[str, Any]] | AsyncIterable[Mapping[str, Any]],
                      depth: int = 4) -> AsyncGenerator[tuple[dict[str, np.ndarray],
                                                              PipelineStats], None]:
        """(outputs, stats) per input, in order, at most ``depth`` frames in flight; ``feeds``
        is pulled only when there is room, a blocking iterator on a worker thread (as a
        Session's stream: :func:`~coinf.wearable.stream.puller`)."""
        if depth < 1:
            raise InputError(f"depth must be >= 1, got {depth}")
        pull = puller(feeds)
        inflight: deque[asyncio.Task[tuple[dict[str, np.ndarray], PipelineStats]]] = deque()
        done = False
        try:
            while True:
                while not done and len(inflight) < depth:
                    feed = await pull()
                    if feed is END:
                        done = True
                        break
                    inflight.append(asyncio.ensure_future(
                        self._frame(check_feed(self.bundle, feed))))
                if not inflight:
                    return
                yield await inflight.popleft()
        finally:
            for task in inflight:
                task.cancel()
            await asyncio.gather(*inflight, return_exceptions=True)

    async def _frame(self, feeds: dict[str, np.ndarray]
                     ) -> tuple[dict[str, np.ndarray], PipelineStats]:
        if self._closed:
            raise InputError("this pipeline session is closed")
        t0 = time.perf_counter()
        retries = 0
        while True:
            plan = self.plan()
            if plan is None:
                outputs, stats = await self._local(feeds)
                break
            try:
                outputs, stats = await self._attempt(plan, feeds)
                break
            except LinkError as exc:
                if not exc.transient:  # configuration faults (bundle, version) always raise
                    raise
                dead = _dead_device(exc, plan)
                if dead is None or retries > len(self.helpers):
                    # busy, a failed slice, ...: this frame finishes here, the helpers stay
                    log.info("pipeline frame finished on the wearable: %s", exc)
                    outputs, stats = await self._local(feeds)
                    break
                await self._mark_dead(dead, exc)
                retries += 1
        stats.retries = retries
        stats.total_ms = (time.perf_counter() - t0) * 1e3
        self.last = stats
        return outputs, stats

    async def _local(self, feeds: dict[str, np.ndarray]
                     ) -> tuple[dict[str, np.ndarray], PipelineStats]:
        cand = self.bundle.candidates[-1]
        loop = asyncio.get_running_loop()
        out, elapsed = await loop.run_in_executor(self.executor.head_pool,
                                                  self._slices.run_slice,
                                                  cand, "head", feeds)
        return out, PipelineStats((WEARABLE,), (), [elapsed * 1e3], [], local=True)

    async def _attempt(self, plan: PipelinePlan, feeds: dict[str, np.ndarray]
                       ) -> tuple[dict[str, np.ndarray], PipelineStats]:
        """One frame through ``plan`` by the one executor (:mod:`coinf.wearable.executor`),
        then every measurement it gives: each device's speed, each link's bandwidth."""
        choices = (self.link_choices(plan) if self.auto_packing
                   else [CompressionOption(1, str(self.packing), 1.0, 1.0)]
                   + [CompressionOption(1, "raw", 1.0, 1.0)] * (len(plan.hops) - 1))
        labels = [option_label(o) for o in choices]
        run = Plan.build(self.bundle, [dataclasses.replace(st, packing=lab) for st, lab
                                       in zip(plan.stages, [*labels, "raw"], strict=True)])
        stats = RunStats(candidate=run.candidate.id, packing=labels[0],
                         strategy=run.strategy)
        crossing = await self.executor.first_stage(run, feeds, stats)
        first = run.candidate
        own_s = stats.head_ms / 1e3
        if not first.is_handheld_only and self._flops[first.id] >= self._min_flops \
                and own_s > 0:
            self._speed[WEARABLE].add(self._flops[first.id] / own_s)
        conn = self._connection(plan.devices[1])
        rpc = await conn.client()
        decoders = peer_decoders(conn.info, self.bundle.priors_digest)
        payload = await self.executor.encode(run, crossing, stats, decoders)  # + the encoder's
        marks: dict[str, float] = {}
        t_send = time.perf_counter()
        pending = self._pending.setdefault(plan.devices[1], [])
        entry = (t_send, len(payload), marks)
        pending.append(entry)
        try:
            outputs = await self.executor.exchange(run, rpc, payload, stats, self.timeout,
                                                   conn.rtt_ms, marks)
        finally:
            pending.remove(entry)
        if "delivered" in marks:
            self._delivers.add(plan.devices[1])
        send_s = self.links.service_time(plan.devices[1], t_send, marks)
        nbytes = len(payload)
        if "delivered" in marks:  # BLE: one completing with the one before shares its air time
            nbytes += self._untimed.pop(plan.devices[1], 0)
            if send_s <= MIN_SEND_S:
                self._untimed[plan.devices[1]], nbytes = nbytes, 0
        conn.succeeded()
        # measurements: every device's speed, every link's bandwidth
        compute = [stats.head_ms] + [h["compute_ms"] for h in stats.hops]
        links = [send_s * 1e3] + [h["send_ms"] for h in stats.hops[:-1]]
        self.links.observe(plan.devices[1], nbytes, send_s)
        for st, hop in zip(run.remote, stats.hops, strict=True):
            flops = self._flops[st.end] - self._flops[st.start]
            if flops >= self._min_flops and hop["compute_ms"] > 0:
                self._speed[st.device].add(flops / (hop["compute_ms"] / 1e3))
        for nxt, hop in zip(plan.devices[2:], stats.hops, strict=False):
            self.links.observe(nxt, hop["bytes"], hop["send_ms"] / 1e3)
        return outputs, PipelineStats(plan.devices, plan.cuts, compute, links,
                                      packing=[o.packing for o in choices],
                                      gamma=[o.gamma for o in choices],
                                      first_link=conn.connector.spec)

    def link_packing(self, plan: PipelinePlan) -> PackSpec:
        """The first link's packing (:meth:`link_packings`)."""
        return self.link_packings(plan)[0]

    def link_packings(self, plan: PipelinePlan) -> list[PackSpec]:
        """Every link's packing (:meth:`link_choices`)."""
        return [PackSpec.parse(o.packing) for o in self.link_choices(plan)]

    def link_choices(self, plan: PipelinePlan) -> list[CompressionOption]:
        """Every link's option at its current bandwidth estimate: the one with the best
        effective accuracy (throughput x accuracy / input rate) among raw, the bundle's
        calibrated packings of that link's cut and its attached compressors with each packing
        of their code (paper 002, §IV-D, Algorithm 2: a threshold table per cut, looked up)."""
        compute_fps = 1.0 / max(max(plan.split.compute_s), 1e-9)
        input_fps = self.input_fps or compute_fps
        out = []
        for cut, receiver in zip(plan.cuts, plan.devices[1:], strict=True):
            cand = self.bundle.candidate(cut)
            key = (cand.id, round(compute_fps, 1))
            table = self._tables.get(key)
            if table is None:
                table = self._tables[key] = thresholds(
                    link_options(cand, self.bundle.compressors(cand.id), OVERHEAD_BYTES),
                    compute_fps, input_fps)
            out.append(lookup(table, self.link_bandwidth(receiver)))
        return out

    def link_bandwidth(self, receiver: str) -> float:
        """The link's bandwidth estimate (B/s), lowered at once when a message on the wearable's
        own link is overdue: one that has been on the wire for ``elapsed`` s without being
        taken shows the link carries at most ``bytes / elapsed`` -- a bandwidth drop is seen
        while the first slow message is still sending, not after its round trip, so the next
        frames already go compressed instead of queueing more raw tensors behind it."""
        est = self.links.value(receiver) or DEFAULT_BANDWIDTH_BPS
        prev_end = self.links.last_end(receiver)
        now = time.perf_counter()
        for t0, nbytes, marks in self._pending.get(receiver, ()):
            done = marks.get("delivered") if receiver in self._delivers else \
                marks.get("delivered", marks.get("sent"))
            if done is not None:
                prev_end = max(prev_end, done)
                continue
            elapsed = now - max(t0, prev_end)
            if elapsed > 2 * nbytes / est:  # overdue (2x: no reaction to jitter)
                return min(est, nbytes / elapsed)
            break
        return est

    def _connection(self, name: str) -> Connection:
        conn = self._conns.get(name)
        if conn is None:
            conn = self._conns[name] = helper_connection(
                self.helpers[name], self.bundle, connect_timeout=self.connect_timeout,
                request_timeout=self.timeout, max_backoff_s=self.dead_retry_s,
                ble_options=self.ble_options)
        return conn

    def retune(self, name: str, bandwidth_bps: float) -> None:
        """Emulation: from now on the link into helper ``name`` (a ``shape=True`` helper)
        carries ``bandwidth_bps`` B/s, its open link included (a bandwidth schedule)."""
        from coinf.ble_protocol.throttle import ThrottledLink

        helper = self.helpers[name] = dataclasses.replace(self.helpers[name],
                                                          bandwidth_bps=bandwidth_bps)
        conn, channel = self._conns.get(name), helper.channel
        if conn is None or channel is None:
            return
        if isinstance(conn.connector, ShapedConnector):
            conn.connector.channel = channel
        rpc = conn.rpc_client
        if rpc is not None and isinstance(rpc.link, ThrottledLink):
            rpc.link.channel = channel

    async def _mark_dead(self, name: str, exc: BaseException) -> None:
        if self._dead.get(name, 0.0) > time.monotonic():
            return
        log.warning("pipeline: helper %s left out for %.0f s: %s", name, self.dead_retry_s, exc)
        self._dead[name] = time.monotonic() + self.dead_retry_s
        conn = self._conns.pop(name, None)
        if conn is not None:
            await conn.close()

    # -- lifecycle --------------------------------------------------------------------------
    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for conn in list(self._conns.values()):
            await conn.close()
        self._conns.clear()
        self.executor.close()

    async def __aenter__(self) -> PipelineSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _dead_device(exc: LinkError, plan: PipelinePlan) -> str | None:
    """The device a failed frame shows to be gone: the hop a DISCONNECTED ERROR names (its
    ``hop``: an index into the route the first helper received), or the first helper when the
    wearable's own link to it failed. None: an answer that leaves every device in place."""
    if isinstance(exc, RemoteError):
        if exc.code == ErrorCode.DISCONNECTED and exc.hop is not None \
                and 0 < exc.hop < len(plan.hops):
            return plan.hops[exc.hop].device
        return None
    if isinstance(exc, ProtocolError) and exc.code in (ErrorCode.DISCONNECTED, ErrorCode.TIMEOUT):
        return plan.devices[1]
    return None


__all__ = ["OVERHEAD_BYTES", "HelperConfig", "PipelinePlan", "PipelineSession", "PipelineStats",
           "link_options", "load_helpers", "option_label"]
