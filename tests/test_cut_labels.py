"""Issue 18: candidate labels a person can read -- op type and scope, never cut; models with
no node names get op type and position."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import onnx
import pytest
from coinf.convert.cuts import node_labels
from coinf.convert.graph import Node
from coinf.convert.split import split_model

RESNET = Path(__file__).resolve().parents[1] / "models" / "onnx" / "resnet.onnx"


def _graph(names_ops: list[tuple[str, str]]) -> SimpleNamespace:
    return SimpleNamespace(nodes=[Node(i, n, op, (), ()) for i, (n, op) in
                                  enumerate(names_ops)])


def test_labels_from_scoped_names_keep_what_matters() -> None:
    labels = node_labels(_graph([
        ("/conv1/Conv", "Conv"),
        ("/bn1/BatchNormalization", "BatchNormalization"),
        ("/Relu", "Relu"),
        ("/layer2/layer2.0/bn2/BatchNormalization", "BatchNormalization"),
        ("/layer2/layer2.0/Relu_1", "Relu"),
        ("/features/features.12/conv/conv.0/conv.0.2/Clip", "Clip"),
    ]))
    assert labels == {
        0: "Conv conv1", 1: "BatchNorm bn1", 2: "Relu#1 after bn1",
        3: "BatchNorm layer2.0/bn2", 4: "Relu#2 layer2.0", 5: "Clip features.12/conv.0.2"}


def test_unnamed_nodes_get_op_and_position() -> None:
    labels = node_labels(_graph([(f"n{i}", op) for i, op in
                                 enumerate(["Conv", "Relu", "Conv", "Relu", "Gemm"])]))
    assert labels == {0: "Conv#1 of 2", 1: "Relu#1 of 2", 2: "Conv#2 of 2", 3: "Relu#2 of 2",
                      4: "Gemm, node 5 of 5"}
    # after a named scope, the position is relative to it
    labels = node_labels(_graph([("/layer3/Conv", "Conv"), ("n1", "Conv"), ("", "Relu")]))
    assert labels[1] == "Conv#2 after layer3" and labels[2] == "Relu after layer3"


@pytest.mark.skipif(not RESNET.exists(), reason="model zoo not exported")
def test_split_of_a_model_without_names(tmp_path: Path) -> None:
    model = onnx.load(str(RESNET))
    for i, node in enumerate(model.graph.node):
        node.name = f"n{i + 2}"
    onnx.save(model, str(tmp_path / "m.onnx"))
    bundle = split_model(tmp_path / "m.onnx", tmp_path / "b", max_candidates=16)
    labels = [c.label for c in bundle.candidates]
    assert len(set(labels)) == len(labels)
    for label in labels[1:-1]:
        assert " of " in label, label  # op type and position
        assert not any(part.startswith("n") and part[1:].isdigit() for part in label.split())
    # named: scopes, no truncation anywhere
    named = split_model(RESNET, tmp_path / "n", max_candidates=64)
    assert "BatchNorm layer2.0/downsample.1" in {c.label for c in named.candidates}
