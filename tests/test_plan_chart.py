"""Issue 18: the plan chart stays readable for big bundles, and `coinf plan` states its units."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from coinf.wearable.planner.chart import MAX_BARS, build_figure, chart_rows, plot_decision
from coinf.wearable.planner.costs import CandidateCost
from coinf.wearable.planner.schedulers import coinf_schedule


def rows64() -> list[CandidateCost]:
    """64 candidates: head grows, crossing bytes shrink unevenly (a zig-zag, like a CNN)."""
    out = []
    for i in range(64):
        head = 0.0 if i == 0 else 20.0 * i
        xfer = 0.0 if i == 63 else 30_000.0 / (1 + i) * (1.5 if i % 3 else 1.0)
        tail = 0.0 if i == 63 else 200.0 * (63 - i) / 63
        ret = 0.0 if i == 63 else 20.0
        cid = f"c{i:03d}"
        label = {0: "handheld-only", 63: "wearable-only"}.get(
            i, f"Conv blocks.{i // 4}/branch3x3dbl.{i % 4}")
        out.append(CandidateCost(cid, head, tail, xfer, ret, head * 1.4 + xfer * 0.15,
                                 tail * 11 + xfer * 0.05, int(xfer * 20), 0.0, label))
    return out


def test_chart_of_64_candidates_stays_within_bounds(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    d = coinf_schedule(rows64(), None)
    d.excluded = {"c000": "infeasible: test"}
    shown = chart_rows(d)
    ids = [r.id for r in shown]
    assert len(shown) <= MAX_BARS
    assert {d.winner, "c000", "c063"} <= set(ids)
    assert ids == sorted(ids)  # the bundle's order
    fig = build_figure(d, "big", "link 20 kB/s")
    try:
        w, h = fig.get_size_inches()
        assert w <= 13.5 and h <= 12.5
        lat_ax, energy_ax = fig.axes[:2]
        assert len(lat_ax.get_yticks()) == len(shown) <= MAX_BARS
        assert lat_ax.get_xscale() == "log"
        # 4 latency segments and 2 energy segments per candidate, nothing else
        from matplotlib.patches import Rectangle

        def bars(ax: object) -> int:
            patches = ax.patches  # type: ignore[attr-defined]
            return sum(1 for p in patches
                       if isinstance(p, Rectangle) and p.get_height() == pytest.approx(0.7))
        assert bars(lat_ax) == 4 * len(shown)
        assert bars(energy_ax) == 2 * len(shown)
        texts = " ".join(t.get_text() for t in fig.texts) + fig._suptitle.get_text()
        assert "why:" in texts and f"chose {d.winner}" in texts
        assert f"{len(shown)} of 64 candidates shown" in texts
        labels = [t.get_text() for t in lat_ax.get_yticklabels()]
        assert any(lab.startswith("▶ " + d.winner) for lab in labels)
        for r, lab in zip(shown, labels, strict=True):  # full labels, never cut
            assert lab.endswith(f"{r.id}  {r.label}"), lab
    finally:
        plt.close(fig)
    png = plot_decision(d, tmp_path / "big.png", "big", "link 20 kB/s")
    from PIL import Image

    with Image.open(png) as im:
        assert im.size[0] <= 1350 and im.size[1] <= 1250


def test_small_decision_shows_every_candidate() -> None:
    rows = [*rows64()[:5], rows64()[-1]]
    d = coinf_schedule(rows, 0)
    assert [r.id for r in chart_rows(d)] == [r.id for r in rows]


def test_plan_command_units_source_and_headline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from coinf.cli import main
    from tests.planner_bundle import make_bundle

    b = make_bundle(tmp_path / "b")
    monkeypatch.setenv("COINF_CONFIG", str(tmp_path / "policy.json"))
    assert main(["plan", str(b.root)]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("least energy (objective auto, no latency budget) -> chose ")
    assert "(command line)" not in out and "default: a BLE 4.2 estimate" in out
    assert "times from: head empty" not in out and "compute times: wearable heads from" in out
    assert main(["plan", str(b.root), "--bandwidth", "160kbit/s", "--rtt-ms", "10",
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert any("up 20.0 kB/s" in n and "(command line)" in n for n in got["notes"])
    assert main(["plan", str(b.root), "--bandwidth", "20kbps"]) == 2
    assert "ambiguous" in capsys.readouterr().err
    assert main(["plan", str(b.root), "--png", str(tmp_path / "missing" / "p.png")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_the_reference_points_are_always_drawn() -> None:
    from coinf.wearable.planner.chart import chart_rows
    from coinf.wearable.planner.costs import CandidateCost, Decision

    rows = [CandidateCost(f"c{i:03d}", 10.0 + i, 1.0, 5.0, 1.0, 50.0 + i, 5.0, 100)
            for i in range(40)]
    rows.insert(1, CandidateCost("c000~png", 500.0, 1.0, 900.0, 1.0, 900.0, 5.0, 100))
    d = Decision("c001", "test", rows, "t")
    assert "c000~png" not in {r.id for r in chart_rows(d, limit=8)}  # dominated: not drawn
    assert "c000~png" in {r.id for r in chart_rows(d, limit=8, always=("c000~png",))}
