"""Spatial partition over several devices (MeDNN): this device coordinates, helpers compute tiles.

A benchmark, not part of the runtime: ``coinf bench spatial`` runs it, and ``coinf bench
strategies`` shows why a Session never does (on realistic device sets the planner's own cost
model never has it beat the best local / split / pipeline plan by more than its error;
docs/SPATIAL.md, docs/BENCHMARKS.md).

The wearable holds the feature map between layer groups, like MeDNN's group owner. For each
group it cuts every worker's input region, halo included, out of the map. Its own tiles run
here, on a worker thread. A helper's tile goes out as a TILE request (layers, rows, columns;
docs/PROTOCOL.md §6.10) over that helper's link. Every helper runs the ordinary handheld
daemon, which builds the tile's sub-graph from its own copy of the bundle's model and checks
the region's shape before running.
All tiles of a group run at once. The outputs are checked and stitched, and the next group
starts. The layers after the spatial chain run on the device the plan says finishes them
first (the fastest, unless sending it the map costs more than it saves).

Every request is bounded by ``timeout``, and every reply by the largest valid answer to it
(a tile's or the outputs' RESULT bound). Every helper's reply is checked like a split's result
(:func:`~coinf.wearable.frame.validate_result`): a tile must be exactly ``{"tile": float32 of
the tile's shape}`` and finite, the outputs of the REST request exactly the model's, finite.
A helper that dies, times out, answers ERROR or answers anything else is a transient fault of that
helper: the group's other requests are cancelled, the helper is dropped and (with ``fallback``,
the default) the frame is computed again without it, down to this device alone; nothing it
sent reaches the caller. Only configuration faults (protocol version, bundle mismatch, missing
encryption) raise, as in a split. Without ``fallback`` the helper's error is raised.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from coinf.ble_protocol.messages import MsgType, result_bound
from coinf.ble_protocol.request import (
    Kind,
    Request,
    Tile,
    decode_result,
    encode_request,
    new_nonce,
)
from coinf.ble_protocol.tensors import decode_tensors, encode_tensors
from coinf.ble_protocol.transport import Connector
from coinf.convert.gtdp import Worker
from coinf.device.emulation import DeviceEmulation
from coinf.device.spatial import SpatialModel, SpatialPlan
from coinf.wearable.connection import Connection
from coinf.wearable.frame import check_feed, validate_result
from coinf.wearable.frame import result_bound as outputs_bound

from coinf.bundle import Bundle
from coinf.errors import ErrorCode, InputError, LinkError, PeerResultError, ProtocolError

log = logging.getLogger(__name__)
#: a helper's errors that are configuration faults (raised, as in a split), not its failure
CONFIG_CODES = frozenset({ErrorCode.BAD_VERSION, ErrorCode.BUNDLE_MISMATCH,
                          ErrorCode.INSUFFICIENT_ENCRYPTION})
Check = Callable[[dict[str, np.ndarray]], Any]


@dataclass
class TileHelper:
    """A device that computes tiles for this one, reached through ``connector``."""

    worker: Worker
    connector: Connector


@dataclass
class SpatialStats:
    """One inference: wall time, and how much of it was the slowest tile's compute."""

    total_ms: float = 0.0
    compute_ms: float = 0.0
    comm_ms: float = 0.0
    groups: int = 0
    replans: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    workers: list[str] = field(default_factory=list)
    #: why the outputs were computed here after all (helpers' tiles gave a non-finite result)
    fallback: str | None = None
    #: per group: (wall ms, each tile's compute ms in plan order)
    per_group: list[tuple[float, list[float]]] = field(default_factory=list)


def _encode(key: Tile | None, name: str, arr: np.ndarray, nonce: int) -> bytes:
    """A TILE request (``key``) or the REST request (``None``). Tiles travel raw: float
    feature maps barely compress losslessly, and on a Wi-Fi-class link the codec would cost
    more time than the bytes it saves."""
    request = Request(Kind.REST, nonce=nonce) if key is None else Request.for_tile(key, nonce)
    return encode_request(request, encode_tensors({name: arr}))


