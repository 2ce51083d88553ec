"""The cost table the schedulers rank: one :class:`CandidateCost` row per candidate cut.

Pure data, no I/O. Times are milliseconds, energies millijoules, sizes bytes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

#: a configuration is feasible when ``TIMEOUT_MARGIN`` x its predicted exchange (transfer + tail
#: + return) fits in the Session's per-inference timeout; the same factor stretches the request
#: deadline of a split fixed by the user (``wearable.options.request_timeout``). 2x absorbs a
#: bandwidth estimate that is off by half (BLE throughput swings that much).
TIMEOUT_MARGIN = 2.0


@dataclass(frozen=True)
class CandidateCost:
    """Predicted (or measured) costs of running one candidate cut once.

    ``transfer_ms`` is the uplink time of the crossing tensors (wearable -> handheld) and
    ``return_ms`` the downlink time of the results; both are 0 for ``wearable-only``.
    """

    id: str
    head_ms: float
    tail_ms: float
    transfer_ms: float
    return_ms: float
    wearable_energy_mj: float
    handheld_energy_mj: float
    crossing_bytes: int
    accuracy_drop_pp: float = 0.0
    label: str = ""

    def __post_init__(self) -> None:
        for name in ("head_ms", "tail_ms", "transfer_ms", "return_ms", "wearable_energy_mj",
                     "handheld_energy_mj", "accuracy_drop_pp"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
                raise ValueError(
                    f"candidate {self.id}: {name} must be a number >= 0, got {value!r}")
        if self.crossing_bytes < 0:
            raise ValueError(f"candidate {self.id}: crossing_bytes must be >= 0")

    # -- derived metrics --------------------------------------------------------------------
    def latency_ms(self, streaming: bool = False) -> float:
        """End-to-end latency; in streaming mode the pipelined period (CoINF Alg. III.1 line 4).

        coinf's pipeline (:mod:`wearable.stream`) overlaps three resources: the wearable's CPU
        (head), the radio (transfer and return share the air) and the handheld's CPU (tail), so
        the period is the slowest of them: ``max(head, transfer + return, tail)``.
        """
        if streaming:
            return max(self.head_ms, self.transfer_ms + self.return_ms, self.tail_ms)
        return self.head_ms + self.transfer_ms + self.tail_ms + self.return_ms

    def exchange_ms(self) -> float:
        """What the link and the handheld take: ``transfer + tail + return`` (0 when local)."""
        return self.transfer_ms + self.tail_ms + self.return_ms

    def throughput_fps(self, streaming: bool = True) -> float:
        """Inferences per second when frames arrive back to back (pipelined by default)."""
        lat = self.latency_ms(streaming)
        return math.inf if lat <= 0 else 1000.0 / lat

    def energy_mj(self, w_wearable: float = 1.0, w_handheld: float = 1.0) -> float:
        """Weighted energy ``Ww * Ew + Wh * Eh`` (CoINF Alg. III.1 line 9)."""
        return w_wearable * self.wearable_energy_mj + w_handheld * self.handheld_energy_mj

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> CandidateCost:
        return cls(**{k: obj[k] for k in cls.__dataclass_fields__ if k in obj})


@dataclass
class Decision:
    """A scheduler's answer: the winning row, why it won, and every row it looked at."""

    winner: str
    why: str
    rows: list[CandidateCost]
    scheduler: str
    #: per candidate id, the score each scheduler ranked on (latency used, weighted energy...).
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    best_effort: bool = False
    streaming: bool = False
    #: context the planner adds: where the times came from, effective weights, link estimate.
    notes: list[str] = field(default_factory=list)
    #: rows the planner ruled out before the scheduler ran, with the reason (infeasible under
    #: the timeout, accuracy bound not established...). They stay in ``rows`` for display.
    excluded: dict[str, str] = field(default_factory=dict)
    #: one line: the objective in force and why the winner won (``coinf plan`` prints it first).
    headline: str = ""

    @property
    def row(self) -> CandidateCost:
        return next(r for r in self.rows if r.id == self.winner)

    def explain(self) -> str:
        """One headline (objective, winner, why), then a fixed-width table of every row (the
        winner marked ``*``, excluded rows ``x``, full labels), then the exclusions and notes."""
        width = max([16] + [len(self._name(r)) for r in self.rows])
        head = (f"{'':1} {'candidate':<{width}} {'head':>9} {'xfer':>9} {'tail':>9} {'ret':>8} "
                f"{'latency':>9} {'E_wear':>9} {'E_hand':>9} {'bytes':>9} {'acc':>5}")
        unit = (f"{'':1} {'':<{width}} {'ms':>9} {'ms':>9} {'ms':>9} {'ms':>8} {'ms':>9} "
                f"{'mJ':>9} {'mJ':>9} {'':>9} {'pp':>5}")
        lines = [self.headline] if self.headline else []
        lines += [f"scheduler: {self.scheduler}" + ("  (streaming)" if self.streaming else ""),
                  head, unit]
        for r in self.rows:
            mark = "*" if r.id == self.winner else ("x" if r.id in self.excluded else " ")
            lines.append(
                f"{mark} {self._name(r):<{width}} {r.head_ms:9.1f} {r.transfer_ms:9.1f} "
                f"{r.tail_ms:9.1f} {r.return_ms:8.1f} {r.latency_ms(self.streaming):9.1f} "
                f"{r.wearable_energy_mj:9.1f} {r.handheld_energy_mj:9.1f} "
                f"{r.crossing_bytes:9d} {r.accuracy_drop_pp:5.2f}")
        ids = {r.id for r in self.rows}
        shown = [k for k in self.excluded if k in ids]
        others = [k for k in self.excluded if k not in ids]
        lines.extend(f"excluded {k}: {self.excluded[k]}" for k in shown)
        lines.extend(f"excluded {k}: {self.excluded[k]}" for k in others[:8])
        if len(others) > 8:
            lines.append(f"excluded {len(others) - 8} more packed configurations likewise")
        lines.extend(f"note: {n}" for n in self.notes)
        lines.append(("best effort (no candidate met every constraint): " if self.best_effort
                      else "why: ") + self.why)
        return "\n".join(lines)

    @staticmethod
    def _name(r: CandidateCost) -> str:
        return r.id if not r.label or r.label == r.id else f"{r.id} {r.label}"

    def to_json(self) -> dict[str, Any]:
        return {"winner": self.winner, "why": self.why, "scheduler": self.scheduler,
                "best_effort": self.best_effort, "streaming": self.streaming,
                "rows": [r.to_json() for r in self.rows], "scores": self.scores,
                "notes": self.notes, "excluded": self.excluded, "headline": self.headline}
