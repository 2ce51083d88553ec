"""``coinf bench spatial``: one model's conv layers split by space over N emulated devices.

This process is device 0, the coordinator, as the wearable would be. Devices 1..N-1 are
``coinf handheld`` processes on unix sockets. Every device runs ``--slowdown`` times slower than
this machine: the real model runs, then the device sleeps for the extra time. All helper links
share one shaped medium (``--mbps``, ``--latency-ms``), as devices on one Wi-Fi network do.
Local runs (the whole model on device 0 alone) and distributed runs are interleaved. Every
distributed output is compared with the local one.

The break-even bandwidth is where the distributed run stops paying: the runs are repeated at
lower bandwidths (``--sweep``), and the crossing of speedup 1 is interpolated.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from coinf.cli import argtypes
from coinf.cli.bench import emit, median, options, progress, stop_processes
from coinf.errors import InputError, UserError


def register(parser: argparse.ArgumentParser) -> None:
    options.add_json(parser)
    parser.add_argument("--devices", type=argtypes.integer(2, 8), default=4,
                        help="devices, this one included")
    parser.add_argument("--model", default="vgg16-64",
                        help="an ONNX file, 'vgg' (the committed zoo model, widths 16-64) or "
                             "'vgg16-64' (default: the zoo's VGG at VGG-16 widths, 64x64 input, "
                             "built here with torch)")
    parser.add_argument("--slowdown", type=argtypes.slowdown, default=20.0,
                        help="every device is this many times slower than this machine")
    parser.add_argument("--mbps", type=argtypes.number(0, 1e6, lo_open=True), default=50.0,
                        help="shared link bandwidth, Mbit/s of payload (Wi-Fi class: 50)")
    parser.add_argument("--latency-ms", type=argtypes.number(0, 1e5), default=2.0,
                        help="one-way link latency")
    parser.add_argument("--strategy", default="fused", choices=["fused", "per-layer", "whole"])
    parser.add_argument("--frames", type=argtypes.positive_int, default=15,
                        help="measured frames (median)")
    parser.add_argument("--sweep", default="",
                        help="also measure at these Mbit/s (comma-separated) for break-even")
    options.add_png(parser, "the speedup against the link's Mbit/s, measured and predicted")
    parser.set_defaults(func=run)


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"--sweep: expected numbers separated by commas, got {text!r}") from None
    if any(v <= 0 for v in values):
        raise InputError(f"--sweep: bandwidths must be > 0, got {text!r}")
    return values


def _start_helpers(bundle: Path, sockets: list[Path], slowdown: float) -> list[subprocess.Popen]:
    procs = []
    try:
        for sock in sockets:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "coinf", "handheld", "--bundle", str(bundle), "--listen",
                 f"unix:{sock}", "--slowdown", str(slowdown), "--threads", "1",
                 "--max-request-mib", "256"],  # tile requests: bounded by their region
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if "serving" not in line:
                raise UserError(f"a helper process did not start: {line.strip()!r}")
    except BaseException:
        stop_processes(procs)
        raise
    return procs


def _device_speed(emu: Any, local: Any, sm: Any, feed: dict[str, Any], x: np.ndarray
                  ) -> tuple[float, float]:
    """(FLOPs per second, a tile's fixed cost in s) of an emulated device: from a measured
    local run of the whole model (all devices are alike here) and from the smallest tile (1x1
    output of the last layer) run here."""
    from coinf.convert.spatial import Rect
    from coinf.device.spatial import tile_of

    flops = sum(layer.flops for layer in sm.chain)
    _, local_s = emu.timed(lambda: local.run(None, feed))
    speed = flops / max(local_s, 1e-9)
    last = len(sm.chain)
    key = tile_of(last - 1, last, Rect(0, 1, 0, 1))
    tiny = np.zeros(sm.region_shape(key, x.shape[0]), dtype=np.float32)
    overhead = median([emu.timed(lambda: sm.run_tile(key, tiny))[1] for _ in range(15)])
    return speed, overhead


def _connector(sock: Path, channel: Any, air: asyncio.Lock) -> Any:
    """A connector to the helper at ``sock`` over the shaped medium ``channel`` (``air``: the
    lock every helper link shares)."""
    from coinf.ble_protocol.throttle import ThrottledLink
    from coinf.ble_protocol.transport import FactoryConnector, open_connector

    inner = open_connector(f"unix:{sock}")

    async def factory() -> Any:
        return ThrottledLink(await inner.connect(5.0), channel, air=air, shape_receive=True)

    return FactoryConnector(factory)


async def _run_frames(s: Any, frames: int, feed: dict[str, Any], ref: list[Any], local: Any,
                      emu: Any) -> tuple[list[float], list[Any], float, Any]:
    """Distributed and local runs interleaved after two warm-up runs: (local ms, distributed
    stats, largest difference from the local output ``ref``, the first frame's plan)."""
    local_ms: list[float] = []
    dist: list[Any] = []
    err = 0.0
    for _ in range(2):  # warm-up: connections, every tile's sub-graph on every device
        await s.run(feed)
    for i in range(frames):
        out, stats = await s.run(feed)
        dist.append(stats)
        err = max(err, max(float(np.max(np.abs(a - b)))
                           for a, b in zip(ref, out.values(), strict=True)))
        _, t = await asyncio.to_thread(emu.timed, lambda: local.run(None, feed))
        local_ms.append(t * 1e3)
        if i == 0:
            plan = s.plan()
    return local_ms, dist, err, plan


def _break_even(predicted: Callable[[float], float]) -> float | None:
    """The lowest bandwidth (Mbit/s) at which the planner starts to distribute (below it: all
    here), by bisection in log space; None when it never does in 0.01..1000."""
    lo, hi = 0.01, 1000.0
    if not predicted(lo) <= 1.0 + 1e-6 < predicted(hi):
        return None
    for _ in range(20):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if predicted(mid) <= 1.0 + 1e-6 else (lo, mid)
    return round(hi, 3)


async def _measure(args: argparse.Namespace, bundle: Any, sockets: list[Path], mbps: float,
                   frames: int) -> dict[str, Any]:
    import onnxruntime as ort

    from coinf.ble_protocol.shaped import Channel
    from coinf.convert.gtdp import Worker
    from coinf.device.emulation import DeviceEmulation
    from coinf.device.spatial import SpatialModel
    from coinf.research.spatial_session import SpatialSession, TileHelper

    emu = DeviceEmulation(args.slowdown, threads=1)
    local = ort.InferenceSession(str(bundle.model_path), emu.session_options(),
                                 providers=["CPUExecutionProvider"])
    inp = local.get_inputs()[0]
    x = np.random.default_rng(0).random(inp.shape, dtype=np.float32)
    feed = {inp.name: x}
    ref = local.run(None, feed)
    sm = SpatialModel(bundle.model_path, threads=1)
    speed, overhead = _device_speed(emu, local, sm, feed, x)
    channel = Channel(mbps * 1e6 / 8, latency_s=args.latency_ms / 1e3)
    air = asyncio.Lock()  # one medium for every helper link
    helpers = [TileHelper(Worker(f"helper{i + 1}", speed, mbps * 1e6 / 8, args.latency_ms / 1e3,
                                 overhead), _connector(s, channel, air))
               for i, s in enumerate(sockets)]
    async with SpatialSession(bundle, Worker("coordinator", speed, overhead_s=overhead), helpers,
                              strategy=args.strategy, emulation=emu, timeout=30.0) as s:
        local_ms, dist, err, plan = await _run_frames(s, frames, feed, ref, local, emu)
    lm, dm = median(local_ms), median([d.total_ms for d in dist])
    me = Worker("coordinator", speed, overhead_s=overhead)
    like = helpers[0].worker

    def predicted(bw_mbps: float) -> float:
        """Eq. 1 speedup the planner predicts at a bandwidth (same devices, fused groups)."""
        from dataclasses import replace

        ws = [me] + [replace(like, name=f"h{k}", bandwidth_bps=bw_mbps * 1e6 / 8)
                     for k in range(len(helpers))]
        est = sum(g.est_s for g in sm.plan(ws, args.strategy).groups)
        alone = sum(g.est_s for g in sm.plan([me], "whole").groups)
        return alone / est

    return {
        "mbps": mbps,
        "local_ms": round(lm, 2),
        "distributed_ms": round(dm, 2),
        "speedup": round(lm / dm, 3),
        "compute_ms": round(median([d.compute_ms for d in dist]), 2),
        "comm_ms": round(median([d.comm_ms for d in dist]), 2),
        "max_abs_err": err,
        "groups": len(plan.groups),
        "plan": plan.describe(),
        "bytes_per_frame": dist[-1].bytes_sent + dist[-1].bytes_received,
        "predicted_speedup": round(predicted(mbps), 3),
        "predicted_break_even_mbps": _break_even(predicted),
    }


def run(args: argparse.Namespace) -> int:
    if not 2 <= args.devices <= 8:
        raise InputError(f"--devices must be in [2, 8], got {args.devices}")
    if args.slowdown < 1 or args.mbps <= 0 or args.latency_ms < 0 or args.frames < 1:
        raise InputError("--slowdown >= 1, --mbps > 0, --latency-ms >= 0 and --frames >= 1")
    sweep = _floats(args.sweep)
    from coinf.convert.split import split_model

    options.check_png(args.png)
    from coinf.models.zoo import committed_path

    with tempfile.TemporaryDirectory(prefix="coinf-spatial-") as tmp:
        if args.model == "vgg16-64":
            progress("building vgg16-64 (VGG-16 widths, 64x64 input, seeded weights)")
            src = _vgg16_64(Path(tmp) / "vgg16-64.onnx")
        else:
            src = committed_path("vgg") if args.model == "vgg" else Path(args.model)
        if not src.is_file():
            raise InputError(f"--model {src}: no such file")
        progress(f"splitting {src.name}")
        bundle = split_model(src, Path(tmp) / "bundle", max_candidates=4)
        sockets = [Path(tmp) / f"h{i}.sock" for i in range(args.devices - 1)]
        progress(f"starting {len(sockets)} helper processes (slowdown {args.slowdown:g})")
        procs = _start_helpers(Path(tmp) / "bundle", sockets, args.slowdown)
        try:
            t0 = time.perf_counter()
            main = asyncio.run(_measure(args, bundle, sockets, args.mbps, args.frames))
            progress(f"{args.mbps:g} Mbit/s: speedup {main['speedup']} "
                     f"({time.perf_counter() - t0:.0f} s)")
            rows = [main]
            for mbps in sweep:
                row = asyncio.run(_measure(args, bundle, sockets, mbps, max(args.frames // 2, 3)))
                progress(f"{mbps:g} Mbit/s: speedup {row['speedup']}")
                rows.append(row)
        finally:
            stop_processes(procs)
    result = {"model": src.stem, "devices": args.devices, "slowdown": args.slowdown,
              "strategy": args.strategy, "latency_ms": args.latency_ms,
              **{k: main[k] for k in ("mbps", "local_ms", "distributed_ms", "speedup",
                                      "compute_ms", "comm_ms", "max_abs_err", "groups",
                                      "bytes_per_frame", "predicted_speedup",
                                      "predicted_break_even_mbps", "plan")}}
    if sweep:
        pts = sorted((r["mbps"], r["speedup"]) for r in rows)
        result["sweep"] = [{"mbps": m, "speedup": s} for m, s in pts]
        result["break_even_mbps"] = _crossing(pts)
    if args.png:
        _plot(result, rows, args.png)
        result["png"] = args.png
    emit(result)
    return 0


def _plot(result: dict[str, Any], rows: list[dict[str, Any]], path: str) -> None:
    """Speedup over the coordinator alone against the shared medium's Mbit/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(rows, key=lambda r: r["mbps"])
    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.plot([r["mbps"] for r in rows], [r["speedup"] for r in rows], marker="o",
            label="measured")
    ax.plot([r["mbps"] for r in rows], [r["predicted_speedup"] for r in rows], marker="x",
            ls="--", label="predicted (the cost model)")
    ax.axhline(1.0, color="grey", lw=1, label="the coordinator alone")
    ax.set_xscale("log")
    ax.set_xlabel("shared medium (Mbit/s)")
    ax.set_ylabel("speedup")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    ax.set_title(f"{result['model']}: conv tiles over {result['devices']} devices, each "
                 f"x{result['slowdown']:g}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _vgg16_64(path: Path) -> Path:
    """The zoo's VGG class with VGG-16's channel widths (64-512) on a 64x64 input: the compute
    per transferred byte of a real VGG at a size a bench can run (torch, seeded)."""
    from coinf.models.zoo import deterministic_torch, require_torch

    require_torch()
    from coinf.models.architectures import VGG, VGG16_LARGE
    from coinf.models.export import export_onnx
    from coinf.models.inputs import InputSpec

    with deterministic_torch():
        model = VGG(64, VGG16_LARGE, 256, 100).eval()
        data = export_onnx(model, (InputSpec("image", (1, 3, 64, 64)),), ("logits",),
                           keep_batchnorm=False, doc="coinf bench spatial: VGG-16 widths, 64x64",
                           metadata={})
    path.write_bytes(data)
    return path


def _crossing(pts: list[tuple[float, float]]) -> float | None:
    """Bandwidth where speedup crosses 1 (log-linear interpolation), None if it never does."""
    for (m0, s0), (m1, s1) in itertools.pairwise(pts):
        if (s0 - 1) * (s1 - 1) <= 0 and s0 != s1:
            f = (1 - s0) / (s1 - s0)
            return round(math.exp(math.log(m0) + f * (math.log(m1) - math.log(m0))), 3)
    return None
