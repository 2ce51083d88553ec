"""Packing calibration on a tiny hand-made bundle (onnx.helper MLP run by onnxruntime)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from coinf.ble_protocol import packing
from coinf.convert import calibrate as cal
from onnx import TensorProto, helper, numpy_helper

from coinf.bundle import Bundle, Candidate, Part, TensorSpec
from coinf.cli import main
from coinf.errors import BundleError

RNG = np.random.default_rng(7)
W1 = RNG.standard_normal((16, 64)).astype(np.float32)
B1 = RNG.standard_normal(64).astype(np.float32) * 0.1
W2 = RNG.standard_normal((64, 10)).astype(np.float32)
B2 = np.zeros(10, np.float32)


def _graph(nodes: list[onnx.NodeProto], inp: tuple[str, int], out: tuple[str, int],
           inits: dict[str, np.ndarray]) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(inp[0], TensorProto.FLOAT, [1, inp[1]])],
        [helper.make_tensor_value_info(out[0], TensorProto.FLOAT, [1, out[1]])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


HEAD_NODES = [helper.make_node("MatMul", ["x", "W1"], ["m1"]),
              helper.make_node("Add", ["m1", "B1"], ["a1"]),
              helper.make_node("Relu", ["a1"], ["h"])]
TAIL_NODES = [helper.make_node("MatMul", ["h", "W2"], ["m2"]),
              helper.make_node("Add", ["m2", "B2"], ["y"])]


def forward(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = np.maximum(x @ W1 + B1, 0)
    return h, h @ W2 + B2


def make_bundle(root: Path) -> Bundle:
    (root / "c001").mkdir(parents=True)
    onnx.save(_graph(HEAD_NODES + TAIL_NODES, ("x", 16), ("y", 10),
                     {"W1": W1, "B1": B1, "W2": W2, "B2": B2}), root / "model.onnx")
    onnx.save(_graph(HEAD_NODES, ("x", 16), ("h", 64), {"W1": W1, "B1": B1}),
              root / "c001/head.onnx")
    onnx.save(_graph(TAIL_NODES, ("h", 64), ("y", 10), {"W2": W2, "B2": B2}),
              root / "c001/tail.onnx")
    x = TensorSpec("x", (1, 16), "float32", 64)
    h = TensorSpec("h", (1, 64), "float32", 256)
    y = TensorSpec("y", (1, 10), "float32", 40)
    none = Part(None, 0, 0, ())
    whole = Part("model.onnx", 2 * 16 * 64 + 2 * 64 * 10, W1.nbytes + W2.nbytes, ("all",))
    bundle = Bundle(
        root=root, model_file="model.onnx", model_sha256="0" * 64, inputs=(x,), outputs=(y,),
        candidates=(
            Candidate("c000", "handheld-only", (x,), none, whole),
            Candidate("c001", "relu", (h,), Part("c001/head.onnx", 2048, W1.nbytes, ("relu",)),
                      Part("c001/tail.onnx", 1280, W2.nbytes, ("fc2",))),
            Candidate("c002", "wearable-only", (y,), whole, none),
        ),
    )
    bundle.save()
    return Bundle.load(root)


@pytest.fixture()
def bundle(tmp_path: Path) -> Bundle:
    return make_bundle(tmp_path / "b")


def make_data(path: Path, n: int = 60, labels: bool = True) -> tuple[np.ndarray, np.ndarray]:
    x = RNG.standard_normal((n, 16)).astype(np.float32)
    y = forward(x)[1].argmax(1)
    y[: n // 10] = (y[: n // 10] + 1) % 10  # the model is not perfect on these
    arrays = {"x": x, "labels": y} if labels else {"x": x}
    np.savez(path, **arrays)
    return x, y


def test_calibrate_cli_writes_tables(bundle: Bundle, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    x, _ = make_data(tmp_path / "val.npz")
    identity = bundle.identity
    assert main(["calibrate", str(bundle.root), "--data", str(tmp_path / "val.npz")]) == 0
    assert "c001" in capsys.readouterr().out
    again = Bundle.load(bundle.root)
    assert again.identity == identity  # calibration does not change what the handshake compares
    assert again.meta[cal.META_KEY]["samples"] == len(x)
    tables = {c.id: cal.packing_rows(c) for c in again.candidates}
    # a [1, N] activation is no waveform and no image: no codec rows there
    got = [r["spec"] for r in tables["c001"]]
    want = [s for s in cal.DEFAULT_SPECS if not packing.PackSpec.parse(s).is_media]
    # ansN rows whose bodies are not smaller than qN's or qzN's are dropped (the same tensor,
    # more bytes and time): on this 64-value vector, all of them
    assert [s for s in got if s[:3] != "ans"] == [s for s in want if s[:3] != "ans"]
    assert set(got) <= set(want)
    assert tables["c000"] and not tables["c002"]

    # sizes are the mean of the real packed bodies, computed here without onnxruntime
    h = forward(x)[0]
    for spec in ("q3", "q8", "f16", "f32"):
        want = np.mean([len(packing.pack(h[i : i + 1], spec)) for i in range(len(x))])
        got = cal.expected_packed_bytes(again.candidate("c001"), spec)
        assert got == pytest.approx(want, abs=0.01)
    row = {r["spec"]: r for r in tables["c001"]}
    assert row["q4"]["ratio"] == pytest.approx(256 / row["q4"]["mean_bytes"], rel=1e-3)
    sizes = [row[f"q{b}"]["mean_bytes"] for b in (2, 3, 4, 5, 6, 7, 8, 10, 12, 16)]
    assert sizes == sorted(sizes)
    assert row["q16"]["top1_agreement"] == 1.0 and row["q16"]["accuracy_drop_pp"] == 0.0
    assert row["f32"]["rel_l2"] == 0.0
    assert row["q2"]["rel_l2"] > row["q4"]["rel_l2"] > row["q8"]["rel_l2"] > 0


def test_accuracy_drop_is_measured_against_labels(bundle: Bundle, tmp_path: Path) -> None:
    x, y = make_data(tmp_path / "val.npz", n=80)
    data = cal.load_dataset(str(tmp_path / "val.npz"), bundle)
    rows = {r["spec"]: r for r in cal.calibrate_candidate(bundle, bundle.candidate("c001"),
                                                          data, ["q1", "q2", "q16"])}
    # recompute the q1 drop independently: dequantized ReLU output through the numpy tail
    h = forward(x)[0]
    ref_acc = (forward(x)[1].argmax(1) == y).mean()
    q1 = np.stack([packing.unpack(packing.pack(h[i : i + 1], "q1"))[0] for i in range(len(x))])
    q1_acc = ((q1 @ W2 + B2).argmax(1) == y).mean()
    assert rows["q1"]["accuracy_drop_pp"] == pytest.approx(100 * (ref_acc - q1_acc), abs=1e-3)
    assert rows["q1"]["accuracy_drop_pp"] > rows["q16"]["accuracy_drop_pp"]


def test_without_labels_drop_is_disagreement(bundle: Bundle, tmp_path: Path) -> None:
    make_data(tmp_path / "val.npz", labels=False)
    data = cal.load_dataset(str(tmp_path / "val.npz"), bundle)
    assert data.labels is None
    results = cal.calibrate(bundle, data, ["q1", "q2", "q6"], ["c001"])
    assert list(results) == ["c001"]
    for r in results["c001"]:
        assert r["accuracy_drop_pp"] == pytest.approx(100 * (1 - r["top1_agreement"]), abs=1e-3)
    assert results["c001"][0]["accuracy_drop_pp"] > 0  # 1 bit does change some answers


def test_planner_helpers(bundle: Bundle, tmp_path: Path) -> None:
    make_data(tmp_path / "val.npz", n=20)
    data = cal.load_dataset(str(tmp_path / "val.npz"), bundle)
    cal.store(bundle, cal.calibrate(bundle, data, ["q4", "f16"]), data)
    b = Bundle.load(bundle.root)
    c1, c2 = b.candidate("c001"), b.candidate("wearable-only")
    assert cal.expected_packed_bytes(c1, 4) == cal.expected_packed_bytes(c1, "q4") > 0
    assert cal.expected_packed_bytes(c1, "raw") == 256
    assert cal.expected_packed_bytes(c2, 4) == 0 and cal.accuracy_drop(c2, 4) == 0
    assert cal.accuracy_drop(c1, "f32") == 0
    assert cal.accuracy_drop(c1, 4) == max(0.0, next(
        r["accuracy_drop_pp"] for r in cal.packing_rows(c1) if r["spec"] == "q4"))
    c1.extra["packing"][0]["accuracy_drop_pp"] = -0.5  # noise: packing "fixed" an input
    assert cal.accuracy_drop(c1, "q4") == 0.0
    with pytest.raises(BundleError, match="no calibration for packing q7"):
        cal.expected_packed_bytes(c1, 7)
    best = cal.best_row(cal.packing_rows(c1), tolerance_pp=100.0)
    assert best is not None and best["spec"] == "q4"


def test_bad_inputs_are_one_line_errors(bundle: Bundle, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    np.savez(tmp_path / "bad.npz", x=np.zeros((5, 15), np.float32))
    np.savez(tmp_path / "badlab.npz", x=np.zeros((5, 16), np.float32), labels=np.zeros(4, int))
    make_data(tmp_path / "good.npz", n=3)
    cases = [
        ["--data", str(tmp_path / "bad.npz")],
        ["--data", str(tmp_path / "badlab.npz")],
        ["--data", str(tmp_path / "missing.npz")],
        ["--data", str(tmp_path / "good.npz"), "--bits", "4,q99"],
    ]
    for extra in cases:
        assert main(["calibrate", str(bundle.root), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("coinf calibrate: error:") and "\n" not in err
    assert main(["calibrate", str(tmp_path / "nobundle"), "--data", "x.npz"]) == 2
    assert "not a bundle directory" in capsys.readouterr().err


def test_few_samples_report_a_bound_warn_and_establish_nothing(
        bundle: Bundle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 18: 8 unlabelled samples resolve 12.5 pp, not 1 pp: the bound says so."""
    make_data(tmp_path / "val.npz", n=8, labels=False)
    assert main(["calibrate", str(bundle.root), "--data", str(tmp_path / "val.npz"),
                 "--bits", "8,16,f16"]) == 0
    out = capsys.readouterr()
    assert "8 samples cannot establish a 1 pp tolerance" in out.err
    assert "31.2 pp" in out.err and ">= 299 samples" in out.err
    assert "q8:0.00[31.2]" in out.out
    rows = {r["spec"]: r for r in cal.packing_rows(Bundle.load(bundle.root).candidate("c001"))}
    assert rows["q8"]["samples"] == 8
    assert rows["q8"]["accuracy_drop_upper_pp"] == pytest.approx(31.23, abs=0.01)
    assert rows["f16"]["accuracy_drop_upper_pp"] == pytest.approx(31.23, abs=0.01)
    # nothing lossy is established; a lossless packing needs no samples
    assert cal.best_row([rows["q8"], rows["q16"]]) is None
    assert cal.accuracy_bound(Bundle.load(bundle.root).candidate("c001"), "f32") == (0.0, None)
