"""Text of ``coinf run``'s results: the table of measured cuts, the stream and planner lines,
the per-cut progress line, and byte sizes (B or kB)."""

from __future__ import annotations

from typing import Any


def size_text(n: float) -> str:
    """A byte count as ``B`` below 1000, else ``kB`` with one decimal."""
    return f"{n:.0f} B" if n < 1000 else f"{n / 1000:.1f} kB"


def progress_line(row: dict[str, Any], repeat: int) -> str:
    """One cut measured: what went over the link per inference, packed (median), beside the
    crossing's unpacked size, and the median end-to-end time."""
    head = f"{row['candidate']} ({row['label']}): {repeat} run(s)"
    if row["bytes"] == 0:
        return f"{head}, sent nothing, {row['total_ms']:.1f} ms"
    sent = size_text(row["bytes_up"])
    return (f"{head}, sent {sent} as {row['packing']} ({size_text(row['bytes'])} unpacked), "
            f"{row['total_ms']:.1f} ms")


def format_table(rows: list[dict[str, Any]], show_links: bool = False) -> str:
    """The measured cuts, one row each (``show_links``: the links that carried the runs)."""
    head = (f"{'candidate':<10} {'packing':<9} {'cut after':<28} {'sent B':>9} {'head ms':>8} "
            f"{'pack ms':>8} {'xfer ms':>8} {'tail ms':>8} {'ret ms':>8} {'e2e ms':>8}  match")
    lines = [head, "-" * len(head)]
    for r in rows:
        label = r["label"] if len(r["label"]) <= 28 else "…" + r["label"][-27:]
        match = ("lossy, top-1 " + ("same" if r.get("top1_same") else "CHANGED")) \
            if r.get("lossy") else "yes" if r["match"] else "NO"
        lines.append(
            f"{r['candidate']:<10} {r.get('packing', 'raw'):<9} {label:<28} "
            f"{round(r.get('bytes_up', r['bytes'])):>9} "
            f"{r['head_ms']:>8.2f} {r['pack_ms']:>8.2f} {r['transfer_ms']:>8.2f} "
            f"{r['tail_ms']:>8.2f} {r['return_ms']:>8.2f} {r['total_ms']:>8.2f}  "
            f"{match}"
            + (f"  (finished on the wearable {r['fallbacks']}x: handheld unavailable)"
               if r.get("fallbacks") else "")
            + ("  (over " + ", ".join(f"{n} {c}x" for n, c in r["links"].items()) + ")"
               if show_links and r.get("links") else "")
        )
    return "\n".join(lines)


def format_stream(s: dict[str, Any]) -> str:
    """The ``--stream`` result in one line: frames/s one at a time and pipelined."""
    return (f"streaming {s['frames']} frames at {s['cut']}: {s['sequential_fps']:.2f} frames/s one "
            f"at a time, {s['pipelined_fps']:.2f} frames/s pipelined ({s['speedup']:.2f}x)")


def format_plan(p: dict[str, Any]) -> str:
    """The ``--planner-runs`` result in one line: the planner's choice against the table."""
    predicted = "?" if p["predicted_ms"] is None else f"{p['predicted_ms']:.2f}"
    line = (f"planner ({p['objective']} objective, {p['runs']} runs): chose {p['chosen']} "
            f"({p['label']}), predicted {predicted} ms, measured {p['measured_ms']:.2f} ms "
            "(median)")
    if p["fastest_in_table"]:
        line += f"; fastest in the table: {p['fastest_in_table']} at {p['fastest_ms']:.2f} ms"
    return line
