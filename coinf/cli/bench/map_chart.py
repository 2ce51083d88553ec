"""The picture of ``coinf bench map``: one row per model, one column per link x objective; each
cell coloured by what won (measured), with the chosen plan, its gain over the wearable alone and
its regret."""

from __future__ import annotations

from typing import Any

COLOURS = {"local": "#d9d9d9", "offload": "#9ecae1", "split": "#a1d99b", None: "#ffffff"}
WORDS = {"local": "wearable alone", "offload": "send the input", "split": "split"}
LINK_NAMES = {"ble": "BLE 4.2 1M\n(Pi Zero 2 W)", "ble-2m": "BLE 5 2M+DLE",
              "ble-dle": "BLE 4.2 DLE", "wifi": "Wi-Fi 802.11n\n(Pi Zero 2 W)"}


def plot_map(cells: list[dict[str, Any]], models: list[str], links: list[str],
             objectives: list[str], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    cols = [(link, o) for link in links for o in objectives]
    fig, ax = plt.subplots(figsize=(2.3 * len(cols) + 1.5, 1.25 * len(models) + 1.6))
    by = {(c["model"], c["link"], c["objective"]): c for c in cells}
    for i, model in enumerate(models):
        for j, (link, o) in enumerate(cols):
            c = by.get((model, link, o))
            kind = c["winner_kind"] if c else None
            ax.add_patch(Rectangle((j, len(models) - 1 - i), 1, 1, facecolor=COLOURS[kind],
                                   edgecolor="white", lw=2))
            if c is None:
                continue
            ch = c["chosen"]
            lines = [f"chose {WORDS.get(ch['kind'], ch['kind'])}", ch["id"]]
            gain = c.get("best_vs_local")
            if gain is not None and c["winner_kind"] != "local":
                metric = "faster" if o == "latency" else "less energy"
                lines.append(f"best: {gain:.1f}x {metric}")
            if c.get("regret") is not None:
                lines.append(f"regret {c['regret']:.2f}")
            elif not ch.get("measured"):
                lines.append("chosen not run")
            ax.text(j + 0.5, len(models) - 0.5 - i, "\n".join(lines), ha="center",
                    va="center", fontsize=7)
    ax.set_xlim(0, len(cols))
    ax.set_ylim(0, len(models))
    ax.set_xticks([j + 0.5 for j in range(len(cols))])
    ax.set_xticklabels([f"{LINK_NAMES.get(link, link)}\n{o}" for link, o in cols], fontsize=7)
    ax.set_yticks([len(models) - 0.5 - i for i in range(len(models))])
    ax.set_yticklabels(models, fontsize=8)
    ax.tick_params(length=0)
    for s in ax.spines.values():
        s.set_visible(False)
    ax.legend(handles=[Patch(facecolor=COLOURS[k], label=f"best measured: {WORDS[k]}")
                       for k in ("local", "offload", "split")],
              loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, fontsize=7,
              frameon=False)
    ax.set_title("Where cooperation pays: Pi Zero 2 W + laptop, measured end to end over the "
                 "emulated links\n(colour: what won; text: the planner's choice, the best "
                 "point's gain over the wearable alone, the choice's regret)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
