"""The model zoo: committed files, reproducible builders, the trained digit model, the CLI."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from coinf.models.digits import DIGITS_SEED
from coinf.models.zoo import (
    ONNX_DIR,
    ZOO,
    committed_path,
    digits_data,
    metadata_path,
    model_stats,
    random_feed,
    spec_for,
)

from coinf.cli import main

ROOT = Path(__file__).resolve().parents[1]
NAMES = list(ZOO)
RANDOM_WEIGHT_NAMES = [n for n, s in ZOO.items() if not s.trained]
ORT_TYPES = {"float32": "tensor(float)", "int64": "tensor(int64)"}

# Python prelude that makes `import torch` fail, to prove a code path never needs torch.
NO_TORCH = "import sys; sys.modules['torch'] = None; "


def _session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _run_cli(args: list[str], prelude: str = "") -> subprocess.CompletedProcess[str]:
    code = prelude + "import sys; from coinf.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


# ---------------------------------------------------------------- committed files (no torch)


def test_every_family_is_registered_with_committed_files_within_budget() -> None:
    expected = {"lenet_digits", "alexnet", "vgg", "mobilenetv2", "inception", "resnet",
                "wavenet", "lstm_lm", "textcnn", "gru_text", "senna_mlp"}  # fmt: skip
    assert set(ZOO) == expected
    sizes = {n: committed_path(n).stat().st_size for n in NAMES}
    assert all(size < 4_000_000 for size in sizes.values()), sizes
    total = sum(p.stat().st_size for p in ONNX_DIR.glob("*.onnx"))
    assert total < 15_000_000, total
    assert sorted(p.name for p in ONNX_DIR.glob("*.onnx")) == sorted(f"{n}.onnx" for n in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_committed_model_checks_and_runs_with_declared_inputs(name: str) -> None:
    spec = spec_for(name)
    path = committed_path(name)
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    assert proto.opset_import[0].version == 17
    props = {p.key: p.value for p in proto.metadata_props}
    assert props["coinf.zoo.name"] == name
    assert json.loads(props["coinf.zoo.input_high"]) == {
        s.name: s.high for s in spec.inputs if s.high is not None
    }

    sess = _session(path)
    got = [(i.name, tuple(i.shape), i.type) for i in sess.get_inputs()]
    want = [(s.name, s.shape, ORT_TYPES[s.dtype]) for s in spec.inputs]
    assert got == want  # static shapes, batch 1, declared order
    assert [o.name for o in sess.get_outputs()] == list(spec.outputs)

    outs = sess.run(None, random_feed(name, seed=3))
    for out, meta in zip(outs, sess.get_outputs(), strict=True):
        assert tuple(out.shape) == tuple(meta.shape)
        assert np.isfinite(out).all()
        assert float(np.std(out)) > 1e-6, "constant output: weights or inputs are degenerate"
    # different inputs give different outputs (the graph really depends on its inputs)
    other = sess.run(None, random_feed(name, seed=4))
    assert not np.allclose(outs[0], other[0])


def test_random_feed_respects_vocabulary_bounds() -> None:
    for name, spec in ZOO.items():
        feed = random_feed(name, seed=7)
        for s in spec.inputs:
            arr = feed[s.name]
            assert arr.shape == s.shape and arr.dtype == np.dtype(s.dtype)
            if s.high is not None:
                assert arr.min() >= 0 and arr.max() < s.high


def test_model_stats_reads_nodes_params_and_size() -> None:
    stats = model_stats(committed_path("mobilenetv2"))
    assert stats.nodes >= 150  # BatchNormalization nodes are kept, like model-zoo exports
    proto = onnx.load(str(committed_path("mobilenetv2")))
    assert stats.params == sum(int(np.prod(t.dims)) for t in proto.graph.initializer)
    assert stats.size_bytes == committed_path("mobilenetv2").stat().st_size


# ---------------------------------------------------------------- digits data and accuracy


def test_digits_split_is_deterministic_and_disjoint() -> None:
    a, b = digits_data(), digits_data()
    assert a.seed == DIGITS_SEED
    for part in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(a, part), getattr(b, part))
    assert a.x_train.dtype == np.float32 and a.y_train.dtype == np.int64
    assert a.x_test.shape[1:] == spec_for("lenet_digits").inputs[0].shape[1:]
    assert len(a.y_train) + len(a.y_val) + len(a.y_test) == 1797
    assert a.x_train.min() >= 0.0 and a.x_train.max() <= 1.0
    # disjoint: no test image equals a training image
    train = {x.tobytes() for x in a.x_train}
    assert sum(x.tobytes() in train for x in a.x_test) < 5  # sklearn digits has a few duplicates
    assert set(np.unique(a.y_test)) == set(range(10))


def test_committed_digit_model_reproduces_recorded_accuracy() -> None:
    meta = json.loads(metadata_path("lenet_digits").read_text())
    assert meta["split_seed"] == DIGITS_SEED
    assert meta["test_accuracy"] >= 0.95
    data = digits_data()
    sess = _session(committed_path("lenet_digits"))
    preds = [int(np.argmax(sess.run(None, {"image": x[None]})[0])) for x in data.x_test]
    acc = float(np.mean(np.asarray(preds) == data.y_test))
    assert abs(acc - meta["test_accuracy"]) <= 0.005, (acc, meta["test_accuracy"])
    digest = hashlib.sha256(committed_path("lenet_digits").read_bytes()).hexdigest()
    assert meta["onnx_sha256"] == digest


# ---------------------------------------------------------------- CLI (no torch needed)


def test_list_works_without_torch() -> None:
    res = _run_cli(["models", "list"], prelude=NO_TORCH)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split()[:4] == ["name", "family", "input", "nodes"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == set(NAMES)
    assert "1x3x96x96" in rows["mobilenetv2"] and "missing" not in res.stdout
    stats = model_stats(committed_path("resnet"))
    assert f" {stats.nodes} " in rows["resnet"]


def test_zoo_import_does_not_import_torch() -> None:
    code = "import sys, models, models.zoo; assert 'torch' not in sys.modules; print('ok')"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_build_without_torch_is_a_one_line_error(tmp_path: Path) -> None:
    res = _run_cli(["models", "build", "senna_mlp", "--out", str(tmp_path)], prelude=NO_TORCH)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "needs torch" in res.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["models", "build", "nope", "--out", "{tmp}"], "unknown model 'nope'; expected one of:"),
        (["models", "build", "--out", "{tmp}"], "give one model NAME or --all"),
        (["models", "build", "vgg", "--all", "--out", "{tmp}"], "give one model NAME or --all"),
        (["models", "build", "vgg", "--out", "{tmp}/file"], "is not a directory"),
    ],
)
def test_cli_errors(
    argv: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x")
    rc = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert needle in err and err.strip().count("\n") == 0 and "Traceback" not in err
    if "unknown" in needle:
        assert all(n in err for n in NAMES)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


# ---------------------------------------------------------------- builders (need torch)


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every model rebuilt once from its builder, through the CLI."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("zoo")
    assert main(["models", "build", "--all", "--out", str(out)]) == 0
    return out


def _diff_report(a: Path, b: Path) -> str:
    """Where two ONNX files differ (graph or weights), for a useful failure message."""
    pa, pb = onnx.load(str(a)), onnx.load(str(b))
    nodes_a = [(n.name, n.op_type) for n in pa.graph.node]
    nodes_b = [(n.name, n.op_type) for n in pb.graph.node]
    if nodes_a != nodes_b:
        return "graph structure differs"
    wa = {t.name: onnx.numpy_helper.to_array(t) for t in pa.graph.initializer}
    wb = {t.name: onnx.numpy_helper.to_array(t) for t in pb.graph.initializer}
    diffs = {k: float(np.max(np.abs(wa[k] - wb[k]))) for k in wa if k in wb}
    worst = max(diffs, key=lambda k: diffs[k], default=None)
    return f"same graph; worst weight {worst}: {diffs.get(worst or '', 0.0):.2e}"


@pytest.mark.parametrize("name", NAMES)
def test_rebuild_is_byte_identical(name: str, rebuilt: Path) -> None:
    new, old = rebuilt / f"{name}.onnx", committed_path(name)
    assert new.read_bytes() == old.read_bytes(), _diff_report(new, old)
    if spec_for(name).trained:
        assert (rebuilt / f"{name}.json").read_text() == metadata_path(name).read_text()


@pytest.mark.parametrize("name", RANDOM_WEIGHT_NAMES)
def test_committed_onnx_matches_torch_module(name: str) -> None:
    torch = pytest.importorskip("torch")
    from coinf.models.zoo import construct

    model, _ = construct(name)
    sess = _session(committed_path(name))
    for seed in (11, 12):
        feed = random_feed(name, seed=seed)
        with torch.no_grad():
            want = model(*(torch.from_numpy(feed[s.name]) for s in spec_for(name).inputs))
        got = sess.run(None, feed)[0]
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)


def test_large_variant_builds_and_is_bigger(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    assert main(["models", "build", "wavenet", "--large", "--out", str(tmp_path)]) == 0
    path = tmp_path / "wavenet_large.onnx"
    spec = spec_for("wavenet")
    sess = _session(path)
    assert [tuple(i.shape) for i in sess.get_inputs()] == [s.shape for s in spec.large_inputs]
    out = sess.run(None, random_feed("wavenet", large=True))[0]
    assert np.isfinite(out).all()
    assert model_stats(path).params > 4 * model_stats(committed_path("wavenet")).params
    props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert props["coinf.zoo.variant"] == "large"
