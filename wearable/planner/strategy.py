"""Which way to use the devices nearby: local, a depth split, an n-device pipeline or a spatial
partition, compared on one set of device speeds and link bandwidths.

* **local**: the whole model on the wearable.
* **depth split**: head here, tail on the first helper (CoINF / Neurosurgeon).
* **pipeline**: the DP split over the wearable and every helper (streaming-CNN paper); one frame
  takes the sum of its stages, but a stream runs one frame per bottleneck stage.
* **spatial**: the conv layers' maps tiled over the wearable and the helpers (MeDNN GTDP, Eq. 1
  per group), the layers after them on the fastest device; one frame at a time. Predicted
  only, never chosen: :data:`SPATIAL_NOT_RUN` says why.

``objective="latency"`` (one inference) picks the smallest per-frame time; ``"throughput"``
(a stream) the highest frame rate. Every figure is a prediction from the same inputs; the
explanation says what decided.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from coinf.convert.gtdp import Worker
from coinf.wearable.planner.pipeline_dp import (
    CutPoint,
    slowest_stage,
    split_dp,
    split_latency,
)

from coinf.errors import InputError, ModelError

OBJECTIVES = ("latency", "throughput", "energy")
#: a pipeline over one more device replaces the shorter one only when this much better
MORE_MARGIN = 0.05
#: why a Session never runs spatial partition (its prediction is still shown)
SPATIAL_NOT_RUN = ("spatial partition: predicted, not run. On realistic device sets (a Pi Zero "
                   "2 W with 1-3 laptop, phone or Pi 4 helpers over BLE 4.2 or Wi-Fi) it beat "
                   "the best local, split or pipeline plan by over 10 % only when every helper "
                   "had a 5 MB/s link of its own, never once its tiles share the wearable's "
                   "one radio, and the cost model overstates its gain (coinf bench strategies, "
                   "coinf bench spatial); it runs only in coinf bench spatial")


@dataclass
class StrategyOption:
    """One way to run the model: predicted seconds per frame and frames per second."""

    name: str
    devices: list[str]
    latency_s: float
    throughput_fps: float
    detail: str
    notes: list[str] = field(default_factory=list)
    #: the cuts between consecutive devices (a depth split: one; a pipeline: one per link)
    cuts: tuple[str, ...] = ()
    #: how each cut crosses its link (``raw``, ``q8``, ``g4+q8``...; empty: raw)
    packings: tuple[str, ...] = ()
    #: every stage's predicted seconds in pipeline order (compute 1, link 1, compute 2, ...)
    stage_s: tuple[float, ...] = ()
    #: frames per second its slowest *compute* stage allows (what a link's packing is chosen
    #: against: :func:`~coinf.wearable.planner.compress_select.choose_hop`)
    compute_fps: float = math.inf
    #: what the first hop sends (bytes, headers included) and the accuracy its packings give
    #: up at most (pp; :func:`choose_strategy` fills these in)
    sent_bytes: float = 0.0
    loss_pp: float = 0.0
    #: marginal energy per frame (mJ) on the wearable and on the helpers together
    wearable_mj: float = math.nan
    helpers_mj: float = math.nan

    def to_json(self) -> dict[str, object]:
        return {"strategy": self.name, "devices": self.devices,
                "latency_ms": round(self.latency_s * 1e3, 3),
                "throughput_fps": round(self.throughput_fps, 3), "detail": self.detail,
                "notes": self.notes, "cuts": list(self.cuts),
                "packings": list(self.packings or ("raw",) * len(self.cuts)),
                "stage_ms": [round(v * 1e3, 3) for v in self.stage_s],
                "bytes": round(self.sent_bytes), "loss_pp": round(self.loss_pp, 3),
                "wearable_mj": _rounded(self.wearable_mj),
                "helpers_mj": _rounded(self.helpers_mj)}

    def columns(self) -> dict[str, float]:
        """The 2-device planner's columns (``coinf plan``): the wearable's compute (head), the
        links (xfer, the result's way back included), the helpers' compute (tail), latency,
        energy, bytes and accuracy given up."""
        stages = [v * 1e3 for v in self.stage_s]
        return {"head_ms": stages[0] if stages else math.nan,
                "xfer_ms": sum(stages[1::2]), "tail_ms": sum(stages[2::2]),
                "latency_ms": self.latency_s * 1e3, "wearable_mj": self.wearable_mj,
                "helpers_mj": self.helpers_mj, "bytes": self.sent_bytes,
                "loss_pp": self.loss_pp, "fps": self.throughput_fps}

    @property
    def runnable(self) -> bool:
        """A plan the one executor runs (spatial partition runs only in ``bench spatial``:
        :data:`SPATIAL_NOT_RUN`)."""
        return self.name in ("local", "depth split", "pipeline") and math.isfinite(
            self.latency_s)


def _rounded(v: float) -> float | None:
    return round(v, 3) if math.isfinite(v) else None


def to_plan(option: StrategyOption, bundle: Any) -> Any:
    """The :class:`~coinf.wearable.plan.Plan` that runs ``option`` (None for spatial), with
    its predicted latency."""
    from coinf.wearable.plan import Plan, Stage

    if not option.runnable:
        return None
    ids = [bundle.candidates[0].id, *option.cuts, bundle.candidates[-1].id]
    if option.name == "local":
        ids = [ids[0], ids[-1]]
    packs = [*(option.packings or ("raw",) * len(option.cuts)), "raw"]
    stages = [Stage(d, a, b, packing=p) for d, a, b, p
              in zip(option.devices, ids, ids[1:], packs, strict=False)]
    return Plan.build(bundle, stages, {"latency_ms": option.latency_s * 1e3,
                                       "throughput_fps": option.throughput_fps,
                                       "compute_fps": min(option.compute_fps, 1e9)})


def profile_speeds(planner: Any) -> tuple[float, float]:
    """(wearable, handheld) FLOP/s as the planner's device profiles predict the whole model:
    the one cost model the 2-device planner uses, in the units the DP splits by."""
    base = planner.base_times()
    flops = float(planner.bundle.candidates[-1].head.flops)
    wear_ms, hand_ms = base[-1][0], base[0][1]
    return flops / max(wear_ms / 1e3, 1e-9), flops / max(hand_ms / 1e3, 1e-9)


def _fps(seconds: float) -> float:
    return math.inf if seconds <= 0 else 1.0 / seconds


def compare(points: Sequence[CutPoint], names: Sequence[str], speeds: Sequence[float],
            bandwidths: Sequence[float], latencies: Sequence[float], result_bytes: float,
            model_path: str | Path | Any = None,
            objective: str = "latency") -> list[StrategyOption]:
    """Every strategy that applies. ``names``/``speeds`` (FLOP/s) list the wearable first;
    ``bandwidths``/``latencies`` are each helper's link (B/s, s), in the same order.
    ``objective`` places the cuts: ``latency`` the least sum of stages (one frame),
    ``throughput`` the least bottleneck (a stream). The depth split goes to whichever helper
    serves the objective best. ``model_path`` (the ONNX file, or a
    :class:`~coinf.device.spatial.SpatialModel` built from it once) adds the spatial
    partition's prediction."""
    if not (len(names) == len(speeds) == len(bandwidths) + 1 == len(latencies) + 1):
        raise InputError("compare: one speed per device and one link per helper")
    if objective not in OBJECTIVES:
        raise InputError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    dp = split_latency if objective == "latency" else split_dp
    total = points[-1].flops
    alone = total / speeds[0]
    out = [StrategyOption("local", [names[0]], alone, _fps(alone),
                          f"{total / 1e6:.1f} MFLOP on the wearable", stage_s=(alone,),
                          compute_fps=_fps(alone))]
    groups = [("depth split", [0, h]) for h in range(1, len(names))]
    # a pipeline over the first k devices, k = 3..n: one more joins only when it pays
    groups += [("pipeline", list(range(k))) for k in range(3, len(names) + 1)]
    found: dict[str, StrategyOption] = {}
    for name, idx in groups:
        devs = [names[i] for i in idx]
        try:
            split = dp(points, [speeds[i] for i in idx], [bandwidths[i - 1] for i in idx[1:]],
                       result_bytes)
        except InputError as exc:
            found.setdefault(name, StrategyOption(name, devs, math.inf, 0.0, "not possible",
                                                  [str(exc)]))
            continue
        lat = sum(split.stage_s) + sum(2 * latencies[i - 1] for i in idx[1:])
        opt = StrategyOption(name, devs, lat, split.bound_fps,
                             f"cuts {', '.join(split.cuts)}; slowest stage "
                             f"{slowest_stage(split, devs)}", cuts=tuple(split.cuts),
                             stage_s=split.stage_s,
                             compute_fps=_fps(max(split.compute_s)))
        old = found.get(name)
        margin = MORE_MARGIN if old is not None and len(devs) > len(old.devices) else 1e-6
        if old is None or old.latency_s == math.inf or _better(opt, old, objective, margin):
            found[name] = opt
    out.extend(found.values())
    if model_path is not None and len(names) >= 2:
        out.append(_spatial(model_path, names, speeds, bandwidths, latencies))
    return out


def _better(a: StrategyOption, b: StrategyOption, objective: str,
            margin: float = 1e-6) -> bool:
    if objective == "latency":
        return a.latency_s < b.latency_s * (1 - margin)
    return a.throughput_fps > b.throughput_fps * (1 + margin)


def _spatial(model_path: str | Path | Any, names: Sequence[str], speeds: Sequence[float],
             bandwidths: Sequence[float], latencies: Sequence[float]) -> StrategyOption:
    from coinf.device.spatial import SpatialModel

    try:
        sm = model_path if isinstance(model_path, SpatialModel) else SpatialModel(model_path)
    except ModelError as exc:
        return StrategyOption("spatial", list(names), math.inf, 0.0, "not possible", [str(exc)])
    workers = [Worker(names[0], speeds[0])] + [
        Worker(n, s, b, t) for n, s, b, t in zip(names[1:], speeds[1:], bandwidths, latencies,
                                                 strict=True)]
    plan = sm.plan(workers, "fused")
    lat = plan.est_s  # the groups and the layers after the chain
    used = sorted({workers[t.worker].name for g in plan.groups for t in g.tiles
                   if not t.out.empty()} | {workers[plan.rest_worker].name})
    detail = ("no tile is worth sending: everything stays on the wearable" if plan.local_only
              else f"{len(plan.groups)} layer groups over {len(used)} devices")
    return StrategyOption("spatial", used, lat, _fps(lat), detail,
                          ["each helper's configured link is taken as its link to the wearable",
                           SPATIAL_NOT_RUN])


def choose(options: Sequence[StrategyOption], objective: str = "latency",
           budget_ms: float | None = None) -> tuple[StrategyOption, str]:
    """The best option for ``objective`` (``energy``: the least on the wearable) among those
    within the latency budget (all of them when none is), and a sentence saying why."""
    if objective not in OBJECTIVES:
        raise InputError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    ok = [o for o in options if math.isfinite(o.latency_s)]
    within = [o for o in ok if budget_ms is None or o.latency_s * 1e3 <= budget_ms]
    over = "" if budget_ms is None or within else \
        f" (none fits the {budget_ms:g} ms budget)"
    ok = within or ok
    key: dict[str, Any] = {"latency": lambda o: o.latency_s,
                           "throughput": lambda o: -o.throughput_fps,
                           "energy": lambda o: (o.wearable_mj if math.isfinite(o.wearable_mj)
                                                else math.inf)}
    rank = key[objective]
    best = ok[0]  # a tie goes to the simpler way, listed first
    for o in ok[1:]:
        # for a stream, one more device joins only when it clearly pays (MORE_MARGIN)
        more = objective == "throughput" and len(o.devices) > len(best.devices)
        if rank(o) < rank(best) - (MORE_MARGIN if more else 1e-6) * abs(rank(best)):
            best = o
    others = sorted((o for o in ok if o is not best), key=rank)
    if objective == "latency":
        vs = f"; next: {others[0].name} {others[0].latency_s * 1e3:.1f} ms" if others else ""
        why = (f"{best.name}: {best.latency_s * 1e3:.1f} ms per inference, the smallest "
               f"predicted latency{vs}")
    elif objective == "energy":
        vs = f"; next: {others[0].name} {others[0].wearable_mj:.1f} mJ" if others else ""
        why = (f"{best.name}: {best.wearable_mj:.1f} mJ on the wearable per inference, the "
               f"least predicted{vs}")
    else:
        vs = f"; next: {others[0].name} {others[0].throughput_fps:.1f} fps" if others else ""
        why = (f"{best.name}: {best.throughput_fps:.1f} frames/s, the highest predicted "
               f"throughput{vs}")
        pipe = next((o for o in others if o.name == "pipeline"), None)
        if pipe is not None and best.name != "pipeline":
            why += (f". More devices cannot help: the {len(pipe.devices)}-device pipeline "
                    f"predicts {pipe.throughput_fps:.1f} frames/s ({pipe.detail})")
    if budget_ms is not None:
        why += f"; latency budget {budget_ms:g} ms{over}"
    return best, why


def policy_tolerance(planner: Any) -> float:
    """The accuracy a hop may give up (relative): the planner's policy's tolerance."""
    policy = getattr(planner, "policy", None)
    return float(getattr(policy, "accuracy_tolerance_pp", 1.0)) / 100.0


def cut_work(bundle: Any, planner: Any) -> dict[str, float]:
    """Each cut's head in the DP's work units: the model's FLOPs times the head's share of the
    wearable's predicted time (the planner's profile: calibrated, measured or modelled), so a
    slice is weighed by what it costs to run, not by its FLOPs (a pooling or a small layer
    costs more than its FLOPs say). Device speeds are in the same units: the whole model's work
    over its predicted (or measured) time."""
    base = planner.base_times()
    total_flops = float(bundle.candidates[-1].head.flops)
    total_ms = float(base[-1][0])
    if not (total_ms > 0 and total_flops > 0):
        return {c.id: float(c.head.flops) for c in bundle.candidates}
    return {c.id: total_flops * min(max(float(b[0]) / total_ms, 0.0), 1.0)
            for c, b in zip(bundle.candidates, base, strict=True)}


@dataclass(frozen=True)
class Devices:
    """What :func:`choose_strategy` plans over: the helpers (HelperConfig, in order), the
    wearable's measured speed (None: its profile's), the stream's input rate (None: as fast as
    the plan computes), and limits: at most ``max_devices`` devices (the wearable included),
    or ``all_devices``: a plan over every one of them even where fewer would be faster
    (benchmarks of a K-device pipeline)."""

    helpers: tuple[Any, ...]
    wearable_speed: float | None = None
    input_fps: float | None = None
    max_devices: int | None = None
    all_devices: bool = False


def choose_strategy(bundle: Any, planner: Any, helpers: Sequence[Any] | Devices, objective: str,
                    default_bandwidth_bps: float, model_path: Any = None
                    ) -> tuple[list[StrategyOption], StrategyOption, str]:
    """Local, a depth split or a pipeline over this wearable and ``helpers`` (HelperConfig, or
    :class:`Devices`), compared on one cost model: each slice's work as the planner predicts it
    (:func:`cut_work`), the wearable's speed from its profile (or as measured), a helper's
    configured (or measured) speed, else the handheld profile's, and each helper's link. Each
    cut costs what its hop sends -- its smallest packing or compressor code within the policy's
    accuracy tolerance (:func:`~coinf.wearable.planner.compress_select.hop_option`) -- and each
    hop of a plan then sends the option its link's bandwidth favours
    (:func:`~coinf.wearable.planner.compress_select.choose_hop`). Every option, the best one
    the executor runs (within the policy's latency budget when one is set), and why; each
    option's energy per frame from the planner's power models (:func:`_energy`).
    ``model_path`` adds spatial partition's prediction. What a Session given helpers runs and
    what ``coinf plan --helpers`` prints."""
    from coinf.wearable.planner.compress_select import choose_hop, option_label

    dev = helpers if isinstance(helpers, Devices) else Devices(tuple(helpers))
    names, speeds, bws, lats, points, tolerance, hop_options = _inputs(
        bundle, planner, dev, default_bandwidth_bps)
    result = float(sum(t.nbytes for t in bundle.outputs))
    shape = "throughput" if objective == "throughput" else "latency"  # where cuts go
    options = compare(points, names, speeds, bws, lats, result, model_path, shape)
    bw_of = dict(zip(names[1:], bws, strict=True))
    ble = {h.name: bool(getattr(h, "over_ble", False)) for h in dev.helpers}
    for o in options:
        hops = [choose_hop(hop_options[c], bw_of[d], o.compute_fps, dev.input_fps, tolerance,
                           shape) for c, d in zip(o.cuts, o.devices[1:], strict=False)]
        o.packings = tuple(option_label(h) for h in hops)
        _price_codecs(o, bundle, planner)
        o.sent_bytes = hops[0].nbytes if hops else 0.0
        o.loss_pp = max(((1.0 - h.accuracy) * 100 for h in hops), default=0.0)
        if o.runnable:
            o.wearable_mj, o.helpers_mj = _energy(o, planner, ble)
    runnable = [o for o in options if o.runnable]
    budget = getattr(getattr(planner, "policy", None), "latency_budget_ms", None)
    best, why = choose(runnable, objective, budget if objective != "throughput" else None)
    if dev.all_devices and len(names) > 1:
        every = [o for o in runnable if len(o.devices) == len(names) and o.name != "local"]
        if every:
            best = min(every, key=lambda o: o.latency_s if objective == "latency"
                       else -o.throughput_fps)
            why = (f"{best.name} over all {len(names)} devices, as asked: "
                   f"{best.latency_s * 1e3:.1f} ms per inference, "
                   f"{best.throughput_fps:.1f} frames/s predicted")
    return options, best, why


def codec_s(bundle: Any, planner: Any, cut: str, label: str) -> tuple[float, float]:
    """(encode s on the wearable, decode s on the receiver) of sending cut ``cut`` as ``label``
    (``q8``, ``g4+q8``), as the 2-device planner prices it: the packing's measured (profiled or
    calibrated) time, else the Pi-core estimate for packing work; a compressor's FLOPs at each
    device's model rate plus its code's entropy-coder time."""
    from coinf.wearable.planner.codec_costs import (
        codec_factor,
        codec_ms,
        estimated_pack_ms,
        is_packing_work,
        parse_config_spec,
    )

    if label == "raw":
        return 0.0, 0.0
    gamma, packing = parse_config_spec(label)
    cand = bundle.candidate(cut)
    enc = dec = 0.0
    if gamma:
        comp = bundle.compressor(cut, gamma)
        enc += comp.flops * planner._ms_per_flop("wearable")
        dec += comp.flops * planner._ms_per_flop("handheld")
        coded = comp.code_ms.get(packing)
        if coded is not None:
            enc += coded[0] * codec_factor(planner.wearable, planner.codec_slowdown)
            dec += coded[1]
            return enc / 1e3, dec / 1e3
    # the cut's own tensors: as measured; a code never timed: estimated, as packing work is
    ms = codec_ms(planner, cand, packing) if packing != "raw" and not gamma else None
    if ms is None and is_packing_work(packing):
        size = bundle.compressor(cut, gamma).code.nbytes if gamma else cand.crossing_bytes
        ms = (estimated_pack_ms(size, planner.wearable, planner.pack_mb_s,
                                planner.codec_slowdown), 0.0)
    if ms is not None:
        enc, dec = enc + ms[0], dec + ms[1]
    return enc / 1e3, dec / 1e3


def _price_codecs(o: StrategyOption, bundle: Any, planner: Any) -> None:
    """Add each hop's packing and coding time to the stages that do it (the sender's compute,
    the receiver's), and the latency and throughput that follow."""
    stages = list(o.stage_s)
    added = 0.0
    for i, (cut, label) in enumerate(zip(o.cuts, o.packings, strict=False)):
        enc, dec = codec_s(bundle, planner, cut, label)
        if 2 * i + 2 < len(stages):
            stages[2 * i] += enc
            stages[2 * i + 2] += dec
            added += enc + dec
    if added > 0:
        o.stage_s = tuple(stages)
        o.latency_s += added
        o.throughput_fps = _fps(max(stages))
        o.compute_fps = _fps(max(stages[0::2]))


def _energy(o: StrategyOption, planner: Any, over_ble: dict[str, bool]) -> tuple[float, float]:
    """(wearable, helpers) marginal mJ per frame of ``o``, as the 2-device planner counts them:
    compute above idle power, the wearable's radio sending while its link carries the frame
    (the result's way back included) and a Wi-Fi wake-up per exchange; helpers on the
    handheld's power model, receiving what the wearable sends and sending each hand-off."""
    pw, ph = planner.wearable.power, planner.handheld.power
    ms = [v * 1e3 for v in o.stage_s]
    wear = ms[0] * max(pw.cpu_active_w - pw.cpu_idle_w, 0.0)
    if len(ms) == 1:
        return wear, 0.0
    kind = "ble" if over_ble.get(o.devices[1], False) else "wifi"
    (w_tx, _, w_wake), (h_tx, h_rx, h_wake) = pw.radio(kind), ph.radio(kind)
    helpers = sum(ms[2::2]) * max(ph.cpu_active_w - ph.cpu_idle_w, 0.0) + ms[1] * h_rx \
        + sum(ms[3::2]) * h_tx + h_wake
    return wear + ms[1] * w_tx + w_wake, helpers


def _inputs(bundle: Any, planner: Any, dev: Devices, default_bandwidth_bps: float
            ) -> tuple[list[str], list[float], list[float], list[float], list[CutPoint], float,
                       dict[str, list[Any]]]:
    """The one cost model's inputs: device names, speeds, links (B/s, s), the cuts (work as
    predicted, bytes as their hop sends them), the policy's accuracy tolerance and each cut's
    ways to cross a link (:func:`~coinf.wearable.planner.compress_select.link_options`, read
    once)."""
    from coinf.wearable.planner.compress_select import OVERHEAD_BYTES, cheapest, link_options
    from coinf.wearable.planner.pipeline_dp import cut_points

    wear, hand = profile_speeds(planner)
    chosen = list(dev.helpers)
    if dev.max_devices is not None:
        chosen = chosen[:max(dev.max_devices - 1, 0)]
    names = ["wearable", *(h.name for h in chosen)]
    speeds = [dev.wearable_speed or wear, *(h.speed_flops or hand for h in chosen)]
    bws = [h.bandwidth_bps or default_bandwidth_bps for h in chosen]
    lats = [h.latency_s for h in chosen]
    tolerance = policy_tolerance(planner)
    work = cut_work(bundle, planner)
    hop_options = {c.id: link_options(c, bundle.compressors(c.id), OVERHEAD_BYTES)
                   for c in bundle.candidates}
    points = [replace(p, flops=work.get(p.id, p.flops),
                      nbytes=cheapest(hop_options[p.id], tolerance).nbytes)
              for p in cut_points(bundle)]
    return names, speeds, bws, lats, points, tolerance, hop_options


def fixed_option(bundle: Any, planner: Any, dev: Devices, cuts: Sequence[str],
                 default_bandwidth_bps: float) -> StrategyOption:
    """The prediction for a split fixed by the caller: ``cuts`` over the wearable and the
    first ``len(cuts)`` helpers of ``dev``, on the same cost model as
    :func:`choose_strategy`."""
    from coinf.wearable.planner.pipeline_dp import evaluate

    names, speeds, bws, lats, points, _, _ = _inputs(bundle, planner, dev,
                                                     default_bandwidth_bps)
    n = len(cuts) + 1
    if n > len(names):
        raise InputError(f"{len(cuts)} cuts need {n} devices; {len(names)} are available")
    result = float(sum(t.nbytes for t in bundle.outputs))
    split = evaluate(points, cuts, speeds[:n], bws[:n - 1], result)
    lat = sum(split.stage_s) + sum(2 * t for t in lats[:n - 1])
    return StrategyOption("pipeline" if n > 2 else "depth split", names[:n], lat,
                          split.bound_fps, f"cuts {', '.join(cuts)}, fixed by the caller",
                          cuts=tuple(cuts), stage_s=split.stage_s,
                          compute_fps=_fps(max(split.compute_s)))
