"""The rate-quality plot of ``coinf bench rate``: bytes sent (log axis) against quality loss."""

from __future__ import annotations

from typing import Any

STYLE = {"codec": "-", "input": ":", "split": "--", "learned": "-."}
NAMES = {"codec": "offload, codec", "input": "offload, packed input", "split": "split",
         "learned": "split + learned bottleneck"}


def _front(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points no other point beats in both bytes and loss, by bytes."""
    out: list[dict[str, Any]] = []
    for p in sorted(points, key=lambda p: (p["bytes"], p["quality_loss"])):
        if not out or p["quality_loss"] < out[-1]["quality_loss"]:
            out.append(p)
    return out


#: the plot's loss axis ends at this many tolerances (points beyond it are counted, not drawn)
CLIP_TOLERANCES = 10


def plot_rate(points: list[dict[str, Any]], path: str, title: str, tolerance: float,
              criterion: str | None = None) -> None:
    """One line per method: each codec on the input, q/qz on the input, and the best split
    (the front over every cut x packing); the tolerance as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    lines: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for p in points:
        if p["method"] == "raw":
            continue
        key = (p["family"], "best cut x packing" if p["family"] == "split" else p["method"])
        lines.setdefault(key, []).append(p)
    for (family, method), pts in sorted(lines.items()):
        pts = _front(pts) if family == "split" else sorted(pts, key=lambda p: p["bytes"])
        learned = family == "learned"  # few points, often on the split front: stand out
        ax.plot([p["bytes"] for p in pts], [p["quality_loss"] for p in pts], STYLE[family],
                marker="D" if learned else "o", ms=7 if learned else 4, zorder=3 if learned else 2,
                color="black" if learned else None, label=f"{NAMES[family]}: {method}")
        if family == "split":  # label the front where it matters: near the tolerance
            near = [p for p in pts if p["quality_loss"] <= 3 * max(tolerance, 0.5)]
            for i, p in enumerate(near[:4]):
                share = p.get("wearable_share")
                where = f" ({share:.0%} on the wearable)" if share is not None else ""
                ax.annotate(f"{p['cut']} {p['packing']}{where}", (p["bytes"], p["quality_loss"]),
                            xytext=(0.02, 0.55 - 0.06 * i), textcoords="axes fraction",
                            fontsize=6, arrowprops={"arrowstyle": "-", "lw": 0.4,
                                                    "color": "grey"})
    raw = [p for p in points if p["method"] == "raw" and p["family"] == "input"]
    for p in raw:
        ax.axvline(p["bytes"], color="grey", lw=0.8)
        ax.annotate("raw float input", (p["bytes"], 0), fontsize=7, rotation=90,
                    xytext=(-9, 5), textcoords="offset points")
    ax.axhline(tolerance, color="red", lw=0.8, ls="--")
    ax.annotate(f"{tolerance:g} pp tolerance", (ax.get_xlim()[0], tolerance), fontsize=7,
                color="red", xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    top = CLIP_TOLERANCES * max(tolerance, 0.5)  # the region where choices are made, readable
    above = sum(p["quality_loss"] > top for p in points)
    ax.set_ylim(-0.5, top if above else None)
    if above:
        ax.annotate(f"{above} point(s) above {top:g} pp not shown", (0.01, 0.97),
                    xycoords="axes fraction", fontsize=7, va="top")
    ax.set_xlabel("bytes sent per inference (log scale)")
    ax.set_ylabel({"labels": "task accuracy lost against the labels (pp)",
                   "stable": "answers changed, stable inputs (pp)"}.get(
        criterion or "", "task-quality loss vs the exact model (pp)"))
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(True, which="both", lw=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
