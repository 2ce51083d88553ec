"""The heavy real models: PP-OCRv4 text recognition and detection from rapidocr-onnxruntime's
wheel, on text rendered onto the sample photos (labelled), with their post-processing and
metrics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from coinf.convert import post
from coinf.convert.metrics import Metric, parse_metric
from coinf.models import ocr, realdata
from coinf.models import pretrained as pt
from onnx import TensorProto, helper

from coinf.errors import InputError

REC = pt.PRETRAINED["ppocr_rec"]


def _installed() -> None:
    if pt.installed_version(REC) != REC.version:
        pytest.skip("rapidocr-onnxruntime==1.4.4 is not installed (make test installs it)")


def _session(model: onnx.ModelProto):  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def test_the_recogniser_reads_the_rendered_words() -> None:
    """Labelled: each crop says a known word, its label the word's ids in the dictionary the
    package ships in the model's metadata; the published weights read nearly all of them."""
    _installed()
    chars = ocr.characters(onnx.load(str(pt.require_package(REC))))
    assert chars[0] == "<blank>" and chars[ocr.SPACE] == " " and len(chars) == ocr.REC_CLASSES
    model = pt.build_model("ppocr_rec")
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == \
        [1, 3, 48, 320]
    sess = _session(model)
    x, labels = ocr.word_set(20, [p for _, p in realdata.photos()], chars, seed=3)
    assert x.shape == (20, 3, 48, 320) and labels.shape == (20, ocr.REC_STEPS)
    assert [ocr.word_of(r, chars) for r in labels] == [ocr.WORDS[i] for i in range(20)]
    metric = parse_metric(REC.metric)
    right = 0
    for i in range(len(x)):
        probs = sess.run(None, {"x": x[i:i + 1]})[0]
        assert probs.shape == (1, ocr.REC_STEPS, ocr.REC_CLASSES)
        right += metric.correct(probs.argmax(-1), labels[i])
    assert right >= 17


def test_ctc_against_labels_ignores_the_listed_ids() -> None:
    """``ctc@I``: word accuracy against a label row (ids padded with -1), id I (a space)
    dropped on both sides; the loss counts inputs the reference reads and the packed run
    does not."""
    m = parse_metric("ctc@9")
    label = np.array([5, 7, -1, -1])
    read = np.array([[9, 5, 5, 0, 7, 9]])  # " 57 " with the spaces dropped
    assert m.correct(read, label) and not parse_metric("ctc").correct(read, label)
    wrong = np.array([[5, 0, 0, 0, 0, 0]])
    assert not m.correct(wrong, label)
    assert m.loss([read], [wrong], label) == 1.0 and m.loss([wrong], [read], label) == 0.0
    assert m.loss([read], [wrong]) == 1.0  # without a label: the decodings differ
    assert m.judges_labels(1, 40) and not m.judges_labels(0, 1)
    with pytest.raises(InputError, match="ctc@6624"):
        parse_metric("ctc@x")


def test_the_detector_marks_the_text_and_the_mask_post_shrinks_it(tmp_path: Path) -> None:
    _installed()
    model = pt.build_model("ppocr_det")
    post.attach(model, "mask:4")
    sess = _session(model)
    blank = np.full((400, 400, 3), 200, np.uint8)
    page, _ = ocr.render_page(blank, np.random.default_rng(0))
    masks = [sess.run(None, {"x": ocr.preprocess_det(a)})[0] for a in (blank, page)]
    assert all(m.shape == (1, 1, 160, 160) and m.dtype == np.uint8 for m in masks)
    assert masks[0].sum() == 0 and masks[1].sum() > 20  # text found only where it was drawn


def test_mask_post_is_maxpool_then_threshold() -> None:
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["p"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
                          [helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 1, 8, 8])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    assert post.attach(model, "mask:4")["kind"] == "mask"
    x = np.zeros((1, 1, 8, 8), np.float32)
    x[0, 0, 1, 2], x[0, 0, 6, 7], x[0, 0, 5, 1] = 0.9, 0.3, 0.29
    got = _session(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got[0, 0], [[1, 0], [0, 1]])
    with pytest.raises(InputError, match="mask:K"):
        post.check_spec("mask:0")


def test_ctc_compares_the_decoded_strings() -> None:
    m = parse_metric("ctc")
    a = np.array([[0, 5, 5, 0, 7, 7, 7, 0]])
    assert m.loss([a], [np.array([[5, 0, 0, 7, 0, 0, 0, 0]])]) == 0.0  # the same "5 7"
    assert m.loss([a], [np.array([[5, 0, 5, 7, 0, 0, 0, 0]])]) == 1.0  # "5 5 7"
    assert m.loss([a], [np.array([[0, 0, 0, 0, 0, 0, 0, 0]])]) == 1.0
    assert Metric("ctc").loss([np.zeros((1, 0), np.int64)], [np.zeros((1, 0), np.int64)]) == 0


def test_the_demo_holds_out_one_input_not_its_label(tmp_path: Path) -> None:
    """The recogniser's data carries labels: the held-out input is the image alone."""
    _installed()
    from coinf.cli.commands.demo_prep import held_out_input

    x = np.load(held_out_input("ppocr_rec", tmp_path))
    assert x.shape == (1, 3, 48, 320) and x.dtype == np.float32
