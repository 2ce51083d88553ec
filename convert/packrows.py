"""A packing table's rows as a whole: which rows are never a choice, where a standard codec
applies, and the criterion the rows were judged by, as the manifest records it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from coinf.ble_protocol import media

from coinf.bundle import Bundle, Candidate

LOSSLESS = "f32"


def drop_dominated(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Without the ``ansN`` rows whose bodies are not smaller than ``qN``'s or ``qzN``'s of the
    same width and assignment: the same tensor, more bytes and more time, so never a choice
    (and their tables need not be stored)."""
    def plain(r: dict[str, Any]) -> bool:
        return "promoted" not in r and "tensors" not in r

    best: dict[int, float] = {}
    for r in rows:
        if r["codec"] in ("q", "qz") and plain(r):
            best[r["bits"]] = min(best.get(r["bits"], math.inf), float(r["mean_bytes"]))
    return [r for r in rows if not (r["codec"] == "ans" and plain(r)
                                    and r["mean_bytes"] >= best.get(r["bits"], math.inf))]


def codec_applies(bundle: Bundle, cand: Candidate, codec: str) -> bool:
    """Whether a standard codec packs at least one crossing tensor of ``cand``: a float image
    at any cut, a float waveform only where it is a model input (a ``[1, N]`` activation of a
    fully connected layer is shaped like one, but it is no sound). The other tensors travel
    as the codec's fallback (lossless)."""
    inputs = {t.name for t in bundle.inputs}
    return any(np.dtype(t.dtype).kind == "f" and media.applies(codec, tuple(t.shape))
               and (codec in media.IMAGE or t.name in inputs) for t in cand.crossing)


#: what each criterion means, as ``coinf calibrate``, ``plan`` and ``demo`` say it
CRITERIA = {
    "labels": "accuracy against the labels, every input",
    "stable": "agreement with the unpacked model on the inputs whose answer survives 1 LSB "
              "of input noise",
    "all": "the metric against the unpacked model, every input",
}


def criterion_summary(results: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The criterion the rows were judged by, how many inputs it judged of how many, and the
    model's own noise floor (the largest over the candidates: one model, one data set, so
    they differ only by float rounding between slicings)."""
    rows = [r for rs in results.values() for r in rs if "criterion" in r]
    if not rows:
        return {}
    worst = max(rows, key=lambda r: float(r.get("noise_floor_pp", 0.0)))
    out = {"criterion": str(worst["criterion"]),
           "criterion_text": CRITERIA.get(str(worst["criterion"]), ""),
           "judged": int(min(int(r.get("samples", 0)) for r in rows)),
           "inputs": int(worst.get("inputs", 0)),
           "noise_floor_pp": float(worst.get("noise_floor_pp", 0.0))}
    if "model_accuracy_pct" in worst:  # with labels: the unpacked model's own accuracy
        out["model_accuracy_pct"] = float(worst["model_accuracy_pct"])
    return out
