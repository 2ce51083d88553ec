"""``coinf bench plan``: the planner's choice against a measured oracle, over the emulated setup.

This machine plays both sides: the wearable is emulated (``EmulationOptions(slowdown=K,
threads=T)``), the link by a shaped in-process channel at ``--bandwidth-kbps``. The planner gets
what ``coinf profile`` would measure on the devices -- this machine's slice times, the wearable's
multiplied by K -- and the link's nominal bandwidth and latency, then picks a candidate (the
latency objective: the oracle is end-to-end latency). Every candidate is then run end to end
through a Session: the two baselines and the chosen one fully, the others cheapest prediction
first, each dropped after its first run when that run is already slower than the best median so
far, or not run at all when the upload's airtime alone exceeds it (``stopped_early`` says which;
``measured_ms`` is then that first run or that lower bound).

``coinf bench plan-sweep`` runs it over every bundle in a directory x bandwidths x slowdowns.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from pathlib import Path
from typing import Any

from coinf.cli import argtypes
from coinf.cli.bench import emit, options, progress
from coinf.cli.bench.fit_chart import Point, plot_fit
from coinf.errors import CoinfError, UserError


def _measure(bundle: Any, config: str, bandwidth_bps: float, slowdown: float, threads: int,
             runs: int, stop_above_ms: float | None,
             latency_s: float, feeds: dict[str, Any] | None = None,
             ) -> tuple[float, bool, dict[str, float]]:
    """Median end-to-end ms of ``runs`` runs (after one warm-up) of a configuration (``c004``
    or ``c004~q8``), whether it stopped early (the first timed run exceeded
    ``stop_above_ms``), and the median of each RunStats time."""
    from coinf.ble_protocol.shaped import Channel
    from coinf.cli.sample import bundle_feeds
    from coinf.wearable.options import (
        EmulationOptions,
        LinkOptions,
        PlacementOptions,
        SessionOptions,
    )
    from coinf.wearable.session import Session

    feeds = feeds or bundle_feeds(bundle)
    cid, _, packing = config.partition("~")
    stats = []
    opts = SessionOptions(placement=PlacementOptions(split=cid, packing=packing or "raw"),
                          link=LinkOptions(transport=Channel(bandwidth_bps, latency_s)),
                          emulation=EmulationOptions(slowdown=slowdown, threads=threads,
                                                     handheld_threads=threads))
    with Session(bundle, opts) as sess:
        sess.run(None, feeds)  # warm-up: connect, load the slices
        for _ in range(runs):
            sess.run(None, feeds)
            assert sess.last_run is not None
            stats.append(sess.last_run)
            if stop_above_ms is not None and stats[0].total_ms > stop_above_ms:
                break
    med = {k: statistics.median(getattr(s, k) for s in stats)
           for k in ("total_ms", "head_ms", "tail_ms", "transfer_ms", "return_ms")}
    stopped = stop_above_ms is not None and stats[0].total_ms > stop_above_ms
    return (stats[0].total_ms if stopped else med["total_ms"]), stopped, med


@dataclasses.dataclass
class _Oracle:
    """Runs configurations of ``bundle`` end to end over one shaped link (:func:`_measure`)."""

    bundle: Any
    bps: float
    latency_s: float
    slowdown: float
    threads: int
    runs: int
    feeds: dict[str, Any]

    def measure(self, config: str, stop_above_ms: float | None = None
                ) -> tuple[float, bool, dict[str, float]]:
        return _measure(self.bundle, config, self.bps, self.slowdown, self.threads, self.runs,
                        stop_above_ms, self.latency_s, self.feeds)


@dataclasses.dataclass
class _Calibration:
    """What a Session knows after running both baselines: the link and the load factors."""

    link: Any  # a calibrated LinkEstimate
    load: float  # the wearable's measured / predicted compute
    hload: float  # the handheld's
    rtt: float  # the link's fixed per-exchange cost, ms


@dataclasses.dataclass
class _Outcome:
    """Every candidate's predicted and measured ms, the choice and the reference points."""

    predicted: dict[str, float]
    measured: dict[str, float]
    stopped: dict[str, str]  # why a candidate's measurement stopped early ("": it did not)
    chosen: str
    refs: dict[str, str | None]


