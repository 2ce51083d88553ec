"""Packing times measured again alone after parallel calibration (convert/packtime.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from coinf.convert import packcal
from coinf.convert.feeds import Dataset
from coinf.convert.metrics import Metric
from coinf.convert.packtime import retime

from tests.test_quality_criterion import _argmax_bundle

SENTINEL = 1e6  # ms: no packing of eight floats takes this long


def _rows() -> list[dict]:
    return [{"spec": "q4", "encode_ms": SENTINEL, "decode_ms": SENTINEL},
            {"spec": "f32", "encode_ms": SENTINEL, "decode_ms": SENTINEL},
            {"spec": "qz6"},  # calibrated before packings were timed: stays untimed
            {"spec": "c001-lam1e-08", "encode_ms": SENTINEL, "decode_ms": SENTINEL}]


def test_timed_rows_get_this_process_times_and_others_are_left(tmp_path: Path) -> None:
    b = _argmax_bundle(tmp_path / "b", n_in=8)
    data = Dataset("d", {"x": np.random.default_rng(1).random((6, 1, 8)).astype(np.float32)})
    results = {"c000": _rows(), "c001": _rows()}
    assert retime(b, data, results, inputs=2, flush_bytes=1 << 16) == 2
    for rows in results.values():
        for row in rows[:2]:
            assert row["encode_ms"] != SENTINEL and row["decode_ms"] != SENTINEL
            assert row["encode_ms"] >= 0 and row["decode_ms"] >= 0
        assert "encode_ms" not in rows[2]
        assert rows[3]["encode_ms"] == SENTINEL  # a learned point's: not a packing
    assert "packing" not in b.candidate("c001").extra  # the rows were lent, not stored


def test_a_head_needing_more_than_the_feeds_keeps_its_times(tmp_path: Path) -> None:
    b = _argmax_bundle(tmp_path / "b", n_in=8)
    data = Dataset("d", {"other": np.zeros((3, 1, 8), np.float32)})
    results = {"c001": _rows()}
    assert retime(b, data, results) == 0
    assert results["c001"][0]["encode_ms"] == SENTINEL


def test_parallel_calibration_times_packing_again_alone(tmp_path: Path) -> None:
    from coinf.convert.pool import calibrate_many

    b = _argmax_bundle(tmp_path / "b", n_in=8)
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(3).random((20, 8)).astype(np.float32))
    said: list[str] = []
    got = calibrate_many(b.root, tmp_path / "d.npz", [("c000", ("q8",)), ("c001", ("q4",))],
                         packcal.Options(metric=Metric("top1")), progress=said.append,
                         workers=2)
    assert any("timed again on a quiet machine: 2 candidates" in s for s in said)
    assert all(r["encode_ms"] > 0 for rows in got.values() for r in rows)
