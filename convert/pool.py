"""Calibrating several candidates at once: one worker process per CPU core.

Each candidate's packing table (:func:`convert.calibrate.calibrate_candidate`) is independent
of the others', so :func:`calibrate_many` runs them in parallel (``spawn``ed processes:
onnxruntime's threads do not survive ``fork``). A worker loads the bundle and the data itself,
re-parses the metric (a ``MODULE:FUNC`` metric is imported there) and returns its rows with the
entropy tables it fitted, which are registered here so that :func:`convert.calibrate.store`
finds them. Workers side by side slow each other's packing, so its times are measured again
here once they are done (:mod:`convert.packtime`). One core, or one candidate, runs in this
process.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from coinf.convert.metrics import Metric, parse_metric
from coinf.convert.packcal import Options

Job = tuple[str, Sequence[str]]  # candidate id, packings


def cores() -> int:
    """The CPU cores this process may use."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def calibrate_many(bundle_dir: Path, data_path: str | Path, jobs: Sequence[Job],
                   opts: Options, limit: int | None = None,
                   progress: Callable[[str], None] | None = None,
                   workers: int | None = None) -> dict[str, list[dict[str, Any]]]:
    """The packing tables of ``jobs`` on the feeds of ``data_path`` (its first ``limit``), in
    ``workers`` processes (default: one per core, at most one per job), in the jobs' order."""
    n = max(1, min(len(jobs), workers or cores()))
    t0 = time.perf_counter()
    say = progress or (lambda _: None)
    results: dict[str, list[dict[str, Any]]] = {}
    if n == 1:
        for cid, specs in jobs:
            results[cid], _ = _one(bundle_dir, data_path, limit, cid, tuple(specs), opts, False)
            say(f"  {cid}: {len(specs)} packings, {time.perf_counter() - t0:.0f} s so far")
        return results
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from coinf.ble_protocol import priors

    plain = replace(opts, metric=Metric(opts.metric.name, opts.metric.outputs))
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_one, bundle_dir, data_path, limit, cid, tuple(specs), plain,
                               True): cid for cid, specs in jobs}
        for fut in as_completed(futures):
            cid = futures[fut]
            results[cid], tables = fut.result()
            priors.register(tables)
            say(f"  {cid}: done after {time.perf_counter() - t0:.0f} s ({n} processes)")
    _retime(bundle_dir, data_path, limit, results, say)
    return {cid: results[cid] for cid, _ in jobs}


def _retime(bundle_dir: Path, data_path: str | Path, limit: int | None,
            results: dict[str, list[dict[str, Any]]], say: Callable[[str], None]) -> None:
    """The workers' packing times, measured again here alone (:mod:`convert.packtime`)."""
    from coinf.convert import calibrate as cal
    from coinf.convert.packtime import retime

    from coinf.bundle import Bundle

    bundle = Bundle.load(bundle_dir)
    retime(bundle, cal.load_dataset(str(data_path), bundle, limit), results, progress=say)


def _one(bundle_dir: Path, data_path: str | Path, limit: int | None, cid: str,
         specs: tuple[str, ...], opts: Options, worker: bool,
         ) -> tuple[list[dict[str, Any]], list[Any]]:
    """One candidate's rows, and (in a worker) the entropy tables they name."""
    from coinf.ble_protocol import priors
    from coinf.convert import calibrate as cal

    from coinf.bundle import Bundle

    bundle = Bundle.load(bundle_dir)
    data = cal.load_dataset(str(data_path), bundle, limit)
    if worker:
        opts = replace(opts, metric=parse_metric(opts.metric.name, opts.metric.outputs,
                                                 [t.name for t in bundle.outputs]))
    rows = cal.calibrate_candidate(bundle, bundle.candidate(cid), data, specs, opts)
    if not worker:
        return rows, []
    keys = {str(k) for r in rows if isinstance(r.get("priors"), dict)
            for k in r["priors"].values()}
    return rows, [t for t in (priors.lookup(k) for k in sorted(keys)) if t is not None]
