"""A short run of ``coinf bench fuzz`` in CI: every decoder answers hostile bytes with its
documented error only (the full run, 100,000 inputs per decoder, is a benchmark)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from coinf.cli.bench.fuzz import BUDGET, TENSOR_DECODERS, fuzz_one, seeds

TABLE = seeds(np.random.default_rng(5))


@pytest.mark.parametrize("name", sorted(TABLE))
def test_decoder_raises_only_protocol_errors(name):
    valid, decode = TABLE[name]
    stats = fuzz_one(name, valid, decode, 400, random.Random(name),
                     BUDGET if name in TENSOR_DECODERS else None)
    assert stats["other_exceptions"] == 0, stats.get("examples")
    assert stats["decoded"] >= len(valid)  # the valid seeds decode
    assert stats["protocol_errors"] > 0 or name == "error"  # and the mutants are refused


def test_the_checker_counts_foreign_exceptions():
    def fragile(data: bytes) -> None:
        raise KeyError("boom")

    stats = fuzz_one("fragile", [b"x"], fragile, 20, random.Random(0))
    assert stats["other_exceptions"] == 20 and "KeyError" in stats["examples"][0]
