"""``coinf bench pack``: packing ratio vs accuracy per cut, codec speed, end-to-end gain.

Without ``--bundle`` it measures the zoo's trained ``lenet_digits`` (split here) on the digits
validation split; with ``--bundle DIR --data digits|FILE.npz`` any bundle.
The end-to-end figure is a model, not a radio measurement: head and pack times measured on this
machine times ``--pi-slowdown`` (the Pi Zero 2 W is assumed that much slower), tail and unpack
times as measured (the handheld), and transfer at the pi-zero-2w preset's ATT capacity from the
air-time formula (1M PHY, 27-B LL payload, 7.5 ms interval, 6 exchanges per event).
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from coinf.ble_protocol import bitplanes, packing
from coinf.ble_protocol.tensors import encode_tensors
from coinf.cli import argtypes
from coinf.cli.bench import emit, median, options, progress
from coinf.errors import InputError


def register(parser: argparse.ArgumentParser) -> None:
    options.add_json(parser)
    options.add_bundle(parser, default_text="the zoo's trained lenet_digits")
    options.add_data(parser, "digits")
    options.add_limit(parser)
    parser.add_argument("--labels", default=None, metavar="KEY",
                        help="with --data FILE.npz: the array of integer labels")
    parser.add_argument("--metric", default=None,
                        help="accuracy metric (see coinf calibrate --metric; default top1)")
    parser.add_argument("--metric-output", action="append", default=[], metavar="NAME",
                        help="output(s) the metric reads (default: the first)")
    options.add_repeats(parser, 15)
    options.add_tolerance(parser)
    parser.add_argument("--pi-slowdown", type=argtypes.slowdown, default=10.0,
                        help="assumed Pi Zero 2 W / this-machine compute time ratio")
    parser.add_argument("--throughput-mb", type=argtypes.number(0, 1e4, lo_open=True), default=4.0,
                        help="size of the tensor the codec speed is measured on (MB of float32)")
    options.add_png(parser, "every cut's packings, ratio against accuracy drop")
    parser.set_defaults(func=run)


def pi_zero_capacity() -> tuple[float, str]:
    """ATT payload bytes/s of the pi-zero-2w preset, from the BLE air-time formula."""
    try:
        from coinf.ble_protocol.radio.params import preset

        return float(preset("pi-zero-2w").capacity_bps()), "coinf.ble_protocol.radio.params"
    except ImportError:
        pass
    # same formula, inlined: 1M PHY (8 us/byte), 27-B LL payload, encrypted (MIC), 7.5 ms
    # interval, at most 6 exchanges per event, ATT value 512 B per notification
    t_pair = (1 + 4 + 2 + 27 + 4 + 3) * 8e-6 + (1 + 4 + 2 + 3) * 8e-6 + 2 * 150e-6
    exchanges = min(6, math.floor(7.5e-3 / t_pair))
    per_att = math.ceil((512 + 7) / 27)
    return 512 * exchanges / (per_att * 7.5e-3), "inline formula"


def _time(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``fn`` over ``repeats`` calls (after one warm-up)."""
    fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return median(out)


def _codec_speed(tensor: np.ndarray, spec: str, repeats: int) -> dict[str, float]:
    """Pack/unpack MB/s (MB of float32 input) with bitshuffle and with the numpy fallback,
    interleaved so both see the same machine load."""
    mb = tensor.size * 4 / 1e6
    body = packing.pack(tensor, spec)
    times: dict[str, list[float]] = {k: [] for k in ("pack", "unpack", "pack_np", "unpack_np")}
    lib = bitplanes.USE_BITSHUFFLE
    try:
        for _ in range(repeats):
            for use, suffix in ((lib, ""), (False, "_np")):
                bitplanes.USE_BITSHUFFLE = use
                times["pack" + suffix].append(_time(lambda: packing.pack(tensor, spec), 1))
                times["unpack" + suffix].append(_time(lambda: packing.unpack(body), 1))
    finally:
        bitplanes.USE_BITSHUFFLE = lib
    out = {f"{k}_mb_s": round(mb / median(v), 1) for k, v in times.items()}
    out["ratio"] = round(tensor.size * 4 / len(body), 2)
    return out


