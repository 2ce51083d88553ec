"""``coinf bench strategies``: local, depth split, pipeline and spatial partition predicted on
realistic device sets, per model x device set x link, by the planner's own cost model.

The wearable is the default Pi Zero 2 W profile, a laptop-class helper the default laptop
profile (docs/PLANNER.md, "Default profiles"; each device's FLOP/s is its profile's prediction
of the whole model, :func:`~coinf.wearable.planner.strategy.profile_speeds`). Two more helper
classes are estimates stated here: a **phone** at a quarter of the laptop (a mid-range phone's
big cores through onnxruntime) and a **Pi 4** at three times the wearable (Cortex-A72 at 1.5
GHz against the A53 at 1 GHz). Links: BLE 4.2 at 10, 20.5 (the ``pi-zero-2w`` radio preset)
and 36 kB/s with 15 ms one way; the Pi Zero 2 W's 2.4 GHz 802.11n Wi-Fi at 1 and 5 MB/s with
2 ms. Every helper gets the whole link (``spatial_ms``, the cost model's own assumption, which
favours spatial partition); ``spatial_shared_ms`` splits it between the helpers, as the
wearable's one radio does when it sends every tile of a group at once.

Spatial partition "wins" a row only when it beats the best plan the executor runs by more than
``--margin`` (the cost model's error; ``coinf bench spatial`` measures it against real runs).
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from coinf.cli import argtypes
from coinf.cli.bench import emit, options, progress
from coinf.errors import InputError, MissingDependency

#: helper classes: FLOP/s as a function of (wearable, laptop) profile speeds
CLASSES = {"laptop": lambda w, lap: lap, "phone": lambda w, lap: lap / 4,
           "pi4": lambda w, lap: 3 * w}
SETS = {"L": ("laptop",), "P": ("phone",), "L+P": ("laptop", "phone"),
        "L+L": ("laptop", "laptop"), "L+P+Pi4": ("laptop", "phone", "pi4"),
        "L+L+L": ("laptop", "laptop", "laptop")}
#: link name -> (B/s, one-way latency s)
LINKS = {"ble-10k": (10e3, 0.015), "ble-20k": (20.48e3, 0.015), "ble-36k": (36e3, 0.015),
         "wifi-1M": (1e6, 0.002), "wifi-5M": (5e6, 0.002)}
DEFAULT_MODELS = ("digitnet", "vgg", "resnet", "mobilenetv2", "wearcam", "vgg16-64",
                  "resnet_large", "mobilenetv2_imagenet")


def register(parser: argparse.ArgumentParser) -> None:
    options.add_json(parser)
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help="comma-separated: zoo names, NAME_large (built with torch), "
                             "pretrained names (coinf models list), vgg16-64 (bench spatial's "
                             "VGG), or ONNX files (default %(default)s; add vgg_large for "
                             "VGG-16 at 224 px: a 553 MB build)")
    parser.add_argument("--sets", default=",".join(SETS),
                        help=f"device sets (helpers besides the wearable): {', '.join(SETS)}")
    parser.add_argument("--links", default=",".join(LINKS),
                        help=f"links: {', '.join(LINKS)}")
    parser.add_argument("--objective", choices=["latency", "throughput"], default="latency",
                        help="what the cuts and the winner minimise (default %(default)s)")
    parser.add_argument("--margin", type=argtypes.number(0, 1), default=0.10,
                        help="spatial wins a row only when faster than the best runnable plan "
                             "by more than this fraction (default %(default)s)")
    options.add_png(parser, "every row's spatial plan against the best runnable one")
    parser.set_defaults(func=run)


def _pick(text: str, known: dict[str, Any], what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise InputError(f"--{what}: unknown {bad or 'nothing given'}; expected some of "
                         f"{', '.join(known)}")
    return names


def _model(name: str, tmp: Path) -> Path:
    """The ONNX file of ``name`` (built into ``tmp`` when it is not committed)."""
    from coinf.models import pretrained, zoo

    if name.endswith(".onnx"):
        path = Path(name)
        if not path.is_file():
            raise InputError(f"--models: {path}: no such file")
        return path
    if name == "vgg16-64":
        from coinf.cli.bench.spatial import _vgg16_64

        return _vgg16_64(tmp / "vgg16-64.onnx")
    if name in pretrained.PRETRAINED:
        return pretrained.build(name, tmp)
    large = name.endswith("_large")
    base = name.removesuffix("_large")
    try:
        zoo.spec_for(base)
    except Exception:
        raise InputError(f"--models: unknown model {name!r}") from None
    return zoo.build(base, tmp, large=True) if large else zoo.committed_path(base)


def _row(points: Any, spatial: Any, result: float, wear: float, lap: float, helpers: Sequence[str],
         link: tuple[float, float], objective: str, margin: float) -> dict[str, Any]:
    from coinf.wearable.planner.strategy import choose, compare

    names = ["wearable", *(f"{h}{i + 1}" for i, h in enumerate(helpers))]
    speeds = [wear, *(CLASSES[h](wear, lap) for h in helpers)]
    bw, lat = link
    n = len(helpers)
    options = compare(points, names, speeds, [bw] * n, [lat] * n, result, spatial, objective)
    shared = compare(points, names, speeds, [bw / n] * n, [lat] * n, result, spatial,
                     objective)[-1]
    by = {o.name: o for o in options}
    best, _ = choose([o for o in options if o.runnable], objective)
    sp = by["spatial"]

    def ms(o: Any) -> float | None:
        return round(o.latency_s * 1e3, 2) if o is not None and math.isfinite(o.latency_s) \
            else None

    if objective == "latency":
        ratio = sp.latency_s / best.latency_s
        ratio_shared = shared.latency_s / best.latency_s
    else:
        ratio = best.throughput_fps / max(sp.throughput_fps, 1e-12)
        ratio_shared = best.throughput_fps / max(shared.throughput_fps, 1e-12)
    return {
        "local_ms": ms(by["local"]), "split_ms": ms(by.get("depth split")),
        "pipeline_ms": ms(by.get("pipeline")), "spatial_ms": ms(sp),
        "spatial_shared_ms": ms(shared),
        "pipeline_fps": round(by["pipeline"].throughput_fps, 3) if "pipeline" in by else None,
        "best_runnable": best.name, "best_devices": best.devices,
        "winner": "spatial" if ratio < 1 - margin else best.name,
        "spatial_ratio": round(ratio, 3), "spatial_shared_ratio": round(ratio_shared, 3),
        "spatial_detail": sp.detail,
    }


def run(args: argparse.Namespace) -> int:
    from coinf.bundle import Bundle
    from coinf.convert.split import split_model
    from coinf.device.profile import DeviceProfile
    from coinf.device.spatial import SpatialModel
    from coinf.wearable.planner.pipeline_dp import cut_points
    from coinf.wearable.planner.planner import Planner
    from coinf.wearable.planner.strategy import profile_speeds
    from coinf.wearable.policy import load_policy

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models:
        raise InputError("--models: give at least one model")
    options.check_png(args.png)
    sets, links = _pick(args.sets, SETS, "sets"), _pick(args.links, LINKS, "links")
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="coinf-strategies-") as tmp:
        for name in models:
            t0 = time.perf_counter()
            try:
                src = _model(name, Path(tmp))
            except MissingDependency as exc:
                skipped[name] = str(exc)
                progress(f"{name}: skipped ({exc})")
                continue
            bundle: Bundle = split_model(src, Path(tmp) / f"b-{name}")
            planner = Planner(bundle, DeviceProfile.pi_zero_2w(), DeviceProfile.laptop(),
                              load_policy(None)[0])
            wear, lap = profile_speeds(planner)
            points = cut_points(bundle)
            spatial = SpatialModel(bundle.model_path)
            result = float(sum(t.nbytes for t in bundle.outputs))
            for set_name in sets:
                for link in links:
                    row = _row(points, spatial, result, wear, lap, SETS[set_name], LINKS[link],
                               args.objective, args.margin)
                    rows.append({"model": name, "gflop": round(points[-1].flops / 1e9, 3),
                                 "set": set_name, "link": link, **row})
            progress(f"{name}: {len(sets) * len(links)} rows ({time.perf_counter() - t0:.0f} s)")
    wins = [r for r in rows if r["winner"] == "spatial"]
    shared_wins = [r for r in rows if r["spatial_shared_ratio"] < 1 - args.margin]
    low = min(rows, key=lambda r: r["spatial_ratio"]) if rows else None
    verdict = (f"spatial partition wins {len(wins)} of {len(rows)} rows by more than "
               f"{args.margin:.0%} ({len(shared_wins)} on a shared medium)")
    if args.png:
        _plot(rows, models, args.margin, args.png)
    emit({**({"png": args.png} if args.png else {}),
          "objective": args.objective, "margin": args.margin,
          "profiles": {"wearable": "pi_zero_2w (default)", "laptop": "laptop (default)",
                       "phone": "laptop / 4 (estimate)", "pi4": "3 x wearable (estimate)"},
          "links": {k: {"bytes_per_s": v[0], "latency_ms": v[1] * 1e3} for k, v in LINKS.items()
                    if k in links},
          "verdict": verdict, "spatial_wins": len(wins), "spatial_wins_shared": len(shared_wins),
          "best_spatial_ratio": None if low is None else
          {k: low[k] for k in ("model", "set", "link", "spatial_ratio", "spatial_shared_ratio",
                               "best_runnable")},
          "skipped": skipped, "rows": rows})
    return 0


def _plot(rows: list[dict[str, Any]], models: list[str], margin: float, path: str) -> None:
    """Per model, every device set x link: the spatial plan's predicted latency over the best
    runnable plan's, each helper on its own link and all on one shared medium."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(models) + 2), 4.2))
    colours = dict(zip(LINKS, ("#3182bd", "#e6550d", "#31a354", "#756bb1"), strict=False))
    seen: set[str] = set()
    for i, model in enumerate(models):
        mine = [r for r in rows if r["model"] == model]
        for j, r in enumerate(mine):
            x = i + (j - len(mine) / 2) * 0.6 / max(len(mine), 1)
            for key, marker, word in (("spatial_ratio", "o", "own links"),
                                      ("spatial_shared_ratio", "x", "one shared medium")):
                label = f"{r['link']}, {word}"
                ax.scatter(x, r[key], marker=marker, s=14, color=colours.get(r["link"], "grey"),
                           label=None if label in seen else label)
                seen.add(label)
    ax.axhline(1 - margin, color="grey", ls="--", lw=1,
               label=f"spatial {margin:.0%} faster than the best runnable plan")
    ax.set_yscale("log")
    ax.set_xticks(range(len(models)), models, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("spatial latency / best runnable (predicted)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=6, ncol=2)
    ax.set_title("Does spatial partition pay? Each dot a device set x link", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
