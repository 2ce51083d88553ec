"""The chart of ``coinf plan BUNDLE --pipeline CONFIG --png FILE``: one horizontal bar per
pipeline stage in order -- each device's compute (its slice) and each link's transfer (with what
it carries: raw, a packing, a compressor's code) -- on a shared time axis, the bottleneck stage
highlighted, and the throughput bound and the strategy choice written on the figure."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

COMPUTE_COLOUR = "#4c72b0"
LINK_COLOUR = "#dd8452"
BOTTLENECK_COLOUR = "#c44e52"


def stage_bars(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, float, str]]:
    """``(label, ms, kind)`` per stage in pipeline order, kind ``compute`` or ``link``, from
    ``coinf plan --helpers``'s stage rows (device, slice, compute_ms, link_ms, compressor)."""
    bars: list[tuple[str, float, str]] = []
    for i, r in enumerate(rows):
        bars.append((f"{r['device']}: {r['slice']}", float(r["compute_ms"]), "compute"))
        if r.get("link_ms") is not None:
            nxt = rows[i + 1]["device"] if i + 1 < len(rows) else "?"
            what = r.get("compressor") or "raw"
            size = f", {r['link_bytes']} B" if r.get("link_bytes") is not None else ""
            bars.append((f"link {r['device']} -> {nxt} ({what}{size})", float(r["link_ms"]),
                         "link"))
    return bars


def plot_pipeline(rows: Sequence[Mapping[str, Any]], path: str | Path, title: str = "",
                  footer: Sequence[str] = ()) -> Path:
    """Draw the stages of a pipeline plan to a PNG at ``path`` (its parent must exist)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = stage_bars(rows)
    if not bars:
        raise ValueError("a pipeline plan with no stage")
    worst = max(range(len(bars)), key=lambda i: bars[i][1])
    height = 1.6 + 0.45 * len(bars) + 0.22 * len(footer)
    fig, ax = plt.subplots(figsize=(11.0, height))
    y = list(range(len(bars)))[::-1]
    top = max(ms for _, ms, _ in bars) or 1.0
    for yi, (i, (_label, ms, kind)) in zip(y, enumerate(bars), strict=True):
        colour = BOTTLENECK_COLOUR if i == worst else (
            COMPUTE_COLOUR if kind == "compute" else LINK_COLOUR)
        ax.barh(yi, ms, color=colour, height=0.6)
        ax.text(ms + top * 0.01, yi, f"{ms:.2f} ms" + ("  bottleneck" if i == worst else ""),
                va="center", fontsize=8, fontweight="bold" if i == worst else "normal")
    ax.set_yticks(y)
    ax.set_yticklabels([b[0] for b in bars], fontsize=9)
    ax.set_xlim(0, top * 1.3)
    ax.set_xlabel("time per frame (ms); a stream's period is its slowest stage")
    bound = 1e3 / bars[worst][1] if bars[worst][1] > 0 else float("inf")
    ax.set_title(f"{title}  |  at most {bound:.1f} frames/s" if title else
                 f"at most {bound:.1f} frames/s", fontsize=11)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=COMPUTE_COLOUR, label="compute (device, slice)"),
                       Patch(color=LINK_COLOUR, label="link (what it carries)"),
                       Patch(color=BOTTLENECK_COLOUR, label="bottleneck")],
              fontsize=8, loc="lower right", frameon=False)
    if footer:
        text = "\n".join(textwrap.shorten(line, 160) for line in footer)
        fig.text(0.01, 0.01, text, fontsize=8, va="bottom", ha="left")
    fig.tight_layout(rect=(0, 0.22 * len(footer) / height if footer else 0, 1, 1))
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


__all__ = ["plot_pipeline", "stage_bars"]
