"""``coinf bench overhead --session``: the split, the whole model and a Session timed side by
side on the same slices, and the frame loop's cost reported as a ratio and in ms a frame."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coinf.cli import main
from tests.bundles import make_tiny_bundle


def test_the_session_is_timed_beside_plain_onnxruntime(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")
    assert main(["bench", "overhead", str(bundle.model_path), "--bundle", str(bundle.root),
                 "--split", "c001", "--runs", "5", "--warmup", "1", "--session", "--json",
                 "--png", str(tmp_path / "o.png")]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["split"], got["runs"]) == ("c001", 5)
    for key in ("full_ms", "split_ms", "session_ms"):
        assert got[key] > 0, key
    # the ms are rounded to 1e-4 and this model's slices take ~0.02 ms: a few % of rounding
    assert got["ratio"] == pytest.approx(got["split_ms"] / got["full_ms"], rel=0.03)
    assert got["session_vs_split"] == pytest.approx(got["session_ms"] / got["split_ms"], rel=0.03)
    assert got["frame_loop_ms"] == pytest.approx(got["session_ms"] - got["split_ms"], abs=1e-3)
    # a Session's frame also crosses a link and a daemon: it cannot be cheaper than the slices
    assert got["frame_loop_ms"] > 0
    png = tmp_path / "o.png"
    assert got["png"] == str(png) and png.read_bytes()[:4] == b"\x89PNG"
