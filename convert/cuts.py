"""Candidate cuts of a general DAG (see docs/BUNDLE.md, "How candidates are chosen").

A cut is a downward-closed set of *dynamic* nodes (the head). Constant nodes are never part of a
cut: they are replicated into whichever slice needs them. The crossing set of a head ``H`` is

* every dynamic tensor produced in ``H`` that a dynamic node outside ``H`` consumes or that is a
  graph output, plus
* every real graph input that a dynamic node outside ``H`` consumes or that is a graph output
  (sent raw).

Enumeration walks three topological orders of the dynamic nodes (the file's own order, a
depth-first order that completes a branch before opening the next one, and a greedy order that
keeps the live frontier small); every prefix of a topological order is downward closed, so every
prefix is a valid cut. Prefix crossing sets are maintained incrementally (O(edges) per order) and
heads are deduplicated by a 64-bit Zobrist hash. The pool is then pruned to ``max_candidates``.
"""

from __future__ import annotations

import bisect
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from coinf.convert import pareto
from coinf.convert.cost import NodeCost
from coinf.convert.graph import Graph

from coinf.bundle import HANDHELD_ONLY, WEARABLE_ONLY
from coinf.errors import ModelError

DEFAULT_MAX_CANDIDATES = 64
# Ops that runtimes fuse into the producer before them (Conv+BN+Relu, Gemm+Relu...). A cut between
# a producer and such a follower moves as many bytes as the cut just after the follower, costs
# the same, and breaks the fusion on both sides -- so it is never offered as a candidate.
FUSIBLE_FOLLOWERS = frozenset({
    "BatchNormalization", "Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish",
    "Tanh", "Elu", "Selu", "Softplus", "PRelu", "Dropout", "Identity", "Add", "Mul", "Sub", "Div",
})
GREEDY_SCAN = 64  # the greedy order looks at most at this many ready nodes per step


@dataclass(frozen=True)
class Cut:
    """One selected cut. ``head`` holds node indices (dynamic nodes only)."""

    head: frozenset[int]
    crossing: tuple[str, ...]
    head_flops: int
    crossing_bytes: int
    label: str
    reason: str  # handheld-only | wearable-only | pareto | single-tensor | in-block | spread


@dataclass
class _Prefix:
    flops: int
    nbytes: int
    ntensors: int
    order: int
    k: int


