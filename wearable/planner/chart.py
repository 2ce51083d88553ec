"""The plan chart of ``coinf plan --png``: one horizontal bar per candidate worth looking at
(the Pareto front of latency and energy, the chosen one, the extremes), latency split into head /
transfer / tail / return on a log time axis, energy per side, the excluded rows marked, and the
objective, budget, link, devices and the reason for the choice written on the figure."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

from coinf.wearable.planner.costs import CandidateCost, Decision

#: at most this many candidates on a chart (the rest are summarised in the footer)
MAX_BARS = 20
WIDTH_IN = 13.0
MAX_HEIGHT_IN = 12.0

_SEGMENTS = (("head (wearable)", "head_ms", "#4c72b0"), ("transfer (up)", "transfer_ms", "#dd8452"),
             ("tail (handheld)", "tail_ms", "#55a868"), ("return (down)", "return_ms", "#c44e52"))


def _weighted(d: Decision, r: CandidateCost) -> float:
    s = d.scores.get(r.id, {})
    return float(s.get("weighted_energy_mj", r.wearable_energy_mj + r.handheld_energy_mj))


def chart_rows(d: Decision, limit: int = MAX_BARS,
               always: tuple[str, ...] = ()) -> list[CandidateCost]:
    """The rows worth drawing, in the bundle's order: the chosen one, handheld-only and
    wearable-only, the fastest and the least-energy feasible rows, then the Pareto front of
    (latency, energy) -- spread evenly when it is longer than ``limit``. ``always``: rows always
    drawn (the reference points of ``coinf plan``)."""
    rows = d.rows
    if len(rows) <= limit:
        return list(rows)
    feasible = [r for r in rows if r.id not in d.excluded] or list(rows)

    def lat(r: CandidateCost) -> float:
        return r.latency_ms(d.streaming)

    known = {r.id for r in rows}
    must = [d.winner, rows[0].id, rows[-1].id, *(k for k in always if k in known),
            min(feasible, key=lat).id, min(feasible, key=lambda r: _weighted(d, r)).id]
    front: list[CandidateCost] = []
    best_e = math.inf
    for r in sorted(feasible, key=lambda r: (lat(r), _weighted(d, r))):
        if _weighted(d, r) < best_e:
            front.append(r)
            best_e = _weighted(d, r)
    keep = list(dict.fromkeys(must))
    room = limit - len(keep)
    rest = [r.id for r in front if r.id not in keep]
    if room > 0 and rest:
        step = len(rest) / room
        keep += list(dict.fromkeys(rest[int(i * step)] for i in range(min(room, len(rest)))))
    # a short front (one row dominates): the runners-up, best latency-and-energy rank first
    by_lat = {r.id: i for i, r in enumerate(sorted(feasible, key=lat))}
    by_e = {r.id: i for i, r in enumerate(sorted(feasible, key=lambda r: _weighted(d, r)))}
    for r in sorted(feasible, key=lambda r: by_lat[r.id] + by_e[r.id]):
        if len(keep) >= limit:
            break
        if r.id not in keep:
            keep.append(r.id)
    ids = set(keep)
    return [r for r in rows if r.id in ids]


def _ms(v: float) -> str:
    return f"{v / 1e3:.1f} s" if v >= 1000 else f"{v:.0f} ms" if v >= 10 else f"{v:.1f} ms"


def _mj(v: float) -> str:
    return f"{v / 1e3:.1f} J" if v >= 1000 else f"{v:.0f} mJ" if v >= 10 else f"{v:.1f} mJ"


def build_figure(d: Decision, title: str = "", context: str = "",
                 keep: tuple[str, ...] = ()) -> Any:
    """The matplotlib Figure of the chart (``plot_decision`` saves it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = chart_rows(d, always=keep)
    n = len(rows)
    height = min(MAX_HEIGHT_IN, 3.4 + 0.36 * n)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(WIDTH_IN, height), sharey=True,
                                   gridspec_kw={"width_ratios": [3, 2]})
    y = list(range(n))[::-1]  # first row at the top
    labels = [("▶ " if r.id == d.winner else "")
              + (f"{r.id}  {r.label}" if r.label and r.label != r.id else r.id) for r in rows]
    lat = [r.latency_ms(d.streaming) for r in rows]
    _draw_latency(ax1, rows, y, lat)
    _draw_energy(ax2, rows, y)
    top = max(lat)
    ax1.set_yticks(y)
    ax1.set_yticklabels(labels, fontsize=9)
    for yi, r, tick in zip(y, rows, ax1.get_yticklabels(), strict=True):
        if r.id == d.winner:
            tick.set_fontweight("bold")
            for ax in (ax1, ax2):
                ax.axhspan(yi - 0.45, yi + 0.45, color="#ffd54f", alpha=0.35, zorder=0)
        elif r.id in d.excluded:
            tick.set_color("#888888")
            ax1.text(top * 3.6, yi, "excluded", fontsize=8, va="center", ha="right",
                     color="#b00020", fontweight="bold")
    for ax in (ax1, ax2):
        ax.grid(axis="x", alpha=0.3)
        ax.set_ylim(-0.6, n - 0.4)
    objective = d.headline.split(" -> ", 1)[0] if d.headline else d.scheduler
    head = f"{title}: " if title else ""
    suptitle = (f"{head}chose {d.winner}" + (f" ({d.row.label})" if d.row.label else "")
                + f" -- {objective}")
    fig.suptitle(textwrap.shorten(suptitle, 130, placeholder=" ..."), fontsize=12,
                 fontweight="bold", x=0.01, ha="left")
    if context:
        fig.text(0.01, 1 - 0.5 / height, context, fontsize=9, ha="left", va="top")
    footer = _footer(d, n)
    lines = footer.count("\n") + 1
    fig.tight_layout(rect=(0, (0.2 + 0.16 * lines) / height, 1, 1 - 0.75 / height))
    fig.text(0.01, 0.1 / height, footer, fontsize=9, ha="left", va="bottom")
    return fig


