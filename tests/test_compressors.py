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