class _Dag:
    """The dynamic part of a graph, indexed for fast prefix walks."""

    def __init__(self, g: Graph, costs: Sequence[NodeCost]) -> None:
        self.g = g
        self.nodes = [n.index for n in g.nodes if n.dynamic]
        self.flops = {i: costs[i].flops for i in self.nodes}
        outs = set(g.outputs)
        dyn = g.dynamic_tensors
        self.ins = {i: [t for t in g.nodes[i].inputs if t in dyn] for i in self.nodes}
        self.outs = {i: list(g.nodes[i].outputs) for i in self.nodes}
        self.uses: dict[str, int] = {}
        for i in self.nodes:
            for t in self.ins[i]:
                self.uses[t] = self.uses.get(t, 0) + 1
        self.is_out = {t: t in outs for t in dyn}
        self.nbytes = {t: g.types[t].nbytes for t in dyn}
        self.succ: dict[int, list[int]] = {i: [] for i in self.nodes}
        self.npred: dict[int, int] = {}
        for i in self.nodes:
            preds = sorted({g.producer[t] for t in self.ins[i] if t in g.producer})
            self.npred[i] = len(preds)
            for p in preds:
                self.succ[p].append(i)
        self.mid_chain = {i: self._ends_mid_chain(i) for i in self.nodes}
        rng = random.Random(0x5EED)
        self.zob = {i: rng.getrandbits(64) for i in self.nodes}
        # tensor ordering used for crossing lists: graph inputs, then node outputs in file order
        self.rank: dict[str, int] = {}
        for t in g.inputs:
            self.rank.setdefault(t, len(self.rank))
        for n in g.nodes:
            for t in n.outputs:
                self.rank.setdefault(t, len(self.rank))

    def _ends_mid_chain(self, v: int) -> bool:
        """True when cutting right after ``v`` would split it from a fusible follower.

        That is: ``v``'s output feeds exactly one node, a fusible elementwise follower whose only
        dynamic input it is, with an output no larger than its input.
        """
        used = [t for t in self.outs[v] if self.uses.get(t, 0) > 0 or self.is_out[t]]
        if len(used) != 1 or self.is_out[used[0]] or self.uses.get(used[0]) != 1:
            return False
        t = used[0]
        (c,) = [i for i in self.succ[v] if t in self.ins[i]]
        follower = self.g.nodes[c]
        if follower.op_type not in FUSIBLE_FOLLOWERS or self.ins[c] != [t]:
            return False
        return all(self.nbytes.get(o, 0) <= self.nbytes[t] for o in self.outs[c])

    # -- orders -------------------------------------------------------------------------------
    def order_file(self) -> list[int]:
        return list(self.nodes)

    def order_dfs(self) -> list[int]:
        """Kahn's algorithm with a stack: finish the current branch before opening another."""
        npred = dict(self.npred)
        stack = [i for i in reversed(self.nodes) if npred[i] == 0]
        order: list[int] = []
        while stack:
            v = stack.pop()
            order.append(v)
            ready = []
            for s in self.succ[v]:
                npred[s] -= 1
                if npred[s] == 0:
                    ready.append(s)
            stack.extend(sorted(ready, reverse=True))
        return order

    def order_greedy(self) -> list[int]:
        """At each step run the ready node that grows the crossing bytes least."""
        npred = dict(self.npred)
        remaining = dict(self.uses)
        ready: list[int] = [i for i in self.nodes if npred[i] == 0]
        order: list[int] = []
        while ready:
            best, best_key = -1, None
            for pos in range(len(ready) - 1, max(len(ready) - 1 - GREEDY_SCAN, -1), -1):
                v = ready[pos]
                grow = sum(self.nbytes[t] for t in self.outs[v]
                           if self.uses.get(t, 0) > 0 or self.is_out[t])
                free = sum(self.nbytes[t] for t in self.ins[v]
                           if remaining[t] == 1 and not self.is_out[t])
                key = (grow - free, -pos)
                if best_key is None or key < best_key:
                    best, best_key = pos, key
            v = ready.pop(best)
            order.append(v)
            for t in self.ins[v]:
                remaining[t] -= 1
            for s in self.succ[v]:
                npred[s] -= 1
                if npred[s] == 0:
                    ready.append(s)
        return order

    # -- prefixes -----------------------------------------------------------------------------
    def walk(self, order: list[int], oid: int, pool: dict[int, _Prefix]) -> None:
        """Add every proper non-empty prefix of ``order`` to ``pool`` (keyed by head hash)."""
        remaining = dict(self.uses)
        nbytes = 0
        ntensors = 0
        for t in self.g.inputs:
            if remaining.get(t, 0) > 0 or self.is_out.get(t, False):
                nbytes += self.nbytes[t]
                ntensors += 1
        flops = 0
        h = 0
        for k, v in enumerate(order[:-1], start=1):
            for t in self.ins[v]:
                remaining[t] -= 1
                if remaining[t] == 0 and not self.is_out[t]:
                    nbytes -= self.nbytes[t]
                    ntensors -= 1
            for t in self.outs[v]:
                if self.uses.get(t, 0) > 0 or self.is_out[t]:
                    nbytes += self.nbytes[t]
                    ntensors += 1
            flops += self.flops[v]
            h ^= self.zob[v]
            if h not in pool and not self.mid_chain[v]:
                pool[h] = _Prefix(flops, nbytes, ntensors, oid, k)

    def crossing(self, head: frozenset[int]) -> tuple[str, ...]:
        """The crossing set of ``head``, computed from scratch (ordered by tensor rank)."""
        need: set[str] = {t for t in self.is_out if self.is_out[t]}
        for i in self.nodes:
            if i not in head:
                need.update(self.ins[i])
        avail = set(self.g.inputs)
        for i in head:
            avail.update(self.outs[i])
        return tuple(sorted(need & avail, key=self.rank.__getitem__))


def _spread(items: list[_Prefix], m: int) -> list[_Prefix]:
    """Pick ``m`` items spread evenly over the head-FLOPs range (deterministic)."""
    if m <= 0:
        return []
    if len(items) <= m:
        return list(items)
    items = sorted(items, key=lambda p: (p.flops, p.nbytes, p.order, p.k))
    lo, hi = items[0].flops, items[-1].flops
    taken: set[int] = set()
    for j in range(m):
        target = lo + (hi - lo) * (j + 0.5) / m
        best = min((i for i in range(len(items)) if i not in taken),
                   key=lambda i: (abs(items[i].flops - target), i))
        taken.add(best)
    return [items[i] for i in sorted(taken)]


