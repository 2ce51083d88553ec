"""Text lines read from a detector's mask and matched (convert/textlines.py, --metric lines@T)."""

from __future__ import annotations

import numpy as np
import pytest
from coinf.convert import textlines
from coinf.convert.feeds import dataset_from_arrays
from coinf.convert.metrics import parse_metric

from coinf.bundle import TensorSpec
from coinf.errors import InputError


def _mask(*rects: tuple[int, int, int, int], side: int = 40) -> np.ndarray:
    m = np.zeros((1, 1, side, side), np.uint8)
    for x0, y0, x1, y1 in rects:
        m[0, 0, y0:y1, x0:x1] = 1
    return m


def test_regions_are_eight_connected() -> None:
    m = np.zeros((6, 6), bool)
    m[0, 0] = m[1, 1] = True  # touching at a corner: one region
    m[4, 3:6] = True
    lab = textlines.components(m)
    assert len(np.unique(lab[lab > 0])) == 2
    assert lab[0, 0] == lab[1, 1] != lab[4, 4]
    assert (lab[~m] == 0).all()
    snake = np.zeros((9, 9), bool)
    snake[::2, :] = True
    snake[1::4, 8] = snake[3::4, 0] = True  # one region folded five times
    assert len(np.unique(textlines.components(snake))) == 2  # the region and the background


def test_each_region_is_one_line_grown_by_the_unclip() -> None:
    boxes = textlines.line_boxes(_mask((4, 10, 24, 14), (30, 30, 36, 36)))
    assert boxes.shape == (2, 4)
    d = 20 * 4 * textlines.UNCLIP / (2 * 24)  # area x ratio / perimeter
    line = boxes[np.argmin(boxes[:, 0])]
    assert line == pytest.approx([(4 - d) / 40, (10 - d) / 40, (24 + d) / 40, (14 + d) / 40])
    assert textlines.line_boxes(_mask()).shape == (0, 4)


def test_f1_matches_one_to_one_at_the_iou_threshold() -> None:
    a = np.array([[0.1, 0.1, 0.5, 0.2], [0.1, 0.6, 0.9, 0.7]])
    assert textlines.f1(a, a, 0.5) == 1.0
    assert textlines.f1(a, a[:1], 0.5) == pytest.approx(2 / 3)
    shifted = a + np.array([0.3, 0, 0.3, 0])  # the first overlaps 1/7 of its union, the second 5/11
    assert textlines.f1(a, shifted, 0.5) == 0.0
    assert textlines.f1(a, np.vstack([a[:1], a[:1]]), 0.5) == pytest.approx(0.5)  # one-to-one
    assert textlines.f1(a[:0], a[:0], 0.5) == 1.0 and textlines.f1(a, a[:0], 0.5) == 0.0


def test_lines_metric_against_the_model_and_against_labels() -> None:
    metric = parse_metric("lines@0.5")
    ref = _mask((4, 10, 24, 14), (4, 30, 30, 34))
    assert metric.loss([ref], [ref]) == 0.0
    assert metric.loss([ref], [_mask((4, 10, 24, 14))]) == pytest.approx(1 - 2 / 3)
    label = np.full((8, 4), -1.0, np.float32)
    label[:2] = textlines.line_boxes(ref)
    assert metric.correct(ref, label) == 1.0
    assert metric.loss([ref], [_mask((4, 10, 24, 14))], label) == pytest.approx(1 - 2 / 3)
    assert metric.loss([_mask()], [ref], label) == 0.0  # better than the clean run: no loss
    assert metric.judges_labels(2, 1) and not metric.judges_labels(0, 1)


def test_box_labels_load_and_malformed_ones_are_refused() -> None:
    spec = TensorSpec("x", (1, 2), "float32", 8)
    labels = np.full((3, 8, 4), -1.0, np.float32)
    labels[:, 0] = [0.1, 0.1, 0.4, 0.2]
    d = dataset_from_arrays({"x": np.zeros((3, 2), np.float32), "labels": labels}, [spec], "d")
    assert d.labels is not None and d.labels.shape == (3, 8, 4)
    labels[1, 0, 0] = np.nan
    with pytest.raises(InputError, match="line boxes per feed"):
        dataset_from_arrays({"x": np.zeros((3, 2), np.float32), "labels": labels}, [spec], "d")