def _device_profiles(bundle: Any, threads: int, slowdown: float, repeats: int,
                     predictor_profile: str | None) -> tuple[Any, Any]:
    """The wearable's and the handheld's profiles as the planner sees them: this machine's
    slice times (the wearable's x ``slowdown``), or ``predictor_profile``'s predictors."""
    from coinf.device.profile import DeviceProfile, profile_bundle

    wear = DeviceProfile.pi_zero_2w()
    wear.threads, wear.slowdown = threads, slowdown
    hand = DeviceProfile.laptop()
    hand.threads = threads
    if predictor_profile:
        from coinf.cli.paths import naming

        with naming("--predicted", predictor_profile):
            pred = DeviceProfile.load(predictor_profile).predictor
        if pred is None:
            raise UserError(f"{predictor_profile} has no predictor; run `coinf profile --train`")
        wear.predictor = hand.predictor = pred
    else:
        progress(f"{bundle.root.name}: profiling slices ({threads} thread(s))")
        mp = profile_bundle(bundle, threads, warmup=2, repeats=repeats)
        wear.models[bundle.identity] = mp
        hand.models[bundle.identity] = mp
    return wear, hand


def _calibrate(planner: Any, oracle: _Oracle, measured: dict[str, float],
               stopped: dict[str, str]) -> _Calibration:
    """Run both baselines (into ``measured``), then calibrate DynO's load factors (measured /
    predicted compute) and the link's fixed per-exchange cost (measured network time minus
    airtime) -- the planner's run-time inputs."""
    from coinf.ble_protocol.shaped import Channel
    from coinf.wearable.planner.adapt import LinkEstimate

    bps, latency_s = oracle.bps, oracle.latency_s
    overhead = Channel(bps, latency_s).overhead_bytes
    first, last = oracle.bundle.candidates[0].id, oracle.bundle.candidates[-1].id
    nominal = planner.costs(LinkEstimate(bps, bps, 2000.0 * latency_s, "nominal",
                                         overhead_bytes=overhead))
    base = {r.id: r for r in nominal}
    meds: dict[str, dict[str, float]] = {}
    for cid in (first, last):
        measured[cid], _, meds[cid] = oracle.measure(cid)
        stopped[cid] = ""
    load = meds[last]["head_ms"] / base[last].head_ms if base[last].head_ms > 0 else 1.0
    hload = meds[first]["tail_ms"] / base[first].tail_ms if base[first].tail_ms > 0 else 1.0
    air = 1000.0 * (base[first].crossing_bytes + overhead) / bps + \
        (base[first].return_ms - 1000.0 * latency_s)
    rtt = max(0.0, meds[first]["transfer_ms"] + meds[first]["return_ms"] - air)
    link = LinkEstimate(bps, bps, rtt, "calibrated", overhead_bytes=overhead)
    return _Calibration(link, min(max(load, 0.01), 999.0), min(max(hload, 0.01), 999.0), rtt)


def _measure_candidates(oracle: _Oracle, rows: list[Any], full: list[str],
                        predicted: dict[str, float], overhead_bytes: int,
                        measured: dict[str, float], stopped: dict[str, str]) -> None:
    """Measure ``full`` fully, then the others cheapest prediction first, each stopped after
    its first run when that is slower than the best so far, or not run at all when its
    upload's airtime alone is (into ``measured`` and ``stopped``)."""
    rest = sorted((c for c in predicted if c not in full), key=lambda c: predicted[c])
    airtime = {r.id: 1000.0 * (r.crossing_bytes + overhead_bytes) / oracle.bps for r in rows}
    for cid in dict.fromkeys(full + rest):
        if cid in measured:
            continue
        best = min(measured.values(), default=None)
        if cid not in full and best is not None and airtime[cid] > best:
            # the upload alone takes longer than the best measured run: a hard lower bound
            measured[cid], stopped[cid] = airtime[cid], "upload airtime > best"
        else:
            limit = None if cid in full or best is None else best
            ms, stop, _ = oracle.measure(cid, limit)
            measured[cid], stopped[cid] = ms, ("first run > best" if stop else "")
        progress(f"  {cid}: predicted {predicted[cid]:.1f} ms, measured {measured[cid]:.1f} ms"
                 + (f" (stopped: {stopped[cid]})" if stopped[cid] else ""))


