"""The picture of ``coinf bench faults``: one panel per scenario, every inference's latency over
time (offloaded, finished on the wearable, lost), the fault's time shaded."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

COLOURS = {"offloaded": "#3182bd", "local": "#e6550d", "lost": "#000000"}
WORDS = {"offloaded": "offloaded", "local": "finished on the wearable", "lost": "lost"}


def plot_faults(scenarios: Sequence[Any], path: str, title: str) -> None:
    """``scenarios``: :class:`~coinf.cli.bench.faults.Scenario` objects (``name``, ``t0``,
    ``injected_t``, ``healed_t``, ``trace``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(scenarios), 1, figsize=(9, 1.9 * len(scenarios) + 0.8),
                             squeeze=False)
    for ax, sc in zip(axes[:, 0], scenarios, strict=True):
        if sc.injected_t is not None and sc.healed_t is not None:
            end = sc.healed_t - sc.t0 if sc.healed_t > sc.injected_t else \
                max((t for t, _, _ in sc.trace), default=0.0)  # faulty throughout
            ax.axvspan(sc.injected_t - sc.t0, end, color="#fdd0a2", alpha=0.6, lw=0,
                       label="fault")
        for kind, colour in COLOURS.items():
            pts = [(t, ms) for t, ms, k in sc.trace if k == kind]
            if pts:
                ax.scatter([t for t, _ in pts], [ms for _, ms in pts], s=4, color=colour,
                           label=f"{WORDS[kind]} ({len(pts)})")
        ax.set_yscale("log")
        ax.set_ylabel("ms", fontsize=8)
        ax.set_title(sc.name, fontsize=9, loc="left")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right", markerscale=3)
    axes[-1, 0].set_xlabel("seconds since the scenario started")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