class SpatialSession:
    """``async with SpatialSession(bundle, me, helpers) as s: outputs, stats = await s.run(feed)``.

    ``me`` describes this device (its speed; its link is infinite). ``strategy`` is GTDP's
    grouping (``fused``, ``per-layer`` or ``whole``; see :mod:`coinf.convert.gtdp`).
    ``fallback``: a failing helper is dropped and the frame computed without it (else raised).
    """

    def __init__(self, bundle: Bundle, me: Worker, helpers: Sequence[TileHelper], *,
                 strategy: str = "fused", emulation: DeviceEmulation | None = None,
                 timeout: float = 10.0, connect_timeout: float = 5.0,
                 fallback: bool = True) -> None:
        if timeout <= 0:
            raise InputError(f"timeout must be > 0 s, got {timeout}")
        self.bundle = bundle
        self.model = SpatialModel(bundle.model_path,
                                  threads=(emulation or DeviceEmulation()).threads)
        self.me = me
        self.helpers = list(helpers)
        self.strategy = strategy
        self.emulation = emulation or DeviceEmulation()
        self.timeout = timeout
        self.fallback = fallback
        self._outputs_bound = outputs_bound(bundle)
        self._conns = [Connection(h.connector, bundle.identity, connect_timeout=connect_timeout,
                                  reconnect_timeout=connect_timeout, request_timeout=timeout,
                                  max_backoff_s=5.0) for h in self.helpers]
        self._alive = [True] * len(self.helpers)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="coinf-tile")
        self._plan: SpatialPlan | None = None

    async def __aenter__(self) -> SpatialSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for c in self._conns:
            await c.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- planning -------------------------------------------------------------------------------
    def workers(self) -> tuple[list[Worker], list[int]]:
        """The live workers (this device first) and each one's helper index (-1 = here)."""
        ws, idx = [self.me], [-1]
        for i, h in enumerate(self.helpers):
            if self._alive[i]:
                ws.append(h.worker)
                idx.append(i)
        return ws, idx

    def plan(self) -> SpatialPlan:
        if self._plan is None:
            ws, _ = self.workers()
            self._plan = self.model.plan(ws, self.strategy)
        return self._plan

    # -- running --------------------------------------------------------------------------------
    async def run(self, feed: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray],
                                                                 SpatialStats]:
        """The model's outputs for ``feed``; a helper that fails is dropped and the frame rerun."""
        feed = check_feed(self.bundle, feed)  # names, dtypes, shapes: once, before any work
        replans = 0
        while True:
            try:
                outputs, stats = await self._run_once(feed)
                stats.replans = replans
                return outputs, stats
            except _HelperFailed as exc:
                if not self.fallback:
                    raise exc.cause from None
                log.warning("helper %s failed (%s); re-planning without it",
                            self.helpers[exc.helper].worker.name, exc.cause)
                self._alive[exc.helper] = False
                await self._conns[exc.helper].close()
                self._plan = None
                replans += 1

    async def _run_once(self, feed: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray],
                                                                       SpatialStats]:
        plan = self.plan()
        _, owner = self.workers()
        stats = SpatialStats(workers=[w.name for w in plan.workers])
        t_start = time.perf_counter()
        x = feed[self.model.input]
        if plan.local_only:  # nothing pays off elsewhere: one run of the whole model here
            outputs, local_s = await asyncio.get_running_loop().run_in_executor(
                self._pool, self.emulation.timed, lambda: self.model.run_whole(feed))
            stats.compute_ms = stats.total_ms = local_s * 1e3
            return outputs, stats
        for g in plan.groups:
            y = self.model.new_map(x, g)
            jobs = self.model.jobs(x, g)
            t_group = time.perf_counter()
            computes = await self._group(jobs, y, owner, stats)
            stats.per_group.append(((time.perf_counter() - t_group) * 1e3,
                                    [round(c * 1e3, 2) for c in computes]))
            stats.compute_ms += max(computes) * 1e3
            stats.groups += 1
            x = y
        fastest = plan.rest_worker  # the device that finishes the rest first (plan)
        if owner[fastest] < 0:
            outputs, rest_s = await asyncio.get_running_loop().run_in_executor(
                self._pool, self.emulation.timed, lambda: self.model.run_rest(x))
            if stats.bytes_received:  # helpers' tiles went into it: the split's result check
                outputs = await self._checked_final(feed, outputs, stats)
        else:
            outputs, rest_s = await self._remote(owner[fastest], None, "map", x, stats,
                                                 self.bundle_outputs_bytes(), self._outputs_bound,
                                                 self._check_outputs)
        stats.compute_ms += rest_s * 1e3
        stats.total_ms = (time.perf_counter() - t_start) * 1e3
        stats.comm_ms = max(stats.total_ms - stats.compute_ms, 0.0)
        return outputs, stats

    async def _group(self, jobs: list[Any], y: np.ndarray, owner: list[int],
                     stats: SpatialStats) -> list[float]:
        loop = asyncio.get_running_loop()

        async def one(worker: int, key: Tile, part: np.ndarray,
                      rect: Any) -> tuple[np.ndarray, float]:
            if owner[worker] < 0:
                out, s = await loop.run_in_executor(
                    self._pool, self.emulation.timed, lambda: self.model.run_tile(key, part))
                return out, s
            want = (y.shape[0], y.shape[1], rect.h, rect.w)
            budget = int(np.prod(want)) * 4
            res, s = await self._remote(owner[worker], key, "region", part, stats, budget,
                                        result_bound([("tile", 4, budget)]),
                                        lambda r: _check_tile(key, want, r))
            return res, s

        tasks = [asyncio.ensure_future(one(w, key, part, rect)) for w, key, part, rect in jobs]
        try:
            results = await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        for (_w, key, _p, rect), (out, _s) in zip(jobs, results, strict=True):
            self.model.place(y, key, rect, out)
        return [s for _, s in results]

    async def _remote(self, helper: int, key: Tile | None, name: str, arr: np.ndarray,
                      stats: SpatialStats, max_bytes: int, max_reply: int,
                      check: Check) -> tuple[Any, float]:
        """One REQUEST to a helper: (its checked result, the helper's compute seconds). Any
        fault of the helper's is :class:`_HelperFailed`; a configuration fault is raised."""
        try:
            rpc = await self._conns[helper].client()
            nonce = new_nonce()
            payload = _encode(key, name, arr, nonce)
            stats.bytes_sent += len(payload)
            reply = await rpc.request(MsgType.REQUEST, payload, self.timeout,
                                      max_reply=max_reply)
            stats.bytes_received += len(reply.payload)
            (hop,), blob = decode_result(reply.payload, 1, nonce)
            try:
                res = decode_tensors(blob, max_bytes=max_bytes)
            except ProtocolError as exc:
                raise PeerResultError(f"{key or 'REST'}: result does not decode: {exc}") \
                    from None
            return check(res), hop.compute_us / 1e6
        except LinkError as exc:
            if isinstance(exc, ProtocolError) and exc.code in CONFIG_CODES:
                raise
            raise _HelperFailed(helper, exc) from exc

    def bundle_outputs_bytes(self) -> int:
        return sum(self.model.g.ttype(o).nbytes for o in self.model.g.outputs)

    def _check_outputs(self, res: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A helper's outputs (REST): exactly the model's, finite (a split's check)."""
        try:
            return validate_result(self.bundle, res)
        except PeerResultError as exc:
            raise PeerResultError(f"REST: {exc.text}") from None

    async def _checked_final(self, feed: Mapping[str, np.ndarray],
                             outputs: dict[str, np.ndarray],
                             stats: SpatialStats) -> dict[str, np.ndarray]:
        """Outputs computed here from helpers' (checked) tiles must still pass the split's
        check; if they do not, no single helper is to blame: the frame is computed here whole
        (with ``fallback``; else :class:`PeerResultError`)."""
        try:
            return validate_result(self.bundle, outputs)
        except PeerResultError as exc:
            if not self.fallback:
                raise
            log.warning("outputs from helpers' tiles rejected (%s); computing the frame here",
                        exc.text)
            stats.fallback = f"outputs from helpers' tiles rejected: {exc.text}"
            whole, s = await asyncio.get_running_loop().run_in_executor(
                self._pool, self.emulation.timed, lambda: self.model.run_whole(feed))
            stats.compute_ms += s * 1e3
            return dict(whole)


def _check_tile(key: Tile, want: tuple[int, ...], res: Mapping[str, np.ndarray]) -> np.ndarray:
    """A helper's tile: exactly one tensor ``tile``, float32 of the tile's shape, finite."""
    if set(res) != {"tile"}:
        raise PeerResultError(f"{key}: result holds {sorted(res)}, expected ['tile']")
    out = res["tile"]
    if out.dtype != np.float32 or out.shape != want:
        raise PeerResultError(f"{key} is {out.dtype}{list(out.shape)}, expected "
                              f"float32{list(want)}")
    if not np.isfinite(out).all():
        raise PeerResultError(f"{key} has NaN or infinite values")
    return out


class _HelperFailed(Exception):
    def __init__(self, helper: int, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.helper = helper
        self.cause = cause
