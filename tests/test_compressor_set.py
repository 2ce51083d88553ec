"""Compressor sets of ``digitnet`` (convert/compressor_set.py): simulated quantization equals the
real codec, joint fine-tuning shares one backbone, and the exported set follows its format
(signatures, composition with the backbone's head and tail, index.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

TRAIN, TEST = 64, 12


def _session(blob: bytes | str) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(blob, opts, providers=["CPUExecutionProvider"])


def _sig(values: Any) -> list[tuple[str, str, list[int]]]:
    return [(v.name, v.type, list(v.shape)) for v in values]


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_fake_quant_is_the_codec_round_trip_with_an_identity_gradient(bits: int) -> None:
    from coinf.ble_protocol.packing import pack, unpack
    from coinf.convert.compressor_set import fake_quant

    rng = np.random.default_rng(bits)
    x = np.concatenate([rng.normal(0, 3, (3, 8, 4, 4)), rng.exponential(1, (2, 8, 4, 4)),
                        np.full((1, 8, 4, 4), 0.5)]).astype(np.float32)  # the last: constant
    t = torch.from_numpy(x).requires_grad_(True)
    got = fake_quant(t, bits)
    for spec in (f"q{bits}", f"qz{bits}"):
        want = np.concatenate([unpack(pack(v[None], spec)) for v in x])
        span = float(np.ptp(x.reshape(len(x), -1), axis=1).max())
        np.testing.assert_allclose(got.detach().numpy(), want, rtol=0, atol=1e-5 * span)
    assert not np.allclose(got.detach().numpy(), x)  # it does quantize
    got.sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), np.ones_like(x))
    assert fake_quant(t, 0) is t


@pytest.fixture(scope="module")
def tuned() -> Any:
    """A joint model at both cuts, gamma 2/4/8, fine-tuned one epoch on a few images."""
    from coinf.convert.compressor_set import JointCompressed, finetune_joint
    from coinf.models.digitnet import load_digitnet_onnx
    from coinf.models.digits import digits_data
    from coinf.models.zoo import committed_path, deterministic_torch

    data = digits_data(size=32)
    with deterministic_torch():
        original = load_digitnet_onnx(committed_path("digitnet"))
        import copy

        joint = JointCompressed(copy.deepcopy(original), ["pool2", "pool1"], [2, 4, 8])
        before = {k: v.clone() for k, v in joint.backbone.state_dict().items()}
        finetune_joint(joint, data.x_train[:TRAIN], data.y_train[:TRAIN], epochs=2, warmup=1)
    return joint, original, before, data


def test_joint_training_shares_one_backbone_for_every_gamma(tuned: Any) -> None:
    joint, _original, before, data = tuned
    assert joint.cuts == ["pool1", "pool2"]  # put in network order
    assert [f"{c}-g{g}" for c, g in joint.keys] == [
        f"{c}-g{g}" for c in ("pool1", "pool2") for g in (2, 4, 8)]
    # one set of weights: the model's parameters are the backbone's plus the compressors'
    ids = [id(p) for p in joint.parameters()]
    assert len(ids) == len(set(ids))
    own = sum(1 for _ in joint.backbone.parameters())
    assert len(ids) == own + sum(1 for _ in joint.encoders.parameters()) + sum(
        1 for _ in joint.decoders.parameters())
    # the backbone was trained (after the warm-up epoch), and every path runs through it
    changed = [k for k, v in joint.backbone.state_dict().items() if not torch.equal(v, before[k])]
    assert changed
    x = torch.from_numpy(data.x_test[:4])
    with torch.no_grad():
        outs = joint.forward_all(x)
        torch.testing.assert_close(outs[0], joint.backbone(x))
        for (cut, gamma), out in zip(joint.keys, outs[1:], strict=True):
            torch.testing.assert_close(out, joint.forward_key(x, cut, gamma))
    # a gamma path's loss reaches the shared backbone's weights on both sides of its cut
    joint.zero_grad()
    torch.nn.functional.cross_entropy(joint.forward_key(x, "pool1", 4, bits=2),
                                      torch.from_numpy(data.y_test[:4])).backward()
    for block in (joint.backbone.block1, joint.backbone.block3):
        grads = [p.grad for p in block.parameters()]
        assert all(g is not None and float(g.abs().sum()) > 0 for g in grads)
    assert joint.encoders["pool2-g4"][0].body[0].weight.grad is None  # other paths untouched
    joint.zero_grad()
    for cut, gamma in joint.keys:
        a = np.prod(joint.activation_shape[cut])
        assert a == gamma * np.prod(joint.code_shape[f"{cut}-g{gamma}"])


def test_exported_set_follows_the_format_and_composes_with_the_backbone(
        tuned: Any, tmp_path: Path) -> None:
    import onnx
    from coinf.convert.compressor_set import split_backbone, write_set
    from coinf.models.zoo import committed_path

    joint, _, _, data = tuned
    packings = ["raw", "q4", "qz2"]
    index = write_set(tmp_path, joint, committed_path("digitnet"), packings=packings,
                      test_limit=TEST)
    assert json.loads((tmp_path / "index.json").read_text()) == index
    assert index["format"] == 1 and index["model"] == "backbone.onnx"
    assert "test split" in index["test_set"] and index["test_images"] == TEST
    assert set(index["base_accuracy"]) == set(packings)
    backbone_bytes = (tmp_path / "backbone.onnx").read_bytes()
    backbone = onnx.shape_inference.infer_shapes(onnx.load_from_string(backbone_bytes))
    onnx.checker.check_model(backbone, full_check=True)
    typed = {v.name: v for v in [*backbone.graph.value_info, *backbone.graph.output]}
    whole = _session(backbone_bytes)
    assert _sig(whole.get_inputs()) == [("image", "tensor(float)", [1, 1, 32, 32])]
    assert _sig(whole.get_outputs()) == [("logits", "tensor(float)", [1, 10])]
    x = data.x_test[:3]
    assert len(index["compressors"]) == 6
    for entry in index["compressors"]:
        (cut,) = entry["crossing"]
        t = typed[cut].type.tensor_type  # the crossing tensor is a real tensor of the backbone
        crossing = (cut, "tensor(float)", [d.dim_value for d in t.shape.dim])
        assert t.elem_type == onnx.TensorProto.FLOAT
        assert crossing[2] == list(joint.activation_shape[cut])
        enc = _session(str(tmp_path / entry["encoder"]))
        dec = _session(str(tmp_path / entry["decoder"]))
        code = ("code", "tensor(float)", entry["code_shape"])
        assert _sig(enc.get_inputs()) == [crossing] and _sig(enc.get_outputs()) == [code]
        assert _sig(dec.get_inputs()) == [code] and _sig(dec.get_outputs()) == [crossing]
        assert entry["encoder"] == f"{cut}-g{entry['gamma']}.enc.onnx"
        assert entry["code_dtype"] == "float32"
        assert 0 < entry["flops"] <= 0.02 * entry["model_flops"]  # <= 2 % of the model
        assert set(entry["accuracy"]) == set(packings)
        assert all(0.0 <= a <= 1.0 for a in entry["accuracy"].values())
        # head to the cut + encoder + decoder + the rest == the torch network with the compressor
        head, tail = (_session(b) for b in split_backbone(backbone_bytes, cut))
        got = []
        for xi in x:
            act = head.run(None, {"image": xi[None]})[0]
            c = enc.run(None, {cut: act})[0]
            got.append(tail.run(None, {cut: dec.run(None, {"code": c})[0]})[0])
        with torch.no_grad():
            want = joint.forward_key(torch.from_numpy(x), cut, entry["gamma"]).numpy()
        np.testing.assert_allclose(np.concatenate(got), want, rtol=1e-4, atol=1e-4)
    # and the whole backbone is the torch backbone
    with torch.no_grad():
        want = joint.backbone(torch.from_numpy(x)).numpy()
    got = np.concatenate([whole.run(None, {"image": xi[None]})[0] for xi in x])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

    from coinf.cli.bench.compress import set_rows, targets

    rows = set_rows(index, packings)
    assert len(rows) == (2 + 6) * len(packings)
    plain = [r for r in rows if r["gamma"] == 1 and r["packing"] == "raw"]
    assert [r["ratio_vs_float32"] for r in plain] == [1.0, 1.0]
    g8 = next(r for r in rows if (r["cut"], r["gamma"], r["packing"]) == ("pool1", 8, "raw"))
    assert g8["ratio_vs_float32"] == 8.0
    assert targets(rows)["overhead_le_2pct"] is True


def test_digitnet_loads_from_its_onnx_file(tmp_path: Path) -> None:
    from coinf.models.digitnet import load_digitnet_onnx
    from coinf.models.digits import digits_data
    from coinf.models.zoo import committed_path

    x = digits_data(size=32).x_test[:5]
    model = load_digitnet_onnx(committed_path("digitnet"))
    sess = _session(str(committed_path("digitnet")))
    got = np.concatenate([sess.run(None, {"image": xi[None]})[0] for xi in x])
    with torch.no_grad():
        np.testing.assert_allclose(model(torch.from_numpy(x)).numpy(), got, rtol=1e-4,
                                   atol=1e-4)
    with pytest.raises(ValueError, match="not a digitnet"):
        load_digitnet_onnx(committed_path("lenet_digits"))


@pytest.mark.parametrize(("argv", "needle"), [
    (["models", "compressors", "-o", "{tmp}", "--gammas", "3"], "--gammas '3': expected"),
    (["models", "compressors", "-o", "{tmp}", "--cuts", "fc1"], "--cuts 'fc1': expected"),
    (["models", "compressors", "-o", "{tmp}", "--packings", "q99"], "--packings: "),
    (["models", "compressors", "-o", "{tmp}", "--model", "vgg"], "only 'digitnet'"),
    (["models", "compressors", "-o", "{tmp}", "--epochs", "-1"], "--epochs -1"),
    (["bench", "compress", "--gammas", "5", "--json"], "--gammas '5': expected"),
])
def test_cli_refuses_bad_arguments_in_one_line(argv: list[str], needle: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from coinf.cli import main

    rc = main([a.replace("{tmp}", str(tmp_path / "set")) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err, err
    assert err.strip().count("\n") == 0 and "Traceback" not in err
    assert not (tmp_path / "set").exists()


SET_DIR = Path(__file__).resolve().parents[1] / "models" / "onnx" / "digitnet_set"


def test_committed_set_is_consistent_and_reproduces_its_recorded_accuracy() -> None:
    """models/onnx/digitnet_set (written by `coinf bench compress --out`): every file the index
    names has the format's signature, and one recorded accuracy is measured again."""
    import onnx
    from coinf.convert.compressor_set import evaluate

    index = json.loads((SET_DIR / "index.json").read_text())
    assert index["format"] == 1 and index["fine_tuning"]["joint"] is True
    backbone_bytes = (SET_DIR / index["model"]).read_bytes()
    backbone = onnx.shape_inference.infer_shapes(onnx.load_from_string(backbone_bytes))
    typed = {v.name: v for v in backbone.graph.value_info}
    names = {p.name for p in SET_DIR.iterdir()}
    assert names == {"index.json", "backbone.onnx"} | {
        c[f] for c in index["compressors"] for f in ("encoder", "decoder")}
    for entry in index["compressors"]:
        (cut,) = entry["crossing"]
        shape = [d.dim_value for d in typed[cut].type.tensor_type.shape.dim]
        assert shape == index["cuts"][cut]["shape"]
        enc, dec = (_session(str(SET_DIR / entry[f])) for f in ("encoder", "decoder"))
        crossing = (cut, "tensor(float)", shape)
        code = ("code", "tensor(float)", entry["code_shape"])
        assert _sig(enc.get_inputs()) == [crossing] and _sig(enc.get_outputs()) == [code]
        assert _sig(dec.get_inputs()) == [code] and _sig(dec.get_outputs()) == [crossing]
        assert entry["flops"] <= 0.02 * entry["model_flops"]
    from coinf.models.digits import digits_data

    data = digits_data(size=32)
    entry = next(c for c in index["compressors"] if (c["crossing"], c["gamma"]) == (["pool2"], 8))
    acc, size = evaluate(backbone_bytes, "pool2", (SET_DIR / entry["encoder"]).read_bytes(),
                         (SET_DIR / entry["decoder"]).read_bytes(), data.x_test, data.y_test,
                         ["q2"])
    # exact on the machine that wrote it; another CPU's kernels may flip one borderline image
    assert abs(acc["q2"] - entry["accuracy"]["q2"]) <= 1.0 / len(data.y_test) + 1e-9
    assert size["q2"] == pytest.approx(entry["bytes"]["q2"], rel=0.01)