def plan_one(bundle_dir: str | Path, bandwidth_kbps: float | None, slowdown: float, threads: int,
             runs: int, objective: str, repeats: int,
             predictor_profile: str | None = None, preset: str = "pi-zero-2w",
             inputs: list[str] | None = None) -> dict[str, Any]:
    """One configuration. The link is a shaped channel at the radio ``preset``'s ATT capacity
    (or ``bandwidth_kbps``) with half its connection interval of latency each way. With
    ``predictor_profile`` the planner never sees this model's timings: compute times come from
    that profile's layer predictors. ``inputs`` (``NAME=FILE.npy``) replace the random feeds:
    a codec's bytes depend on the picture. The four reference points (wearable/planner/
    references.py) are always measured. Every measured configuration counts as a reference
    point: ``chosen_vs_best_reference`` is the choice over the best of them all, named by
    ``best_reference`` (with its reference kind, if it is one);
    ``chosen_vs_named_references`` compares with the four named points only."""
    from coinf.bundle import Bundle
    from coinf.cli.bench.stream import channel_for
    from coinf.cli.sample import bundle_feeds, load_feeds
    from coinf.wearable.planner.planner import Planner
    from coinf.wearable.planner.references import references
    from coinf.wearable.policy import Policy

    bundle = Bundle.load(bundle_dir)
    feeds = bundle_feeds(bundle)
    feeds.update(load_feeds(inputs or [], bundle.inputs))
    channel, bps = channel_for(preset, bandwidth_kbps)
    oracle = _Oracle(bundle, bps, channel.latency_s, slowdown, threads, runs, feeds)
    wear, hand = _device_profiles(bundle, threads, slowdown, repeats, predictor_profile)
    planner = Planner(bundle, wear, hand, Policy(objective=objective, battery_aware=False,
                                                 charging_rule=False))
    budget = 0 if objective == "auto" else None
    measured: dict[str, float] = {}
    stopped: dict[str, str] = {}
    cal = _calibrate(planner, oracle, measured, stopped)
    decide: dict[str, Any] = {"latency_budget_ms": budget, "load_factor": cal.load,
                              "handheld_load": cal.hload}
    decision = planner.decide(cal.link, **decide)
    predicted = {r.id: r.latency_ms() for r in decision.rows}
    refs = references(planner, decision, link_estimate=cal.link, **decide)
    # the baselines, the choice and the reference points: always measured
    first, last = bundle.candidates[0].id, bundle.candidates[-1].id
    full = [first, last, decision.winner, *(r for r in refs.values() if r)]
    _measure_candidates(oracle, decision.rows, full, predicted, cal.link.overhead_bytes,
                        measured, stopped)
    outcome = _Outcome(predicted, measured, stopped, decision.winner, refs)
    times_from = "predictor" if predictor_profile else "measured slices"
    return _plan_result(oracle, preset, objective, times_from, cal, outcome)


