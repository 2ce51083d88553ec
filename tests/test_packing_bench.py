"""``coinf bench pack`` on the hand-made test bundle: JSON shape and internal consistency."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coinf.cli import main
from tests.test_calibrate import make_bundle, make_data


def test_bench_pack_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = make_bundle(tmp_path / "b")
    make_data(tmp_path / "val.npz", n=30)
    png = tmp_path / "pack.png"
    rc = main(["bench", "pack", "--json", "--bundle", str(bundle.root), "--data",
               str(tmp_path / "val.npz"), "--repeats", "2", "--throughput-mb", "0.05",
               "--png", str(png)])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["png"] == str(png) and png.read_bytes()[:4] == b"\x89PNG"
    for key in ("model", "rows", "best_ratio_at_1pp", "pack_mb_s", "unpack_mb_s",
                "e2e_speedup_pi_zero"):
        assert key in out
    cuts = {r["cut"] for r in out["rows"]}
    assert cuts == {"c000 handheld-only", "c001 relu"}  # wearable-only sends nothing
    within = [r["ratio"] for r in out["rows"] if r["accuracy_drop_pp"] <= 1.0]
    assert out["best_ratio_at_1pp"] == max(within)
    assert out["pack_mb_s"] > 0 and out["unpack_mb_s"] > 0
    e2e = out["e2e"]
    assert e2e["transfer_model"] == "formula" and e2e["preset"] == "pi-zero-2w"
    assert 19_000 < e2e["capacity_bytes_per_s"] < 22_000  # 1M PHY, 27 B LL, 7.5 ms: ~20.5 kB/s
    assert out["e2e_speedup_pi_zero"] >= 1.0  # packing is optional, so it never loses


def test_bench_pack_names_the_reference_points(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    bundle = make_bundle(tmp_path / "b")
    make_data(tmp_path / "val.npz", n=30)
    assert main(["bench", "pack", "--json", "--bundle", str(bundle.root), "--data",
                 str(tmp_path / "val.npz"), "--repeats", "2", "--throughput-mb", "0.05"]) == 0
    e2e = json.loads(capsys.readouterr().out)["e2e"]
    ref = e2e["reference"]
    assert ref["wearable_only"]["config"] == "c002" and ref["handheld_raw"]["config"] == "c000"
    # a [1, 16] input is no image and no waveform, but every packing of it counts
    input_packed = [v for k, v in e2e["latency_ms_with_packing"].items() if k.startswith("c000 ")]
    assert ref["handheld_codec"]["config"].startswith("c000~")
    assert ref["handheld_codec"]["latency_ms"] == min(input_packed)
    assert ref["best_split"]["config"].startswith("c001")
    every = {**e2e["latency_ms_without_packing"], **e2e["latency_ms_with_packing"]}
    assert min(every.values()) <= min(r["latency_ms"] for r in ref.values() if r) + 0.01
