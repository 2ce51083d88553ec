"""What a user would do instead: the four reference points beside every plan.

A split is only worth its code if it beats what a user would pick without coinf. Beside the
chosen configuration, :func:`references` names, under the same objective, link and devices:

* ``wearable_only``: compute everything on the wearable;
* ``handheld_raw``: send the model input as it is (float bytes) and compute on the handheld;
* ``handheld_codec``: send the model input through its best packing whose calibrated quality
  loss is within the tolerance -- a standard codec (JPEG, WebP, PNG, PCM16, FLAC) or any of
  coinf's own (``qN``, ``qzN``, ``ansN``, ``f16``, ...) -- and compute on the handheld;
* ``best_split``: the best configuration that runs part of the model on each side.

Each is what the planner's own scheduler picks among that kind of row, so the comparison uses
one cost model throughout. When no row of a kind is feasible (the raw input would outlast the
timeout) the fastest of them stands in, with its ``excluded`` reason; a kind with no row at all
(no packing calibrated on the input, or every one refused) is ``None``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from coinf.wearable.planner.costs import CandidateCost, Decision
from coinf.wearable.planner.planner import (
    Planner,
    learned_bound,
    parse_config_spec,
    split_config,
)

from coinf.errors import CoinfError

KINDS = ("wearable_only", "handheld_raw", "handheld_codec", "best_split")


def _kinds(planner: Planner) -> dict[str, Callable[[CandidateCost], bool]]:
    cands = {c.id: c for c in planner.bundle.candidates}

    def cut(r: CandidateCost) -> Any:
        return cands[split_config(r.id)[0]]

    return {
        "wearable_only": lambda r: cut(r).is_wearable_only,
        "handheld_raw": lambda r: cut(r).is_handheld_only and split_config(r.id)[1] == "raw",
        "handheld_codec": lambda r: cut(r).is_handheld_only and split_config(r.id)[1] != "raw",
        "best_split": lambda r: not (cut(r).is_handheld_only or cut(r).is_wearable_only),
    }


def row_json(r: CandidateCost, streaming: bool, bound: float | None = None) -> dict[str, Any]:
    """One configuration as ``coinf plan --json`` lists it."""
    cid, packing = split_config(r.id)
    out = {"id": r.id, "cut": cid, "packing": packing, "bytes": r.crossing_bytes,
           "quality_loss": round(r.accuracy_drop_pp, 4),
           "latency_ms": round(r.latency_ms(streaming), 3),
           "wearable_mj": round(r.wearable_energy_mj, 4)}
    if bound is not None:
        out["quality_loss_bound"] = round(bound, 4)
    return out


def references(planner: Planner, decision: Decision, **decide: Any) -> dict[str, str | None]:
    """Configuration id of each reference point (``KINDS``), ``None`` where none is feasible;
    ``decide`` are the arguments the decision was made with (link, status, objective...)."""
    out: dict[str, str | None] = {}
    for kind, keep in _kinds(planner).items():
        try:
            out[kind] = planner.decide(only=keep, **decide).winner
        except ValueError:  # none feasible: the fastest of that kind, shown as excluded
            rows = [r for r in decision.rows if keep(r)]
            out[kind] = min(rows, key=lambda r: r.latency_ms(decision.streaming)).id \
                if rows else None
    return out


def plan_json(planner: Planner, decision: Decision, **decide: Any) -> dict[str, Any]:
    """``candidates`` (every configuration, with ``excluded`` reasons), ``chosen`` and
    ``reference`` (the four points, each a candidate entry or None)."""
    from coinf.convert.calibrate import accuracy_bound, is_exact

    cands = {c.id: c for c in planner.bundle.candidates}
    rows = {r.id: r for r in decision.rows}
    entries = {}
    for rid, r in rows.items():
        cid, packing = split_config(rid)
        exact = False
        try:
            gamma, spec = parse_config_spec(packing)
            bound = accuracy_bound(cands[cid], spec)[0] if gamma is None else learned_bound(
                planner.bundle.compressor(cid, gamma), spec)  # None for an autoencoder set
            exact = gamma is None and spec != "raw" and is_exact(cands[cid], spec)
        except (CoinfError, KeyError, ValueError):  # an uncalibrated row: no bound to show
            bound = None
        entry = row_json(r, decision.streaming, bound)
        if exact:  # accepted without a sample bound
            entry["exact"] = True
        entry["excluded"] = decision.excluded.get(rid)
        entries[rid] = entry
    refs = references(planner, decision, **decide)
    refused = {k: v for k, v in decision.excluded.items() if k not in rows}
    why_none = {}
    if refs["handheld_codec"] is None:
        codec = [f"{k}: {v}" for k, v in refused.items()
                 if cands[split_config(k)[0]].is_handheld_only]
        why_none["handheld_codec"] = (f"{len(codec)} packings of the model input refused, "
                                      f"e.g. {codec[0]}") if codec else (
            "no packing calibrated on the model input (`coinf calibrate`; standard codecs "
            "need the `codecs` extra and an image- or audio-like input)")
    from coinf.convert.calibrate import META_KEY, criterion_line

    meta = getattr(planner.bundle, "meta", None) or {}
    quality = {k: v for k, v in (meta.get(META_KEY) or {}).items()
               if k in ("criterion", "criterion_text", "judged", "inputs", "noise_floor_pp",
                        "data", "metric")}
    quality["text"] = criterion_line(meta)
    return {"quality": quality,
            "candidates": list(entries.values()), "chosen": entries[decision.winner],
            "reference": {k: (entries.get(v) if v else None) for k, v in refs.items()},
            "reference_missing": why_none, "refused": refused}
