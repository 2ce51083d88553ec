"""``coinf bench pipeline``: a pipeline over K emulated devices vs the same with two.

The wearable runs in this process, each of the K-1 helpers in its own process (``coinf
handheld --pipeline CONFIG --name hI``: a real daemon with the forward role on a local TCP port;
``--in-process`` hosts them here instead). Every device plays a ``--slowdown`` x slower machine
and every link (wearable -> helper 1, helper i -> helper i+1) is shaped to ``--bandwidth-kbps``
and ``--latency-ms``. A warm-up stream lets the DP split settle on measured speeds and
bandwidths; then the split is frozen and batches of frames stream through the K-device and the
2-device pipelines alternately (same helpers, side by side). ``stage_ms`` are the means (what
bounds a stage's throughput) of each device's compute and each link's transfer over the
K-device batches (``stage_ms_median`` the medians), ``bound_fps`` one frame per slowest stage,
``throughput_fps`` the steady-state rate (results after the first over the time since it);
throughputs are medians over ``--repeats`` batches. ``efficiency`` is the median over batches of
each batch's throughput over its own bound (the load of a shared machine moves between
batches); ``efficiency_pooled`` is ``throughput_fps / bound_fps``.

``--first-link ble``: the wearable reaches helper 1 over BLE through the emulated radio (a
``coinf radio`` process, ``--radio-preset``): its GATT server on the radio's wearable side, h1 a
BLE central on the other (``coinf handheld --listen ble:HCI``, also listening on TCP for its
peers); helper-to-helper links are shaped TCP as before. The wearable's GATT server serves one
helper at a time, so the K-device and 2-device pipelines are one session (and one BLE link)
restricted to its first 2 devices for the 2-device batches. The default bundle is then the
zoo's lenet_digits (small crossing tensors: its cuts carry 40 B to 14 kB).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import math
import secrets
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

from coinf.cli import argtypes
from coinf.cli.bench import emit, median, options, progress, realtime, stop_processes
from coinf.cli.passkey import write_passkey_file


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--devices", type=argtypes.integer(2, 64), default=3,
                        help="devices in the pipeline, the "
                        "wearable included (default %(default)s)")
    options.add_bundle(parser, default_text="the zoo's vgg, split now")
    parser.add_argument("--slowdown", type=argtypes.slowdown, default=100.0,
                        help="every device plays a K x slower machine (default %(default)s)")
    options.add_bandwidth_kbps(parser, 4000.0)
    parser.add_argument("--latency-ms", type=argtypes.number(0, 1e5), default=2.0,
                        help="every link's latency")
    parser.add_argument("--frames", type=argtypes.positive_int, default=40, help="frames per batch")
    options.add_repeats(parser, 3)
    options.add_warmup(parser, 20)
    parser.add_argument("--depth", type=argtypes.count, default=0,
                        help="frames in flight (default 4 x devices)")
    parser.add_argument("--rate", type=argtypes.number(0, 1e6, hi_open=True), default=0.0,
                        metavar="HZ",
                        help="also feed both pipelines from a real-time source at HZ frames/s "
                        "(2 x --frames frames; one arriving with a frame in every stage is "
                        "dropped) and report effective accuracy = delivered x accuracy / "
                        "generated")
    parser.add_argument("--accuracy", type=argtypes.fraction, default=1.0,
                        help="the model's accuracy for effective accuracy (default 1)")
    parser.add_argument("--compressors", metavar="DIR", type=argtypes.existing_dir,
                        help="a compressor set (index.json): with --bandwidth-kbps-schedule, "
                        "measure run-time selection of gamma and packing instead "
                        "(coinf/cli/bench/pipeline_switch.py)")
    parser.add_argument("--cuts", metavar="C1,C2",
                        help="with --bandwidth-kbps-schedule: a fixed split (one cut per link) "
                        "instead of the DP's")
    parser.add_argument("--bandwidth-kbps-schedule", metavar="A,B,...",
                        help="kB/s of the link into the first helper, one phase each (needs "
                        "--rate and --compressors or a --bundle with compressors)")
    parser.add_argument("--in-process", action="store_true",
                        help="host the helpers in this process (default: one process each)")
    parser.add_argument("--first-link", choices=("tcp", "ble"), default="tcp",
                        help="the wearable -> helper 1 link: shaped TCP (default) or BLE through "
                        "the emulated radio (a coinf radio process)")
    parser.add_argument("--profiles", metavar="P1,P2,...",
                        help="one device profile per device, the wearable first (pi-zero-2w, "
                        "laptop or a profile JSON file): each device plays its profile on "
                        "this model (its slowdown measured here, never below 1) instead of "
                        "--slowdown")
    parser.add_argument("--hop-bandwidth-kbps", type=argtypes.kbps, default=None,
                        help="the helper-to-helper links' bandwidth, kB/s (default: "
                        "--bandwidth-kbps)")
    parser.add_argument("--radio-preset", default="pi-zero-2w",
                        help="with --first-link ble: the radio preset (default %(default)s)")
    options.add_png(parser, "the stages and the frames per second (not with "
                    "--bandwidth-kbps-schedule)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from coinf.errors import InputError

    if args.devices < 2:
        raise InputError("--devices must be >= 2 (the wearable and at least one helper)")
    if args.frames < 1 or args.repeats < 1 or args.slowdown < 1 or args.bandwidth_kbps <= 0:
        raise InputError("--frames and --repeats must be >= 1, --slowdown >= 1, "
                         "--bandwidth-kbps > 0")
    if args.rate < 0 or not 0 <= args.accuracy <= 1:
        raise InputError("--rate must be >= 0 and --accuracy in [0, 1]")
    if args.profiles and (args.bandwidth_kbps_schedule or args.compressors):
        raise InputError("--profiles applies to the K-device against 2-device comparison, "
                         "not to --bandwidth-kbps-schedule (which uses --slowdown)")
    args.device_profiles = device_profiles(args.profiles, args.devices) if args.profiles \
        else None
    options.check_png(args.png)
    if args.bandwidth_kbps_schedule or args.compressors:
        from coinf.cli.bench import pipeline_switch

        if not args.bandwidth_kbps_schedule:
            raise InputError("--compressors needs --bandwidth-kbps-schedule A,B,...")
        emit(asyncio.run(pipeline_switch.measure(args)))
        return 0
    if args.first_link == "ble":
        from coinf.ble_protocol.radio import PRESETS

        if args.in_process:
            raise InputError("--first-link ble runs the helpers as processes (the BLE central "
                             "is a `coinf handheld --listen ble:HCI`): drop --in-process")
        if args.radio_preset not in PRESETS:
            raise InputError(f"unknown --radio-preset {args.radio_preset!r}: expected one of "
                             f"{', '.join(sorted(PRESETS))}")
    result = asyncio.run(measure(args))
    if args.png:
        from coinf.cli.bench.pipeline_chart import plot_pipeline

        plot_pipeline(result, args.png)
        result["png"] = args.png
    emit(result)
    return 0


def device_profiles(spec: str, devices: int) -> list[Any]:
    """``--profiles``: one :class:`~coinf.device.profile.DeviceProfile` per device."""
    from coinf.device.profile import DeviceProfile, ProfileError
    from coinf.errors import InputError

    names = [n.strip() for n in spec.split(",")]
    if len(names) != devices or not all(names):
        raise InputError(f"--profiles: {len(names)} names for --devices {devices}; expected "
                         f"one per device, the wearable first (e.g. pi-zero-2w,laptop,laptop)")
    out = []
    for name in names:
        if name == "pi-zero-2w":
            out.append(DeviceProfile.pi_zero_2w())
        elif name == "laptop":
            out.append(DeviceProfile.laptop())
        else:
            try:
                out.append(DeviceProfile.load(name))
            except (OSError, ValueError, ProfileError) as exc:
                raise InputError(f"--profiles: {name!r} is neither pi-zero-2w, laptop nor a "
                                 f"readable profile file ({exc})") from None
    return out


def slowdowns(args: argparse.Namespace, bundle: Any) -> list[float]:
    """Each device's slowdown: its profile's against this machine, else ``--slowdown``."""
    from coinf.device.emulation import profile_slowdown

    if not args.device_profiles:
        return [args.slowdown] * args.devices
    out = []
    for prof in args.device_profiles:
        slow, pred_ms, here_ms = profile_slowdown(str(bundle.model_path), prof)
        progress(f"{prof.name}: {pred_ms:.1f} ms per inference predicted, {here_ms:.1f} ms "
                 f"here: slowdown {slow:.2f}")
        out.append(round(slow, 3))
    return out


def _bundle(args: argparse.Namespace, tmp: Path) -> Any:
    from coinf.bundle import Bundle
    from coinf.convert.split import split_model
    from coinf.models.zoo import ONNX_DIR

    if args.bundle:
        return Bundle.load(args.bundle)
    model = "lenet_digits" if args.first_link == "ble" else "vgg"
    progress(f"splitting the zoo's {model} ...")
    return split_model(ONNX_DIR / f"{model}.onnx", tmp / model)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    ble = radio_link(args) if args.first_link == "ble" else None
    try:
        return await _measure(args, ble)
    finally:
        if ble is not None:
            ble.stop()


async def _measure(args: argparse.Namespace, ble: RadioLink | None) -> dict[str, Any]:
    import numpy as np

    from coinf.ble_protocol.shaped import Channel
    from coinf.ble_protocol.tls_store import one_machine_env
    from coinf.handheld.pipeline_host import local_helpers

    # the helper processes and this wearable: one machine, one one-off paired identity
    with tempfile.TemporaryDirectory() as tmpdir, one_machine_env():
        bundle = _bundle(args, Path(tmpdir))
        k = args.devices
        names = [f"h{i}" for i in range(1, k)]
        slow = slowdowns(args, bundle)
        hop_kbps = args.hop_bandwidth_kbps or args.bandwidth_kbps
        # the link into each helper: h1's from the wearable, the others' from the helper before
        kbps = [args.bandwidth_kbps] + [hop_kbps] * (k - 2)
        latency = args.latency_ms / 1000
        channels = {n: Channel(v * 1000, latency, overhead_bytes=16)
                    for n, v in zip(names, kbps, strict=True)}
        depth = args.depth or 4 * k
        rng = np.random.default_rng(0)
        frames = [{t.name: rng.standard_normal(t.shape).astype(t.dtype)
                   for t in bundle.inputs} for _ in range(8)]
        if args.in_process:
            hosting: Any = local_helpers(bundle, names, dict(zip(names, slow[1:], strict=True)),
                                         channels, max_pending=depth + 2)
        else:
            hosting = helper_processes(bundle, names, args, Path(tmpdir), depth + 2, ble,
                                       slow[1:], kbps)
        async with hosting as hosts:
            helpers, extra = _helper_configs(hosts, kbps, latency, ble)
            measured = await _run_session(bundle, helpers, extra, slow[0], frames, args, depth)
        return _report(args, bundle, ble, slow, hop_kbps, depth, measured)


def _helper_configs(hosts: list[Any], kbps: list[float], latency: float, ble: RadioLink | None
                    ) -> tuple[list[Any], dict[str, Any]]:
    """The wearable's view of each helper (its link shaped to ``kbps`` and ``latency``), and
    the session's BLE settings when the first link is BLE."""
    from coinf.wearable.pipeline_config import HelperConfig

    helpers = [HelperConfig(h.name, h.address, v * 1000, latency, shape=True,
                            wearable_link=getattr(h, "wearable_link", None))
               for h, v in zip(hosts, kbps, strict=True)]
    extra: dict[str, Any] = {}
    if ble is not None:  # the prior of the BLE link: the radio's capacity
        helpers[0] = dataclasses.replace(helpers[0], bandwidth_bps=ble.capacity_bps,
                                         latency_s=0.0)
        extra = {"connect_timeout": 30.0, "helper_ble_options": ble.wearable_options}
    return helpers, extra


