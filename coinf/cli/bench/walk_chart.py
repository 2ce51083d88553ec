"""The picture of ``coinf bench walk``: the package each cross-module call enters, in call order,
for one split frame and one 3-device pipeline frame."""

from __future__ import annotations

from typing import Any


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "coinf" else parts[0]


def plot_walk(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    walks = [(name, result[name]) for name in ("split", "pipeline")]
    calls = {name: [c.split(" -> ")[1] for c in w["cross_module_calls"]] for name, w in walks}
    packages = sorted({_package(m) for seq in calls.values() for m in seq})
    row = {p: i for i, p in enumerate(packages)}
    fig, axes = plt.subplots(len(walks), 1, figsize=(10, 1.0 + 0.32 * len(packages) * 2),
                             squeeze=False)
    for ax, (name, w) in zip(axes[:, 0], walks, strict=True):
        ys = [row[_package(m)] for m in calls[name]]
        ax.step(range(len(ys)), ys, where="post", lw=0.8, color="#3182bd")
        ax.scatter(range(len(ys)), ys, s=4, color="#08519c")
        ax.set_yticks(range(len(packages)), packages, fontsize=7)
        ax.set_xlim(-1, max(len(ys), 1))
        ax.grid(alpha=0.3)
        ax.set_title(f"{name}: {w['calls']} calls, {w['cross_module']} cross-module, "
                     f"{w['package_crossings']} package crossings, {w['reentries']} re-entries, "
                     f"{w['threads']} threads", fontsize=8, loc="left")
    axes[-1, 0].set_xlabel("cross-module calls, in the order they happened (every thread)")
    fig.suptitle(f"One frame through coinf's packages ({result['model']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
