"""The CLI's shared contracts: every benchmark accepts ``--json``; user errors exit 2 quietly."""

from __future__ import annotations

from pathlib import Path

import pytest

from coinf.cli import build_parser, main
from coinf.cli.bench import BENCHES


@pytest.mark.parametrize("name", [b[0] for b in BENCHES])
def test_every_bench_accepts_json(name: str) -> None:
    parser = build_parser()
    required = {"plan": ["--bundle", "b"], "predict": ["--bundle", "b"],
                "stream": ["--bundle", "b"], "overhead": ["m.onnx"], "faults": ["--bundle", "b"],
                "runtime": ["--bundle", "b"], "memory": ["--bundle", "b"], "split": ["m.onnx"],
                "attack": ["--bundle", "b"], "hostile": ["--bundle", "b"]}
    args = parser.parse_args(["bench", name, *required.get(name, []), "--json"])
    assert args.json is True


def test_missing_bundle_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "predict", "--bundle", "/nonexistent/bundle", "--json"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "/nonexistent/bundle" in err


def test_bench_predict_wants_a_bundle_or_the_zoo(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ([], ["--bundle", "b", "--zoo"]):
        assert main(["bench", "predict", *argv, "--json"]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and "--bundle" in err and "--zoo" in err
    assert main(["bench", "predict", "--zoo", "--synthetic", "-1"]) == 2
    assert "--synthetic" in capsys.readouterr().err
    assert main(["bench", "predict", "--zoo", "--passes", "0"]) == 2
    assert "--passes must be >= 1, got 0" in capsys.readouterr().err
    assert main(["bench", "predict", "--zoo", "--family", "small=-1"]) == 2
    assert "small=N needs N >= 0" in capsys.readouterr().err
    assert main(["bench", "predict", "--zoo", "--family", "tiny=3"]) == 2
    assert "one of small, gated, mobile" in capsys.readouterr().err
    assert main(["bench", "predict", "--zoo", "--family", "gated=x"]) == 2
    assert "whole number" in capsys.readouterr().err
    assert main(["bench", "predict", "--zoo", "--profile", "p.json"]) == 2
    assert "--profile" in capsys.readouterr().err


def test_bench_predict_zoo_reports_the_families_it_trained_on(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    import coinf.research.context_data as cd

    seen: dict[str, object] = {}

    def scored(cache: object, repeats: int, synthetic: int, **kw: object) -> dict[str, object]:
        seen.update(kw)  # the expensive leave-one-model-out itself is tested in test_incontext
        row = {"within_10pct": 0.5, "profiled_within_10pct": None, "additive_within_10pct": 1.0,
               "plan_regret": {"x1@10kB/s": 0.0, "x10@break-even": 0.1}}
        return {"a": dict(row), "b": {**row, "within_10pct": 1.0,
                                      "plan_regret": {"x1@10kB/s": 0.2}}}

    monkeypatch.setattr(cd, "zoo_leave_one_out", scored)
    assert main(["bench", "predict", "--zoo", "--synthetic", "7", "--family", "gated=3",
                 "--passes", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["families"] == {**cd.FAMILY_NETWORKS, "gated": 3} == seen["families"]
    assert out["passes"] == 1 == seen["passes"]  # scores a `profile --train` context cache
    assert out["synthetic"] == 7 and out["mean_within_10pct"] == pytest.approx(0.75)
    assert out["min_within_10pct"] == 0.5
    # the worst model per condition, over the conditions any model has
    assert out["max_plan_regret"] == {"x1@10kB/s": 0.2, "x10@break-even": 0.1}
    assert out["max_measurement_plan_regret"] is None
    # the goal is plan regret; slice accuracy stands next to the measurement's repeatability
    assert out["plan_regret_target"] == 0.02 and out["worst_plan_regret"] == 0.2
    assert out["meets_plan_regret_target"] is False
    assert out["measurement_repeatability_within_10pct"] == {"a": None, "b": None}


def test_bench_predict_bundle_holds_plan_regret_against_its_target(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--bundle`` end to end on a tiny model, the zoo training replaced by a fixed
    predictor: the JSON leads with plan regret and its target, and reports slice accuracy
    next to how well the two measurement passes repeat."""
    import json

    import coinf.research.context_data as cd
    import onnx
    from coinf.convert.split import split_model
    from coinf.device.predict import Linear
    from coinf.device.slicepred import SlicePredictor

    from tests.test_incontext import conv_bn_relu_gemm

    onnx.save(conv_bn_relu_gemm(), str(tmp_path / "m.onnx"))
    bundle = split_model(tmp_path / "m.onnx", tmp_path / "b")
    fixed = SlicePredictor({"*": Linear([0.5, 0.0, 0.0, 0.0], -3.0, log=True)})
    monkeypatch.setattr(cd, "train_on_zoo", lambda *a, **kw: (fixed, ["other"]))
    monkeypatch.setattr(cd, "profiled_constants", lambda *a: (1.0, 0.0, 0.0, 0.0, 0.0, 0.0))
    assert main(["bench", "predict", "--bundle", str(bundle.root), "--scale", "0.01",
                 "--repeats", "3", "--cache", str(tmp_path / "cache"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["leave_one_model_out"] is True and out["slices"] > 0
    assert out["plan_regret_target"] == 0.02
    assert out["worst_plan_regret"] == max(out["plan_regret"].values()) >= 0.0
    assert out["meets_plan_regret_target"] == (out["worst_plan_regret"] <= 0.02)
    assert 0.0 <= out["measurement_repeatability_within_10pct"] <= 1.0
    assert set(out["within_10pct"]) == {"incontext", "coinf", "neurosurgeon"}


def test_bench_predict_zoo_warns_of_slice_times_that_do_not_add_up(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    import coinf.research.context_data as cd

    rows = {"a": {"within_10pct": 0.2, "profiled_within_10pct": None,
                  "additive_within_10pct": 0.22},
            "b": {"within_10pct": 1.0, "profiled_within_10pct": None,
                  "additive_within_10pct": 0.97},
            "c": {"within_10pct": 1.0, "profiled_within_10pct": None,
                  "additive_within_10pct": None}}
    monkeypatch.setattr(cd, "zoo_leave_one_out", lambda *a, **kw: rows)
    assert main(["bench", "predict", "--zoo", "--json"]) == 0
    got = capsys.readouterr()
    assert json.loads(got.out)["inconsistent_timings"] == {"a": 0.22}
    assert "warning" in got.err and "a (0.22)" in got.err and "b (" not in got.err
    rows["a"]["additive_within_10pct"] = 0.95
    assert main(["bench", "predict", "--zoo", "--json"]) == 0
    got = capsys.readouterr()
    assert json.loads(got.out)["inconsistent_timings"] == {} and "warning" not in got.err


def test_bench_predict_zoo_names_models_whose_measurement_does_not_repeat(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    import coinf.research.context_data as cd

    def row(score: float, repeat: float | None) -> dict[str, float | None]:
        return {"within_10pct": score, "profiled_within_10pct": None,
                "additive_within_10pct": 0.97, "measurement_repeatability_within_10pct": repeat}

    rows = {"a": row(0.4, 0.56), "b": row(0.9, 0.95), "c": row(1.0, None)}
    monkeypatch.setattr(cd, "zoo_leave_one_out", lambda *a, **kw: rows)
    assert main(["bench", "predict", "--zoo", "--json"]) == 0
    got = capsys.readouterr()
    out = json.loads(got.out)
    assert out["unrepeatable_timings"] == {"a": 0.56}
    assert out["min_measurement_repeatability_within_10pct"] == 0.56
    assert out["median_measurement_repeatability_within_10pct"] == pytest.approx(0.755)
    assert "a (0.56)" in got.err and "b (" not in got.err
    rows["a"]["measurement_repeatability_within_10pct"] = 0.9
    assert main(["bench", "predict", "--zoo", "--json"]) == 0
    got = capsys.readouterr()
    assert json.loads(got.out)["unrepeatable_timings"] == {} and "repeat" not in got.err


def test_missing_optional_dependency_is_a_one_line_error(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A Pi with only coinf[wearable] gets the extra to install, not a traceback."""
    import sys

    for name in ("scipy", "scipy.sparse", "scipy.sparse.csgraph"):
        monkeypatch.setitem(sys.modules, name, None)  # `import scipy...` now fails
    assert main(["bench", "mincut", "--repeats", "1"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "coinf[convert]" in err and "scipy" in err
    assert main(["profile", "--train", "--quick", "--out", "/nonexistent/p.json"]) == 2
    err = capsys.readouterr().err
    assert "coinf[train]" in err and "scipy" in err


def test_the_pi_wheel_names_a_full_install_for_what_it_leaves_out(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    """The lean wheel (`make wheel-pi`, setup.py) has no benchmarks and no zoo builders:
    `coinf bench` and `coinf models build` print one line naming a full install, exit 2."""
    import sys

    monkeypatch.delitem(sys.modules, "coinf.cli.commands.bench", raising=False)
    monkeypatch.setitem(sys.modules, "coinf.cli.bench", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "coinf.models.architectures", None)
    assert main(["bench", "rate", "--json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert ("benchmarks are not part of the Pi install; run them from a full install" in err
            and "[demo]" in err)
    assert main(["models", "build", "lenet_digits", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model builders are not part of the Pi install" in err
    assert "[models]" in err


def test_run_every_candidate_then_let_the_planner_choose(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """`coinf run --all --plan N` (what the demo's wearable process does), in-process."""
    import json

    from tests.bundles import make_tiny_bundle

    bundle = make_tiny_bundle(tmp_path / "b")
    assert main(["run", str(bundle.root), "--all", "--repeat", "1", "--planner-runs", "2",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ids = {c.id for c in bundle.candidates}
    assert {r["candidate"] for r in out["rows"]} == ids and all(r["match"] for r in out["rows"])
    plan = out["plan"]
    assert plan["runs"] == 2 and sum(plan["choices"].values()) == 2
    assert plan["chosen"].split("~")[0] in ids and plan["measured_ms"] > 0
    assert plan["fastest_in_table"] in ids
    assert main(["run", str(bundle.root), "--plan", "-1"]) == 2


def test_run_lists_each_measured_run_and_the_uncounted_warmups(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`coinf run --warmup 2 --repeat 3 --json`: three runs listed per row (their median is
    the row's figure), the two warm-ups apart; a warm-up count out of range is one line."""
    import json
    import statistics

    from tests.bundles import make_tiny_bundle

    bundle = make_tiny_bundle(tmp_path / "b")
    assert main(["run", str(bundle.root), "--all", "--repeat", "3", "--warmup", "2",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows and all(len(r["warmup_ms"]) == 2 and len(r["runs"]["total_ms"]) == 3
                        for r in rows)
    for r in rows:
        assert r["total_ms"] == pytest.approx(statistics.median(r["runs"]["total_ms"]),
                                              abs=1e-3)
    assert main(["run", str(bundle.root), "--all", "--warmup", "-1"]) == 2
    assert "--warmup" in capsys.readouterr().err


def test_profile_refuses_a_pass_count_below_one_before_measuring(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`coinf profile --train --passes 0` names the flag and writes nothing."""
    out = tmp_path / "p.json"
    assert main(["profile", "--train", "--quick", "--passes", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--passes must be >= 1, got 0" in err and "Traceback" not in err
    assert not out.exists()