@dataclasses.dataclass
class _Measured:
    """What one pipeline session measured."""

    runs: dict[str, list[float]]  # frames/s of each batch, per view (K, 2, chosen)
    stage_rows: list[list[float]]  # per K-device frame: each stage's ms
    efficiencies: list[float]  # per K-device batch: its throughput over its own bound
    live: dict[str, Any]  # the real-time source's results (--rate)
    plans: tuple[Any, Any, Any]  # the K-device, 2-device and chosen plans
    predicted_stage_ms: list[float]  # the K-device plan's, as the planner predicted them
    verdict: dict[str, Any]
    first_link: str


async def _run_session(bundle: Any, helpers: list[Any], extra: dict[str, Any], slowdown: float,
                       frames: list[dict[str, Any]], args: argparse.Namespace, depth: int
                       ) -> _Measured:
    """Warm up, freeze the split, then time the K-device, 2-device and chosen pipelines
    (views of one session: one link per helper) side by side."""
    from coinf.cli.bench.helper_session import pipeline_session

    sess = pipeline_session(bundle, helpers, slowdown, args.device_profiles, **extra)
    rp = sess.replanner
    views = {"K": _View(rp, all_devices=True),  # every device, even if fewer pay
             "2": _View(rp, max_devices=2, all_devices=True),
             "chosen": _View(rp)}  # as many devices as the planner keeps
    async with sess:
        for name, view in views.items():
            progress(f"warm-up: {name} pipeline, {args.warmup} frames ...")
            await _stream(sess, view, frames, args.warmup, depth)
        for view in views.values():  # every view planned on the same (latest) measurements
            view.plan()
        rp.adaptive = False
        runs, stage_rows, efficiencies, links = await _time_batches(sess, views, frames, args,
                                                                    depth)
        live = await _realtime_runs(sess, views, frames, args) if args.rate > 0 else {}
        plans = tuple(views[n].plan() for n in ("K", "2", "chosen"))
        with views["K"].limited():
            predicted = [round(v * 1e3, 3) for v in rp.chosen.stage_s]
        with views["chosen"].limited():
            verdict = {"predicted_fps": _predicted_fps(rp.options), "why": rp.why}
        first_link = next(iter(links), "")  # how the K-device frames went
    return _Measured(runs, stage_rows, efficiencies, live, (plans[0], plans[1], plans[2]),
                     predicted, verdict, first_link)