def _plan_result(oracle: _Oracle, preset: str, objective: str, times_from: str,
                 cal: _Calibration, out: _Outcome) -> dict[str, Any]:
    """:func:`plan_one`'s result."""
    bundle, measured, predicted, refs = oracle.bundle, out.measured, out.predicted, out.refs
    first, last = bundle.candidates[0].id, bundle.candidates[-1].id
    best_id = min(measured, key=lambda c: measured[c])
    chosen = out.chosen
    return {
        "model": bundle.root.name, "preset": preset, "objective": objective,
        "slowdown": oracle.slowdown,
        "times_from": times_from,
        "bandwidth_bps": oracle.bps,
        "calibration": {"wearable_load_factor": cal.load, "handheld_load_factor": cal.hload,
                        "rtt_ms": cal.rtt},
        "candidates": [{"id": c, "predicted_ms": predicted[c],
                        "measured_ms": measured[c], "stopped_early": out.stopped[c] or None}
                       for c in predicted],
        "chosen": chosen, "best": best_id, "chosen_ms": measured[chosen],
        "best_ms": measured[best_id], "ratio": measured[chosen] / measured[best_id],
        "wearable_only_ms": measured[last], "handheld_only_ms": measured[first],
        "reference": {k: None if v is None else {"id": v, "predicted_ms": predicted[v],
                                                  "measured_ms": measured[v]}
                      for k, v in refs.items()},
        # every measured configuration is a reference point (every packing of the input too)
        "chosen_vs_best_reference": measured[chosen] / measured[best_id],
        "best_reference": {"id": best_id, "kind": next(
            (k for k, v in refs.items() if v == best_id), None),
            "predicted_ms": predicted[best_id], "measured_ms": measured[best_id]},
        "chosen_vs_named_references": measured[chosen] / min(
            measured[v] for v in refs.values() if v),
    }


def _check(args: argparse.Namespace) -> None:
    if args.runs < 1 or args.threads < 1 or args.repeats < 1:
        raise UserError("--runs, --threads and --repeats must be >= 1")
    if args.objective not in ("latency", "auto", "throughput"):
        raise UserError("--objective must be latency (the oracle measures latency), auto or "
                         "throughput")


def run(args: argparse.Namespace) -> int:
    _check(args)
    if args.wearable_slowdown < 1 or (args.bandwidth_kbps is not None
                                      and args.bandwidth_kbps <= 0):
        raise UserError("--wearable-slowdown must be >= 1 and --bandwidth-kbps > 0")
    options.check_png(args.png)
    result = plan_one(args.bundle, args.bandwidth_kbps, args.wearable_slowdown, args.threads,
                      args.runs, args.objective, args.repeats, args.predicted, args.preset,
                      args.input)
    if args.png:
        _plot(result, args.png)
        result["png"] = args.png
    emit(result)
    return 0


def _plot(result: dict[str, Any], path: str) -> None:
    """Every configuration measured end to end against its prediction, chosen and best named."""
    marks = {result["chosen"]: "chosen"}
    marks.setdefault(result["best"], "best measured")
    points = [Point(c["id"], c["predicted_ms"], c["measured_ms"], marks.get(c["id"], ""),
                    partial=bool(c["stopped_early"]))
              for c in result["candidates"] if c["measured_ms"] is not None]
    kbps = result["bandwidth_bps"] / 1000
    plot_fit(points, path, f"{result['model']}: every configuration end to end, {kbps:g} kB/s, "
             f"wearable x{result['slowdown']:g}; chosen / best {result['ratio']:.2f}", "ms")


