"""Packing times measured alone and cold, after calibration in parallel workers.

Workers calibrating candidates side by side (:mod:`convert.pool`) share this machine's cores,
caches and memory bandwidth, so the packing times they record in each row (``encode_ms``,
``decode_ms``) run slow: f32 + LZ4 of a 320x320 image input measured 10.2 ms in two workers
against 5.6 ms alone. The planner prices every packing from those times
(:func:`coinf.wearable.planner.codec_costs.codec_ms`), so :func:`retime` packs a few of the
data's inputs again in this one process once the workers are gone, exactly as the wearable
packs them (:func:`convert.packcal.tensor_specs`), and rewrites each row's times with the
median. Each packing and each unpacking is timed once per input with the caches flushed
first, as a device meets a fresh frame after its head ran (or a body just received): a
second packing of the same tensor, warm, takes half the time on a 64 kB waveform. A
candidate whose head needs more than the data's feeds (a stateful model's state) keeps its
workers' times.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from coinf.ble_protocol.packing import PackSpec, pack, unpack
from coinf.convert.feeds import Dataset
from coinf.convert.headtail import Runner
from coinf.convert.packcal import tensor_specs

from coinf.bundle import Bundle

#: inputs packed per candidate (the median of their times is kept)
INPUTS = 5
#: bytes written between timings to push the tensor and the codec's state out of the caches
#: (twice the largest last-level cache of the machines this runs on, 32 MB)
FLUSH_BYTES = 64 << 20


def retime(bundle: Bundle, data: Dataset, results: Mapping[str, list[dict[str, Any]]],
           inputs: int = INPUTS, flush_bytes: int = FLUSH_BYTES,
           progress: Callable[[str], None] | None = None) -> int:
    """Rewrite ``encode_ms``/``decode_ms`` of every timed row of ``results`` (candidate id ->
    its packing rows) with the median over ``inputs`` feeds, each timed cold (``flush_bytes``
    written before it); the number of candidates retimed."""
    t0 = time.perf_counter()
    scratch = np.empty(max(flush_bytes, 1), np.uint8)
    done = 0
    for cid, rows in results.items():
        cand = bundle.candidate(cid)
        runner = Runner(bundle, cand)
        feeds = [data.feed(i) for i in range(min(inputs, len(data)))]
        if not feeds or any(n not in feeds[0] for n in runner.head_inputs) \
                or any(n not in feeds[0] for n in runner.crossing if runner.head is None):
            continue
        crossings = [runner.run_head(f) for f in feeds]
        saved = cand.extra.get("packing")
        cand.extra["packing"] = rows  # tensor_specs reads the rows from the candidate
        try:
            for row in rows:
                timed = _time_row(cand, row, crossings, scratch)
                if timed is not None:
                    row["encode_ms"], row["decode_ms"] = timed
        finally:
            if saved is None:
                cand.extra.pop("packing", None)
            else:
                cand.extra["packing"] = saved
        done += 1
    if progress and done:
        progress(f"  packing timed again on a quiet machine: {done} candidates in "
                 f"{time.perf_counter() - t0:.0f} s")
    return done


def _time_row(cand: Any, row: dict[str, Any], crossings: list[dict[str, np.ndarray]],
              scratch: np.ndarray) -> tuple[float, float] | None:
    """(median encode ms, median decode ms) of one row's packing, each timed once per input
    with the caches flushed (``scratch`` written) before it; None for a row that was not
    timed or is no packing (a learned point's)."""
    if "encode_ms" not in row:
        return None
    try:
        uniform = PackSpec.parse(str(row.get("spec")))
    except ValueError:
        return None
    specs = tensor_specs(cand, uniform)
    enc: list[float] = []
    dec: list[float] = []
    for k, crossing in enumerate(crossings):
        scratch.fill(k & 0xFF)
        t0 = time.perf_counter()
        bodies = [pack(v, specs.get(n, uniform)) for n, v in crossing.items()]
        enc.append(time.perf_counter() - t0)
        scratch.fill(~k & 0xFF)
        t0 = time.perf_counter()
        for body in bodies:
            unpack(body)
        dec.append(time.perf_counter() - t0)
    return round(1e3 * float(np.median(enc)), 4), round(1e3 * float(np.median(dec)), 4)
