"""Post-processing appended before splitting (convert/post.py): only what the app needs comes
back, every candidate still verifies, and the task metrics that read it (class, boxes@T)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from coinf.convert.metrics import boxes_loss, parse_metric
from coinf.convert.split import split_model
from onnx import TensorProto, helper

from coinf import Session
from coinf.errors import InputError
from tests.bundles import fixed
from tests.planner_bundle import make_model

RNG = np.random.default_rng(7)


def _run(path: Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(str(path)).run(None, feed)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("post")
    make_model(root / "m.onnx")
    return root / "m.onnx"


def test_topk_returns_the_best_classes_and_every_cut_verifies(classifier: Path,
                                                              tmp_path: Path) -> None:
    b = split_model(classifier, tmp_path / "b", post="topk:3", verify=True)
    assert [(t.name, t.shape, t.dtype) for t in b.outputs] == [
        ("y_topk_values", (1, 3), "float32"), ("y_topk_indices", (1, 3), "int64")]
    assert b.meta["post"]["spec"] == "topk:3" and b.meta["verified"]["ok"]
    x = RNG.standard_normal((1, 3, 32, 32)).astype(np.float32)
    (logits,) = _run(classifier, {"x": x})
    values, idx = _run(b.model_path, {"x": x})
    assert list(idx[0]) == list(np.argsort(-logits[0])[:3])
    assert np.allclose(values[0], np.sort(logits[0])[::-1][:3], atol=1e-6)
    assert all(o.nbytes <= 24 for o in b.outputs)  # 60 B back instead of 40
    with Session(b.root, fixed(b.candidates[1].id)) as sess:  # a split returns the ids too
        got = sess.run(None, {"x": x})
        assert got[1].dtype == np.int64 and list(got[1][0]) == list(idx[0])


def test_argmax_and_a_file_of_your_own(classifier: Path, tmp_path: Path) -> None:
    b = split_model(classifier, tmp_path / "a", post="argmax", verify=True)
    assert [t.name for t in b.outputs] == ["y_argmax"]
    soft = helper.make_model(helper.make_graph(
        [helper.make_node("Softmax", ["y"], ["probs"], axis=-1)], "post",
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 10])]),
        opset_imports=[helper.make_opsetid("", 17)])
    soft.ir_version = 8
    onnx.save(soft, str(tmp_path / "soft.onnx"))
    f = split_model(classifier, tmp_path / "f", post=str(tmp_path / "soft.onnx"), verify=True)
    x = RNG.standard_normal((1, 3, 32, 32)).astype(np.float32)
    (probs,) = _run(f.model_path, {"x": x})
    assert [t.name for t in f.outputs] == ["probs"] and probs.sum() == pytest.approx(1, abs=1e-5)


def _detector(path: Path, classes: int = 3, anchors: int = 50) -> None:
    """An identity 'detector': its input is its raw output [1, 4+C, N]."""
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["out"])], "det",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                         [1, 4 + classes, anchors])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT,
                                                         [1, 4 + classes, anchors])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))


def test_boxes_keeps_the_best_anchors(tmp_path: Path) -> None:
    _detector(tmp_path / "d.onnx")
    b = split_model(tmp_path / "d.onnx", tmp_path / "b", post="boxes:4", verify=True)
    x = RNG.random((1, 7, 50)).astype(np.float32)
    (boxes,) = _run(b.model_path, {"x": x})
    assert boxes.shape == (1, 4, 6)
    scores = x[0, 4:].max(0)
    best = np.argsort(-scores)[:4]
    assert np.allclose(boxes[0, :, :4], x[0, :4, best], atol=1e-6)
    assert np.allclose(boxes[0, :, 4], scores[best], atol=1e-6)
    assert list(boxes[0, :, 5]) == list(x[0, 4:, best].argmax(1).astype(float))


@pytest.mark.parametrize("spec", ["topk:0", "topk", "nms:3", "argmax@nosuch", "missing.onnx"])
def test_a_bad_post_is_refused_before_any_work(classifier: Path, tmp_path: Path,
                                               spec: str) -> None:
    with pytest.raises(InputError, match="--post"):
        split_model(classifier, tmp_path / "x", post=spec)
    assert not (tmp_path / "x").exists()


def test_class_and_boxes_metrics() -> None:
    cls = parse_metric("class")
    assert cls.loss([np.array([[3, 1, 2]])], [np.array([[3, 2, 1]])]) == 0.0
    assert cls.loss([np.array([[3, 1, 2]])], [np.array([[1, 3, 2]])]) == 1.0
    a = np.array([[10, 10, 4, 4, 0.9, 1], [30, 30, 6, 6, 0.8, 2], [0, 0, 1, 1, 0.1, 0]])
    assert boxes_loss(a, a, 0.5) == 0.0
    moved = a.copy()
    moved[0, 0] += 4  # IoU 1/3 with the original
    assert boxes_loss(a, moved, 0.5) == pytest.approx(0.5)
    other = a.copy()
    other[1, 5] = 0  # the same box, another class
    assert boxes_loss(a, other, 0.5) == pytest.approx(0.5)
    faint = a.copy()
    faint[1, 4] = 0.2  # below the score threshold: one box missing of two
    assert boxes_loss(a, faint, 0.5) == pytest.approx(1 - 2 / 3)
    none = a.copy()
    none[:, 4] = 0.0
    assert boxes_loss(none, none, 0.5) == 0.0
    assert parse_metric("boxes@0.5").loss([a[None]], [moved[None]]) == pytest.approx(0.5)
    with pytest.raises(InputError):
        parse_metric("boxes@2")
