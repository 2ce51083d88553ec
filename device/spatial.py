"""Running a spatial plan: tile sub-graphs per worker, halos gathered and redistributed.

The coordinator keeps the whole feature map between groups (MeDNN's group owner): before a
group it cuts each worker's input region, halo included, out of the map; after it, each tile's
output goes back into its place. The layers after the spatial chain (FC, global pooling) run
as one slice on one device. :class:`SpatialModel` prepares every sub-graph once;
:meth:`SpatialModel.run` computes with a caller-supplied function per tile, so the same code
runs tiles in-process, or on other devices over the project's links.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
from coinf.convert.graph import Graph, load_graph
from coinf.convert.gtdp import Group, Worker, plan_groups
from coinf.convert.slicer import build_slice
from coinf.convert.spatial import Layer, Rect, input_region, spatial_chain, tile_model

from coinf.errors import ModelError

TileFn = Callable[[int, str, np.ndarray], np.ndarray]
"""(worker index, tile key, input region) -> output tile."""


def tile_key(i0: int, i1: int, r: Rect) -> str:
    """The wire name of a tile: ``sp:I0-I1:R0-R1:C0-C1`` (layers, output rows, columns)."""
    return f"sp:{i0}-{i1}:{r.r0}-{r.r1}:{r.c0}-{r.c1}"


def parse_tile_key(key: str, chain_len: int) -> tuple[int, int, Rect]:
    """Inverse of :func:`tile_key`; raise :class:`ModelError` for anything malformed."""
    parts = key.split(":")
    try:
        if len(parts) != 4 or parts[0] != "sp":
            raise ValueError
        (i0, i1), (r0, r1), (c0, c1) = (tuple(int(v) for v in p.split("-", 1)) for p in parts[1:])
    except ValueError:
        raise ModelError(f"bad tile name {key[:60]!r}; expected sp:I0-I1:R0-R1:C0-C1") from None
    if not 0 <= i0 < i1 <= chain_len:
        raise ModelError(f"tile {key[:60]!r}: layers outside the chain of {chain_len}")
    return i0, i1, Rect(r0, r1, c0, c1)


def _session(model: bytes, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


@dataclass
class SpatialPlan:
    strategy: str
    workers: list[Worker]
    groups: list[Group]

    @property
    def est_s(self) -> float:
        return sum(g.est_s for g in self.groups)

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

        self.chain: list[Layer] = spatial_chain(self.g, [c.flops for c in all_costs(self.g)])
        if not self.chain:
            raise ModelError(f"{self.g.path.name}: no spatial layers at its input (expected a "
                             f"4-D input read by Conv/Pool layers)")
        self.threads = threads
        self.max_tiles = max_tiles
        self._tiles: dict[str, ort.InferenceSession] = {}
        self.input = self.g.nodes[self.chain[0].node].inputs[0]
        self.chain_out = self.g.nodes[self.chain[-1].node].outputs[0]
        chain_nodes = {layer.node for layer in self.chain}
        rest = [n.index for n in self.g.nodes if n.dynamic and n.index not in chain_nodes]
        self.rest = (_session(build_slice(self.g, rest, [self.chain_out], self.g.outputs,
                                          "rest").SerializeToString(), threads)
                     if self.chain_out not in self.g.outputs else None)

    def plan(self, workers: Sequence[Worker], strategy: str = "fused") -> SpatialPlan:
        return SpatialPlan(strategy, list(workers), plan_groups(self.chain, workers, strategy))

    def tile_session(self, key: str) -> ort.InferenceSession:
        """The session of tile ``key`` (validated against the chain; LRU-bounded cache)."""
        sess = self._tiles.get(key)
        if sess is None:
            i0, i1, rect = parse_tile_key(key, len(self.chain))
            proto = tile_model(self.g, self.chain, i0, i1, rect, name=key.replace(":", "_"))
            sess = _session(proto.SerializeToString(), self.threads)
            if len(self._tiles) >= self.max_tiles:
                self._tiles.pop(next(iter(self._tiles)))
            self._tiles[key] = sess
        return sess

    def region_shape(self, key: str, batch: int) -> tuple[int, int, int, int]:
        i0, i1, rect = parse_tile_key(key, len(self.chain))
        region, _, _ = input_region(self.chain, i0, i1, rect)
        return batch, self.chain[i0].in_shape[0], region.h, region.w

    def run_tile(self, key: str, region: np.ndarray) -> np.ndarray:
        """Compute one tile from its input region, checking the region's shape first."""
        want = self.region_shape(key, region.shape[0] if region.ndim == 4 else -1)
        if region.shape != want or region.dtype != np.float32:
            raise ModelError(f"tile {key}: input region {region.shape} {region.dtype}, expected "
                             f"{want} float32")
        sess = self.tile_session(key)
        return np.asarray(sess.run(None, {sess.get_inputs()[0].name: region})[0])

    def run(self, feed: Mapping[str, np.ndarray], plan: SpatialPlan,
            tile_fn: TileFn | None = None) -> dict[str, np.ndarray]:
        """The model's outputs, every group's tiles computed by ``tile_fn`` (default: here)."""
        fn = tile_fn or (lambda _w, key, region: self.run_tile(key, region))
        x = np.asarray(feed[self.input], dtype=np.float32)
        for g in plan.groups:
            c, h, w = self.chain[g.i1 - 1].out_shape
            y = np.empty((x.shape[0], c, h, w), dtype=np.float32)
            for t in g.tiles:
                if t.out.empty():
                    continue
                key = tile_key(g.i0, g.i1, t.out)
                region, _, _ = input_region(self.chain, g.i0, g.i1, t.out)
                part = np.ascontiguousarray(x[:, :, region.r0:region.r1, region.c0:region.c1])
                out = fn(t.worker, key, part)
                if out.shape != (x.shape[0], c, t.out.h, t.out.w):
                    raise ModelError(f"tile {key} returned {out.shape}, expected "
                                     f"{(x.shape[0], c, t.out.h, t.out.w)}")
                y[:, :, t.out.r0:t.out.r1, t.out.c0:t.out.c1] = out
            x = y
        if self.rest is None:
            return {self.chain_out: x}
        names = [o.name for o in self.rest.get_outputs()]
        return dict(zip(names, self.rest.run(None, {self.chain_out: x}), strict=True))
