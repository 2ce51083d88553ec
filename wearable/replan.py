"""The plan a Session given helpers runs, chosen again whenever its devices change.

:class:`Replanner` holds the helpers (a list, a config file or ``Discover``), which of them are
left out and until when, and the plan :func:`~coinf.wearable.planner.strategy.choose_strategy`
makes of the others (the one planner; nothing here predicts). A Session asks it for the plan of
each frame as the frame starts, so a change applies from the next frame on and never to one in
flight:

* a helper of the running plan fails (its link drops, it times out, or the hop before it
  reports it unreachable): the frame finishes on the wearable as always, the helper is left
  out for a backoff (1 s doubling to ``max_backoff_s``) and the plan is chosen again without
  it;
* when the backoff has passed, the Session probes the helper in the background (connect and
  handshake); if it answers, the plan is chosen again with it, else its backoff doubles;
* with ``Discover``, the network is browsed again at most every ``Discover.rebrowse_s``, in
  the background, and a helper seen for the first time joins the choice;
* a helper's speed is measured on every frame it runs (its slice's FLOPs over the compute time
  its RESULT reports, averaged): once it is ``SPEED_FACTOR`` x off the speed the plan was
  chosen with (its configured ``speed_flops``, else the handheld profile's), the plan is
  chosen again with the measured speed (a loaded laptop, a phone that throttles);
* so is the link into each helper (:class:`~coinf.wearable.link_meter.LinkMeter`: the bytes of
  each message over the time the link took to carry it; the wearable's own link from the
  request's marks, the links between helpers from the hand-off times their RESULTs report):
  once it is ``SPEED_FACTOR`` x slower than the bandwidth the plan was chosen with (the
  configured one, else the default), over at least ``SPEED_FRAMES`` timed sends, or
  ``SPEED_FACTOR`` x faster, the plan is chosen again with the measured bandwidth (a crowded
  radio, a helper walking away, a link far better than configured).

* the wearable's own speed is measured the same way, from each frame's first stage (the whole
  model in a local frame);
* each hop's packing follows its link, frame by frame: at the link's current bandwidth (lowered
  at once while a message on the wearable's own link is overdue:
  :meth:`~coinf.wearable.link_meter.LinkMeter.current`) the hop sends the option with the best
  effective accuracy (:func:`~coinf.wearable.planner.compress_select.choose_hop`), so a
  bandwidth drop switches the next frames to a compressor's code while the cuts stay.

``adaptive = False`` keeps the cuts until a device leaves or joins (a benchmark of one split);
``max_devices`` and ``all_devices`` limit the choice (:class:`~coinf.wearable.planner.strategy.
Devices`).

Every change is kept in :attr:`Replanner.history` (bounded): the plan, why, and the first
frame that ran it; each frame's :class:`~coinf.wearable.frame.RunStats` names its plan and
version.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from coinf.wearable.frame import RunStats
from coinf.wearable.link_meter import LinkMeter, Pending
from coinf.wearable.pipeline_config import DEFAULT_BANDWIDTH_BPS, HelperConfig
from coinf.wearable.plan import WEARABLE, Plan
from coinf.wearable.planner.compress_select import (
    OVERHEAD_BYTES,
    CompressionOption,
    choose_hop,
    link_options,
    option_label,
)
from coinf.wearable.planner.strategy import (
    SPATIAL_NOT_RUN,
    Devices,
    choose_strategy,
    cut_work,
    fixed_option,
    policy_tolerance,
    profile_speeds,
    to_plan,
)

from coinf.errors import ErrorCode, InputError, LinkError, ProtocolError, RemoteError

log = logging.getLogger(__name__)
T = TypeVar("T")
FIRST_BACKOFF_S = 1.0
HISTORY = 64
#: re-plan when a helper's measured speed is this many times off the one planned with
SPEED_FACTOR = 1.5
#: frames a helper's speed is averaged over before it may move the plan; and the average's weight
SPEED_FRAMES = 3
SPEED_EWMA = 0.3
#: a slice with less than this share of the model's FLOPs is not timed (overhead dominates)
MIN_SHARE = 0.05


class Replanner:
    """The helpers, which are left out, and the plan over the others (module docstring)."""

    def __init__(self, bundle: Any, planner: Any, helpers: Sequence[HelperConfig],
                 objective: str, max_backoff_s: float, input_fps: float | None = None) -> None:
        self.bundle = bundle
        self.planner = planner
        self.objective = objective
        self.max_backoff_s = max_backoff_s
        #: the stream's input rate, frames/s (None: as fast as the plan computes)
        self.input_fps = input_fps
        #: measurements move the plan (False: only a device leaving or joining does)
        self.adaptive = True
        #: each hop's packing follows its link's bandwidth, frame by frame
        self.follow_links = True
        #: at most this many devices, the wearable included (None: every helper alive)
        self.max_devices: int | None = None
        #: a plan over every device even where fewer would be faster (benchmarks)
        self.all_devices = False
        #: cuts fixed by the caller (:meth:`pin`), run whenever enough devices are alive
        self.pinned: tuple[str, ...] | None = None
        self._frozen: dict[tuple[Any, ...], tuple[Plan, Any]] = {}
        #: the option the plan was made of (its predicted stage times: ``stage_s``)
        self.chosen: Any = None
        self._hop_options: dict[str, list[CompressionOption]] = {}
        self._tolerance = policy_tolerance(planner)
        self.helpers: dict[str, HelperConfig] = {h.name: h for h in helpers}
        #: name -> (left out until, monotonic; backoff s; why)
        self.dead: dict[str, tuple[float, float, str]] = {}
        self.probing: set[str] = set()
        self.version = 0
        self.frames = 0  # frames that asked for a plan so far
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self.options: list[Any] = []
        self.why = ""
        #: name -> (frames measured, average FLOP/s); the speeds the plan was chosen with
        self.measured: dict[str, tuple[int, float]] = {}
        self._planned_speed: dict[str, float] = {}
        #: the links into the helpers, measured; the bandwidths the plan was chosen with
        self.links = LinkMeter()
        self._planned_bw: dict[str, float] = {}
        #: each cut's work, in the units device speeds are measured in (the one cost model)
        self._flops = cut_work(bundle, planner)
        self._min_flops = MIN_SHARE * max(self._flops[bundle.candidates[-1].id], 1.0)
        #: what choose_strategy assumes for the wearable, and for a helper with no speed given
        self._wearable_speed, self._handheld_speed = profile_speeds(planner)
        self.plan: Plan = self._choose("start")

    # -- the choice ------------------------------------------------------------------------
    def alive(self) -> list[HelperConfig]:
        return [h for n, h in self.helpers.items() if n not in self.dead]

    def _choose(self, reason: str) -> Plan:
        helpers = [self._as_measured(h) for h in self.alive()]
        key = (tuple(h.name for h in helpers), self.max_devices, self.all_devices,
               self.pinned)
        if not self.adaptive and key in self._frozen:
            plan, self.chosen = self._frozen[key]
            return self._adopt(plan, reason, self.why)
        n, avg = self.measured.get(WEARABLE, (0, 0.0))
        wearable = avg if n >= SPEED_FRAMES else None
        dev = Devices(tuple(helpers), wearable, self.input_fps, self.max_devices,
                      self.all_devices)
        options, best, why = choose_strategy(self.bundle, self.planner, dev, self.objective,
                                             DEFAULT_BANDWIDTH_BPS)
        if self.pinned is not None:
            try:
                best = fixed_option(self.bundle, self.planner, dev, self.pinned,
                                    DEFAULT_BANDWIDTH_BPS)
                why = f"{best.detail}: {best.throughput_fps:.1f} frames/s predicted"
            except InputError as exc:  # too few devices alive for it: the planner's choice
                why = f"{why} (the fixed split needs more devices: {exc})"
        self._planned_speed = {h.name: h.speed_flops or self._handheld_speed for h in helpers}
        self._planned_speed[WEARABLE] = wearable or self._wearable_speed
        self._planned_bw = {h.name: h.bandwidth_bps or DEFAULT_BANDWIDTH_BPS for h in helpers}
        plan = to_plan(best, self.bundle)
        assert plan is not None  # the best runnable option always makes a plan
        self.options, self.chosen = options, best
        if len(self._frozen) >= HISTORY:  # device sets come and go (Discover): bounded
            self._frozen.clear()
        self._frozen[key] = (plan, best)
        return self._adopt(plan, reason, why)

    def _adopt(self, plan: Plan, reason: str, why: str) -> Plan:
        """Run ``plan`` from the next frame on (a new version when it differs)."""
        self.why = why
        old = getattr(self, "plan", None)
        if old is None or plan != old:
            self.version += 1
            self.plan = plan
            self.history.append({"version": self.version, "from_frame": self.frames,
                                 "strategy": plan.strategy, "plan": str(plan),
                                 "reason": reason, "why": why})
            if old is not None:
                log.info("re-planned (%s): %s", reason, plan)
        return self.plan

    def pin(self, cuts: Sequence[str] | None) -> Plan:
        """Fix the cuts (one per link, over the wearable and the first helpers alive) from now
        on, each hop's packing still following its link; ``None``: choose again."""
        if cuts is not None:
            from coinf.wearable.planner.pipeline_dp import cut_points, evaluate

            n = len(cuts)  # known and nested (the devices' speeds do not matter here)
            evaluate(cut_points(self.bundle), cuts, [1.0] * (n + 1), [1.0] * n)
        self.pinned = tuple(cuts) if cuts is not None else None
        return self._choose(f"split fixed at {', '.join(cuts)}" if cuts else "split released")

    def limit(self, max_devices: int | None = None, all_devices: bool = False) -> Plan:
        """Plan over at most ``max_devices`` devices (None: all), or over every device
        (``all_devices``); the plan for the next frames."""
        if max_devices is not None and not (isinstance(max_devices, int) and max_devices >= 1):
            raise InputError(f"max_devices must be an integer >= 1 or None, got {max_devices!r}")
        self.max_devices, self.all_devices = max_devices, all_devices
        return self._choose(f"limited to {max_devices or 'every'} device(s)"
                            + (", all of them" if all_devices else ""))

    def _as_measured(self, h: HelperConfig) -> HelperConfig:
        """``h`` with its speed as measured over enough frames, and its link as measured once
        that is ``SPEED_FACTOR`` x off the configured one (:meth:`_link_off`)."""
        if self.measured.get(h.name, (0, 0.0))[0] >= SPEED_FRAMES:
            h = replace(h, speed_flops=self.measured[h.name][1])
        bw = self._link_off(h.name, h.bandwidth_bps or DEFAULT_BANDWIDTH_BPS)
        return h if bw is None else replace(h, bandwidth_bps=bw)

    def take(self) -> tuple[Plan, int]:
        """The plan for the frame starting now (each hop's packing as its link favours it
        now), and its version."""
        self.frames += 1
        if self.follow_links and self.plan.remote:
            self._follow_links()
        return self.plan, self.version

    def _follow_links(self) -> None:
        plan = self.plan
        fps = float(plan.predicted.get("compute_fps", 1e9))
        labels, notes = [], []
        for st, nxt in zip(plan.stages, plan.stages[1:], strict=False):
            options = self._hop_options.get(st.end)
            if options is None:
                cand = self.bundle.candidate(st.end)
                options = self._hop_options[st.end] = link_options(
                    cand, self.bundle.compressors(cand.id), OVERHEAD_BYTES)
            bw = self.links.current(nxt.device, self._planned_bw.get(nxt.device)
                                    or DEFAULT_BANDWIDTH_BPS)
            labels.append(option_label(choose_hop(options, bw, fps, self.input_fps,
                                                  self._tolerance, self.objective)))
            notes.append(f"{nxt.device} {bw / 1e3:.1f} kB/s: {labels[-1]}")
        if labels == [st.packing for st in plan.stages[:-1]]:
            return
        stages = [replace(st, packing=p) for st, p in zip(plan.stages, labels, strict=False)]
        self._adopt(Plan.build(self.bundle, [*stages, plan.stages[-1]], plan.predicted),
                    "packing follows the links (" + "; ".join(notes) + ")", self.why)

    # -- speeds measured -------------------------------------------------------------------
    async def timed(self, exchange: Awaitable[T], device: str, nbytes: int,
                    marks: dict[str, float], stats: RunStats) -> T:
        """Await a frame's ``exchange`` of ``nbytes`` with ``device`` (``marks``: its request's),
        timing the link into it: an overdue message lowers its bandwidth at once
        (:meth:`sending`), and the time the link took goes into ``stats.send_ms``."""
        t0 = time.perf_counter()
        entry = self.sending(device, nbytes, t0, marks)
        try:
            outputs = await exchange
        finally:
            self.finished(device, entry)
        stats.send_ms = self.sent(device, nbytes, t0, marks) * 1e3
        return outputs

    def sending(self, device: str, nbytes: int, t0: float, marks: dict[str, float]) -> Pending:
        """The wearable is sending a frame's ``nbytes`` to ``device`` from ``t0``: until
        :meth:`finished`, an overdue message lowers that link's bandwidth at once."""
        return self.links.sending(device, nbytes, t0, marks)

    def finished(self, device: str, entry: Pending) -> None:
        self.links.finished(device, entry)

    def sent(self, device: str, nbytes: int, t0: float, marks: dict[str, float]) -> float:
        """The wearable sent a frame's ``nbytes`` to ``device`` at ``t0``; ``marks``: the
        request's (:meth:`coinf.ble_protocol.rpc.RpcClient.request`). The seconds the link
        took to carry it."""
        return self.links.sent(device, nbytes, t0, marks)

    def observed(self, plan: Plan, stats: RunStats) -> None:
        """A frame of ``plan`` came back (``stats.head_ms`` and ``stats.hops``: each hop's
        compute, hand-off and bytes): average every device's speed and the links between
        helpers, and choose again when a speed or a link is ``SPEED_FACTOR`` x off the plan's
        (unless not ``adaptive``)."""
        hops = stats.hops
        timed = [(plan.stages[0], stats.head_ms)] + [
            (st, float(hop.get("compute_ms") or 0.0))
            for st, hop in zip(plan.remote, hops, strict=False)]
        moved = [m for m in (self._measure(st, ms) for st, ms in timed) if m]
        for st, hop in zip(plan.remote[1:], hops, strict=False):
            self.links.observe(st.device, float(hop.get("bytes") or 0),
                               float(hop.get("send_ms") or 0.0) / 1e3)
        moved += [m for m in map(self._link_moved, (st.device for st in plan.remote)) if m]
        if moved and self.adaptive:
            self._choose("; ".join(moved))

    def _measure(self, st: Any, ms: float) -> str | None:
        """Average the speed of ``st``'s device from its slice's ``ms``; why the plan moves,
        if it does."""
        flops = self._flops.get(st.end, 0.0) - self._flops.get(st.start, 0.0)
        known = st.device == WEARABLE or st.device in self.helpers
        if not known or flops < self._min_flops or not ms > 0:
            return None
        n, avg = self.measured.get(st.device, (0, 0.0))
        speed = flops / (ms / 1e3)
        avg = speed if n == 0 else (1 - SPEED_EWMA) * avg + SPEED_EWMA * speed
        self.measured[st.device] = (n + 1, avg)
        planned = self._planned_speed.get(st.device)
        if n + 1 >= SPEED_FRAMES and planned is not None and \
                max(avg / planned, planned / avg) > SPEED_FACTOR:
            return f"{st.device} measured at {avg / 1e9:.2f} GFLOP/s, planned " \
                   f"{planned / 1e9:.2f}"
        return None

    def _link_off(self, name: str, planned: float | None) -> float | None:
        """The measured bandwidth of the link into ``name`` when it is ``SPEED_FACTOR`` x
        slower than ``planned`` over at least ``SPEED_FRAMES`` timed sends, or that much faster
        (a bound counts: the link is at least that fast); else None."""
        est = self.links.value(name)
        if est is None or not planned:
            return None
        slower = self.links.timed.get(name, 0) >= SPEED_FRAMES and est * SPEED_FACTOR < planned
        return est if slower or est > planned * SPEED_FACTOR else None

    def _link_moved(self, name: str) -> str | None:
        """Why the link into ``name`` moves the plan, if it does."""
        planned = self._planned_bw.get(name)
        est = self._link_off(name, planned) if name in self.helpers else None
        if est is None or planned is None:
            return None
        return f"the link into {name} measured at {est / 1e3:.1f} kB/s, planned " \
               f"{planned / 1e3:.1f}"

    # -- devices leaving and coming back ---------------------------------------------------
    def failed(self, name: str, exc: BaseException) -> bool:
        """``name`` failed a frame: leave it out for a backoff and choose again. False when it
        was already left out (another frame in flight saw the same failure)."""
        if name not in self.helpers or name in self.dead:
            return False
        self._leave_out(name, FIRST_BACKOFF_S, f"{name} failed: {exc}")
        return True

    def _leave_out(self, name: str, backoff: float, why: str) -> None:
        backoff = min(backoff, self.max_backoff_s)
        self.dead[name] = (time.monotonic() + backoff, backoff, why)
        self.links.forget(name)
        log.warning("helper %s left out for %.1f s: %s", name, backoff, why)
        self._choose(why)

    def due(self) -> list[str]:
        """Helpers left out whose backoff has passed and that no probe is checking yet."""
        now = time.monotonic()
        return [n for n, (until, _, _) in self.dead.items()
                if until <= now and n not in self.probing]

    def back(self, name: str) -> None:
        """A probe reached ``name``: it joins the choice again."""
        self.probing.discard(name)
        if self.dead.pop(name, None) is not None:
            self._choose(f"{name} is back")

    def still_out(self, name: str, exc: BaseException) -> None:
        """A probe did not reach ``name``: its backoff doubles."""
        self.probing.discard(name)
        _, backoff, _ = self.dead.get(name, (0.0, FIRST_BACKOFF_S / 2, ""))
        backoff = min(backoff * 2, self.max_backoff_s)
        self.dead[name] = (time.monotonic() + backoff, backoff, f"{name} unreachable: {exc}")

    def merge(self, found: Sequence[HelperConfig]) -> list[str]:
        """Helpers a new browse found: those not known yet join; one whose address changed is
        taken as announced. The names that changed (their old links must go)."""
        changed = [h.name for h in found if self.helpers.get(h.name) != h]
        for h in found:
            self.helpers[h.name] = h
        if changed:
            self._choose(f"discovered {', '.join(changed)}")
        return changed

    # -- explaining ------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """What ``Session.strategies`` shows: every option now, the chosen one and why, the
        plan, the helpers left out and the history of changes."""
        now = time.monotonic()
        return {"objective": self.objective, "chosen": _name(self.plan), "why": self.why,
                "options": [o.to_json() for o in self.options],
                "plan": self.plan.to_json(), "version": self.version,
                "helpers": list(self.helpers),
                "left_out": {n: {"retry_in_s": round(max(until - now, 0.0), 2), "why": why}
                             for n, (until, _, why) in self.dead.items()},
                "history": list(self.history), "spatial": SPATIAL_NOT_RUN,
                "limits": {"max_devices": self.max_devices, "all_devices": self.all_devices,
                           "pinned": list(self.pinned) if self.pinned else None,
                           "adaptive": self.adaptive, "follow_links": self.follow_links}}


def _name(plan: Plan) -> str:
    return "depth split" if plan.strategy == "split" else plan.strategy


def failed_device(exc: LinkError, plan: Plan) -> str | None:
    """The device a failed frame shows to be at fault: the hop a DISCONNECTED ERROR names (an
    index into the route the first device received), else the first remote device for any
    failure of its own (link, timeout, busy, bad result). None: a device further on failed
    otherwise (that frame only: the devices stay)."""
    if isinstance(exc, RemoteError) and exc.hop is not None and exc.hop > 0:
        if exc.code == ErrorCode.DISCONNECTED and exc.hop < len(plan.remote):
            return plan.remote[exc.hop].device
        return None
    if isinstance(exc, ProtocolError) or exc.transient:
        return plan.remote[0].device if plan.remote else None
    return None


__all__ = ["Replanner", "failed_device"]
