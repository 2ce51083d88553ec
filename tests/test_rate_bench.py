"""``coinf bench rate`` on a small image bundle and real photos: the codec and split families,
the summary at the tolerance, the plot; bad arguments refused before any work."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from coinf.ble_protocol import media

from coinf.cli import main
from tests.planner_bundle import make_bundle
from tests.test_codec_plan import photos


def test_bench_rate_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not {"jpeg", "webp", "png"} <= media.available():
        pytest.skip("the codecs extra is not installed")
    bundle = make_bundle(tmp_path / "b", hw=16)
    np.savez(tmp_path / "p.npz", x=photos(40, 16))
    png = tmp_path / "rate.png"
    assert main(["bench", "rate", "--bundle", str(bundle.root), "--data",
                 str(tmp_path / "p.npz"), "--cuts", "1", "--png", str(png), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    points = out["points"]
    families = {p["family"] for p in points}
    assert families == {"codec", "input", "split"}
    codec = [p for p in points if p["family"] == "codec"]
    assert {p["method"] for p in codec} == {"jpeg", "webp", "png"}
    assert all(p["cut"] == "c000" and p["encode_ms"] > 0 for p in codec)
    split = {p["cut"] for p in points if p["family"] == "split"}
    assert split == {"c002"}  # --cuts 1: the cut that sends least (after the pooling)
    s = out["summary"]
    ok = [p["bytes"] for p in codec if p["quality_loss"] <= 1.0]
    assert s["best_codec_bytes"] == (round(min(ok), 1) if ok else None)
    assert s["best_split"]["cut"] == "c002"
    assert png.is_file() and png.stat().st_size > 10_000
    raw = next(p for p in points if p["family"] == "input" and p["packing"] == "raw")
    assert raw["bytes"] == 3 * 16 * 16 * 4


@pytest.mark.parametrize("argv,text", [
    (["--model", "x", "--bundle", "y"], "either --model"),
    (["--bundle", "y"], "--bundle needs --data"),
    (["--model", "mobilenetv2_imagenet", "--cuts", "0"], "--cuts must be >= 1"),
])
def test_bad_arguments_are_one_line(argv: list[str], text: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "rate", *argv]) == 2
    err = capsys.readouterr().err
    assert text in err and "Traceback" not in err
