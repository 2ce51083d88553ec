"""Codec negotiation (docs/PROTOCOL.md §6.5): each side lists what it decodes, and a packing the
peer lacks goes as the nearest one it decodes with the same values, never as a failed run."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from coinf.ble_protocol import codecs, negotiate
from coinf.ble_protocol.negotiate import fit, peer_set
from coinf.ble_protocol.packing import PackSpec, describe, pack, unpack
from coinf.wearable.planner.codec_costs import undecodable

from coinf import LinkOptions, Session
from tests.bundles import fixed, make_tiny_bundle, reference
from tests.procs import handheld_daemon

needs_zstd = pytest.mark.skipif(not codecs.AVAILABLE, reason="zstandard is not installed here")


def test_a_list_from_before_the_entropy_stages_reads_right() -> None:
    old = peer_set(["f16", "f32", "q", "raw", "qz", "png"])  # protocol 2, zstandard there
    assert {"lz4", "zstd", "qz", "png"} <= old
    assert "zstd" not in peer_set(["f16", "f32", "q", "raw"])  # no zstandard there
    assert peer_set(None) >= {"qz", "zstd", "lz4"} and "png" not in peer_set(None)
    assert peer_set("not a list") == peer_set(None)
    assert peer_set([1, {"x": 2}, "q"]) == negotiate.MANDATORY  # junk entries are skipped
    assert "ans" not in peer_set(["ans"], same_priors=False)


def test_what_this_side_lists_follows_its_libraries() -> None:
    have = set(negotiate.decodable())
    assert have >= negotiate.MANDATORY
    assert ({"qz", "zstd"} <= have) == codecs.AVAILABLE


def test_fit_keeps_the_values_and_says_why() -> None:
    no_zstd = peer_set(["f16", "f32", "q", "raw", "lz4"])
    q4, why = fit(PackSpec.parse("qz4"), no_zstd)
    assert str(q4) == "q4" and why is not None and "qz4 sent as q4" in why and "zstd" in why
    assert str(fit(PackSpec.parse("ans3"), no_zstd)[0]) == "q3"
    assert fit(PackSpec.parse("qz4"), peer_set(["qz", "zstd"])) == (PackSpec.parse("qz4"), None)
    jpeg = PackSpec.parse("jpeg-q90")
    assert fit(jpeg, no_zstd) == (jpeg, None)  # no exact substitute: the caller refuses it
    assert "cannot decode jpeg" in str(negotiate.missing(jpeg, no_zstd))
    assert "cannot decode qz, zstd" in str(undecodable("qz4", no_zstd))
    assert undecodable("qz4", peer_set(["qz"])) is None


@needs_zstd
def test_a_receiver_without_zstd_never_gets_a_zstd_body() -> None:
    x = np.maximum(np.random.default_rng(0).standard_normal((1, 8, 16, 16)), 0).astype(np.float32)
    assert describe(pack(x, "qz4"))["zstd"]
    plain = pack(x, "qz4", zstd=False)
    assert describe(plain)["codec"] == "quant"
    # ans without a table falls back to QUANTZ, or to QUANT for a receiver without zstd
    assert describe(pack(x, "ans4"))["codec"] == "quantz"
    assert describe(pack(x, "ans4", zstd=False))["codec"] == "quant"
    assert np.array_equal(unpack(plain), unpack(pack(x, "qz4")))


@needs_zstd
def test_a_handheld_without_zstandard_gets_lz4_and_the_run_succeeds(tmp_path: Path) -> None:
    """A real daemon in a process where ``import zstandard`` fails (a shadowing package on its
    PYTHONPATH), a Session fixed to qz4: the run offloads with q4 and says why."""
    shadow = tmp_path / "shadow" / "zstandard"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("zstandard hidden by the test")\n')
    path = os.pathsep.join(p for p in (str(shadow.parent), os.environ.get("PYTHONPATH")) if p)
    bundle = make_tiny_bundle(tmp_path / "tiny")
    sock = tmp_path / "hh.sock"
    x = np.random.default_rng(3).standard_normal((1, 16)).astype(np.float32)
    link = LinkOptions(transport=f"unix:{sock}", fallback=False)
    with handheld_daemon(bundle.root, f"unix:{sock}", env={"PYTHONPATH": path}):
        with Session(bundle.root, fixed("c001", "qz4", link=link)) as sess:
            info = sess.connect()
            assert "zstd" not in info["decoders"] and "qz" not in info["decoders"]
            assert "lz4" in info["decoders"]
            (y,) = sess.run(None, {"x": x})
            stats = sess.last_run
            assert stats is not None and not stats.local and stats.fallback is None
            assert stats.packing == "qz4"
            assert stats.packing_fallback is not None
            assert "qz4 sent as q4" in stats.packing_fallback
            assert "zstd" in stats.packing_fallback
        with Session(bundle.root, fixed("c001", "q4", link=link)) as sess:
            (want,) = sess.run(None, {"x": x})
            assert sess.last_run is not None and sess.last_run.packing_fallback is None
    assert np.array_equal(y, want)  # the same levels: the same result as q4
    np.testing.assert_allclose(y, reference(bundle, x), rtol=0.1, atol=0.1)


def test_a_compressor_the_handheld_does_not_list_is_not_planned() -> None:
    from types import SimpleNamespace

    from coinf.wearable.planner.codec_costs import peer_compressors

    cand = SimpleNamespace(id="c002")
    have = peer_set(["q"])
    assert peer_compressors({"compressors": [{"cut": "c002", "gamma": 4}, "c002~g8",
                                             {"cut": "c003", "gamma": True}]}) == {("c002", 4)}
    assert peer_compressors({}) is None  # not listed: every compressor of the bundle
    assert undecodable("g4+q8", have, cand, frozenset({("c002", 4)})) is None
    assert undecodable("g4+q8", have, cand, None) is None
    assert "no compressor g8 at c002" in str(undecodable("g8", have, cand,
                                                         frozenset({("c002", 4)})))


def test_a_learned_code_goes_as_f32_to_a_peer_without_latent() -> None:
    from coinf.ble_protocol.negotiate import MANDATORY, fit
    from coinf.ble_protocol.packing import PackSpec

    spec = PackSpec("latent")
    out, why = fit(spec, frozenset(MANDATORY))
    assert str(out) == "f32" and why is not None and "latent sent as f32" in why
    same, none = fit(spec, frozenset(MANDATORY | {"latent"}))
    assert same is spec and none is None
