"""The picture of ``coinf bench stream``: a frame's stages (the slowest bounds a pipelined
stream) and the frames per second, sequential and pipelined, every repeat shown."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def plot_stream(result: dict[str, Any], sequential: Sequence[float],
                pipelined: Sequence[float], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (stages, fps) = plt.subplots(1, 2, figsize=(9, 3.6),
                                      gridspec_kw={"width_ratios": [3, 2]})
    names = list(result["stage_ms"])
    values = [result["stage_ms"][n] for n in names]
    slowest = max(range(len(values)), key=lambda i: values[i])
    stages.bar(names, values, color=["#e6550d" if i == slowest else "#9ecae1"
                                     for i in range(len(values))])
    stages.set_ylabel("median ms a frame (sequential frames)")
    stages.set_title(f"stages at {result['cut']} ({result['crossing_bytes']:,} B raw): the "
                     f"slowest bounds the stream at {result['bound_fps']:g} fps", fontsize=8)
    stages.grid(alpha=0.3, axis="y")
    for i, runs in enumerate((sequential, pipelined)):
        fps.bar(i, sorted(runs)[len(runs) // 2], color="#a1d99b")
        fps.scatter([i] * len(runs), list(runs), s=12, color="black", zorder=3)
    fps.axhline(result["bound_fps"], color="grey", ls="--", lw=1, label="bound")
    fps.set_xticks([0, 1], ["sequential", "pipelined"])
    fps.set_ylabel("frames per second (median, each repeat a dot)")
    fps.legend(fontsize=7)
    fps.grid(alpha=0.3, axis="y")
    fig.suptitle(f"{result['bundle']} over {result['preset']} "
                 f"({result['bandwidth_bps'] / 1000:g} kB/s), wearable x{result['slowdown']:g}: "
                 f"speedup {result['speedup_vs_sequential']:.2f}, efficiency "
                 f"{result['efficiency']:.2f}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
