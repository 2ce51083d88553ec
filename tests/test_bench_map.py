"""bench map's judgement of a cell and its picture, on measured-looking figures (the end-to-end
cell is tests/test_demo_real.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coinf.cli import main
from coinf.cli.bench import map as bench_map
from coinf.cli.bench.map_chart import plot_map
from tests.planner_bundle import make_bundle


def _plan(ids: list[str]) -> dict:
    entry = {i: {"id": i, "quality_loss": 0.0, "latency_ms": 1.0, "wearable_mj": 1.0}
             for i in ids}
    return {"chosen": entry[ids[0]], "reference": {
        "wearable_only": entry["c003"], "handheld_raw": entry["c000"],
        "handheld_codec": None, "best_split": entry["c001"]}}


def test_regret_and_gain_come_from_the_measured_figures(tmp_path: Path) -> None:
    b = make_bundle(tmp_path / "b")
    measured = {"c000": {"measured": True, "latency_ms": 400.0, "wearable_mj": 50.0},
                "c001": {"measured": True, "latency_ms": 300.0, "wearable_mj": 90.0},
                "c003": {"measured": True, "latency_ms": 600.0, "wearable_mj": 500.0}}
    lat = bench_map.cell(b, _plan(["c000", "c001", "c003"]), measured, "latency")
    assert lat["best_measured"] == "c001" and lat["winner_kind"] == "split"
    assert lat["regret"] == pytest.approx(400 / 300, rel=1e-3)
    assert lat["best_vs_local"] == pytest.approx(2.0)
    energy = bench_map.cell(b, _plan(["c000", "c001", "c003"]), measured, "energy")
    assert energy["regret"] == 1.0 and energy["winner_kind"] == "offload"
    assert energy["best_vs_local"] == pytest.approx(10.0)
    s = bench_map.summary([{"model": "m", "link": "ble", **lat},
                           {"model": "m", "link": "ble", **energy}])
    assert s["within_2pct"] == 1 and s["regret_max"] == pytest.approx(400 / 300, rel=1e-3)
    assert s["winners"] == {"split": 1, "offload": 1} and len(s["cooperation_2x"]) == 2
    png = tmp_path / "map.png"
    plot_map([{"model": "m", "link": "ble", **lat}, {"model": "m", "link": "ble", **energy}],
             ["m"], ["ble"], ["latency", "energy"], str(png))
    assert png.stat().st_size > 10_000


def test_a_miss_is_tested_against_the_best_points_runs(tmp_path: Path) -> None:
    """p_vs_best: a gap that every run shows is beyond the noise; one the runs overlap on is
    not; the summary counts only the first as a miss beyond noise."""
    b = make_bundle(tmp_path / "b")

    def point(runs: list[float]) -> dict:
        return {"measured": True, "latency_ms": sorted(runs)[len(runs) // 2],
                "wearable_mj": 1.0, "runs": {"latency_ms": runs, "wearable_mj": [1.0] * 5}}

    apart = {"c000": point([110, 111, 112, 113, 114]), "c001": point([100, 101, 102, 103, 99]),
             "c003": point([900.0] * 5)}
    overlap = {"c000": point([104, 90, 120, 95, 130]), "c001": point([100, 98, 125, 92, 99]),
               "c003": point([900.0] * 5)}
    far = bench_map.cell(b, _plan(["c000", "c001", "c003"]), apart, "latency")
    near = bench_map.cell(b, _plan(["c000", "c001", "c003"]), overlap, "latency")
    assert far["regret"] > 1.02 and near["regret"] > 1.02
    assert far["p_vs_best"] < 0.05 <= near["p_vs_best"]
    s = bench_map.summary([{"model": "m", "link": "ble", **far},
                           {"model": "m", "link": "wifi", **near}])
    assert s["misses_beyond_noise"] == 1 and len(s["misses"]) == 2


def test_the_rank_test_is_exact_on_small_samples() -> None:
    assert bench_map.rank_test([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(2 / 252)
    assert bench_map.rank_test([1, 2, 3], [1, 2, 3]) == 1.0
    assert bench_map.rank_test([], [1.0]) == 1.0
    assert bench_map.rank_test(list(range(30)), list(range(100, 130))) < 1e-6  # approximated


def test_a_point_predicted_too_slow_is_reported_not_run(tmp_path: Path) -> None:
    import argparse

    args = argparse.Namespace(max_run_s=1.0, repeat=1)
    got = bench_map.measure_link(None, "ble", {"c000": {"latency_ms": 5000.0}}, 1.0, args)
    assert got == {"c000": {"measured": False,
                            "why": "predicted 5 s per run (> --max-run-s 1)"}}


def test_bad_arguments_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["bench", "map", "--models", "nope"]) == 2
    assert "--models 'nope': expected some of" in capsys.readouterr().err
    assert main(["bench", "map", "--links", "ble,lora", "--out", str(tmp_path)]) == 2
    assert "--links 'ble,lora'" in capsys.readouterr().err
    assert main(["bench", "map", "--models", "swift_f0", "--samples-for", "x=2",
                 "--out", str(tmp_path)]) == 2
    assert "--samples-for 'x=2'" in capsys.readouterr().err
