"""``coinf bench walk`` traces one split frame and one pipeline frame through coinf's modules."""

from __future__ import annotations

import pytest

from coinf.cli.bench.walk import measure


@pytest.mark.timeout(120)  # two sessions and two helper daemons, traced
def test_the_walk_counts_the_frames_calls_and_crossings() -> None:
    out = measure(True, lambda _m: None)
    for kind, first in (("split", "coinf.wearable.session"), ("pipeline", "coinf.wearable.core")):
        walk = out[kind]
        assert walk["modules"][0] == first
        assert "coinf.wearable.executor" in walk["modules"]
        assert "coinf.ble_protocol.request" in walk["modules"]  # the request went on the wire
        assert 0 < walk["package_crossings"] <= walk["cross_module"] <= walk["calls"]
        assert len(walk["cross_module_calls"]) == walk["cross_module"]
        assert walk["threads"] >= 1 and walk["reentries"] >= 0
    # the in-process handheld's modules are imported only when the session connects: counted
    assert "coinf.handheld.daemon" in out["split"]["modules"]
    assert "coinf.handheld.forward" in out["pipeline"]["modules"]  # h1 forwarded to h2
    assert out["pipeline"]["calls"] > out["split"]["calls"]


@pytest.mark.timeout(120)  # as above
def test_the_walk_draws_both_frames_without_listing_them(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    import json

    from coinf.cli import main

    png = tmp_path / "walk.png"
    assert main(["bench", "walk", "--png", str(png), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert png.read_bytes()[:4] == b"\x89PNG" and got["png"] == str(png)
    assert "cross_module_calls" not in got["split"]  # drawn, not listed (no --list)
