"""Predicted against measured, one point each, with the line where they agree (log axes over
several decades): the picture of ``coinf bench plan`` (every configuration's end-to-end time,
the chosen and the best marked) and of ``coinf bench memory`` (every head's peak RSS)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Point:
    label: str
    predicted: float
    measured: float
    mark: str = ""  # e.g. "chosen", "best": drawn apart and named
    partial: bool = False  # measuring stopped early: the measured value is a lower bound


def model_name(bundle: Any) -> str:
    """The name of the model a bundle was split from (its folder's name if unrecorded)."""
    source = (bundle.meta or {}).get("source") or {}
    name = str(source.get("file") or bundle.root.name)
    return name.rsplit(".", 1)[0] if name.endswith((".onnx", ".tflite")) else name


def plot_fit(points: Sequence[Point], path: str, title: str, unit: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, ax = plt.subplots(figsize=(6.4, 5.2))
    plain = [p for p in points if not p.mark and not p.partial]
    ax.scatter([p.measured for p in plain], [p.predicted for p in plain], s=16, alpha=0.7,
               color="#3182bd", label=f"{len(plain)} others" if len(plain) < len(points)
               else None)
    partial = [p for p in points if not p.mark and p.partial]
    if partial:
        ax.scatter([p.measured for p in partial], [p.predicted for p in partial], s=22,
                   marker=">", color="#9ecae1",
                   label=f"{len(partial)} stopped early (measured: at least)")
    for p, colour in zip([p for p in points if p.mark], ("#e6550d", "#31a354", "#756bb1"),
                         strict=False):
        ax.scatter([p.measured], [p.predicted], s=70, color=colour, edgecolors="black",
                   label=f"{p.mark}: {p.label}", zorder=3)
    values = [v for p in points for v in (p.predicted, p.measured) if v > 0]
    if values:
        lo, hi = min(values) / 1.3, max(values) * 1.3
        ax.plot([lo, hi], [lo, hi], color="grey", ls="--", lw=1, label="predicted = measured")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        if hi / lo > 20:  # several decades: log axes, plain numbers
            ax.set_xscale("log")
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_major_formatter(ScalarFormatter())
                axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(f"measured ({unit})")
    ax.set_ylabel(f"predicted ({unit})")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
