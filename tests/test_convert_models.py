"""Model families the loader must handle: old-style, external data, symbolic dims, If, torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from coinf.convert.graph import load_graph
from coinf.convert.split import split_model
from coinf.convert.verify import verify_bundle

from coinf.errors import ModelError
from tests import convert_graphs as cg
from tests.test_convert_split import check_invariants

pytestmark = pytest.mark.filterwarnings("ignore")  # torch exporter deprecation chatter


def test_old_style_initializers_listed_as_inputs(tmp_path: Path) -> None:
    path = cg.old_style(tmp_path / "old.onnx")
    g = load_graph(path)
    assert g.inputs == ["x"]  # W, B, W2 are initializers, not real inputs
    bundle = split_model(path, tmp_path / "b", verify=True)
    check_invariants(bundle)
    assert [t.name for t in bundle.inputs] == ["x"]
    assert bundle.candidates[0].crossing[0].name == "x"
    head = onnx.load(str(bundle.path(bundle.candidates[1].head.file)))
    assert head.ir_version == 3  # IR kept; initializers re-listed as inputs as IR 3 requires
    assert {"W", "B"} <= {i.name for i in head.graph.input}


def test_external_data_model(tmp_path: Path) -> None:
    m = cg.diamond()
    src = tmp_path / "src"
    src.mkdir()
    onnx.save(m, str(src / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    assert (src / "weights.bin").is_file()
    bundle = split_model(src / "m.onnx", tmp_path / "b", verify=True)
    check_invariants(bundle)
    for c in bundle.candidates:  # slices are self-contained
        for f in (c.head.file, c.tail.file):
            if f:
                part = onnx.load(str(bundle.path(f)), load_external_data=False)
                assert all(t.data_location == onnx.TensorProto.DEFAULT
                           for t in part.graph.initializer)
    assert sorted(p.name for p in (tmp_path / "b").iterdir())[:2] == ["c000", "c001"]


def _torch_export(module, shape, path: Path, dynamic: bool = False) -> Path:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    module.eval()
    kw = {"dynamic_axes": {"x": {0: "batch"}, "y": {0: "batch"}}} if dynamic else {}
    torch.onnx.export(module, torch.randn(*shape), str(path), input_names=["x"],
                      output_names=["y"], opset_version=17, dynamo=False, **kw)
    return path


def _resnet():  # type: ignore[no-untyped-def]
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(c, c, 3, padding=1)
            self.bn = nn.BatchNorm2d(c)
            self.c2 = nn.Conv2d(c, c, 3, padding=1, groups=c)  # depthwise
            self.c3 = nn.Conv2d(c, c, 1)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return torch.relu(x + self.c3(self.c2(torch.relu(self.bn(self.c1(x))))))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
            self.b1, self.b2 = Block(8), Block(8)
            self.fc = nn.Linear(8, 4)

        def forward(self, x):  # type: ignore[no-untyped-def]
            x = self.b2(self.b1(torch.relu(self.stem(x))))
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    return Net()


def _inception():  # type: ignore[no-untyped-def]
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.a = nn.Conv2d(8, 4, 1)
            self.b = nn.Sequential(nn.Conv2d(8, 4, 1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1))
            self.c = nn.Sequential(nn.MaxPool2d(3, 1, 1), nn.Conv2d(8, 4, 1))
            self.fc = nn.Linear(12 * 8 * 8, 3)

        def forward(self, x):  # type: ignore[no-untyped-def]
            x = torch.relu(self.stem(x))
            x = torch.cat([self.a(x), self.b(x), self.c(x)], 1)
            return self.fc(x.reshape(x.shape[0], -1))

    return Net()


def _inside(bundle, first: str, merge: str) -> list:  # type: ignore[no-untyped-def]
    """Candidates whose head has started a block (``first``) but not finished it (``merge``)."""
    return [c for c in bundle.candidates
            if any(first in n for n in c.head.nodes) and not any(merge in n for n in c.head.nodes)]


def test_torch_resnet_skip_blocks(tmp_path: Path) -> None:
    path = _torch_export(_resnet(), (1, 3, 16, 16), tmp_path / "res.onnx")
    bundle = split_model(path, tmp_path / "b", verify=True)
    check_invariants(bundle)
    inside = _inside(bundle, "/b1/c1/Conv", "/b1/Add")
    assert inside and all(len(c.crossing) >= 2 for c in inside)  # skip + branch tensor cross
    assert any(len(c.crossing) == 1 for c in bundle.candidates[1:-1])


def test_torch_parallel_branches_with_symbolic_batch(tmp_path: Path) -> None:
    path = _torch_export(_inception(), (1, 3, 8, 8), tmp_path / "inc.onnx", dynamic=True)
    g = load_graph(path)
    assert g.dims == {"batch": 1} and g.types["x"].shape == (1, 3, 8, 8)
    assert g.folded  # x.shape[0] for the reshape became a constant
    bundle = split_model(path, tmp_path / "b", dims={"batch": 3}, verify=True)
    check_invariants(bundle)
    assert bundle.inputs[0].shape == (3, 3, 8, 8) and bundle.meta["dims"] == {"batch": 3}
    inside = _inside(bundle, "/a/Conv", "/Concat")
    assert any(len(c.crossing) >= 2 for c in inside)  # multi-tensor cut inside the block
    with pytest.raises(ModelError, match=r"unknown dim name.*seq.*batch"):
        load_graph(path, {"seq": 4})


def test_if_with_outer_scope_captures(tmp_path: Path) -> None:
    onnx.save(cg.with_if(), str(tmp_path / "if.onnx"))
    g = load_graph(tmp_path / "if.onnx")
    branch = next(n for n in g.nodes if n.name == "branch")
    assert {"cond", "h", "c"} <= set(branch.inputs) and branch.has_subgraph
    bundle = split_model(tmp_path / "if.onnx", tmp_path / "b", verify=True)
    check_invariants(bundle)
    # a cut with relu in the head and the If in the tail must send the captured h
    c = next(c for c in bundle.candidates if "relu" in c.head.nodes and "branch" in c.tail.nodes)
    assert "h" in {t.name for t in c.crossing}
    # both branches are exercised: flip the sign of the input
    assert verify_bundle(bundle, seed=1) == [] and verify_bundle(bundle, seed=2) == []


def test_costs_of_heavy_ops(tmp_path: Path) -> None:
    from coinf.convert.cost import all_costs

    path = _torch_export(_resnet(), (1, 3, 16, 16), tmp_path / "res.onnx")
    g = load_graph(path)
    costs = dict(zip([n.name for n in g.nodes], all_costs(g), strict=True))
    stem = costs["/stem/Conv"]  # 8 out ch, 8x8 out, 3 in ch, 3x3 kernel
    assert stem.macs == 8 * 8 * 8 * 3 * 9 and stem.flops == 2 * stem.macs + 8 * 8 * 8
    dw = costs["/b1/c2/Conv"]  # depthwise: 1 input channel per group
    assert dw.macs == 8 * 8 * 8 * 9
    assert dw.param_bytes == (8 * 9 + 8) * 4
    fc = costs["/fc/Gemm"]
    assert fc.macs == 8 * 4 and fc.output_bytes == 16
    assert costs["/b1/Add"].flops == 8 * 8 * 8


def test_lstm_cost(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")

    class LM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(50, 6)
            self.rnn = torch.nn.LSTM(6, 5)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.rnn(self.emb(x))[0]

    torch.manual_seed(0)
    path = tmp_path / "lm.onnx"
    torch.onnx.export(LM().eval(), torch.zeros(7, 1, dtype=torch.int64), str(path),
                      input_names=["x"], output_names=["y"], opset_version=17, dynamo=False)
    from coinf.convert.cost import all_costs

    g = load_graph(path)
    lstm = next(c for n, c in zip(g.nodes, all_costs(g), strict=True) if n.op_type == "LSTM")
    assert lstm.macs == 7 * 1 * 1 * 4 * 5 * (6 + 5)
    bundle = split_model(path, tmp_path / "b", verify=True)  # int token ids in 0..49
    check_invariants(bundle)
    assert np.dtype(bundle.inputs[0].dtype) == np.int64


def test_shapes_learnt_from_onnxruntime(tmp_path: Path) -> None:
    onnx.save(cg.opaque_shape(), str(tmp_path / "m.onnx"))
    g = load_graph(tmp_path / "m.onnx", {"batch": 2})
    assert g.shape_source == "onnxruntime" and g.types["r"].shape == (2, 4)
    assert "shape" in g.folded and not next(n for n in g.nodes if n.name == "casti").dynamic
    bundle = split_model(tmp_path / "m.onnx", tmp_path / "b", dims={"batch": 2}, verify=True)
    check_invariants(bundle)
    assert bundle.meta["stats"]["shape_source"] == "onnxruntime"
    assert [t.shape for t in bundle.outputs] == [(2, 4)]


def test_loop_with_nested_captures(tmp_path: Path) -> None:
    onnx.save(cg.with_loop(), str(tmp_path / "loop.onnx"))
    g = load_graph(tmp_path / "loop.onnx")
    loop = next(n for n in g.nodes if n.name == "loop")
    assert {"h", "flag", "k", "s"} <= set(loop.inputs)  # captured through Loop -> If
    assert "acc" not in loop.inputs and "cond_in" not in loop.inputs  # defined inside
    bundle = split_model(tmp_path / "loop.onnx", tmp_path / "b", verify=True)
    check_invariants(bundle)
    c = next(c for c in bundle.candidates if "gt" in c.head.nodes and "loop" in c.tail.nodes)
    assert "flag" in {t.name for t in c.crossing}
    for seed in (1, 2, 3):
        assert verify_bundle(bundle, seed=seed) == []


def test_anonymous_dims_are_named_by_input_and_axis(tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])  # no value, no name
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])
    m = cg.model([node], [x], [y])
    onnx.save(m, str(tmp_path / "m.onnx"))
    assert load_graph(tmp_path / "m.onnx").types["y"].shape == (1, 3)
    g = load_graph(tmp_path / "m.onnx", {"x[0]": 6})
    assert g.types["y"].shape == (6, 3) and g.dims == {"x[0]": 6}
