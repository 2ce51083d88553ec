"""``coinf bench split MODEL``: time and peak memory of ``coinf split`` against ``onnx.load``.

Each measurement runs in a fresh child process (``sys.executable``) so its peak RSS
(``VmHWM``, imports included) belongs to that one job; ``onnx.load`` and the
split alternate, ``--repeats`` times each, and medians are reported. ``MODEL`` is an ONNX file, or
``vgg19`` / ``alexnet``: ImageNet-size models built with torch (models/large.py) into
``--models-dir`` when missing. Targets (issue 17): ``ratio = split_s / load_s <= 5`` and
``rss_ratio = peak_rss_bytes / model_bytes <= 3``; the split runs without ``--verify``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from coinf.cli import argtypes
from coinf.cli.bench import emit, median, options, progress
from coinf.errors import InputError

# Peak RSS: VmHWM of this process's memory map (reset by exec), not ru_maxrss, which Linux
# carries over from the parent across fork and exec (a parent that built VGG with torch would
# make every child look 3 GB big).
_PEAK = """
import resource
def peak():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
"""

_LOAD = _PEAK + """
import json, sys, time
import onnx
base = peak()
t = time.perf_counter()
m = onnx.load(sys.argv[1])
s = time.perf_counter() - t
print(json.dumps({"s": s, "maxrss": peak(), "base_rss": base, "nodes": len(m.graph.node)}))
"""

_SPLIT = _PEAK + """
import json, sys, time
from coinf.convert.split import split_model
base = peak()
t = time.perf_counter()
b = split_model(sys.argv[1], sys.argv[2], force=True)
s = time.perf_counter() - t
print(json.dumps({"s": s, "maxrss": peak(), "base_rss": base, "candidates": len(b.candidates),
                  "shared": "weights" in b.meta, "nodes": b.meta["stats"]["nodes"]}))
"""


def _child(code: str, *args: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter; its last stdout line is a JSON object."""
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise InputError(f"benchmark child failed (exit {proc.returncode}): {tail[0]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def resolve_model(name: str, models_dir: str | None) -> Path:
    """An existing ONNX file, or a large model (``vgg19``, ``alexnet``) built when missing."""
    from coinf.models.large import LARGE_MODELS, build_large

    path = Path(name)
    if path.is_file():
        return path
    if name in LARGE_MODELS:
        folder = Path(models_dir) if models_dir else Path(tempfile.gettempdir()) / "coinf-large"
        return build_large(name, folder, progress)
    raise InputError(f"{name}: no such model file; give an .onnx file or one of "
                     f"{', '.join(LARGE_MODELS)} (built with torch)")


def _bundle_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def run(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise InputError("--repeats must be >= 1")
    model = resolve_model(args.model, args.models_dir)
    size = model.stat().st_size
    loads: list[dict[str, Any]] = []
    splits: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="coinf-bench-split-", dir=args.tmp) as tmp:
        out = Path(tmp) / "bundle"
        for i in range(args.repeats):
            loads.append(_child(_LOAD, str(model)))
            splits.append(_child(_SPLIT, str(model), str(out)))
            progress(f"repeat {i + 1}/{args.repeats}: onnx.load {loads[-1]['s']:.2f} s, "
                     f"split {splits[-1]['s']:.2f} s, peak {splits[-1]['maxrss'] / 1e6:.0f} MB")
        bundle_bytes = _bundle_bytes(out)
        weights = out / "weights.bin"
        weights_bytes = weights.stat().st_size if weights.is_file() else 0
    load_s = median([r["s"] for r in loads])
    split_s = median([r["s"] for r in splits])
    peak = max(int(r["maxrss"]) for r in splits)
    emit({
        "model": model.name,
        "model_bytes": size,
        "nodes": splits[-1]["nodes"],
        "load_s": float(f"{load_s:.4g}"),
        "split_s": float(f"{split_s:.4g}"),
        "ratio": round(split_s / load_s, 2),
        "peak_rss_bytes": peak,
        "rss_ratio": round(peak / size, 2),
        "load_peak_rss_bytes": max(int(r["maxrss"]) for r in loads),
        "child_baseline_rss_bytes": int(median([r["base_rss"] for r in splits])),
        "candidates": splits[-1]["candidates"],
        "shared_weights": splits[-1]["shared"],
        "weights_bin_bytes": weights_bytes,
        "bundle_bytes": bundle_bytes,
        "repeats": args.repeats,
        "note": "medians of times; peak RSS is the max over repeats, each job in its own child "
                "process (VmHWM, interpreter and imports included); split without --verify",
        "targets": {"ratio": 5, "rss_ratio": 3},
    })
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL",
                        help="an .onnx file, or vgg19 / alexnet (ImageNet size, built with torch)")
    options.add_json(parser)
    options.add_repeats(parser, 3)
    parser.add_argument("--models-dir", default=None, type=argtypes.existing_dir,
                        help="where vgg19/alexnet are built or found (default: TMPDIR/coinf-large)")
    parser.add_argument("--tmp", default=None, type=argtypes.existing_dir,
                        help="folder for the bundles (default: TMPDIR)")
    parser.set_defaults(func=run)
