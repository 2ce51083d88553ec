"""``cents@T``: the pitch metric of convert/metrics.py (share of voiced frames moved > T cents)."""

from __future__ import annotations

import numpy as np
import pytest
from coinf.convert.metrics import parse_metric

from coinf.errors import InputError

PITCH = np.array([[110.0, 220.0, 330.0, 440.0, 550.0, 660.0]], dtype=np.float32)
CONF = np.array([[0.9, 0.95, 0.6, 0.5, 0.2, 0.0]], dtype=np.float32)  # 4 voiced (>= 0.5)


def loss(name: str, ref: list[np.ndarray], test: list[np.ndarray]) -> float:
    return parse_metric(name, ("pitch", "confidence")[: len(ref)],
                        ("pitch", "confidence")).loss(ref, test)


def test_identical_is_zero() -> None:
    assert loss("cents@50", [PITCH, CONF], [PITCH.copy(), CONF.copy()]) == 0.0


def test_semitone_shift_is_one() -> None:
    up = PITCH * np.float32(2 ** (100 / 1200))
    assert loss("cents@50", [PITCH, CONF], [up, CONF]) == pytest.approx(1.0)
    # within the tolerance, it is the same answer
    assert loss("cents@150", [PITCH, CONF], [up, CONF]) == 0.0


def test_only_voiced_frames_count() -> None:
    test = PITCH.copy()
    test[0, 4:] *= 2  # an octave off on the two unvoiced frames: not counted
    assert loss("cents@50", [PITCH, CONF], [test, CONF]) == 0.0
    test[0, 1] *= 2 ** (60 / 1200)  # one of the four voiced frames moves by 60 cents
    assert loss("cents@50", [PITCH, CONF], [test, CONF]) == pytest.approx(0.25)
    assert loss("cents@70", [PITCH, CONF], [test, CONF]) == 0.0
    # the test's own confidence does not change which frames count
    assert loss("cents@50", [PITCH, CONF], [test, np.zeros_like(CONF)]) == pytest.approx(0.25)


def test_pitch_alone_counts_every_positive_frame() -> None:
    test = PITCH.copy()
    test[0, 5] *= 1.5
    assert loss("cents@50", [PITCH], [test]) == pytest.approx(1 / 6)


def test_no_voiced_frame_and_bad_test_pitch() -> None:
    silent = np.zeros_like(CONF)
    assert loss("cents@50", [PITCH, silent], [PITCH * 2, silent]) == 0.0
    bad = PITCH.copy()
    bad[0, 0], bad[0, 1] = 0.0, np.nan  # no pitch where the reference has one: moved
    assert loss("cents@50", [PITCH, CONF], [bad, CONF]) == pytest.approx(0.5)


def test_parse() -> None:
    m = parse_metric("CENTS@50", ("pitch", "confidence"), ("pitch", "confidence"))
    assert m.name == "cents@50" and m.describe()["outputs"] == ["pitch", "confidence"]
    with pytest.raises(InputError, match="cents@T"):
        parse_metric("cents@", (), ("pitch",))
    with pytest.raises(InputError, match="not a number of cents"):
        parse_metric("cents@1.2.3", (), ("pitch",))
    three = parse_metric("cents@50")
    with pytest.raises(InputError, match="pitch and confidence"):
        three.loss([PITCH, CONF, CONF], [PITCH, CONF, CONF])