def run_sweep(args: argparse.Namespace) -> int:
    _check(args)
    if args.bundles:
        root = Path(args.bundles)
        bundles = sorted(p for p in root.iterdir() if (p / "manifest.json").is_file()) \
            if root.is_dir() else []
        if not bundles:
            raise UserError(f"{root} holds no bundles (directories with manifest.json)")
    else:
        bundles = zoo_bundles(Path(args.cache), args.max_candidates)
    results = []
    for b in bundles:
        for kbps in args.bandwidths_kbps:
            for k in args.slowdowns:
                results.append(plan_one(b, kbps, k, args.threads, args.runs, args.objective,
                                        args.repeats, args.predicted, args.preset))
    ratios = [r["ratio"] for r in results]
    worse = sum(r["chosen_ms"] > 1.02 * min(r["wearable_only_ms"], r["handheld_only_ms"])
                for r in results)
    # configs whose measured best is a real split (not an extreme): where choosing is hard
    split_best = sum(r["best_ms"] < 0.98 * min(r["wearable_only_ms"], r["handheld_only_ms"])
                     for r in results)
    emit({"preset": args.preset, "configs": len(results),
          "within_2pct": sum(x <= 1.02 for x in ratios) / len(ratios),
          "mean_ratio": statistics.fmean(ratios), "worse_than_best_baseline": worse,
          "best_is_split": split_best,
          "best_is_wearable_only": sum(r["best_ms"] >= 0.98 * r["wearable_only_ms"]
                                       for r in results),
          "bandwidths_kbps": list(args.bandwidths_kbps), "slowdowns": list(args.slowdowns),
          "results": [{k: r[k] for k in ("model", "bandwidth_bps", "slowdown", "chosen", "best",
                                         "chosen_ms", "best_ms", "ratio", "wearable_only_ms",
                                         "handheld_only_ms")} for r in results]})
    return 0


def zoo_bundles(cache: Path, max_candidates: int) -> list[Path]:
    """Bundles of every committed zoo model, split into ``cache`` unless already there."""
    from coinf.bundle import MANIFEST, Bundle, sha256_file
    from coinf.convert.split import split_model
    from coinf.models.zoo import ZOO, committed_path

    out = []
    for name in ZOO:
        model, dest = committed_path(name), cache / name
        fresh = False
        if (dest / MANIFEST).is_file():
            try:
                b = Bundle.load(dest)
                fresh = (b.meta.get("source", {}).get("sha256") == sha256_file(model)
                         and len(b.candidates) <= max_candidates)
            except CoinfError:
                fresh = False
        if not fresh:
            progress(f"splitting {name} into {dest} (--max-candidates {max_candidates})")
            split_model(model, dest, max_candidates=max_candidates, force=True)
        out.append(dest)
    return out


def _common(parser: argparse.ArgumentParser) -> None:
    options.add_preset(parser)
    parser.add_argument("--objective", default="latency",
                        help="planner objective: latency (default; the oracle measures "
                        "latency), auto or throughput")
    options.add_threads(parser)
    parser.add_argument("--runs", type=argtypes.positive_int, default=3,
                        help="timed runs per candidate (median)")
    parser.add_argument("--repeats", type=argtypes.positive_int, default=5,
                        help="profiling repeats per slice")
    parser.add_argument("--predicted", metavar="PROFILE", type=argtypes.existing_file,
                        help="plan from this profile's layer predictors instead of profiling "
                             "the bundle (a model never profiled)")
    options.add_json(parser)


def register(parser: argparse.ArgumentParser) -> None:
    options.add_bundle(parser, required=True)
    parser.add_argument("--wearable-slowdown", type=argtypes.slowdown, default=10.0)
    options.add_bandwidth_kbps(parser, default_text="the preset's ATT capacity")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                        type=argtypes.name_equals_file,
                        help="a real input instead of random values (a codec's bytes depend "
                             "on the picture)")
    _common(parser)
    options.add_png(parser, "every configuration's end-to-end time")
    parser.set_defaults(func=run)


def register_sweep(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bundles", type=argtypes.existing_dir,
                        help="directory of bundles (one per model; default: the "
                        "zoo, split into --cache)")
    parser.add_argument("--cache", default="out/bench/bundles", help="where zoo bundles go")
    parser.add_argument("--max-candidates", type=argtypes.integer(2), default=12,
                        help="candidates per zoo bundle (default %(default)s)")
    parser.add_argument("--bandwidths-kbps", type=argtypes.kbps, nargs="+", default=[10.0, 20.0,
                        36.0])
    parser.add_argument("--slowdowns", type=argtypes.slowdown, nargs="+", default=[5.0, 20.0])
    _common(parser)
    parser.set_defaults(func=run_sweep)
