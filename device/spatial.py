"""Running a spatial plan: tile sub-graphs per worker, halos gathered and redistributed.

The coordinator keeps the whole feature map between groups (MeDNN's group owner): before a
group it cuts each worker's input region, halo included, out of the map; after it, each tile's
output goes back into its place. The layers after the spatial chain (FC, global pooling) run
as one slice on one device. :class:`SpatialModel` prepares every sub-graph once;
:meth:`SpatialModel.run` computes with a caller-supplied function per tile, so the same code
runs tiles in-process, or on other devices over the project's links.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
from coinf.convert.graph import Graph, load_graph
from coinf.convert.gtdp import Group, Worker, plan_groups
from coinf.convert.slicer import build_slice
from coinf.convert.spatial import Layer, Rect, input_region, spatial_chain, tile_model
from coinf.device.cancel import CancelToken
from coinf.device.emulation import DeviceEmulation

from coinf.errors import ErrorCode, ModelError, ProtocolError
from coinf.tile import Tile

TileFn = Callable[[int, Tile, np.ndarray], np.ndarray]
"""(worker index, tile, input region) -> output tile."""


def tile_of(i0: int, i1: int, r: Rect) -> Tile:
    """The tile of layers [i0, i1) whose output is rectangle ``r`` (its wire form)."""
    return Tile(i0, i1, r.r0, r.r1, r.c0, r.c1)


def check_tile(tile: Tile, chain_len: int) -> tuple[int, int, Rect]:
    """(i0, i1, output rect) of ``tile``; raise :class:`ModelError` unless it lies in a chain
    of ``chain_len`` layers and is not empty."""
    if not (0 <= tile.i0 < tile.i1 <= chain_len and tile.r0 < tile.r1 and tile.c0 < tile.c1):
        raise ModelError(f"{tile}: outside the chain of {chain_len} layers, or empty")
    return tile.i0, tile.i1, Rect(tile.r0, tile.r1, tile.c0, tile.c1)


def _session(model: bytes, threads: int) -> ort.InferenceSession:
    from coinf.device.sweep import session_options

    return ort.InferenceSession(model, session_options(threads),
                                providers=["CPUExecutionProvider"])


@dataclass
class SpatialPlan:
    """Groups of tiles for the chain; the layers after it on ``rest_worker`` (``rest_s``)."""

    strategy: str
    workers: list[Worker]
    groups: list[Group]
    rest_worker: int = 0
    rest_s: float = 0.0

    @property
    def est_s(self) -> float:
        """Predicted seconds of one inference: every group, then the rest."""
        return sum(g.est_s for g in self.groups) + self.rest_s

    @property
    def local_only(self) -> bool:
        """Every tile and the rest on worker 0 (the coordinator): "run it all here"."""
        return self.rest_worker == 0 and all(t.worker == 0 or t.out.empty()
                                             for g in self.groups for t in g.tiles)

    def describe(self) -> list[str]:
        lines = []
        for g in self.groups:
            tiles = ", ".join(f"{self.workers[t.worker].name}:{t.out.h}x{t.out.w}"
                              for t in g.tiles if not t.out.empty())
            lines.append(f"layers {g.i0}-{g.i1 - 1}: {tiles} (est {g.est_s * 1e3:.2f} ms)")
        return lines


class SpatialModel:
    """A model's spatial chain, its tile sub-graphs (built on demand, cached) and its rest."""

    def __init__(self, model: str | Path | Graph, threads: int = 1, max_tiles: int = 256) -> None:
        self.g = model if isinstance(model, Graph) else load_graph(model)
        from coinf.convert.cost import all_costs

        costs = all_costs(self.g)
        self.chain: list[Layer] = spatial_chain(self.g, [c.flops for c in costs])
        if not self.chain:
            raise ModelError(f"{self.g.path.name}: no spatial layers at its input (expected a "
                             f"4-D input read by Conv/Pool layers)")
        self.threads = threads
        self.max_tiles = max_tiles
        self._tiles: dict[Tile, ort.InferenceSession] = {}
        self._whole: ort.InferenceSession | None = None
        self.input = self.g.nodes[self.chain[0].node].inputs[0]
        self.chain_out = self.g.nodes[self.chain[-1].node].outputs[0]
        chain_nodes = {layer.node for layer in self.chain}
        rest = [n.index for n in self.g.nodes if n.dynamic and n.index not in chain_nodes]
        self.rest_flops = sum(costs[i].flops for i in rest)
        self.rest = (_session(build_slice(self.g, rest, [self.chain_out], self.g.outputs,
                                          "rest").SerializeToString(), threads)
                     if self.chain_out not in self.g.outputs else None)

    def plan(self, workers: Sequence[Worker], strategy: str = "fused") -> SpatialPlan:
        """Tiles per group, and the device for the layers after the chain: the one that
        finishes them first, counting the stitched map's trip to it and the outputs' back."""
        groups = plan_groups(self.chain, workers, strategy)
        sent = self.g.ttype(self.chain_out).nbytes + sum(self.g.ttype(o).nbytes
                                                          for o in self.g.outputs)
        times = []
        for i, w in enumerate(workers):
            link = (sent / w.bandwidth_bps + 2 * w.latency_s
                    if i and math.isfinite(w.bandwidth_bps) else 0.0)
            times.append(self.rest_flops / w.flops_per_s + link + (w.overhead_s if i else 0.0))
        best = min(range(len(workers)), key=lambda i: (times[i], i))
        return SpatialPlan(strategy, list(workers), groups, best, times[best])

    def tile_session(self, key: Tile) -> ort.InferenceSession:
        """The session of tile ``key`` (validated against the chain; LRU-bounded cache)."""
        sess = self._tiles.get(key)
        if sess is None:
            i0, i1, rect = check_tile(key, len(self.chain))
            name = f"tile_{i0}_{i1}_{rect.r0}_{rect.r1}_{rect.c0}_{rect.c1}"
            proto = tile_model(self.g, self.chain, i0, i1, rect, name=name)
            sess = _session(proto.SerializeToString(), self.threads)
            if len(self._tiles) >= self.max_tiles:
                self._tiles.pop(next(iter(self._tiles)))
            self._tiles[key] = sess
        return sess

    def region_shape(self, key: Tile, batch: int) -> tuple[int, int, int, int]:
        i0, i1, rect = check_tile(key, len(self.chain))
        region, _, _ = input_region(self.chain, i0, i1, rect)
        return batch, self.chain[i0].in_shape[0], region.h, region.w

    def run_tile(self, key: Tile, region: np.ndarray) -> np.ndarray:
        """Compute one tile from its input region, checking the region's shape first."""
        want = self.region_shape(key, region.shape[0] if region.ndim == 4 else -1)
        if region.shape != want or region.dtype != np.float32:
            raise ModelError(f"{key}: input region {region.shape} {region.dtype}, expected "
                             f"{want} float32")
        sess = self.tile_session(key)
        return np.asarray(sess.run(None, {sess.get_inputs()[0].name: region})[0])

    def jobs(self, x: np.ndarray, group: Group) -> list[tuple[int, Tile, np.ndarray, Rect]]:
        """(worker, tile, input region, output rect) for every non-empty tile of a group."""
        out = []
        for t in group.tiles:
            if t.out.empty():
                continue
            region, _, _ = input_region(self.chain, group.i0, group.i1, t.out)
            part = np.ascontiguousarray(x[:, :, region.r0:region.r1, region.c0:region.c1])
            out.append((t.worker, tile_of(group.i0, group.i1, t.out), part, t.out))
        return out

    def new_map(self, x: np.ndarray, group: Group) -> np.ndarray:
        c, h, w = self.chain[group.i1 - 1].out_shape
        return np.empty((x.shape[0], c, h, w), dtype=np.float32)

    @staticmethod
    def place(y: np.ndarray, key: Tile, rect: Rect, out: np.ndarray) -> None:
        """Put one tile's output into the map, refusing a tile of the wrong shape."""
        want = (y.shape[0], y.shape[1], rect.h, rect.w)
        if out.shape != want or out.dtype != np.float32:
            raise ModelError(f"{key} returned {out.dtype}{list(out.shape)}, expected "
                             f"float32{list(want)}")
        y[:, :, rect.r0:rect.r1, rect.c0:rect.c1] = out

    def run_whole(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The whole model in one session (a plan that keeps everything here)."""
        if self._whole is None:
            self._whole = _session(self.g.model.SerializeToString(), self.threads)
        names = [o.name for o in self._whole.get_outputs()]
        x = np.asarray(feed[self.input], dtype=np.float32)
        return dict(zip(names, self._whole.run(None, {self.input: x}), strict=True))

    def run_rest(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """The layers after the chain (one device), on the stitched chain output."""
        if self.rest is None:
            return {self.chain_out: x}
        names = [o.name for o in self.rest.get_outputs()]
        return dict(zip(names, self.rest.run(None, {self.chain_out: x}), strict=True))

    def run(self, feed: Mapping[str, np.ndarray], plan: SpatialPlan,
            tile_fn: TileFn | None = None) -> dict[str, np.ndarray]:
        """The model's outputs, every group's tiles computed by ``tile_fn`` (default: here)."""
        fn = tile_fn or (lambda _w, key, region: self.run_tile(key, region))
        x = np.asarray(feed[self.input], dtype=np.float32)
        for g in plan.groups:
            y = self.new_map(x, g)
            for worker, key, part, rect in self.jobs(x, g):
                self.place(y, key, rect, fn(worker, key, part))
            x = y
        return self.run_rest(x)


class TileRunner:
    """The helper's side: tiles of the bundle's model (TILE requests) and the layers after
    them (REST, ``tile=None``), their input checked against the tile's exact region shape
    before anything runs (the wire is untrusted). The :class:`SpatialModel` is built on the
    first request."""

    def __init__(self, model_path: str | Path, emulation: DeviceEmulation | None = None) -> None:
        self.model_path = Path(model_path)
        self.emulation = emulation or DeviceEmulation()
        self._model: SpatialModel | None = None
        self._lock = threading.Lock()

    @property
    def model(self) -> SpatialModel:
        with self._lock:
            if self._model is None:
                try:
                    self._model = SpatialModel(self.model_path, threads=self.emulation.threads)
                except ModelError as exc:
                    raise ProtocolError(ErrorCode.UNKNOWN_CANDIDATE,
                                        f"this model has no tiles: {exc}") from None
            return self._model

    def _parse(self, key: Tile) -> tuple[int, int, Rect]:
        try:
            return check_tile(key, len(self.model.chain))
        except ModelError as exc:
            raise ProtocolError(ErrorCode.UNKNOWN_CANDIDATE, str(exc)) from None

    def budget(self, key: Tile | None) -> int:
        """Bytes the tile's input region (``None``: the chain's output map) takes: the most a
        request for it may allocate."""
        if key is None:
            return self.model.g.ttype(self.model.chain_out).nbytes
        i0, i1, rect = self._parse(key)
        try:
            region, _, _ = input_region(self.model.chain, i0, i1, rect)
        except ModelError as exc:
            raise ProtocolError(ErrorCode.UNKNOWN_CANDIDATE, str(exc)) from None
        batch = self.model.g.ttype(self.model.input).shape[0]
        return batch * self.model.chain[i0].in_shape[0] * region.area * 4

    def run(self, key: Tile | None, feeds: Mapping[str, np.ndarray],
            cancel: CancelToken | None = None) -> tuple[dict[str, np.ndarray], float]:
        """(``{"tile": output}``, emulated seconds) for one tile; for ``None`` (REST) the
        model's outputs from the stitched map (``{"map": ...}``)."""
        if key is None:
            return self._run_rest(feeds, cancel)
        if set(feeds) != {"region"}:
            raise ProtocolError(ErrorCode.MALFORMED,
                                f"{key}: expected one tensor 'region', got {sorted(feeds)}")
        region = feeds["region"]
        try:
            batch = self.model.g.ttype(self.model.input).shape[0]
            want = self.model.region_shape(key, batch)
        except ModelError as exc:
            raise ProtocolError(ErrorCode.UNKNOWN_CANDIDATE, str(exc)) from None
        if region.shape != want or region.dtype != np.float32:
            raise ProtocolError(ErrorCode.MALFORMED, f"{key}: region is {region.dtype}"
                                f"{list(region.shape)}, expected float32{list(want)}")
        out, elapsed = self.emulation.timed(lambda: self.model.run_tile(key, region), cancel)
        return {"tile": out}, elapsed

    def _run_rest(self, feeds: Mapping[str, np.ndarray], cancel: CancelToken | None
                  ) -> tuple[dict[str, np.ndarray], float]:
        spec = self.model.g.ttype(self.model.chain_out)
        arr = feeds.get("map")
        if set(feeds) != {"map"} or arr is None or arr.shape != spec.shape \
                or arr.dtype != np.float32:
            got = {k: f"{v.dtype}{list(v.shape)}" for k, v in feeds.items()}
            raise ProtocolError(ErrorCode.MALFORMED, f"REST: expected one tensor 'map' "
                                f"float32{list(spec.shape)}, got {got}")
        return self.emulation.timed(lambda: self.model.run_rest(arr), cancel)