def _pack_all(tensors: dict[str, np.ndarray], spec: str,
              per_tensor: dict[str, str] | None = None) -> list[bytes]:
    per = per_tensor or {}
    return [packing.pack(v, per.get(k, spec)) for k, v in tensors.items()]


def _metric_name(rows: list[dict[str, Any]], data: Any) -> Any:
    """The metric every row used (a list when rows differ)."""
    names = sorted({str(r["metric"]) for r in rows if r.get("metric")})
    if not names:
        return "top1_accuracy" if data.labels is not None else "top1_disagreement"
    return names[0] if len(names) == 1 else names


def _unpack_all(bodies: dict[str, bytes]) -> list[np.ndarray]:
    return [packing.unpack(b) for b in bodies.values()]


def run(args: argparse.Namespace) -> int:
    from coinf.bundle import Bundle
    from coinf.convert import calibrate as cal

    if args.repeats < 1 or (args.limit is not None and args.limit < 1):
        raise InputError("--repeats and --limit must be >= 1")
    options.check_png(args.png)
    tmp = None
    if args.bundle:
        bundle = Bundle.load(args.bundle)
        data = cal.load_dataset(args.data, bundle, args.limit, args.labels)
        model = bundle.root.resolve().name
    else:
        from coinf.convert.split import split_model
        from coinf.models.zoo import committed_path

        tmp = tempfile.TemporaryDirectory(prefix="coinf-pack-")
        progress("splitting the zoo's lenet_digits (no --bundle given) ...")
        bundle = split_model(committed_path("lenet_digits"), Path(tmp.name) / "lenet_digits")
        data = cal.load_dataset("digits", bundle, args.limit)
        model = "lenet_digits"
    try:
        result = measure(bundle, data, model, args)
    finally:
        if tmp is not None:
            tmp.cleanup()
    if args.png:
        from coinf.cli.bench.pack_chart import plot_pack

        plot_pack(result, args.png, args.tolerance)
        result["png"] = args.png
    emit(result)
    return 0


def _calibrated_rows(bundle: Any, data: Any, args: argparse.Namespace
                     ) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """Every packing's ratio and accuracy drop at every cut: (calibration tables per
    candidate, one row each)."""
    from coinf.convert import calibrate as cal
    from coinf.convert.metrics import parse_metric
    from coinf.convert.packcal import Options

    metric = parse_metric(getattr(args, "metric", None), getattr(args, "metric_output", []),
                          [t.name for t in bundle.outputs])
    tables = cal.calibrate(bundle, data, cal.DEFAULT_SPECS, progress=progress,
                           options=Options(metric=metric, tolerance_pp=args.tolerance))
    rows = [{"cut": f"{cid} {bundle.candidate(cid).label}", "bits": r["spec"],
             "ratio": r["ratio"], "accuracy_drop_pp": r["accuracy_drop_pp"],
             "mean_bytes": r["mean_bytes"], "metric": r.get("metric"),
             **({"tensors": r["tensors"]} if r.get("tensors") else {})}
            for cid, rs in tables.items() for r in rs]
    return tables, rows


