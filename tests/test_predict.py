"""Layer features, the synthetic sweep and the JSON predictors."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import onnx
import pytest
from coinf.device.features import node_features
from coinf.device.predict import Predictor
from coinf.device.sweep import Sample, run_sweep, sweep_configs

from tests.planner_bundle import make_model


@pytest.fixture(scope="module")
def quick() -> tuple[list[Sample], Predictor]:
    samples, overhead = run_sweep(scale=0.1, seed=1, threads=1, repeats=3)
    return samples, Predictor.train(samples, run_overhead_ms=overhead)


def test_features_of_known_layers(tmp_path: Path) -> None:
    model = make_model(tmp_path / "m.onnx", hw=32)
    f = {x.name: x for x in node_features(model)}
    assert f["conv1"].kind == "conv" and f["conv1"].flops == 2 * 16 * 32 * 32 * 3 * 3 * 3
    assert f["conv2"].tree[2] == 2  # stride
    assert f["conv2"].flops == 2 * 32 * 16 * 16 * 16 * 9
    assert f["relu1"].kind == "activation" and f["gap"].kind == "pool"
    assert f["fc"].kind == "gemm" and f["fc"].flops == 2 * 10 * 32
    assert f["flatten"].kind == "memory"


def test_sweep_covers_every_kind_incl_depthwise_and_rnn() -> None:
    configs = [c for c, _ in sweep_configs(scale=0.3, seed=0)]
    kinds = {node_features(m)[0].kind for _, m in sweep_configs(scale=0.1, seed=0)}
    assert kinds == {"conv", "gemm", "pool", "activation", "norm", "rnn", "eltwise"}
    assert any(c.endswith(" dw") for c in configs)
    assert any(c.startswith("LSTM") for c in configs) and any(c.startswith("GRU") for c in configs)


def test_predictor_learns_conv_scaling(quick: tuple[list[Sample], Predictor]) -> None:
    samples, pred = quick
    r2 = pred.r2_table()
    assert set(r2) == {s.features.kind for s in samples}
    convs = sorted((s for s in samples if s.features.kind == "conv"),
                   key=lambda s: s.features.flops)
    small, big = convs[0], convs[-1]
    # the predictor must order a tiny and a huge conv correctly, by a wide margin
    assert pred.predict(big.features) > 5 * pred.predict(small.features)
    assert all(pred.predict(s.features) >= 0 for s in samples)


def test_json_round_trip_is_exact(quick: tuple[list[Sample], Predictor], tmp_path: Path) -> None:
    samples, pred = quick
    pred.save(tmp_path / "p.json")
    text = (tmp_path / "p.json").read_text()
    assert "pickle" not in text
    again = Predictor.load(tmp_path / "p.json")
    for s in samples:
        for style in ("coinf", "neurosurgeon"):
            assert again.predict(s.features, style) == pred.predict(s.features, style)


def test_unprofiled_model_gets_per_node_predictions(quick: tuple[list[Sample], Predictor],
                                                     tmp_path: Path) -> None:
    _, pred = quick
    feats = node_features(make_model(tmp_path / "m.onnx", hw=64))
    ms = pred.predict_nodes(feats)
    assert set(ms) == {"conv1", "relu1", "conv2", "gap", "flatten", "fc"}
    assert ms["flatten"] == 0.0  # metadata-only op
    assert ms["conv2"] > ms["fc"]


def test_bad_predictor_json_is_rejected(quick: tuple[list[Sample], Predictor]) -> None:
    _, pred = quick
    obj = pred.to_json()
    with pytest.raises(ValueError, match="format"):
        Predictor.from_json({**obj, "format": "pickle"})
    broken = json.loads(json.dumps(obj))
    kind = next(iter(broken["kinds"]))
    broken["kinds"][kind]["coinf"]["left"] = [5, -1]
    broken["kinds"][kind]["coinf"]["right"] = [1, -1]
    broken["kinds"][kind]["coinf"]["feature"] = [0, 0]
    broken["kinds"][kind]["coinf"]["threshold"] = [0.0, 0.0]
    with pytest.raises(ValueError, match=r"outside the tree|no linear model"):
        Predictor.from_json(broken)
    broken = json.loads(json.dumps(obj))
    broken["kinds"][kind]["neurosurgeon"]["coef"] = [1.0]
    with pytest.raises(ValueError, match="coefficients"):
        Predictor.from_json(broken)


def test_profile_train_cli_quick(tmp_path: Path) -> None:
    from coinf.cli import main

    out = tmp_path / "w.json"
    assert main(["profile", "--train", "--quick", "--no-context", "--threads", "1",
                 "--repeats", "2", "--out", str(out)]) == 0
    obj = json.loads(out.read_text())
    assert obj["predictor"]["format"] == "coinf-predictor"
    assert main(["profile", "--out", str(out), "--threads", "0"]) == 2
    onnx.checker.check_model(make_model(tmp_path / "m.onnx"))


class _SteppedSession:
    """A session whose runs take ``durations`` seconds in turn on the clock ``now``."""

    def __init__(self, now: list[float], durations: list[float]) -> None:
        self.now, self.durations, self.runs = now, durations, 0

    def run(self, outputs: object, feeds: object) -> list[object]:
        self.now[0] += self.durations[self.runs % len(self.durations)]
        self.runs += 1
        return []


def test_time_session_reports_the_median_or_the_fastest_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``stat="min"`` is the fastest timed run (warm-up runs excluded), ``median`` the middle
    one; a bad statistic fails before any run."""
    import coinf.device.sweep as sweep

    now = [0.0]
    monkeypatch.setattr(sweep, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    # two warm-up runs at 0.5 ms (faster than any timed run), then 4, 2, 9, 3, 7 ms
    runs = [0.0005, 0.0005, 0.004, 0.002, 0.009, 0.003, 0.007]
    assert sweep.time_session(_SteppedSession(now, runs), {}, 2, 5, 10.0,
                              stat="min") == pytest.approx(2.0)
    assert sweep.time_session(_SteppedSession(now, runs), {}, 2, 5, 10.0) == pytest.approx(4.0)
    bad = _SteppedSession(now, runs)
    with pytest.raises(ValueError, match="stat must be 'median' or 'min', got 'mean'"):
        sweep.time_session(bad, {}, 2, 5, stat="mean")
    assert bad.runs == 0
    assert sweep.summarize([3.0, 1.0, 2.0], "min") == 1.0
    assert sweep.summarize([3.0, 1.0, 2.0]) == 2.0


class _CountingSession:
    def __init__(self) -> None:
        self.runs = 0

    def run(self, outputs: object, feeds: object) -> list[object]:
        self.runs += 1
        return []


def test_time_session_runs_a_fast_session_for_min_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fast session gets as many runs as fill ``min_s``; ``repeats`` alone without it, and the
    budget still stops a session that would run too long (a clock that advances 1 ms per
    reading, so the counts do not depend on this machine)."""
    import coinf.device.sweep as sweep

    now = [0.0]

    def clock() -> float:
        now[0] += 0.001
        return now[0]

    monkeypatch.setattr(sweep, "time", SimpleNamespace(perf_counter=clock))
    plain, long, capped = _CountingSession(), _CountingSession(), _CountingSession()
    sweep.time_session(plain, {}, warmup=2, repeats=5, budget_s=10.0)
    sweep.time_session(long, {}, warmup=2, repeats=5, budget_s=10.0, min_s=0.1)
    sweep.time_session(capped, {}, warmup=2, repeats=5, budget_s=0.02, min_s=1.0)
    assert plain.runs == 2 + 5
    assert 2 + 40 <= long.runs <= 2 + 60  # 2 readings per run: ~50 runs fill 0.1 s
    assert 2 + 5 <= capped.runs <= 2 + 15  # the budget wins over min_s
