"""Per-candidate stacked bars (latency: head / transfer / tail / return; energy per side) with
the chosen cut marked, like the papers' figures. For ``coinf plan --png``."""

from __future__ import annotations

from pathlib import Path

from coinf.wearable.planner.costs import Decision


def plot_decision(decision: Decision, path: str | Path, title: str = "") -> Path:
    """Write a PNG of ``decision``'s cost table; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = decision.rows
    x = list(range(len(rows)))
    labels = [r.label or r.id for r in rows]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(6.0, 0.5 * len(rows) + 2), 7),
                                   sharex=True)
    bottom = [0.0] * len(rows)
    for name, key, color in (("head (wearable)", "head_ms", "#4c72b0"),
                             ("transfer", "transfer_ms", "#dd8452"),
                             ("tail (handheld)", "tail_ms", "#55a868"),
                             ("return", "return_ms", "#c44e52")):
        vals = [float(getattr(r, key)) for r in rows]
        ax1.bar(x, vals, bottom=bottom, label=name, color=color)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax1.set_ylabel("latency (ms)")
    ax1.legend(fontsize=8)
    ew = [r.wearable_energy_mj for r in rows]
    eh = [r.handheld_energy_mj for r in rows]
    ax2.bar(x, ew, label="wearable", color="#4c72b0")
    ax2.bar(x, eh, bottom=ew, label="handheld", color="#55a868")
    ax2.set_ylabel("energy (mJ)")
    ax2.legend(fontsize=8)
    win = next(i for i, r in enumerate(rows) if r.id == decision.winner)
    for ax, tops in ((ax1, bottom), (ax2, [a + b for a, b in zip(ew, eh, strict=True)])):
        ax.annotate("chosen", (win, tops[win]), ha="center", va="bottom", fontsize=9,
                    fontweight="bold")
    ax2.set_xticks(x)
    ax2.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
    ax1.set_title(title or decision.scheduler)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
