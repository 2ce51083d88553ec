"""The wearable's memory budget as a hard planner constraint.

A head needs, on the wearable, the runtime (interpreter, numpy, onnxruntime), its weights as
onnxruntime holds them and its peak activations. Per candidate the figure is, best source first:

* **measured**: the head's peak RSS from ``coinf profile --bundle`` (``head_peak_rss_mb`` in the
  profile; :mod:`coinf.device.memprofile` runs each head in a fresh process);
* **predicted**: ``overhead + WEIGHT_FACTOR x weights + ACTIVATION_FACTOR x peak activations``,
  where the peak activations come from a liveness scan of the head's nodes in the model's order
  (tensors produced and still needed, plus the crossing tensors that are kept until sent), and
  the overhead is the median of (measured - weights/activation share) over the profiled heads
  of this bundle, else :data:`RUNTIME_OVERHEAD_MB`.

A configuration whose head exceeds the budget is excluded (``Decision.excluded`` says why) and
never chosen; ``handheld-only`` runs no head and always fits.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

#: MB = 2**20 bytes. Measured on x86-64 with onnxruntime: a child Python that imports numpy and
#: onnxruntime and runs an empty model peaks at ~73 MB; a MatMul with 64 MB / 16 MB of weights
#: peaks at +1.9x / +1.6x its weights (the file's copy and onnxruntime's), activations at ~1.5x
#: (the arena rounds up). Profile the wearable to replace these with its own figures.
RUNTIME_OVERHEAD_MB = 73.0
WEIGHT_FACTOR = 2.0
ACTIVATION_FACTOR = 1.5
#: Pi Zero 2 W: 512 MB shared with the GPU; ~430 MB reach Linux, and the OS, bluetoothd and the
#: wearable service's own stack (bumble, asyncio) take a share. `coinf doctor` shows what is
#: free; `coinf profile --memory-budget MB` sets the budget for a device.
DEFAULT_WEARABLE_BUDGET_MB = 300.0
MB = float(2**20)


@dataclass(frozen=True)
class HeadMemory:
    """One candidate's head memory on the wearable (MB)."""

    cid: str
    weights_mb: float
    activations_mb: float
    predicted_mb: float
    measured_mb: float | None = None

    @property
    def total_mb(self) -> float:
        """What the constraint uses: the measurement when there is one, else the prediction."""
        return self.measured_mb if self.measured_mb is not None else self.predicted_mb

    @property
    def source(self) -> str:
        return "measured" if self.measured_mb is not None else "predicted"

    def to_json(self) -> dict[str, Any]:
        return {"id": self.cid, "weights_mb": round(self.weights_mb, 3),
                "activations_mb": round(self.activations_mb, 3),
                "predicted_mb": round(self.predicted_mb, 2),
                "head_peak_rss_mb": self.measured_mb, "source": self.source}


def head_activation_bytes(bundle: Any) -> dict[str, int]:
    """Peak bytes of live activations while each candidate's head runs, by candidate id
    (liveness over the head's nodes in the model's topological order)."""
    from coinf.convert.graph import load_graph

    g = load_graph(bundle.model_path)
    index = {n.name: n.index for n in g.nodes}

    def nbytes(name: str) -> int:
        t = g.types.get(name)
        return int(t.nbytes) if t is not None else 0

    out: dict[str, int] = {}
    for c in bundle.candidates:
        order = sorted(index[n] for n in c.head.nodes if n in index)
        if not order:
            out[c.id] = 0
            continue
        steps = {i: k for k, i in enumerate(order)}
        crossing = {t.name for t in c.crossing}
        last = len(order)  # crossing tensors stay alive until packed and sent
        born: dict[str, int] = {x: 0 for x in g.inputs if x in g.dynamic_tensors}
        dies: dict[str, int] = {}
        for i in order:
            node = g.nodes[i]
            for x in node.inputs:
                if x in g.dynamic_tensors:
                    born.setdefault(x, 0)
                    dies[x] = max(dies.get(x, 0), steps[i])
            for y in node.outputs:
                born[y] = steps[i]
                dies.setdefault(y, steps[i])
        for x in crossing:
            if x in born:
                dies[x] = last
        delta = [0] * (len(order) + 2)
        for x, b in born.items():
            delta[b] += nbytes(x)
            delta[dies.get(x, b) + 1] -= nbytes(x)
        live = peak = 0
        for d in delta:
            live += d
            peak = max(peak, live)
        out[c.id] = peak
    return out