def test_committed_backbone_splits_with_a_candidate_at_every_cut(tmp_path: Path) -> None:
    """`coinf split` of backbone.onnx offers each cut of the set, crossing exactly that tensor
    (what attaching the set to a bundle relies on)."""
    from coinf.convert.split import split_model

    index = json.loads((SET_DIR / "index.json").read_text())
    bundle = split_model(SET_DIR / "backbone.onnx", tmp_path / "b")
    crossings = {tuple(t.name for t in c.crossing): c for c in bundle.candidates}
    for cut, plain in index["cuts"].items():
        (tensor,) = crossings[(cut,)].crossing
        assert list(tensor.shape) == plain["shape"]


def _weights(path: Path) -> list[np.ndarray]:
    import onnx
    from onnx import numpy_helper

    proto = onnx.load(str(path))
    init = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    return [init[n.input[1]] for n in proto.graph.node if n.op_type in ("Conv", "Gemm")]


@pytest.mark.parametrize("freeze", [False, True])
def test_export_set_fine_tunes_the_backbone_unless_frozen(freeze: bool, tmp_path: Path) -> None:
    from coinf.convert.compressor_set import export_set
    from coinf.models.zoo import committed_path

    index = export_set(tmp_path, cuts=["pool2"], gammas=[8], epochs=1, packings=["raw"],
                       train_limit=32, test_limit=4, freeze_backbone=freeze)
    assert index["fine_tuning"]["freeze_backbone"] is freeze
    new, old = _weights(tmp_path / "backbone.onnx"), _weights(committed_path("digitnet"))
    same = [np.array_equal(a, b) for a, b in zip(new, old, strict=True)]
    assert all(same) if freeze else not any(same)


def test_committed_set_backbone_was_fine_tuned() -> None:
    from coinf.models.zoo import committed_path

    index = json.loads((SET_DIR / "index.json").read_text())
    assert index["fine_tuning"]["freeze_backbone"] is False
    new, old = _weights(SET_DIR / "backbone.onnx"), _weights(committed_path("digitnet"))
    assert not any(np.array_equal(a, b) for a, b in zip(new, old, strict=True))
