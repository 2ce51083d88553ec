"""Choosing among local, depth split, n-device pipeline and spatial partition."""

from __future__ import annotations

import json

import pytest
from coinf.convert.split import split_model
from coinf.models.zoo import committed_path
from coinf.wearable.planner.pipeline_dp import cut_points
from coinf.wearable.planner.strategy import choose, compare

from coinf.errors import InputError

# time beyond the suite's 30 s a test: profiles and predicts strategies per model (up to 16 s alone)
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def vgg(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return split_model(committed_path("vgg"), tmp_path_factory.mktemp("st") / "vgg",
                       max_candidates=12)


def _options(bundle, bandwidth: float, helper_speed: float = 2e9):  # type: ignore[no-untyped-def]
    names = ["wearable", "h1", "h2", "h3"]
    speeds = [1e9] + [helper_speed] * 3
    result = sum(t.nbytes for t in bundle.outputs)
    return compare(cut_points(bundle), names, speeds, [bandwidth] * 3, [0.002] * 3, result,
                   bundle.model_path)


def test_every_strategy_is_predicted_and_the_situation_decides(vgg) -> None:  # type: ignore[no-untyped-def]
    fast = _options(vgg, 12.5e6)
    assert [o.name for o in fast] == ["local", "depth split", "pipeline", "spatial"]
    by = {o.name: o for o in fast}
    local = by["local"]
    assert local.latency_s == pytest.approx(cut_points(vgg)[-1].flops / 1e9)
    # Wi-Fi-class links, faster helpers: spreading the work beats keeping it
    best, why = choose(fast, "latency")
    assert best.name != "local" and best.latency_s < local.latency_s and best.name in why
    stream, _ = choose(fast, "throughput")
    assert stream.throughput_fps >= max(o.throughput_fps for o in fast)
    assert by["pipeline"].throughput_fps > local.throughput_fps
    # a 1 kB/s link: nothing is worth sending, the wearable keeps the model
    slow = _options(vgg, 1e3)
    assert choose(slow, "latency")[0].name == "local"
    assert {o.name: o for o in slow}["spatial"].latency_s >= local.latency_s * 0.999
    with pytest.raises(InputError, match="objective"):
        choose(fast, "fastest")


def test_a_stream_bounded_by_the_wearable_says_more_devices_cannot_help(vgg) -> None:  # type: ignore[no-untyped-def]
    # a slow wearable on a BLE-class link, fast helpers: the wearable's stage bounds every plan
    names = ["wearable", "h1", "h2"]
    result = sum(t.nbytes for t in vgg.outputs)
    options = compare(cut_points(vgg), names, [1e8, 1e11, 1e11], [2e4, 5e6], [0.015, 0.002],
                      result, objective="throughput")
    best, why = choose([o for o in options if o.runnable], "throughput")
    assert best.name != "pipeline"
    assert "More devices cannot help: the 3-device pipeline" in why
    assert "slowest stage the wearable's compute" in why or "the link wearable -> h1" in why


def test_plan_command_explains_the_choice(vgg, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from coinf.cli import main

    config = tmp_path / "p.json"
    config.write_text(json.dumps({"helpers": [
        {"name": f"h{i}", "address": f"tcp:127.0.0.1:{9 + i}", "bandwidth_kbps": 6250,
         "latency_ms": 2, "speed_gflops": 50} for i in range(3)]}))
    assert main(["plan", str(vgg.root), "--pipeline", str(config), "--json",
                 "--wearable-slowdown", "20"]) == 0
    out = json.loads(capsys.readouterr().out)
    names = [s["strategy"] for s in out["strategies"]]
    assert names == ["local", "depth split", "pipeline", "spatial"]
    assert out["chosen"] in names and out["why"].startswith(out["chosen"])
    assert out["objective"] == "latency"
    # what a Session given these helpers runs: a plan the executor takes as it is
    assert out["strategy"] == out["plan"]["strategy"] in ("local", "split", "pipeline")
    assert out["plan"]["stages"][0]["device"] == "wearable"
    runnable = [a for a in out["strategies"] if a["strategy"] != "spatial"]
    assert out["plan"]["latency_ms"] == pytest.approx(min(a["latency_ms"] for a in runnable),
                                                      rel=1e-3)
    assert out["chosen"] != "spatial" and "not run" in out["spatial"]
    spatial = next(s for s in out["strategies"] if s["strategy"] == "spatial")
    assert any("not run" in n for n in spatial["notes"])
    # the 2-device planner's columns, for every plan the executor runs
    for a in runnable:
        assert a["wearable_mj"] > 0 and a["stage_ms"] and a["loss_pp"] >= 0
        assert sum(a["stage_ms"]) <= a["latency_ms"] + 1e-6
    # the text report prints them under the same names as `coinf plan` without helpers
    assert main(["plan", str(vgg.root), "--pipeline", str(config),
                 "--wearable-slowdown", "20"]) == 0
    text = capsys.readouterr().out
    for col in ("head", "xfer", "tail", "latency", "E_wear", "bytes", "acc"):
        assert col in text.splitlines()[0]
    assert main(["plan", str(vgg.root), "--wearable-slowdown", "20"]) == 0
    two = capsys.readouterr().out
    header = next(line for line in two.splitlines() if "candidate" in line)
    for col in ("head", "xfer", "tail", "latency", "E_wear", "bytes", "acc"):
        assert col in header


def test_bench_strategies_predicts_every_way_per_device_set_and_link(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The sweep behind the decision to keep spatial partition out of the runtime: one row per
    model x device set x link with every strategy's prediction, the winner and spatial's ratio
    to the best plan the executor runs; over BLE the wearable keeps the model."""
    from coinf.cli import main

    assert main(["bench", "strategies", "--models", "vgg", "--sets", "L,L+L",
                 "--links", "ble-20k,wifi-5M", "--png", str(tmp_path / "s.png")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["png"] and (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    rows = out["rows"]
    assert [(r["set"], r["link"]) for r in rows] == [("L", "ble-20k"), ("L", "wifi-5M"),
                                                      ("L+L", "ble-20k"), ("L+L", "wifi-5M")]
    for r in rows:
        assert r["best_runnable"] in ("local", "depth split", "pipeline")
        best = min(v for v in (r["local_ms"], r["split_ms"], r["pipeline_ms"]) if v is not None)
        assert r["spatial_ratio"] == pytest.approx(r["spatial_ms"] / best, rel=1e-2)
        # one radio shared by every tile never makes spatial partition faster
        assert r["spatial_shared_ms"] >= r["spatial_ms"] - 1e-6
    assert [r["best_runnable"] for r in rows if r["link"] == "ble-20k"] == ["local", "local"]
    assert out["verdict"].startswith("spatial partition wins")
    assert main(["bench", "strategies", "--sets", "L,phones"]) == 2
    assert "unknown ['phones']" in capsys.readouterr().err