def _predicted_fps(options: list[Any]) -> dict[str, float]:
    """Device count -> the best predicted frames/s of a plan over that many devices."""
    out: dict[str, float] = {}
    for o in options:
        if o.runnable and o.name != "local":
            k = str(len(o.devices))
            out[k] = round(max(out.get(k, 0.0), o.throughput_fps), 2)
    return out


async def _time_batches(sess: Any, views: dict[str, _View], frames: list[dict[str, Any]],
                        args: argparse.Namespace, depth: int
                        ) -> tuple[dict[str, list[float]], list[list[float]], list[float],
                                   list[str]]:
    """``--repeats`` batches of ``--frames`` through every view in turn: (frames/s per batch
    per view, the K-device frames' stage ms, each K-device batch's efficiency, the links the
    K-device frames went over)."""
    devices_k = _devices(views["K"].plan())
    runs: dict[str, list[float]] = {name: [] for name in views}
    links: set[str] = set()
    stage_rows: list[list[float]] = []
    efficiencies: list[float] = []
    for r in range(args.repeats):
        for name, view in views.items():
            fps, stats = await _stream(sess, view, frames, args.frames, depth)
            runs[name].append(fps)
            if name == "K":
                done = [s for s in stats if s.devices == devices_k and s.fallback is None]
                batch = [_stage_ms(s) for s in done]
                links.update(s.link for s in done if s.link)
                stage_rows.extend(batch)
                if batch:  # this batch's throughput over its own bound: the load
                    # of a shared machine varies between batches
                    slowest = max(statistics.fmean(c) for c in zip(*batch, strict=True))
                    efficiencies.append(fps * slowest / 1000.0)
            progress(f"batch {r + 1}/{args.repeats} {name}: {fps:.1f} fps ({view.plan()})")
    return runs, stage_rows, efficiencies, sorted(links)


