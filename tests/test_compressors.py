"""Autoencoder compressors (paper 002, Table I) inserted at a cut of the trained digit CNN:
shapes follow gamma, the exported head+encoder / decoder+tail ONNX pair is valid and computes
what the torch network computes."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")


def test_table_i_compresses_by_gamma_and_exports_a_verified_pair() -> None:
    import onnx
    import onnxruntime as ort
    from coinf.models.compressors import GAMMAS, export, finetune, insert, load_lenet_onnx
    from coinf.models.digits import digits_data
    from coinf.models.zoo import committed_path, deterministic_torch

    data = digits_data()
    with deterministic_torch():
        model = load_lenet_onnx(committed_path("lenet_digits"))
        with torch.no_grad():
            base = (model(torch.from_numpy(data.x_test)).argmax(1).numpy() == data.y_test).mean()
        assert base > 0.9  # the committed weights were loaded, not a fresh init
        for cut in ("pool1", "relu2"):
            for gamma in GAMMAS:
                comp = insert(model, cut, gamma)
                assert np.prod(comp.activation_shape) == gamma * np.prod(comp.code_shape)
                assert comp.encoder_flops > 0 and comp.decoder_flops > 0
        comp = insert(model, "pool1", 4)
        finetune(comp, data.x_train[:64], data.y_train[:64], epochs=1)
        head, tail = export(comp)
    for blob in (head, tail):
        onnx.checker.check_model(onnx.load_from_string(blob), full_check=True)
    h = ort.InferenceSession(head, providers=["CPUExecutionProvider"])
    t = ort.InferenceSession(tail, providers=["CPUExecutionProvider"])
    x = data.x_test[:4]
    codes = np.concatenate([h.run(None, {"image": xi[None]})[0] for xi in x])
    assert codes.shape[1:] == comp.code_shape[1:]
    got = np.concatenate([t.run(None, {"code": c[None]})[0] for c in codes])
    with torch.no_grad():
        ref = comp.forward(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_bad_gamma_and_cut_are_refused() -> None:
    from coinf.models.architectures import make_lenet
    from coinf.models.compressors import insert, make_autoencoder

    with pytest.raises(ValueError, match="gamma"):
        make_autoencoder(6, 3)
    with pytest.raises(ValueError, match="cut"):
        insert(make_lenet(False), "fc9", 2)


def test_a_compressed_model_splits_into_a_verified_bundle_with_a_code_cut(tmp_path) -> None:
    """The fused network (paper's A') is an ordinary model: `coinf split --verify` slices it,
    and one candidate sends only the code, 1/gamma of the activation; a slow link makes the
    pipeline DP choose that cut."""
    from coinf.convert.split import split_model
    from coinf.models.compressors import export_fused, insert, load_lenet_onnx
    from coinf.models.zoo import committed_path, deterministic_torch
    from coinf.wearable.planner.pipeline_dp import cut_points, split_dp

    with deterministic_torch():
        comp = insert(load_lenet_onnx(committed_path("lenet_digits")), "pool1", 4)
        model = tmp_path / "lenet_ae4.onnx"
        model.write_bytes(export_fused(comp))
    bundle = split_model(model, tmp_path / "bundle", verify=True)
    assert bundle.meta["verified"]["ok"]
    (code,) = [c for c in bundle.candidates if [t.name for t in c.crossing] == ["code"]]
    assert code.crossing[0].shape == comp.code_shape
    assert code.crossing_bytes * 4 == 4 * int(np.prod(comp.activation_shape))  # gamma = 4
    points = cut_points(bundle)
    total = bundle.meta["stats"]["total_flops"]
    s = split_dp(points, [total * 100.0, total * 100.0], [1000.0])  # 1 kB/s: bytes decide
    chosen = bundle.candidate(s.cuts[0])
    assert chosen.crossing_bytes <= code.crossing_bytes
