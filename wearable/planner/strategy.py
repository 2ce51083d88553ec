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

OBJECTIVES = ("latency", "throughput")
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

    def to_json(self) -> dict[str, object]:
        return {"strategy": self.name, "devices": self.devices,
                "latency_ms": round(self.latency_s * 1e3, 3),
                "throughput_fps": round(self.throughput_fps, 3), "detail": self.detail,
                "notes": self.notes, "cuts": list(self.cuts),
                "packings": list(self.packings or ("raw",) * len(self.cuts))}

    @property
    def runnable(self) -> bool:
        """A plan the one executor runs (spatial partition runs only in ``bench spatial``:
        :data:`SPATIAL_NOT_RUN`)."""
        return self.name in ("local", "depth split", "pipeline") and math.isfinite(
            self.latency_s)


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
                                       "throughput_fps": option.throughput_fps})


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
    out = [StrategyOption("local", [names[0]], total / speeds[0], _fps(total / speeds[0]),
                          f"{total / 1e6:.1f} MFLOP on the wearable")]
    groups = [("depth split", [0, h]) for h in range(1, len(names))]
    if len(names) >= 3:
        groups.append(("pipeline", list(range(len(names)))))
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
                             f"{slowest_stage(split, devs)}", cuts=tuple(split.cuts))
        old = found.get(name)
        if old is None or _better(opt, old, objective):
            found[name] = opt
    out.extend(found.values())
    if model_path is not None and len(names) >= 2:
        out.append(_spatial(model_path, names, speeds, bandwidths, latencies))
    return out


def _better(a: StrategyOption, b: StrategyOption, objective: str) -> bool:
    if objective == "latency":
        return a.latency_s < b.latency_s * (1 - 1e-6)
    return a.throughput_fps > b.throughput_fps * (1 + 1e-6)


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


def choose(options: Sequence[StrategyOption],
           objective: str = "latency") -> tuple[StrategyOption, str]:
    """The best option for ``objective`` and a sentence saying why."""
    if objective not in OBJECTIVES:
        raise InputError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    ok = [o for o in options if math.isfinite(o.latency_s)]
    if objective == "latency":
        best = ok[0]  # a tie goes to the simpler way, listed first
        for o in ok[1:]:
            if o.latency_s < best.latency_s * (1 - 1e-6):
                best = o
        others = sorted((o for o in ok if o is not best), key=lambda o: o.latency_s)
        vs = f"; next: {others[0].name} {others[0].latency_s * 1e3:.1f} ms" if others else ""
        why = (f"{best.name}: {best.latency_s * 1e3:.1f} ms per inference, the smallest "
               f"predicted latency{vs}")
    else:
        best = ok[0]
        for o in ok[1:]:
            if o.throughput_fps > best.throughput_fps * (1 + 1e-6):
                best = o
        others = sorted((o for o in ok if o is not best), key=lambda o: -o.throughput_fps)
        vs = f"; next: {others[0].name} {others[0].throughput_fps:.1f} fps" if others else ""
        why = (f"{best.name}: {best.throughput_fps:.1f} frames/s, the highest predicted "
               f"throughput{vs}")
        pipe = next((o for o in others if o.name == "pipeline"), None)
        if pipe is not None and best.name != "pipeline":
            why += (f". More devices cannot help: the {len(pipe.devices)}-device pipeline "
                    f"predicts {pipe.throughput_fps:.1f} frames/s ({pipe.detail})")
    return best, why


def choose_strategy(bundle: Any, planner: Any, helpers: Sequence[Any], objective: str,
                    default_bandwidth_bps: float) -> tuple[list[StrategyOption], StrategyOption,
                                                           str]:
    """Local, a depth split or a pipeline over this wearable and ``helpers`` (HelperConfig),
    compared on the planner's device profiles (:func:`profile_speeds`; a helper's configured
    speed, else the handheld profile's) and the helpers' configured links, each cut costing
    what its hop sends: its smallest packing or compressor code within the policy's accuracy
    tolerance (:func:`~coinf.wearable.planner.compress_select.hop_option`; raw for a bundle not
    calibrated). Every option, the best one the executor runs, and why. What a Session given
    helpers runs and what ``coinf plan --helpers`` prints."""
    from coinf.wearable.planner.compress_select import hop_option, option_label
    from coinf.wearable.planner.pipeline_dp import cut_points

    wear, hand = profile_speeds(planner)
    names = ["wearable", *(h.name for h in helpers)]
    speeds = [wear, *(h.speed_flops or hand for h in helpers)]
    bws = [h.bandwidth_bps or default_bandwidth_bps for h in helpers]
    lats = [h.latency_s for h in helpers]
    result = float(sum(t.nbytes for t in bundle.outputs))
    tolerance = float(getattr(getattr(planner, "policy", None), "accuracy_tolerance_pp",
                              1.0)) / 100.0
    points = cut_points(bundle)
    hops = {p.id: hop_option(bundle, p.id, tolerance) for p in points}  # each cut's, once
    options = compare([replace(p, nbytes=hops[p.id].nbytes) for p in points], names, speeds,
                      bws, lats, result, objective=objective)
    for o in options:
        if o.cuts:
            o.packings = tuple(option_label(hops[c]) for c in o.cuts)
    best, why = choose([o for o in options if o.runnable], objective)
    return options, best, why