async def _realtime_runs(sess: Any, views: dict[str, _View], frames: list[dict[str, Any]],
                         args: argparse.Namespace) -> dict[str, Any]:
    """The K-device and 2-device pipelines fed by a real-time source at ``--rate``."""
    live: dict[str, Any] = {}
    for name, key in (("devices", "K"), ("two_devices", "2")):
        progress(f"real-time source at {args.rate:g} Hz: {name} ...")
        stages = 2 * len(views[key].plan().stages) - 1
        # a real-time pipeline holds one frame per stage: a deeper buffer
        # only delays the drops of a short run
        with views[key].limited():
            delivered = await realtime(functools.partial(sess.run, None), frames,
                                       2 * args.frames, args.rate, stages)
        live[name] = {"delivered_fraction": round(delivered, 3),
                      "effective_accuracy": round(delivered * args.accuracy, 4)}
    return live


def _report(args: argparse.Namespace, bundle: Any, ble: RadioLink | None, slow: list[float],
            hop_kbps: float, depth: int, m: _Measured) -> dict[str, Any]:
    """The bench's JSON result."""
    plan, two_plan, chosen = m.plans
    assert plan is not None and two_plan is not None and chosen is not None
    columns = list(zip(*m.stage_rows, strict=True)) if m.stage_rows else []
    # the mean is what bounds a stage's throughput (a median hides the slow frames)
    stage_ms = [round(statistics.fmean(c), 3) for c in columns]
    stage_median = [round(median(list(c)), 3) for c in columns]
    bound = 1000.0 / max(stage_ms) if stage_ms else float("nan")
    fps_k, fps_2, fps_c = (median(m.runs[n]) for n in ("K", "2", "chosen"))
    return {
        "model": Path(bundle.meta.get("source", {}).get("file", bundle.inputs[0].name)).stem,
        "devices": args.devices,
        "first_link": "ble" if m.first_link.startswith("ble:") else "tcp",
        **({"radio": {"preset": args.radio_preset,
                      "capacity_bps": round(ble.capacity_bps)}} if ble else {}),
        **({"profiles": [p.name for p in args.device_profiles]}
           if args.device_profiles else {}),
        "slowdowns": slow,
        "cuts": _cuts(plan),
        "stages": [str(s) for s in plan.stages],
        "stage_ms": stage_ms,
        "stage_ms_median": stage_median,
        "predicted_stage_ms": m.predicted_stage_ms,
        "bound_fps": round(bound, 2),
        "throughput_fps": round(fps_k, 2),
        "efficiency": round(median(m.efficiencies), 3) if m.efficiencies else None,
        "efficiency_pooled": round(fps_k / bound, 3) if bound == bound else None,
        "two_device_cuts": _cuts(two_plan),
        "two_device_fps": round(fps_2, 2),
        "speedup_vs_two_devices": round(fps_k / fps_2, 3),
        "planner": {"devices": len(chosen.stages), "cuts": _cuts(chosen),
                    "fps": round(fps_c, 2),
                    "vs_two_devices": round(fps_c / fps_2, 3),
                    "predicted_fps": m.verdict.get("predicted_fps"),
                    "why": m.verdict.get("why")},
        **({"realtime": {"rate_hz": args.rate, "accuracy": args.accuracy, **m.live}}
           if m.live else {}),
        "runs_fps": {"devices": [round(v, 2) for v in m.runs["K"]],
                     "two_devices": [round(v, 2) for v in m.runs["2"]],
                     "planner": [round(v, 2) for v in m.runs["chosen"]]},
        "settings": {"slowdown": args.slowdown, "bandwidth_kbps": args.bandwidth_kbps,
                     "hop_bandwidth_kbps": hop_kbps,
                     "latency_ms": args.latency_ms, "frames": args.frames,
                     "repeats": args.repeats, "depth": depth},
    }


