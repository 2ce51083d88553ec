"""SMCD group-lasso pruning (MeDNN §VI): unit removal is exact, training removes whole channels,
and the pruned model is an ordinary model that coinf verifies and splits."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from coinf.models import pruning  # noqa: E402
from torch import nn  # noqa: E402

from coinf.errors import ModelError  # noqa: E402


def _chain() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 8, 3, padding=0, dilation=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(1), nn.Linear(8 * 16, 20), nn.ReLU(), nn.Linear(20, 10),
    )


def test_removing_dead_units_keeps_outputs() -> None:
    chain = _chain()
    with torch.no_grad():
        chain[0].weight[2] = 0  # zero filter with a bias: a constant, folded into conv 2's bias
        chain[0].bias[2] = 0.7
        chain[3].weight[:, 4] = 0  # nobody reads conv 1's unit 4
        chain[3].weight[5] = 0  # zero filter feeding the Linear through Flatten
        chain[3].bias[5] = 0.3
        chain[7].weight[11] = 0
    x = torch.rand(5, 1, 28, 28)
    ref = chain.eval()(x)
    pruned, keep = pruning.prune_chain(chain, x[:1], threshold=1e-6)
    assert keep[0] == [0, 1, 3, 5]
    assert keep[1] == [0, 1, 2, 3, 4, 6, 7]
    assert 11 not in keep[2] and len(keep[2]) == 19
    widths = [pruning.out_units(pruned[i]) for i in pruning.weighted(pruned)]
    assert widths == [4, 7, 19, 10]
    assert pruned[3].dilation == (2, 2)
    torch.testing.assert_close(pruned(x), ref, rtol=1e-5, atol=1e-5)


def test_threshold_zero_keeps_everything() -> None:
    chain = _chain()
    x = torch.rand(3, 1, 28, 28)
    pruned, keep = pruning.prune_chain(chain, x[:1], threshold=0.0)
    assert [len(k) for k in keep] == [6, 8, 20]
    torch.testing.assert_close(pruned(x), chain(x), rtol=1e-5, atol=1e-5)


def test_unsupported_chains_are_named() -> None:
    with pytest.raises(ModelError, match="grouped convolution"):
        pruning.check_chain(nn.Sequential(nn.Conv2d(4, 4, 3, groups=2), nn.Conv2d(4, 2, 1)))
    with pytest.raises(ModelError, match="BatchNorm2d is not supported"):
        pruning.check_chain(nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4),
                                          nn.Conv2d(4, 2, 1)))
    with pytest.raises(ModelError, match="prune strength"):
        pruning.PruneConfig(strength=-1)


def test_group_lasso_is_zero_only_for_zero_weights() -> None:
    chain = _chain()
    assert float(pruning.group_lasso(chain).detach()) > 0
    with torch.no_grad():
        for m in chain:
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                m.weight.zero_()
                m.bias.zero_()
    assert float(pruning.group_lasso(chain).detach()) == pytest.approx(0.0, abs=1e-3)


def test_smcd_on_the_digit_model_removes_channels_and_splits(tmp_path) -> None:
    pytest.importorskip("sklearn")
    from coinf.convert.split import split_model
    from coinf.models.zoo import committed_path

    cfg = pruning.PruneConfig(strength=1e-3, sparsify_epochs=8, finetune_epochs=3)
    out = tmp_path / "pruned.onnx"
    meta = pruning.prune_lenet_file(committed_path("lenet_digits"), out, cfg)
    before, after = meta["widths_before"], meta["widths_after"]
    assert before == [6, 16, 120, 84, 10]
    assert after[-1] == 10
    assert sum(after[:2]) < sum(before[:2])  # whole conv filters/channels are gone
    assert all(a <= b for a, b in zip(after, before, strict=True))
    assert meta["test_accuracy"] > 0.85  # still a digit classifier after a short run
    import onnx

    shapes = {t.name: list(t.dims) for t in onnx.load(str(out)).graph.initializer}
    assert shapes["conv2.weight"] == [after[1], after[0], 5, 5]
    assert shapes["fc1.weight"] == [after[2], after[1] * 16]
    bundle = split_model(out, tmp_path / "bundle", verify=True)
    assert len(bundle.candidates) >= 3
