"""``coinf bench stream``: pipelined vs sequential streaming over an emulated radio.

Stage times are medians of the sequential runs (each stage alone); the pipelined run uses the same
Session, link and candidate. Sequential and pipelined batches alternate, medians over repeats.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from coinf.cli import argtypes
from coinf.cli.bench import emit, median, options, progress

STAGES = ("head", "pack", "transfer", "tail", "return")


def register(parser: argparse.ArgumentParser) -> None:
    options.add_bundle(parser, required=True)
    options.add_preset(parser)
    options.add_bandwidth_kbps(parser, default_text="the preset's ATT capacity")
    parser.add_argument("--wearable-slowdown", type=argtypes.slowdown, default=1.0, dest="slowdown")
    options.add_split(parser, default_text="the planner's throughput choice")
    parser.add_argument("--frames", type=argtypes.integer(2), default=30, help="frames per batch")
    options.add_repeats(parser, 3)
    parser.add_argument("--depth", type=argtypes.integer(2), default=3,
                        help="frames in flight when pipelined")
    options.add_threads(parser)
    parser.add_argument("--rate", type=argtypes.number(0, 1e6, hi_open=True), default=0.0,
                        metavar="HZ",
                        help="also run a real-time source at HZ frames/s: frames the pipeline "
                        "cannot take are dropped; reports effective accuracy")
    parser.add_argument("--accuracy", type=argtypes.fraction, default=None,
                        help="model accuracy for effective accuracy, a fraction in [0, 1] "
                        "(default: the zoo's recorded test accuracy, else 1)")
    options.add_json(parser)
    options.add_png(parser, "the stages and the frames per second")
    parser.set_defaults(func=run)


def channel_for(preset: str, bandwidth_kbps: float | None) -> tuple[Any, float]:
    """A shaped channel at the preset's theoretical ATT capacity (or the given bandwidth)."""
    from coinf.ble_protocol.radio.params import preset as radio_preset
    from coinf.ble_protocol.shaped import Channel

    params = radio_preset(preset)
    bps = bandwidth_kbps * 1000 if bandwidth_kbps else params.capacity_bps()
    # one-way latency: on average half a connection interval before the next event
    return Channel(bps, latency_s=params.interval_s / 2, overhead_bytes=16), bps


def throughput_choice(bundle: Any, slowdown: float, bps: float, latency_s: float,
                      threads: int) -> str:
    """The planner's throughput objective (period = slowest of head, link, tail), from this
    machine's measured slice times (the wearable's x ``slowdown``) and the channel."""
    from coinf.device.profile import DeviceProfile, profile_bundle
    from coinf.wearable.planner.adapt import LinkEstimate
    from coinf.wearable.planner.planner import Planner
    from coinf.wearable.policy import Policy

    progress(f"{bundle.root.name}: profiling slices for the throughput objective ...")
    measured = profile_bundle(bundle, threads, warmup=1, repeats=3)
    wear, hand = DeviceProfile.pi_zero_2w(), DeviceProfile.laptop()
    wear.slowdown = slowdown
    wear.models[bundle.identity] = hand.models[bundle.identity] = measured
    planner = Planner(bundle, wear, hand, Policy(objective="throughput", battery_aware=False,
                                                 charging_rule=False))
    link = LinkEstimate(bps, bps, 2000.0 * latency_s, "preset")
    return str(planner.decide(link, objective="throughput").winner)


def recorded_accuracy(bundle: Any) -> float:
    """The zoo's recorded test accuracy of the bundle's source model, else 1.0."""
    import json
    from pathlib import Path

    name = Path(str(bundle.meta.get("source", {}).get("file", ""))).stem
    try:
        from coinf.models.zoo import metadata_path

        return float(json.loads(metadata_path(name).read_text())["test_accuracy"])
    except Exception:  # not a trained zoo model
        return 1.0


def realtime_run(sess: Any, frames: list[Any], rate_hz: float, depth: int,
                 accuracy: float) -> dict[str, Any]:
    """Frames arrive at ``rate_hz`` for as long as ``len(frames)`` of them take; the pipeline
    takes what it can, the rest are dropped (never queued)."""
    from coinf.wearable.stream import RealtimeSource, effective_accuracy

    src = RealtimeSource(frames, rate_hz, limit=len(frames))
    t0 = time.perf_counter()
    done = sum(1 for r in sess.stream(src, depth=depth) if r.error is None)
    elapsed = max(time.perf_counter() - t0, len(frames) / rate_hz)
    fps = done / elapsed
    return {"rate_hz": rate_hz, "offered": src.offered, "processed": done,
            "dropped": src.dropped, "throughput_fps": round(fps, 3), "accuracy": accuracy,
            "effective_accuracy": round(effective_accuracy(fps, accuracy, rate_hz), 4)}