def _draw_latency(ax: Any, rows: list[CandidateCost], y: list[int], lat: list[float]) -> None:
    """Latency bars: each bar's length is the total on a log axis (from a power-of-ten
    ``floor``), its colours split that length in proportion to head / transfer / tail /
    return."""
    from matplotlib.ticker import FuncFormatter

    floor = 10 ** math.floor(math.log10(max(min(v for v in lat if v > 0) / 3, 1e-3)))
    span = [math.log10(max(v, floor) / floor) for v in lat]
    done = [0.0] * len(rows)
    for name, key, color in _SEGMENTS:
        vals = [float(getattr(r, key)) for r in rows]
        starts = [floor * 10 ** (sp * dn) for sp, dn in zip(span, done, strict=True)]
        done = [dn + (v / t if t > 0 else 0.0) for dn, v, t in zip(done, vals, lat, strict=True)]
        ends = [floor * 10 ** (sp * dn) for sp, dn in zip(span, done, strict=True)]
        ax.barh(y, [e - st for st, e in zip(starts, ends, strict=True)], left=starts,
                color=color, label=name, height=0.7)
    ax.set_xscale("log")
    ax.set_xlim(floor, max(lat) * 4)
    for yi, v in zip(y, lat, strict=True):
        ax.text(max(v, floor) * 1.1, yi, _ms(v), va="center", fontsize=8)
    ax.set_xlabel("latency per inference: total on a log axis, colours = share of each part")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _ms(v)))
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=4, frameon=False)


def _draw_energy(ax: Any, rows: list[CandidateCost], y: list[int]) -> None:
    """Energy bars per side (wearable, then handheld), stacked on a linear mJ axis."""
    from matplotlib.ticker import FuncFormatter

    ew = [r.wearable_energy_mj for r in rows]
    eh = [r.handheld_energy_mj for r in rows]
    ax.barh(y, ew, color="#4c72b0", label="wearable", height=0.7)
    ax.barh(y, eh, left=ew, color="#55a868", label="handheld", height=0.7)
    emax = max([a + b for a, b in zip(ew, eh, strict=True)] + [1e-9])
    for yi, a, b in zip(y, ew, eh, strict=True):
        ax.text(a + b + emax * 0.01, yi, _mj(a + b), va="center", fontsize=8)
    ax.set_xlim(0, emax * 1.25)
    ax.set_xlabel("energy per inference (over idle, both devices)")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _mj(v) if v else "0"))
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=2, frameon=False)


def _footer(d: Decision, n: int) -> str:
    """The chart's footer: why the winner was chosen, and which of the rows the ``n`` bars show
    (with the excluded ones counted), wrapped."""
    why = ("best effort: " if d.best_effort else "why: ") + d.why
    shown = (f"{n} of {len(d.rows)} candidates shown: the chosen one, the reference points, the "
             f"Pareto front of latency and energy, then the runners-up" if n < len(d.rows)
             else f"all {n} candidates shown")
    n_ex = sum(1 for r in d.rows if r.id in d.excluded)
    if n_ex:
        first = next(v for k, v in d.excluded.items() if any(r.id == k for r in d.rows))
        shown += f"; {n_ex} excluded, e.g. {first}"
    return "\n".join(textwrap.fill(t, 160) for t in (why, shown))


def plot_decision(decision: Decision, path: str | Path, title: str = "",
                  context: str = "", keep: tuple[str, ...] = ()) -> Path:
    """Write the PNG of ``decision`` (see the module docstring); returns the path.
    ``context`` is a line under the title (link, devices, timeout)."""
    import matplotlib.pyplot as plt

    fig = build_figure(decision, title, context, keep)
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