_GENERIC = re.compile(r"^(n|node|v)?[_-]?\d+$", re.IGNORECASE)
#: shorter names of long op types, so a label and its scope fit a table column
_SHORT_OPS = {"BatchNormalization": "BatchNorm", "GlobalAveragePool": "GlobalAvgPool",
              "GlobalMaxPool": "GlobalMaxPool", "InstanceNormalization": "InstanceNorm",
              "LayerNormalization": "LayerNorm", "ConvTranspose": "ConvT"}


def _scope(name: str, op_type: str) -> tuple[str, int]:
    """The meaningful part of a node name and the op's index in it: its path without the
    trailing op-type component and without path parts the next one repeats
    (``/layer2/layer2.0/bn2/BatchNormalization`` -> ``("layer2.0/bn2", 0)``,
    ``/layer1/layer1.0/Relu_1`` -> ``("layer1.0", 1)``); "" when the name says nothing
    (``n12``, ``/Relu_3``, ``Conv_7``)."""
    parts = [p for p in name.replace("::", "/").split("/") if p]
    k = 0
    m = re.fullmatch(rf"{re.escape(op_type)}(?:_(\d+))?", parts[-1]) if parts else None
    if m:
        parts = parts[:-1]
        k = int(m.group(1) or 0)
    parts = [p for p in parts if not _GENERIC.match(p)]
    kept = [p for i, p in enumerate(parts)
            if i + 1 == len(parts) or not parts[i + 1].startswith(p)]
    return "/".join(kept[-2:]), k


def node_labels(g: Graph) -> dict[int, str]:
    """A readable label for every node: op and scope (``BatchNorm layer2.0/bn2``,
    ``Relu#2 layer1.0`` for ``/layer1/layer1.0/Relu_1``) when the node's name has a scope, else
    op type and position: ``Conv#12 after layer3`` (the 12th Conv, after the last named scope),
    or ``Conv#12 of 53`` (``MaxPool, node 4 of 69`` for a lone op) in a model with no names at
    all. Never cut."""
    totals: dict[str, int] = {}
    for n in g.nodes:
        totals[n.op_type] = totals.get(n.op_type, 0) + 1
    counts: dict[str, int] = {}
    last_scope = ""
    out: dict[int, str] = {}
    for n in g.nodes:
        counts[n.op_type] = k = counts.get(n.op_type, 0) + 1
        op = _SHORT_OPS.get(n.op_type, n.op_type)
        scope, within = _scope(n.name, n.op_type)
        if scope:
            out[n.index] = f"{op}#{within + 1} {scope}" if within else f"{op} {scope}"
            last_scope = scope
            continue
        nth = f"#{k}" if totals[n.op_type] > 1 else ""
        if last_scope:
            out[n.index] = f"{op}{nth} after {last_scope}"
        else:
            out[n.index] = (f"{op}{nth} of {totals[n.op_type]}" if nth
                            else f"{op}, node {n.index + 1} of {len(g.nodes)}")
    return out


def _in_block(ordered: list[_Prefix], chosen: Mapping[int, str]) -> list[_Prefix]:
    """The cheapest multi-tensor cut not yet ``chosen`` (fewest bytes, then FLOPs) between each
    pair of consecutive single-tensor cuts of ``ordered``, in FLOPs order."""
    bounds = sorted({p.flops for p in ordered if p.ntensors == 1})
    blocks: dict[int, _Prefix] = {}
    for p in ordered:
        if p.ntensors < 2 or id(p) in chosen:
            continue
        slot = bisect.bisect_left(bounds, p.flops)
        cur = blocks.get(slot)
        if cur is None or (p.nbytes, p.flops) < (cur.nbytes, cur.flops):
            blocks[slot] = p
    return [blocks[s] for s in sorted(blocks)]


def _unique_labels(cuts: list[Cut]) -> list[Cut]:
    """``cuts`` with every repeated label (the same last node) numbered: ``X``, ``X (2)``..."""
    seen: dict[str, int] = {}
    out = []
    for c in cuts:
        n = seen[c.label] = seen.get(c.label, 0) + 1
        out.append(c if n == 1 else Cut(c.head, c.crossing, c.head_flops, c.crossing_bytes,
                                        f"{c.label} ({n})", c.reason))
    return out


