"""``coinf bench pipeline --compressors DIR --bandwidth-kbps-schedule A,B,...``: run-time
selection of autoencoder compressors (paper 002, §IV-D, Algorithm 2; issue 13, S3).

The compressor set DIR's backbone is split into a bundle and the set attached (or ``--bundle``
names a bundle that has compressors). The wearable (this process) and K-1 in-process helpers,
each device ``--slowdown`` x slower, stream from a real-time source at ``--rate`` Hz; the link
into the first helper is shaped to each bandwidth of the schedule in turn (the others stay at
``--bandwidth-kbps``). The split is made once (warm-up at the schedule's first bandwidth;
``--cuts C1,C2`` fixes it instead) and frozen, as in the paper: only each link's option moves,
chosen per frame from the link's measured bandwidth (the threshold rule of
:func:`~coinf.wearable.planner.compress_select.choose_hop`). A Session given the helpers runs
it (its :class:`~coinf.wearable.replan.Replanner` keeps the split and lets each hop's packing
follow its link). Per phase, side by side on the same split and links: the session choosing
(raw, packings, compressors) and the same session sending raw tensors only (``follow_links``
off). Reported:
frames delivered, the options used, and the effective accuracy = sum over delivered frames of
the accuracy of the option it used / frames generated (a dropped frame counts as wrong;
accuracies from the set's index, on its test set).
"""

from __future__ import annotations

import argparse
import collections
import tempfile
from pathlib import Path
from typing import Any

from coinf.cli.bench import progress, realtime
from coinf.errors import InputError