@dataclasses.dataclass
class RadioLink:
    """A ``coinf radio`` process: the wearable's and helper 1's HCI specs, the pairing."""

    wearable_hci: str
    helper_hci: str
    capacity_bps: float
    passkey: int
    stop: Callable[[], None]

    @property
    def wearable_options(self) -> dict[str, Any]:
        return {"passkey": self.passkey, "pairing_window_s": math.inf}


def radio_link(args: argparse.Namespace) -> RadioLink:
    from coinf.ble_protocol.radio import preset, spawn

    wspec, hspec, stop = spawn(args.radio_preset)
    capacity = preset(args.radio_preset).capacity_bps()
    progress(f"radio process: preset {args.radio_preset}, ATT capacity "
             f"{capacity / 1000:.1f} kB/s each way")
    return RadioLink(wspec, hspec, capacity, secrets.randbelow(1_000_000), stop)


class _View:
    """One way to use a shared session's plan (its :class:`~coinf.wearable.replan.Replanner`
    ``rp``): at most ``max_devices`` devices, every one of them (``all_devices``) even where
    fewer would be faster, or neither: the planner's choice."""

    def __init__(self, rp: Any, max_devices: int | None = None,
                 all_devices: bool = False) -> None:
        self.rp, self.max_devices, self.all_devices = rp, max_devices, all_devices

    def plan(self) -> Any:
        with self.limited():
            return self.rp.plan

    @contextlib.contextmanager
    def limited(self) -> Iterator[None]:
        before = self.rp.max_devices, self.rp.all_devices
        self.rp.limit(self.max_devices, self.all_devices)
        try:
            yield
        finally:
            self.rp.limit(*before)


