"""Run-time compressor choice by bandwidth thresholds (paper 002, §IV-D)."""

from __future__ import annotations

import itertools
import math

import pytest
from coinf.wearable.planner.compress_select import (
    CompressionOption,
    effective_accuracy,
    lookup,
    select,
    thresholds,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from coinf.errors import InputError

options_st = st.lists(
    st.builds(CompressionOption, st.sampled_from([1, 2, 4, 8]),
              st.sampled_from(["raw", "q8", "q4"]), st.floats(10, 1e5), st.floats(0.05, 1.0)),
    min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(options_st, st.floats(0.5, 200), st.floats(0.5, 200), st.floats(1, 1e8))
def test_threshold_table_agrees_with_direct_choice(options, compute, gen, bandwidth) -> None:
    table = thresholds(options, compute, gen)
    assert table[0][0] == 0.0 and all(a[0] < b[0] for a, b in itertools.pairwise(table))
    via_table = lookup(table, bandwidth)
    best = select(options, bandwidth, compute, gen)
    got = effective_accuracy(via_table, bandwidth, compute, gen)
    want = max(effective_accuracy(o, bandwidth, compute, gen) for o in options)
    assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(effective_accuracy(best, bandwidth, compute, gen), want, rel_tol=1e-12)


def test_low_bandwidth_picks_more_compression() -> None:
    opts = [CompressionOption(1, "raw", 3456, 0.978), CompressionOption(4, "q8", 250, 0.975),
            CompressionOption(8, "q4", 70, 0.95)]
    assert select(opts, 1e6, 30, 30).gamma == 1  # the link carries raw tensors at 30 fps
    assert select(opts, 2e4, 30, 30).gamma == 4
    assert select(opts, 2e3, 30, 30).gamma == 8
    table = thresholds(opts, 30, 30)
    assert [o.gamma for _, o in table] == [8, 4, 1]
    # Eq. 3: gamma 4 takes over where 30 fps x nu_8 = b / 250 x nu_4
    assert math.isclose(table[1][0], 30 * 0.95 * 250 / 0.975)


def test_bad_options_are_refused() -> None:
    with pytest.raises(InputError):
        select([], 1.0, 1.0, 1.0)
    with pytest.raises(InputError):
        select([CompressionOption(2, "raw", 0, 0.9)], 1.0, 1.0, 1.0)
    with pytest.raises(InputError):
        thresholds([CompressionOption(2, "raw", 10, 0.9)], 0, 1.0)
