"""``--png`` of ``bench plan`` and ``bench memory``: run end to end, the picture is written, the
JSON names it, and an unwritable path is refused before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coinf.cli import main
from tests.bundles import make_tiny_bundle
from tests.planner_bundle import make_bundle

PNG = b"\x89PNG\r\n\x1a\n"


def test_bench_plan_draws_every_configuration(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    bundle = make_bundle(tmp_path / "b", hw=16)
    png = tmp_path / "plan.png"
    assert main(["bench", "plan", "--bundle", str(bundle.root), "--bandwidth-kbps", "5000",
                 "--wearable-slowdown", "1", "--runs", "1", "--repeats", "2",
                 "--png", str(png)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["png"] == str(png) and png.read_bytes()[:8] == PNG
    assert {c["id"] for c in got["candidates"]} == {c.id for c in bundle.candidates}


def test_bench_memory_draws_every_head(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")
    png = tmp_path / "memory.png"
    assert main(["bench", "memory", "--bundle", str(bundle.root), "--runs", "1",
                 "--png", str(png)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["png"] == str(png) and png.read_bytes()[:8] == PNG
    assert [r["id"] for r in got["candidates"]] == ["c001", "c002"]  # the cuts with a head


@pytest.mark.parametrize("bench", [["plan", "--wearable-slowdown", "1"], ["memory"]])
def test_an_unwritable_png_is_refused_first(tmp_path: Path, bench: list[str],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")
    assert main(["bench", *bench, "--bundle", str(bundle.root),
                 "--png", str(tmp_path / "no" / "such" / "dir" / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "--png" in err and "Traceback" not in err


# time beyond the suite's 30 s a test: a radio and a handheld process over BLE, killed and
# restarted (~16 s alone)
@pytest.mark.timeout(180)
def test_bench_faults_draws_each_scenario_over_time(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")
    png = tmp_path / "faults.png"
    assert main(["bench", "faults", "--bundle", str(bundle.root), "--split", "c001",
                 "--inferences", "12", "--period-ms", "50", "--fault-s", "1",
                 "--scenarios", "handheld_killed", "--png", str(png), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    (row,) = got["scenarios"]
    assert row["scenario"] == "handheld_killed" and row["inferences"] >= 12
    assert row["wrong"] == 0 and row["correct"] + row["lost"] == row["inferences"]
    assert got["png"] == str(png) and png.read_bytes()[:8] == PNG


# time beyond the suite's 30 s a test: two LeNet pruning runs of one epoch each (~16 s alone)
@pytest.mark.timeout(120)
def test_bench_prune_draws_each_strength(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")  # bench prune trains (the models extra)
    png = tmp_path / "prune.png"
    assert main(["bench", "prune", "--epochs", "1", "--finetune-epochs", "1", "--strengths",
                 "1e-3,3e-3", "--repeats", "2", "--png", str(png), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [r["strength"] for r in got["rows"]] == [1e-3, 3e-3]
    assert all(0 < r["flops_reduction_pct"] < 100 for r in got["rows"])
    assert got["png"] == str(png) and png.read_bytes()[:8] == PNG


def test_bench_spatial_draws_the_speedup_against_the_link(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "spatial.png"
    assert main(["bench", "spatial", "--model", "vgg", "--devices", "2", "--frames", "1",
                 "--slowdown", "1", "--sweep", "100", "--png", str(png), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [p["mbps"] for p in got["sweep"]] == [50.0, 100.0]
    assert all(p["speedup"] > 0 for p in got["sweep"]) and got["max_abs_err"] < 1e-3
    assert got["png"] == str(png) and png.read_bytes()[:8] == PNG


def test_bench_link_draws_each_message_against_the_capacity(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "link.png"
    assert main(["bench", "link", "--preset", "pi-zero-2w", "--bytes", "5000", "--messages", "2",
                 "--direction", "both", "--png", str(png), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert {d: len(v) for d, v in got["message_bps"].items()} == {"up": 2, "down": 2}
    # a message cannot cross faster than the radio's capacity (goodput <= capacity)
    assert all(0 < r <= got["capacity_bps"] for v in got["message_bps"].values() for r in v)
    assert got["png"] == str(png) and png.read_bytes()[:8] == PNG
