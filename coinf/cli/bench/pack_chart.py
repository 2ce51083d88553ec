"""The picture of ``coinf bench pack``: every cut's packings as compression ratio against the
accuracy they cost, with the tolerance line."""

from __future__ import annotations

from typing import Any


def plot_pack(result: dict[str, Any], path: str, tolerance: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.6))
    cuts: dict[str, list[dict[str, Any]]] = {}
    for row in result.get("rows", []):
        if row.get("ratio") and row.get("accuracy_drop_pp") is not None:
            cuts.setdefault(row["cut"], []).append(row)
    for cut, rows in cuts.items():
        ax.scatter([r["ratio"] for r in rows], [r["accuracy_drop_pp"] for r in rows], s=14,
                   label=cut, alpha=0.8)
    named = result.get("best_at_1pp") or {}
    best: dict[str, Any] = next((r for r in result.get("rows", [])
                                 if (r["cut"], r["bits"]) == (named.get("cut"),
                                                              named.get("bits"))), {})
    if best.get("ratio"):
        name = f"{best['cut'].split()[0]} {best['bits']} x{best['ratio']:.1f}"
        ax.scatter([best["ratio"]], [best["accuracy_drop_pp"]], s=120, facecolors="none",
                   edgecolors="black", label=f"best within {tolerance:g} pp: {name}")
    ax.axhline(tolerance, color="grey", ls="--", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("compression ratio (float32 bytes / bytes sent)")
    ax.set_ylabel(f"accuracy drop, pp ({result.get('metric', '')})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"{result.get('model', '')}: every cut x packing on {result.get('samples', '')} "
                 f"inputs of {result.get('data', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
