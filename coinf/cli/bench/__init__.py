"""Benchmarks behind ``coinf bench NAME``. Each prints one JSON object on stdout.

Timing goals live here, never in tests. Figures are medians over repeats, and comparisons are
ratios measured side by side (interleaved) in one run, because the machines are shared and noisy.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

# (bench name, module, help). Each module defines register(parser) which sets func.
BENCHES: list[tuple[str, str, str]] = [
    ("overhead", "overhead", "split head+tail in-process vs the whole model"),
    ("mincut", "mincut", "exact min-cut split search time on a ~1,700-node DAG"),
    ("predict", "predict",
     "plan regret of the latency predictors (goal: at most 0.02); slice accuracy next to "
     "measurement repeatability"),
    ("plan", "plan", "the planner's choice vs every candidate measured end to end"),
    ("plan-sweep", "plan_sweep", "bench plan over bundles x bandwidths x slowdowns"),
    ("split", "split", "coinf split of a big model: time and peak RSS vs onnx.load"),
    ("pack", "pack", "packing ratio vs accuracy per cut, codec MB/s, e2e on a Pi"),
    ("rate", "rate", "bytes vs task-quality loss: standard codecs on the input vs every cut"),
    ("map", "map", "where cooperation pays: every real model x link (BLE, BLE 2M, Wi-Fi) x "
     "objective, measured end to end, with the choice's regret"),
    ("entropy", "entropy", "ansN (rANS, calibrated priors) vs qN (LZ4) and qzN (zstd) per cut"),
    ("stream", "stream", "pipelined vs sequential streaming over an emulated radio"),
    ("link", "link", "goodput of the full BLE protocol over the emulated radio"),
    ("fuzz", "fuzz", "generated hostile inputs against every wire decoder"),
    ("spatial", "spatial", "MeDNN spatial partition of conv layers over N emulated devices"),
    ("strategies", "strategies", "local / split / pipeline / spatial predicted per model x "
     "realistic device set x link: does spatial partition ever pay?"),
    ("prune", "prune", "SMCD group-lasso pruning of the digit model: FLOPs, comm, accuracy"),
    ("pipeline", "pipeline", "a pipeline over K emulated devices vs two (DP split)"),
    ("compress", "compress", "autoencoder compressors (gamma 2/4/8) + packing at digit-CNN cuts"),
    ("faults", "faults", "inferences while the handheld or the radio is killed or stopped, or "
     "chunks are lost (library defaults, pi-zero-2w)"),
    ("runtime", "runtime", "onnxruntime vs LiteRT per slice of a bundle with TFLite slices"),
    ("memory", "memory", "each head's peak RSS measured vs the planner's prediction"),
    ("hostile", "hostile", "memory a hostile peer costs: a huge RESULT (wearable), slow "
     "connections (helper)"),
    ("walk", "walk", "one split frame and one 3-device pipeline frame traced through coinf's "
     "modules: calls, cross-module calls, package crossings, re-entries, threads"),
    ("fleet", "fleet", "N emulated wearables streaming to one tail service (batches on Ray "
     "Serve) vs one coinf handheld daemon each: throughput, p50/p99, CPU per frame"),
    ("attack", "attack", "attackers (unpaired client, squatter, connection flood...) against "
     "real daemons: served, tensors read, results accepted, lockout"),
]


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def emit(result: dict[str, Any]) -> None:
    """Print a benchmark result as one JSON object (the contract of every ``coinf bench``)."""
    json.dump(result, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")
    sys.stdout.flush()


def stop_processes(procs: Iterable[subprocess.Popen[Any]], timeout: float = 10.0) -> None:
    """Terminate every helper process a bench started, then wait; kill what does not stop."""
    procs = list(procs)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def progress(message: str) -> None:
    """Progress goes to stderr so stdout stays pure JSON."""
    print(message, file=sys.stderr, flush=True)


async def realtime(run: Callable[[Any], Awaitable[Any]], frames: list[Any], n: int, rate: float,
                   depth: int) -> float:
    """Feed ``run`` a frame every 1/rate s; one that finds ``depth`` frames in flight is
    dropped (paper 002, §III: a dropped frame counts as misclassified). The fraction
    delivered."""
    import asyncio

    loop = asyncio.get_running_loop()
    inflight: set[asyncio.Future[Any]] = set()
    dropped = 0
    t0 = loop.time()
    for i in range(n):
        await asyncio.sleep(max(t0 + i / rate - loop.time(), 0.0))
        if len(inflight) >= depth:
            dropped += 1
            continue
        task = asyncio.ensure_future(run(frames[i % len(frames)]))
        inflight.add(task)
        task.add_done_callback(inflight.discard)
    await asyncio.gather(*inflight)
    return (n - dropped) / n