def enumerate_cuts(g: Graph, costs: Sequence[NodeCost],
                   max_candidates: int = DEFAULT_MAX_CANDIDATES) -> list[Cut]:
    """Candidate cuts ordered by head FLOPs; first is handheld-only, last is wearable-only."""
    if max_candidates < 2:
        raise ModelError(f"--max-candidates must be >= 2 (the two extremes), got {max_candidates}")
    dag = _Dag(g, costs)
    if not dag.nodes:
        raise ModelError(f"{g.path}: no node depends on a graph input; nothing to split")
    orders = [dag.order_file(), dag.order_dfs(), dag.order_greedy()]
    for o in orders:
        if len(o) != len(dag.nodes):
            raise ModelError(f"{g.path}: the graph has a cycle among dynamic nodes")
    pool: dict[int, _Prefix] = {}
    for oid, o in enumerate(orders):
        dag.walk(o, oid, pool)
    prefixes = list(pool.values())

    in_bytes = sum(dag.nbytes[t] for t in g.inputs
                   if dag.uses.get(t, 0) > 0 or dag.is_out.get(t, False))
    budget = max_candidates - 2
    chosen: dict[int, str] = {}  # id(prefix) -> reason
    total_flops = sum(dag.flops.values())
    out_bytes = sum(g.types[t].nbytes for t in g.outputs)
    # (flops, bytes) of the chosen, the two extremes included: what they near-dominate is out
    taken: list[tuple[int, int]] = [(0, in_bytes), (total_flops, out_bytes)]

    def point(p: _Prefix) -> tuple[int, int]:
        return p.flops, p.nbytes

    def take(items: list[_Prefix], reason: str, limit: int | None = None,
             dedupe: bool = True) -> None:
        nonlocal budget
        fresh = [p for p in items if id(p) not in chosen]
        if dedupe:
            fresh = pareto.distinct(fresh, point, total_flops, taken)
        for p in _spread(fresh, budget if limit is None else min(limit, budget)):
            chosen[id(p)] = reason
            taken.append(point(p))
            budget -= 1

    ordered = sorted(prefixes, key=lambda p: (p.flops, p.nbytes, p.order, p.k))
    front = pareto.front(ordered, lambda p: p.flops, lambda p: p.nbytes, in_bytes)
    if len(front) > budget:  # one per near-duplicate group (the fewer bytes), then spread
        front = pareto.distinct(front, point, total_flops)
    take(front, "pareto")
    singles = [p for p in ordered if p.ntensors == 1 and id(p) not in chosen]
    in_block = _in_block(ordered, chosen)
    # when slots are short, in-block cuts get a quarter of them (at least one)
    quota = min(len(in_block), max(1, budget // 4)) if in_block else 0
    take(singles, "single-tensor", limit=budget - quota)
    take(in_block, "in-block")
    take(ordered, "spread")
    take(ordered, "spread", dedupe=False)  # near-duplicates fill only what nothing else wants

    by_id = {id(p): p for p in prefixes}
    labels = node_labels(g)
    total = sum(dag.flops.values())
    cuts = [Cut(frozenset(), dag.crossing(frozenset()), 0, in_bytes, HANDHELD_ONLY, HANDHELD_ONLY)]
    middle: list[Cut] = []
    for pid, reason in chosen.items():
        p = by_id[pid]
        order = orders[p.order]
        head = frozenset(order[:p.k])
        crossing = dag.crossing(head)
        nbytes = sum(dag.nbytes[t] for t in crossing)
        assert nbytes == p.nbytes, "incremental crossing bytes disagree with recomputation"
        middle.append(Cut(head, crossing, p.flops, nbytes, labels[order[p.k - 1]], reason))
    middle.sort(key=lambda c: (c.head_flops, c.crossing_bytes, len(c.head), sorted(c.head)))
    cuts.extend(_unique_labels(middle))
    full = frozenset(dag.nodes)
    out_bytes = sum(g.types[t].nbytes for t in g.outputs)
    cuts.append(Cut(full, tuple(g.outputs), total, out_bytes, WEARABLE_ONLY, WEARABLE_ONLY))
    return cuts