def _devices(plan: Any) -> tuple[str, ...]:
    return tuple(st.device for st in plan.stages)


def _cuts(plan: Any) -> list[str]:
    return [st.end for st in plan.stages[:-1]]


@contextlib.asynccontextmanager
async def helper_processes(bundle: Any, names: list[str], args: argparse.Namespace, tmp: Path,
                           max_pending: int, ble: RadioLink | None = None,
                           slow: list[float] | None = None, kbps: list[float] | None = None
                           ) -> AsyncIterator[list[Any]]:
    """One ``coinf handheld --pipeline`` process per helper on a free local port (``slow``:
    each one's slowdown, ``kbps``: the bandwidth of the link into it; default ``--slowdown``
    and ``--bandwidth-kbps``); with ``ble`` helper 1 is also the BLE central of the
    wearable's link."""
    import json
    import socket
    import subprocess
    import sys
    from types import SimpleNamespace

    ports = []
    for _ in names:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    slow = slow or [args.slowdown] * len(names)
    kbps = kbps or [args.bandwidth_kbps] * len(names)
    entries: list[dict[str, Any]] = [
        {"name": n, "address": f"tcp:127.0.0.1:{p}", "shape": True,
         "bandwidth_kbps": v, "latency_ms": args.latency_ms}
        for n, p, v in zip(names, ports, kbps, strict=True)]
    if ble is not None:
        entries[0]["wearable_link"] = f"ble:{ble.wearable_hci}"
    config = tmp / "pipeline.json"
    config.write_text(json.dumps({"helpers": entries}))
    procs: list[subprocess.Popen[str]] = []
    try:
        for i, n in enumerate(names):
            central = (["--listen", f"ble:{ble.helper_hci}", "--passkey-file",
                        write_passkey_file(tmp, ble.passkey), "--keystore",
                        str(tmp / "bonds" / "handheld.json")]
                       if ble is not None and i == 0 else [])
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "coinf", "handheld", "--bundle", str(bundle.root),
                 "--pipeline", str(config), "--name", n, "--slowdown", str(slow[i]),
                 "--threads", "1", "--max-pending", str(max_pending), *central],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
        for n, proc in zip(names, procs, strict=True):
            assert proc.stdout is not None
            line = await asyncio.to_thread(proc.stdout.readline)
            if "serving" not in line:
                raise RuntimeError(f"helper {n} did not start: {line!r}")
        progress(f"{len(procs)} helper processes serving")
        yield [SimpleNamespace(name=e["name"], address=e["address"],
                               wearable_link=e.get("wearable_link")) for e in entries]
    finally:
        stop_processes(procs)


def _stage_ms(stats: Any) -> list[float]:
    """One frame's stages in pipeline order: the wearable's compute, the link into the first
    helper, its compute, its hand-off to the next, ..., the last device's compute."""
    out = [stats.head_ms, stats.send_ms]
    for i, hop in enumerate(stats.hops):
        out.append(float(hop["compute_ms"]))
        if i < len(stats.hops) - 1:
            out.append(float(hop["send_ms"]))
    return out


async def _stream(sess: Any, view: _View, frames: list[dict[str, Any]], n: int, depth: int
                  ) -> tuple[float, list[Any]]:
    """Stream ``n`` frames through ``view``; (steady-state frames per second: results after
    the first over the time since the first, so filling the pipeline is not counted; per-frame
    stats)."""
    feeds = (frames[i % len(frames)] for i in range(n))
    stats: list[Any] = []
    first = last = 0.0
    with view.limited():
        async for frame in sess.astream(feeds, depth=depth):
            frame.value()  # a frame that failed outright fails the bench
            last = time.perf_counter()
            if not stats:
                first = last
            stats.append(frame.stats)
    return (len(stats) - 1) / max(last - first, 1e-9), stats
