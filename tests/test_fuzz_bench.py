"""A short run of ``coinf bench fuzz`` in CI: every decoder answers hostile bytes with its
documented error only (the full run, 100,000 inputs per decoder, is a benchmark)."""

from __future__ import annotations

import argparse
import json
import random

import numpy as np
import pytest
from coinf.ble_protocol import media

from coinf.cli.bench import fuzz, fuzz_codecs, fuzz_engine
from coinf.cli.bench.fuzz import BUDGET, TENSOR_DECODERS, seeds
from coinf.cli.bench.fuzz_engine import fuzz_one

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


# --- standard codecs (ble_protocol/media.py) -------------------------------------------------

CODECS, SKIPPED = fuzz_codecs.codec_seeds(np.random.default_rng(5))


@pytest.mark.parametrize("codec", sorted(fuzz_codecs.CODEC_SPECS))
def test_codec_decoder_refuses_hostile_bodies(codec):
    """Valid bodies, the crafted ones (other sizes spliced under a header, decompression bombs)
    and their mutants: only ProtocolErrors, or exactly the declared shape and dtype."""
    name = f"codec_{codec}"
    if codec not in media.available():
        assert name not in CODECS and codec in SKIPPED
        pytest.skip(f"{codec}: {SKIPPED[codec]}")
    case = CODECS[name]
    stats = fuzz_codecs.fuzz_codec(name, case, 300, random.Random(name))
    assert stats["other_exceptions"] == 0 and stats["wrong_results"] == 0, stats.get("examples")
    assert stats["inputs"] == 300 and stats["protocol_errors"] + stats["decoded"] == 300
    # the codec itself was exercised: its valid seeds decode, mutants reach it and are refused
    assert stats["codec_decoded"] >= len(case["valid"]) and stats["codec_refused"] > 0
    assert stats["reached_codec"] >= stats["codec_decoded"] + stats["codec_refused"] > 100
    assert len(stats["crafted"]) == len(case["crafted"]) > 5
    assert not [w for w, o in stats["crafted"].items() if o == "not fed"]
    bombs = [o for w, o in stats["crafted"].items() if "bomb" in w or "claims" in w]
    assert bombs and all(o.startswith("refused") for o in bombs)
    # numpy's buffers (tracemalloc) stay within a few times the receiver's budget: a decoder
    # that opened a bomb (1.2 GB for 20000x20000 RGB) would be far beyond
    assert stats["peak_over_budget"] < 16


def _fresh_pcm16() -> dict:
    return fuzz_codecs.codec_seeds(np.random.default_rng(6))[0]["codec_pcm16"]


def test_the_codec_checker_counts_failures(monkeypatch):
    """The check can fail: a codec decoder that raises anything but a ProtocolError, returns
    another shape or dtype, or accepts what it must refuse, is counted."""
    real = media.decode

    def raising(*args):
        raise ValueError("boom")

    monkeypatch.setattr(media, "decode", raising)
    stats = fuzz_codecs.fuzz_codec("codec_pcm16", _fresh_pcm16(), 60, random.Random(0))
    assert stats["other_exceptions"] > 0 and "ValueError: boom" in stats["examples"][0]

    def off_by_one(wire, params, payload, shape, dtype):
        return real(wire, params, payload, shape, dtype)[..., :-1]

    monkeypatch.setattr(media, "decode", off_by_one)
    stats = fuzz_codecs.fuzz_codec("codec_pcm16", _fresh_pcm16(), 60, random.Random(0))
    assert stats["wrong_results"] > 0 and "the header declares" in stats["examples"][0]

    def float64(wire, params, payload, shape, dtype):
        return real(wire, params, payload, shape, dtype).astype(np.float64)

    monkeypatch.setattr(media, "decode", float64)
    stats = fuzz_codecs.fuzz_codec("codec_pcm16", _fresh_pcm16(), 60, random.Random(0))
    assert stats["wrong_results"] > 0

    def trusting(wire, params, payload, shape, dtype):
        return np.zeros(shape, dtype)  # no size check at all

    monkeypatch.setattr(media, "decode", trusting)
    stats = fuzz_codecs.fuzz_codec("codec_pcm16", _fresh_pcm16(), 60, random.Random(0))
    assert "ACCEPTED" in stats["crafted"].values() and stats["wrong_results"] > 0


def test_the_bench_json_counts_codecs_and_lists_the_skipped(monkeypatch, capsys):
    have = media.available()
    monkeypatch.setattr(media, "available", lambda: have - {"flac"})
    for module in (fuzz, fuzz_engine):  # keep pytest's VmHWM intact
        monkeypatch.setattr(module, "rss_resettable", lambda: False)
    fuzz.run(argparse.Namespace(inputs=40, codec_inputs=fuzz_codecs.CODEC_INPUTS, seed=3,
                                decoders=None))
    out = json.loads(capsys.readouterr().out)
    assert out["failures"] == 0 and out["inputs_per_codec_decoder"] == 40
    assert "flac" in out["codecs"]["skipped"] and "codec_flac" not in out["decoders"]
    assert sorted(out["codecs"]["fuzzed"]) == sorted(have - {"flac"})
    assert "packed_tensor" in out["decoders"]  # the other decoders still run by default
    for codec in out["codecs"]["fuzzed"]:
        stats = out["decoders"][f"codec_{codec}"]
        assert stats["reached_codec"] > 0 and stats["codec_decoded"] > 0
        assert stats["budget_bytes"] > 0 and stats["peak_over_budget"] > 0


def test_ans_decoder_refuses_hostile_bodies(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ansN decoder (rANS under calibrated priors): valid bodies decode, every crafted one
    (another table's width or channels, impossible lane counts, missing words, ...) is refused,
    mutants end in a ProtocolError or the declared shape; numpy stays within a few budgets."""
    from coinf.ble_protocol import priors

    from coinf.cli.bench import fuzz_ans

    monkeypatch.setattr(priors, "_BOOK", {})  # the case registers its tables
    case = fuzz_ans.ans_case(np.random.default_rng(5))
    stats = fuzz_ans.fuzz_ans(case, 400, 5)
    assert stats["other_exceptions"] == 0 and stats["wrong_results"] == 0, stats.get("examples")
    assert stats["codec_decoded"] >= len(case["valid"]) and stats["codec_refused"] > 100
    assert len(stats["crafted"]) == len(case["crafted"]) > 10
    assert all(o.startswith("refused") for o in stats["crafted"].values()), stats["crafted"]
    assert stats["peak_over_budget"] < 16