def _codec_speeds(bundle: Any, tables: dict[str, Any], data: Any, spec: str,
                  args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """Codec speed on the largest crossing tensor of the model, and on distinct inputs' such
    tensors side by side to ``--throughput-mb`` (tiling one would flatter LZ4): (the
    ``codec_speed`` entries ``large_tensor`` and ``model_tensor``)."""
    from coinf.convert import calibrate as cal

    biggest = max((c for c in bundle.candidates if c.id in tables), key=lambda c: c.crossing_bytes)
    runner = cal.CandidateRunner(bundle, biggest)
    name = max(biggest.crossing, key=lambda t: t.nbytes).name
    tensor = runner.run_head(data.feed(0))[name].astype(np.float32)
    want = max(1, int(args.throughput_mb * 1e6 / tensor.nbytes))
    parts = [runner.run_head(data.feed(i % len(data)))[name].astype(np.float32).reshape(-1)
             for i in range(want)]
    large = np.concatenate(parts)
    progress(f"codec speed on {large.nbytes / 1e6:.1f} MB ({want} inputs' {biggest.id} "
             f"tensors), {spec}...")
    speed_large = _codec_speed(large, spec, args.repeats)
    speed_model = _codec_speed(tensor, spec, args.repeats)
    return ({"mb": round(large.nbytes / 1e6, 2), "inputs": want,
             "distinct_inputs": min(want, len(data)), **speed_large},
            {"cut": f"{biggest.id} {biggest.label}", "shape": list(tensor.shape),
             **speed_model})


def _head_ms(bundle: Any, cand: Any, feed: dict[str, Any], repeats: int) -> float:
    """Median ms of the candidate's head on this machine (0 without a head)."""
    from coinf.convert import calibrate as cal

    if cand.head.file is None:
        return 0.0
    sess = cal.session(bundle.path(cand.head.file))
    names = [o.name for o in sess.get_outputs()]
    hfeed = {i.name: feed[i.name] for i in sess.get_inputs()}
    return 1e3 * _time(partial(sess.run, names, hfeed), repeats)


def _latencies(bundle: Any, tables: dict[str, Any], feed: dict[str, Any],
               args: argparse.Namespace, cap: float
               ) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    """Modelled end-to-end ms of every candidate without packing, and of every (candidate,
    packing) within ``--tolerance``: the wearable's compute and packing x ``--pi-slowdown``,
    the handheld's as measured, transfers at ``cap`` bytes/s."""
    from coinf.convert import calibrate as cal

    slow, tol = args.pi_slowdown, args.tolerance
    lat_raw: dict[str, float] = {}
    lat_pack: dict[tuple[str, str], float] = {}
    for cand in bundle.candidates:
        head_ms = _head_ms(bundle, cand, feed, args.repeats)
        if cand.is_wearable_only:
            lat_raw[cand.id] = head_ms * slow
            continue
        run = cal.CandidateRunner(bundle, cand)
        crossing = run.run_head(feed)
        tail_ms = 1e3 * _time(partial(run.run_tail, crossing), args.repeats)
        out = run.tail.run(None, {n: crossing[n] for n in run.tail_inputs})
        ret_bytes = len(encode_tensors({f"o{i}": o for i, o in enumerate(out)}))
        fixed = head_ms * slow + tail_ms + 1e3 * ret_bytes / cap
        lat_raw[cand.id] = fixed + 1e3 * len(encode_tensors(crossing)) / cap
        for r in tables[cand.id]:
            if r["accuracy_drop_pp"] > tol:
                continue
            spec = r["spec"]
            per = r.get("tensors") or {}
            bodies = {k: packing.pack(v, per.get(k, spec)) for k, v in crossing.items()}
            pack_ms = 1e3 * _time(partial(_pack_all, crossing, spec, per), args.repeats)
            unpack_ms = 1e3 * _time(partial(_unpack_all, bodies), args.repeats)
            map_overhead = len(encode_tensors({}, packed=bodies)) - sum(map(len, bodies.values()))
            wire = r["mean_bytes"] + map_overhead
            lat_pack[(cand.id, spec)] = fixed + pack_ms * slow + unpack_ms + 1e3 * wire / cap
    return lat_raw, lat_pack


def _e2e(bundle: Any, lat_raw: dict[str, float], lat_pack: dict[tuple[str, str], float],
         args: argparse.Namespace, cap: float, cap_source: str) -> tuple[float, dict[str, Any]]:
    """(the end-to-end speedup packing gives on the Pi Zero, the ``e2e`` entry)."""
    offload_raw = {k: v for k, v in lat_raw.items() if not bundle.candidate(k).is_wearable_only}
    raw_off = min(offload_raw, key=lambda k: offload_raw[k])
    raw_best = min(lat_raw, key=lambda k: lat_raw[k])
    pack_best = min(lat_pack, key=lambda k: lat_pack[k]) if lat_pack else None
    best_packed_ms = min(lat_raw[raw_best], lat_pack[pack_best]) if pack_best else lat_raw[raw_best]

    def cut(cid: str) -> str:
        return f"{cid} {bundle.candidate(cid).label}"

    first, last = bundle.candidates[0].id, bundle.candidates[-1].id
    every = {k: v for k, v in lat_raw.items()} | {f"{c}~{s}": v for (c, s), v in lat_pack.items()}

    def fastest(keep: Any) -> dict[str, Any] | None:
        ids = [k for k in every if keep(k.partition("~")[0], k.partition("~")[2])]
        best_id = min(ids, key=lambda k: every[k]) if ids else None
        return None if best_id is None else {"config": best_id,
                                             "latency_ms": round(every[best_id], 2)}

    return round(lat_raw[raw_best] / best_packed_ms, 2), {
        "preset": "pi-zero-2w",
        "transfer_model": "formula",
        "capacity_bytes_per_s": round(cap, 1),
        "capacity_source": cap_source,
        "pi_slowdown_assumed": args.pi_slowdown,
        "tolerance_pp": args.tolerance,
        "without_packing": {"cut": cut(raw_best), "latency_ms": round(lat_raw[raw_best], 2)},
        "with_packing": ({"cut": cut(pack_best[0]), "bits": pack_best[1],
                          "latency_ms": round(lat_pack[pack_best], 2)} if pack_best else None),
        "offload_speedup": (round(lat_raw[raw_off] / lat_pack[pack_best], 2)
                            if pack_best else None),
        "offload_without_packing": {"cut": cut(raw_off),
                                    "latency_ms": round(lat_raw[raw_off], 2)},
        "latency_ms_without_packing": {cut(k): round(v, 2) for k, v in lat_raw.items()},
        "latency_ms_with_packing": {f"{cut(k[0])} {k[1]}": round(v, 2)
                                    for k, v in lat_pack.items()},
        # what a user would do instead (wearable/planner/references.py), in this model
        "reference": {
            "wearable_only": fastest(lambda c, s: c == last),
            "handheld_raw": fastest(lambda c, s: c == first and not s),
            "handheld_codec": fastest(lambda c, s: c == first and bool(s)),
            "best_split": fastest(lambda c, s: c not in (first, last)),
        },
    }


def measure(bundle: Any, data: Any, model: str, args: argparse.Namespace) -> dict[str, Any]:
    tables, rows = _calibrated_rows(bundle, data, args)
    ok = [r for r in rows if r["accuracy_drop_pp"] <= args.tolerance]
    best = max(ok, key=lambda r: r["ratio"]) if ok else None
    speed_spec = best["bits"] if best and best["bits"].startswith("q") else "q4"
    large_tensor, model_tensor = _codec_speeds(bundle, tables, data, speed_spec, args)
    cap, cap_source = pi_zero_capacity()  # the end-to-end model on the pi-zero-2w preset
    lat_raw, lat_pack = _latencies(bundle, tables, data.feed(0), args, cap)
    speedup, e2e = _e2e(bundle, lat_raw, lat_pack, args, cap, cap_source)
    return {
        "model": model,
        "data": data.name,
        "samples": len(data),
        "metric": _metric_name(rows, data),
        "rows": rows,
        "best_ratio_at_1pp": best["ratio"] if best else None,
        "best_at_1pp": {"cut": best["cut"], "bits": best["bits"]} if best else None,
        "pack_mb_s": large_tensor["pack_mb_s"],
        "unpack_mb_s": large_tensor["unpack_mb_s"],
        "codec_speed": {
            "bits": speed_spec,
            "note": "MB of float32 input per second, one core, median over repeats",
            "bitshuffle_installed": bitplanes._bitshuffle is not None,
            "large_tensor": large_tensor,
            "model_tensor": model_tensor,
        },
        "e2e_speedup_pi_zero": speedup,
        "e2e": e2e,
        "targets": {"best_ratio_at_1pp": 30, "pack_mb_s": 300},
    }
