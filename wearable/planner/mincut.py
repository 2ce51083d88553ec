"""Exact latency-optimal cut of a general DAG by minimum s-t cut (DADS-style).

The wearable holds the graph inputs; it runs a *downward-closed* set W of nodes (every
predecessor of a node in W is in W), sends every tensor produced in W (or a graph input) that some
node outside W consumes -- each tensor once, however many consumers it has -- and the handheld
runs the rest and sends back the graph outputs it produced. Latency (sequential, no overlap)::

    sum_{v in W} w(v) + sum_{v not in W} h(v) + sum_{crossing tensors x} up(x)
      + sum_{outputs produced outside W} down(x)

Flow network (source s = wearable, sink t = handheld):

* ``s -> v`` with capacity ``h(v) + down(outputs of v)``: cut when v runs on the handheld;
* ``v -> t`` with capacity ``w(v)``: cut when v runs on the wearable;
* one auxiliary node ``a_x`` per tensor with several consumers: ``producer -> a_x`` with
  ``up(x)`` (``s -> a_x`` for a graph input) and ``a_x -> consumer`` with infinite capacity, so
  ``up(x)`` is paid exactly once when the producer is on the wearable and at least one consumer
  is not; a tensor with one consumer needs no auxiliary node (``producer -> consumer``);
* ``consumer -> producer`` with infinite capacity for every dependency: the wearable side is
  downward-closed.

Each node pays exactly one of its two times, so ``min(w, h)`` is taken off both edges (a constant
that does not move the cut, but shortens the max-flow). Capacities are integers (microseconds,
scaled down if the sum would not fit in int32) because
:func:`scipy.sparse.csgraph.maximum_flow` only takes integers.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

_INT32_MAX = 2**31 - 1
#: scipy's max-flow algorithm; Edmonds-Karp was faster than Dinic on CNN-like DAGs (see
#: ``coinf bench mincut --method``)
FLOW_METHOD = "edmonds_karp"


@dataclass(frozen=True)
class DagNode:
    """A compute node with its time on each side (ms)."""

    name: str
    wearable_ms: float
    handheld_ms: float


@dataclass(frozen=True)
class DagTensor:
    """A tensor: ``producer`` is a node name or ``None`` for a graph input (on the wearable)."""

    name: str
    producer: str | None
    consumers: tuple[str, ...]
    nbytes: int
    is_output: bool = False


@dataclass
class Dag:
    """An ONNX-independent DAG description. Build with :meth:`add_node` / :meth:`add_tensor`."""

    nodes: list[DagNode] = field(default_factory=list)
    tensors: list[DagTensor] = field(default_factory=list)

    def add_node(self, name: str, wearable_ms: float, handheld_ms: float) -> None:
        self.nodes.append(DagNode(name, float(wearable_ms), float(handheld_ms)))

    def add_tensor(self, name: str, producer: str | None, consumers: Iterable[str], nbytes: int,
                   is_output: bool = False) -> None:
        self.tensors.append(DagTensor(name, producer, tuple(consumers), int(nbytes), is_output))

    def validate(self) -> None:
        """Raise ValueError on unknown node names, negative costs or a cycle."""
        names = {n.name for n in self.nodes}
        if len(names) != len(self.nodes):
            raise ValueError("duplicate node names in the DAG")
        for n in self.nodes:
            if n.wearable_ms < 0 or n.handheld_ms < 0:
                raise ValueError(f"node {n.name}: negative compute time")
        for t in self.tensors:
            if t.producer is not None and t.producer not in names:
                raise ValueError(f"tensor {t.name}: unknown producer {t.producer!r}")
            for c in t.consumers:
                if c not in names:
                    raise ValueError(f"tensor {t.name}: unknown consumer {c!r}")
            if t.nbytes < 0:
                raise ValueError(f"tensor {t.name}: negative size")
        topo_order(self)  # raises on a cycle

    def predecessors(self) -> dict[str, set[str]]:
        preds: dict[str, set[str]] = {n.name: set() for n in self.nodes}
        for t in self.tensors:
            if t.producer is not None:
                for c in t.consumers:
                    if c != t.producer:
                        preds[c].add(t.producer)
        return preds


def topo_order(dag: Dag) -> list[str]:
    preds = dag.predecessors()
    succs: dict[str, set[str]] = {n: set() for n in preds}
    for v, ps in preds.items():
        for p in ps:
            succs[p].add(v)
    indeg = {v: len(ps) for v, ps in preds.items()}
    ready = [n.name for n in dag.nodes if indeg[n.name] == 0]
    order: list[str] = []
    while ready:
        v = ready.pop()
        order.append(v)
        for s in succs[v]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    if len(order) != len(preds):
        raise ValueError("the graph has a cycle; a cut needs a DAG")
    return order


@dataclass
class CutResult:
    """The wearable-side node set, its latency (ms) and the tensors that cross."""

    wearable: frozenset[str]
    latency_ms: float
    crossing: tuple[str, ...]


def cut_latency(dag: Dag, wearable: Iterable[str], up_ms: Mapping[str, float],
                down_ms: Mapping[str, float]) -> tuple[float, tuple[str, ...]]:
    """Latency of a given wearable set (see module docstring) and its crossing tensors."""
    w = set(wearable)
    total = sum(n.wearable_ms if n.name in w else n.handheld_ms for n in dag.nodes)
    crossing = []
    for t in dag.tensors:
        on_wearable = t.producer is None or t.producer in w
        if on_wearable and any(c not in w for c in t.consumers):
            total += up_ms.get(t.name, 0.0)
            crossing.append(t.name)
        if t.is_output and t.producer is not None and t.producer not in w:
            total += down_ms.get(t.name, 0.0)
    return total, tuple(crossing)


def transfer_costs(dag: Dag, bandwidth_bps: float, rtt_ms: float = 0.0,
                   down_bandwidth_bps: float | None = None) -> tuple[dict[str, float],
                                                                       dict[str, float]]:
    """Per-tensor uplink/downlink times (ms) from bytes and a bandwidth (bytes per second).

    A fixed per-tensor ``rtt_ms`` is charged once per tensor (per message); a per-cut constant
    overhead would not change the argmin among cuts that transfer something.
    """
    if bandwidth_bps <= 0:
        raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth_bps}")
    down = down_bandwidth_bps or bandwidth_bps
    up_ms = {t.name: rtt_ms + 1000.0 * t.nbytes / bandwidth_bps for t in dag.tensors}
    down_ms = {t.name: 1000.0 * t.nbytes / down for t in dag.tensors if t.is_output}
    return up_ms, down_ms


def min_cut(dag: Dag, up_ms: Mapping[str, float], down_ms: Mapping[str, float] | None = None,
            *, validate: bool = True) -> CutResult:
    """The latency-optimal downward-closed wearable set, exactly, by max-flow/min-cut."""
    from scipy.sparse import csr_matrix  # imported here: a wearable-only install has no scipy
    from scipy.sparse.csgraph import breadth_first_order, maximum_flow

    if validate:
        dag.validate()
    down_ms = down_ms or {}
    index = {n.name: i + 2 for i, n in enumerate(dag.nodes)}  # 0 = source, 1 = sink
    out_down: dict[str, float] = {}
    for t in dag.tensors:
        if t.is_output and t.producer is not None:
            out_down[t.producer] = out_down.get(t.producer, 0.0) + down_ms.get(t.name, 0.0)
    src: list[int] = []
    dst: list[int] = []
    cap: list[float] = []
    inf_edges: list[tuple[int, int]] = []
    for n in dag.nodes:
        v = index[n.name]
        # every node pays one of the two: only the difference matters to the cut
        h, w = n.handheld_ms + out_down.get(n.name, 0.0), n.wearable_ms
        if h < 0 or w < 0:
            raise ValueError(f"node {n.name}: negative compute or return time")
        m = min(h, w)
        src += [0, v]
        dst += [v, 1]
        cap += [h - m, w - m]
    preds = dag.predecessors()
    for consumer, ps in preds.items():
        for p in ps:
            inf_edges.append((index[consumer], index[p]))
    n_total = 2 + len(dag.nodes)
    for t in dag.tensors:
        consumers = sorted(set(t.consumers) - ({t.producer} if t.producer else set()))
        if not consumers:
            continue
        start = 0 if t.producer is None else index[t.producer]
        if len(consumers) == 1:  # no auxiliary node needed: paid iff that consumer is remote
            src.append(start)
            dst.append(index[consumers[0]])
            cap.append(up_ms.get(t.name, 0.0))
            continue
        a = n_total
        n_total += 1
        src.append(start)
        dst.append(a)
        cap.append(up_ms.get(t.name, 0.0))
        for c in consumers:
            inf_edges.append((a, index[c]))
    finite = np.asarray(cap, dtype=np.float64)
    if np.any(finite < 0):
        raise ValueError("negative transfer or compute cost")
    total_ms = float(finite.sum())
    scale = 1000.0  # microseconds
    if total_ms * scale >= _INT32_MAX // 4:
        scale = (_INT32_MAX // 4) / max(total_ms, 1e-9)
    icap = np.rint(finite * scale).astype(np.int64)
    inf = int(min(icap.sum() + 1, _INT32_MAX // 2))
    rows = np.asarray(src + [e[0] for e in inf_edges], dtype=np.int32)
    cols = np.asarray(dst + [e[1] for e in inf_edges], dtype=np.int32)
    data = np.concatenate([icap, np.full(len(inf_edges), inf, dtype=np.int64)])
    graph64 = csr_matrix((data, (rows, cols)), shape=(n_total, n_total))  # duplicates summed
    graph64.sum_duplicates()
    graph64.data = np.minimum(graph64.data, inf)  # several infinite edges stay infinite
    graph = csr_matrix((graph64.data.astype(np.int32), graph64.indices, graph64.indptr),
                       shape=graph64.shape)
    flow = maximum_flow(graph, 0, 1, method=FLOW_METHOD).flow
    residual = (graph - flow).tocsr()
    residual.data = np.where(residual.data > 0, 1, 0).astype(np.int32)
    residual.eliminate_zeros()
    reach = breadth_first_order(residual, 0, directed=True, return_predecessors=False)
    reached = set(int(i) for i in reach)
    wearable = frozenset(n.name for n in dag.nodes if index[n.name] in reached)
    latency, crossing = cut_latency(dag, wearable, up_ms, down_ms)
    return CutResult(wearable, latency, crossing)


def downward_closed_sets(dag: Dag) -> Iterable[frozenset[str]]:
    """Every downward-closed node set (exponential: for tests on small graphs only)."""
    preds = dag.predecessors()
    names = [n.name for n in dag.nodes]
    if len(names) > 20:
        raise ValueError("brute force is for graphs of at most 20 nodes")
    for mask in itertools.product((False, True), repeat=len(names)):
        w = frozenset(n for n, m in zip(names, mask, strict=True) if m)
        if all(preds[v] <= w for v in w):
            yield w


def brute_force_cut(dag: Dag, up_ms: Mapping[str, float],
                    down_ms: Mapping[str, float] | None = None) -> CutResult:
    """Exhaustive reference for :func:`min_cut`."""
    down_ms = down_ms or {}
    best: CutResult | None = None
    for w in downward_closed_sets(dag):
        lat, crossing = cut_latency(dag, w, up_ms, down_ms)
        if best is None or lat < best.latency_ms:
            best = CutResult(w, lat, crossing)
    assert best is not None
    return best
