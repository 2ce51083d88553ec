"""Packing times measured on a quiet machine, after calibration in parallel workers.

Workers calibrating candidates side by side (:mod:`convert.pool`) share this machine's cores,
caches and memory bandwidth, so the packing times they record in each row (``encode_ms``,
``decode_ms``) run slow: LZ4 of a 320x320 image input measured 10.2 ms in two workers
against 4.3 ms alone. The planner prices every packing from those times
(:func:`coinf.wearable.planner.codec_costs.codec_ms`), so :func:`retime` packs a few of the
data's inputs again in this one process once the workers are gone, exactly as the wearable
packs them (:func:`convert.packcal.tensor_specs`), and rewrites each row's times with the
median. A candidate whose head needs more than the data's feeds (a stateful model's state)
keeps its workers' times.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from coinf.ble_protocol.packing import PackSpec, pack, unpack
from coinf.convert.feeds import Dataset
from coinf.convert.packcal import Runner, tensor_specs

from coinf.bundle import Bundle

#: inputs packed per candidate, and times each is packed (the median of all of them is kept)
INPUTS = 4
REPEATS = 3


def retime(bundle: Bundle, data: Dataset, results: Mapping[str, list[dict[str, Any]]],
           inputs: int = INPUTS, repeats: int = REPEATS,
           progress: Callable[[str], None] | None = None) -> int:
    """Rewrite ``encode_ms``/``decode_ms`` of every timed row of ``results`` (candidate id ->
    its packing rows) with the median over ``inputs`` feeds x ``repeats``; the number of
    candidates retimed."""
    t0 = time.perf_counter()
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
                timed = _time_row(cand, row, crossings, repeats)
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
              repeats: int) -> tuple[float, float] | None:
    """(median encode ms, median decode ms) of one row's packing, or None for a row that was
    not timed or is no packing (a learned point's)."""
    if "encode_ms" not in row:
        return None
    try:
        uniform = PackSpec.parse(str(row.get("spec")))
    except ValueError:
        return None
    specs = tensor_specs(cand, uniform)
    enc: list[float] = []
    dec: list[float] = []
    for crossing in crossings:
        for _ in range(repeats):
            t0 = time.perf_counter()
            bodies = [pack(v, specs.get(n, uniform)) for n, v in crossing.items()]
            t1 = time.perf_counter()
            for body in bodies:
                unpack(body)
            enc.append(t1 - t0)
            dec.append(time.perf_counter() - t1)
    return round(1e3 * float(np.median(enc)), 4), round(1e3 * float(np.median(dec)), 4)