def _check(args: argparse.Namespace) -> None:
    """Every setting, before anything starts."""
    from coinf.errors import UserError

    if args.frames < 2 or args.repeats < 1 or args.depth < 2:
        raise UserError("need --frames >= 2, --repeats >= 1 and --depth >= 2")
    if not 0 <= args.rate < 1e6:
        raise UserError(f"--rate must be a frame rate in Hz (> 0), or 0 for none; got {args.rate}")
    if args.accuracy is not None and not 0 <= args.accuracy <= 1:
        raise UserError(f"--accuracy must be a fraction in [0, 1], got {args.accuracy}")
    options.check_png(args.png)


def run(args: argparse.Namespace) -> int:
    from coinf.bundle import Bundle
    from coinf.cli.sample import bundle_feeds
    from coinf.wearable.options import (
        EmulationOptions,
        LinkOptions,
        PlacementOptions,
        SessionOptions,
    )
    from coinf.wearable.session import Session

    _check(args)
    bundle = Bundle.load(args.bundle)
    channel, bps = channel_for(args.preset, args.bandwidth_kbps)
    split = args.split or throughput_choice(bundle, args.slowdown, bps, channel.latency_s,
                                            args.threads)
    frames = [bundle_feeds(bundle, seed) for seed in range(args.frames)]
    seq_fps: list[float] = []
    pipe_fps: list[float] = []
    stage_samples: dict[str, list[float]] = {s: [] for s in STAGES}
    opts = SessionOptions(placement=PlacementOptions(split=split),
                          link=LinkOptions(transport=channel),
                          emulation=EmulationOptions(slowdown=args.slowdown, threads=args.threads,
                                                     handheld_threads=args.threads))
    with Session(bundle, opts) as sess:
        cand = sess.split
        progress(f"{bundle.root.name}: {cand.id} ({cand.label}), {bps / 1000:.1f} kB/s, "
                 f"wearable x{args.slowdown}")
        for _ in range(2):  # warm up sessions, link and caches
            sess.run(None, frames[0])
        for rep in range(args.repeats):
            for pipelined in ((False, True) if rep % 2 == 0 else (True, False)):
                t0 = time.perf_counter()
                results = list(sess.stream(frames, pipelined=pipelined, depth=args.depth))
                fps = len(frames) / (time.perf_counter() - t0)
                for r in results:
                    r.value()  # a failed frame fails the bench
                    if not pipelined:
                        assert r.stats is not None
                        for s in STAGES:
                            stage_samples[s].append(getattr(r.stats, f"{s}_ms"))
                (pipe_fps if pipelined else seq_fps).append(fps)
                progress(f"  {'pipelined' if pipelined else 'sequential'}: {fps:.2f} frames/s")
        realtime = (realtime_run(sess, frames, args.rate, args.depth,
                                 args.accuracy if args.accuracy is not None
                                 else recorded_accuracy(bundle))
                    if args.rate > 0 else None)
    stage_ms = {s: round(median(v), 3) for s, v in stage_samples.items()}
    bound = 1000.0 / max(max(stage_ms.values()), 1e-9)
    throughput = median(pipe_fps)
    sequential = median(seq_fps)
    result = {
        "bundle": bundle.root.name,
        "preset": args.preset,
        "bandwidth_bps": round(bps, 1),
        "slowdown": args.slowdown,
        "frames": args.frames,
        "cut": cand.id,
        "crossing_bytes": cand.crossing_bytes,
        "stage_ms": stage_ms,
        "bound_fps": round(bound, 3),
        "throughput_fps": round(throughput, 3),
        "efficiency": round(throughput / bound, 4),
        "sequential_fps": round(sequential, 3),
        "speedup_vs_sequential": round(throughput / sequential, 4),
        "link": "shaped (preset capacity + half-interval latency)",
        **({"realtime": realtime} if realtime else {}),
    }
    if args.png:
        from coinf.cli.bench.stream_chart import plot_stream

        plot_stream(result, seq_fps, pipe_fps, args.png)
        result["png"] = args.png
    emit(result)
    return 0