def schedule(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or not all(v > 0 for v in values):
        raise InputError(f"--bandwidth-kbps-schedule must be kB/s values > 0 separated by "
                         f"commas, got {text!r}")
    return values


def _bundle(args: argparse.Namespace, tmp: Path) -> Any:
    from coinf.bundle import Bundle
    from coinf.convert.compressors import attach
    from coinf.convert.split import split_model

    if args.bundle:
        bundle = Bundle.load(args.bundle)
        if not bundle.compressors():
            raise InputError(f"bundle {args.bundle} has no compressors: attach a set with "
                             f"`coinf convert compressors BUNDLE DIR`")
        return bundle
    if not args.compressors:
        raise InputError("--bandwidth-kbps-schedule needs --compressors DIR (or --bundle B "
                         "with compressors attached)")
    progress(f"splitting {args.compressors}/backbone.onnx and attaching the set ...")
    split_model(Path(args.compressors) / "backbone.onnx", tmp / "bundle")
    return attach(tmp / "bundle", args.compressors)


def _accuracy(bundle: Any, cut: str, gamma: int, packing: str) -> float | None:
    """The model's test accuracy with this option at this cut (the set's figures), or None
    for raw / a packing the set gives no figure for (then the model's own is used)."""
    if gamma <= 1:
        return None
    return float(bundle.compressor(cut, gamma).accuracy[packing])


async def _phase(sess: Any, bundle: Any, frames: list[Any], n: int, rate: float,
                 depth: int, base: float) -> dict[str, Any]:
    """Frames every 1/rate s; one that finds ``depth`` frames in flight is dropped."""
    from coinf.wearable.planner.codec_costs import parse_config_spec

    used: list[tuple[float, list[str]]] = []

    async def one(feed: Any) -> None:
        await sess.run(None, feed)
        st = sess.last_run
        acc, options = base, ["local"]
        if st is not None and st.fallback is None and st.packings:
            options = list(st.packings)
            for cut, label in zip(st.cuts, st.packings, strict=False):
                gamma, packing = parse_config_spec(label)
                a = _accuracy(bundle, cut, gamma or 1, packing)
                acc = min(acc, a) if a is not None else acc
        used.append((acc, options))

    delivered = await realtime(one, frames, n, rate, depth)
    counts = collections.Counter("/".join(o) for _, o in used)
    return {"delivered_fraction": round(delivered, 3),
            "effective_accuracy": round(sum(a for a, _ in used) / n, 4),
            "options": dict(counts.most_common())}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from coinf.ble_protocol.shaped import Channel
    from coinf.cli.bench.helper_session import pipeline_session
    from coinf.handheld.pipeline_host import local_helpers
    from coinf.wearable.pipeline_config import HelperConfig
    from coinf.wearable.planner.compress_select import (
        OVERHEAD_BYTES,
        link_options,
        option_label,
        thresholds,
    )

    kbps = schedule(args.bandwidth_kbps_schedule)
    if not args.rate > 0:
        raise InputError("--bandwidth-kbps-schedule needs --rate HZ (the input rate)")
    with tempfile.TemporaryDirectory() as tmpdir:
        bundle = _bundle(args, Path(tmpdir))
        base = float(bundle.meta["compressors"]["base_accuracy"]["raw"])
        names = [f"h{i}" for i in range(1, args.devices)]
        other = Channel(args.bandwidth_kbps * 1000, args.latency_ms / 1000, overhead_bytes=16)
        rng = np.random.default_rng(0)
        frames = [{t.name: rng.standard_normal(t.shape).astype(t.dtype)
                   for t in bundle.inputs} for _ in range(8)]
        depth = args.depth or 2 * args.devices
        async with local_helpers(bundle, names, dict.fromkeys(names, args.slowdown),
                                 dict.fromkeys(names[1:], other), max_pending=depth + 2) as hosts:
            helpers = [HelperConfig(h.name, h.address, kbps[0] * 1000 if i == 0
                                    else other.bandwidth_bps, other.latency_s, shape=i == 0)
                       for i, h in enumerate(hosts)]
            cuts = [c.strip() for c in args.cuts.split(",")] if args.cuts else None
            sess = pipeline_session(bundle, helpers, args.slowdown, input_fps=args.rate)
            rp = sess.replanner
            rp.limit(all_devices=True)  # a K-device pipeline, as asked
            phases = []
            async with sess:
                if cuts:
                    rp.pin(cuts)
                progress(f"warm-up: {args.warmup} frames at {kbps[0]:g} kB/s ...")
                for i in range(args.warmup):
                    await sess.run(None, frames[i % len(frames)])
                rp.adaptive = False  # the split stays; the links' options move
                plan = rp.pin(cuts or [st.end for st in rp.plan.stages[:-1]])
                compute_fps = min(rp.chosen.compute_fps, 1e9)
                cut = plan.stages[0].end
                table = thresholds(link_options(bundle.candidate(cut), bundle.compressors(cut),
                                                OVERHEAD_BYTES), compute_fps, args.rate)
                for bw in kbps:
                    row: dict[str, Any] = {"bandwidth_kbps": bw}
                    sess.helpers.retune(names[0], bw * 1000)
                    # side by side on the same split and links: each hop's packing following
                    # its link, then raw tensors only (the pinned split as made: raw)
                    for name, follow in (("adaptive", True), ("raw", False)):
                        rp.follow_links = follow
                        rp.pin(cuts or [st.end for st in plan.stages[:-1]])
                        progress(f"{bw:g} kB/s, {name}: {args.frames} frames at "
                                 f"{args.rate:g} Hz ...")
                        row[name] = await _phase(sess, bundle, frames, args.frames, args.rate,
                                                 depth, base)
                    measured = rp.links.current(names[0], kbps[0] * 1000)
                    row["measured_kbps_end"] = round(measured / 1000, 1)
                    phases.append(row)
    return {
        "model": Path(bundle.meta.get("source", {}).get("file", "model")).stem,
        "devices": args.devices,
        "cuts": [st.end for st in plan.stages[:-1]],
        "compute_bound_fps": round(compute_fps, 2),
        "rate_hz": args.rate,
        "base_accuracy": base,
        "compressors": [{"cut": c.candidate, "gamma": c.gamma, "code_bytes": c.code_bytes,
                         "accuracy": c.accuracy} for c in bundle.compressors()],
        "thresholds_first_link": [{"from_kbps": round(t / 1000, 3), "option": option_label(o),
                                   "bytes": o.nbytes, "relative_accuracy": round(o.accuracy, 4)}
                                  for t, o in table],
        "phases": phases,
        "settings": {"slowdown": args.slowdown, "schedule_kbps": kbps,
                     "other_links_kbps": args.bandwidth_kbps, "latency_ms": args.latency_ms,
                     "frames_per_phase": args.frames, "warmup": args.warmup, "depth": depth},
    }


__all__ = ["measure", "schedule"]