class MemoryModel:
    """Head memory of every candidate of ``bundle`` on the wearable described by ``profile``,
    against ``budget_mb`` (None: no constraint)."""

    def __init__(self, bundle: Any, profile: Any, budget_mb: float | None) -> None:
        if budget_mb is not None and not budget_mb > 0:
            raise ValueError(f"memory budget must be > 0 MB, got {budget_mb}")
        self.bundle = bundle
        self.profile = profile
        self.budget_mb = budget_mb
        self._heads: dict[str, HeadMemory] | None = None
        self.overhead_source = "default"
        self.overhead_mb = RUNTIME_OVERHEAD_MB

    def _measured(self) -> dict[str, float]:
        mp = self.profile.models.get(self.bundle.identity) if self.profile else None
        if mp is None:
            return {}
        return {cid: float(e["head_peak_rss_mb"]) for cid, e in mp.candidates.items()
                if "head_peak_rss_mb" in e}

    def heads(self) -> dict[str, HeadMemory]:
        """Per candidate id (computed once)."""
        if self._heads is None:
            try:
                acts = head_activation_bytes(self.bundle)
            except Exception:  # a model the graph loader cannot shape: crossing bytes only
                acts = {c.id: c.crossing_bytes if not c.is_handheld_only else 0
                        for c in self.bundle.candidates}
            measured = self._measured()
            share = {c.id: WEIGHT_FACTOR * c.head.param_bytes / MB + ACTIVATION_FACTOR
                     * acts.get(c.id, 0) / MB for c in self.bundle.candidates}
            resid = [measured[c] - share[c] for c in measured if c in share]
            if resid:
                self.overhead_mb = float(statistics.median(resid))
                self.overhead_source = f"median of {len(resid)} profiled heads"
            self._heads = {}
            for c in self.bundle.candidates:
                if c.is_handheld_only:
                    self._heads[c.id] = HeadMemory(c.id, 0.0, 0.0, 0.0, None)
                    continue
                self._heads[c.id] = HeadMemory(
                    c.id, c.head.param_bytes / MB, acts.get(c.id, 0) / MB,
                    self.overhead_mb + share[c.id], measured.get(c.id))
        return self._heads

    def over_budget(self, cid: str) -> str | None:
        """Why candidate ``cid``'s head does not fit, or None when it does."""
        if self.budget_mb is None:
            return None
        h = self.heads().get(cid)
        if h is None or h.total_mb <= self.budget_mb:
            return None
        return (f"memory: head needs {h.total_mb:.1f} MB ({h.source}; weights "
                f"{h.weights_mb:.1f} MB, activations {h.activations_mb:.1f} MB) > the "
                f"wearable's {self.budget_mb:g} MB budget")

    def fits(self, rows: list[Any]) -> tuple[list[Any], dict[str, str]]:
        """The rows (``CandidateCost``, ids maybe ``cid~packing``) whose head fits, and why each
        other one is excluded. With nothing fitting (a bundle without ``handheld-only``) the
        rows of the smallest head stay, so there is still a plan to report."""
        if self.budget_mb is None:
            return rows, {}
        why = {r.id: w for r in rows if (w := self.over_budget(r.id.partition("~")[0]))}
        ok = [r for r in rows if r.id not in why]
        if ok:
            return ok, why
        need = {r.id: h.total_mb if (h := self.heads().get(r.id.partition("~")[0])) else 0.0
                for r in rows}
        least = min(need.values())
        ok = [r for r in rows if need[r.id] == least]
        return ok, {k: v for k, v in why.items() if k not in {r.id for r in ok}}

    def note(self, winner: str) -> str:
        """One line for the decision's notes."""
        if self.budget_mb is None:
            return "memory: no budget (unconstrained)"
        h = self.heads().get(winner)
        need = f"{h.total_mb:.0f} MB ({h.source})" if h and h.total_mb else "no head"
        return (f"memory: budget {self.budget_mb:g} MB on the wearable; the chosen head needs "
                f"{need}; runtime overhead {self.overhead_mb:.0f} MB ({self.overhead_source})")


def budget_of(profile: Any) -> float | None:
    """The wearable's budget: the profile's ``memory_budget_mb``, else the Pi Zero 2 W
    default for a wearable profile."""
    value = getattr(profile, "memory_budget_mb", None)
    if value is not None:
        return float(value)
    return DEFAULT_WEARABLE_BUDGET_MB if getattr(profile, "role", None) == "wearable" else None
