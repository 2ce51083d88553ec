"""The picture of ``coinf bench fleet``: frames per CPU-second and p99 latency against the
number of wearables, the tail service beside one daemon each."""

from __future__ import annotations

from typing import Any

LABELS = {"service": "tail service (coinf serve)", "daemons": "one coinf handheld each"}


def plot_fleet(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, (eff, lat) = plt.subplots(1, 2, figsize=(10, 3.8))
    for side in ("service", "daemons"):
        rows = result.get(side) or []
        if not rows:
            continue
        label = LABELS[side]
        if side == "daemons":
            threads = result.get("daemon_threads", 0)
            label += " (--threads 1)" if threads == 1 else \
                " (as started)" if threads == 0 else f" (--threads {threads})"
        n = [r["wearables"] for r in rows]
        eff.plot(n, [r["frames_per_cpu_s"] for r in rows], marker="o", label=label)
        lat.plot(n, [r["p99_ms"] for r in rows], marker="o", label=label)
    for ax, what in ((eff, "frames per CPU-second (all server processes)"),
                     (lat, "p99 latency of a frame (ms)")):
        ax.set_xscale("log", base=2)
        counts = sorted({r["wearables"] for side in LABELS for r in result.get(side) or []})
        ax.set_xticks(counts, [str(c) for c in counts])
        ax.set_xlabel(f"wearables, each at {result.get('rate_fps', 0):g} frames/s")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
    eff.set_ylim(bottom=0)
    lat.set_yscale("log")
    lat.yaxis.set_major_formatter(ScalarFormatter())
    lat.yaxis.set_minor_formatter(NullFormatter())
    eff.legend(fontsize=8)
    engine = result.get("engine", "")
    if str(engine).startswith("ray"):
        engine += f", replicas {result.get('replicas', '')}"
    fig.suptitle(f"{result.get('model', '')} at {result.get('cut', '')}: one tail service "
                 f"({engine}) vs one daemon per wearable", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
