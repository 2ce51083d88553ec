"""Session over the in-process and socket loopback links, on a hand-made bundle."""

from __future__ import annotations

import numpy as np
import pytest

from coinf import EmulationOptions, Session
from coinf.errors import BundleError, InputError
from tests.bundles import fixed, make_tiny_bundle, reference


@pytest.fixture()
def bundle(tmp_path):
    return make_tiny_bundle(tmp_path / "tiny")


@pytest.mark.parametrize("split", ["c000", "c001", "c002", "handheld-only", "wearable-only"])
def test_inprocess_every_split_matches_whole_model(bundle, split):
    x = np.random.default_rng(1).standard_normal((1, 16)).astype(np.float32)
    with Session(bundle, fixed(split)) as sess:
        (y,) = sess.run(None, {"x": x})
        stats = sess.last_run
    np.testing.assert_allclose(y, reference(bundle, x), rtol=1e-5, atol=1e-6)
    assert stats is not None
    assert stats.local == (sess.split.id == "c002")
    if not stats.local:
        assert stats.bytes_up > 0 and stats.bytes_down > 0


def test_ort_like_surface(bundle):
    with Session(bundle, fixed("c001")) as sess:
        (inp,) = sess.get_inputs()
        (out,) = sess.get_outputs()
        assert (inp.name, inp.shape, inp.type) == ("x", [1, 16], "tensor(float)")
        assert (out.name, out.shape, out.type) == ("y", [1, 4], "tensor(float)")
        x = np.ones((1, 16), np.float32)
        assert sess.run(["y"], {"x": x})[0].shape == (1, 4)


@pytest.mark.parametrize(
    ("feed", "message"),
    [
        ({"x": np.ones((1, 15), np.float32)}, "shape [1, 15], expected [1, 16]"),
        ({"x": np.ones((1, 16), np.float64)}, "dtype float64, expected float32"),
        ({}, "missing input 'x'"),
        ({"x": np.ones((1, 16), np.float32), "z": 1}, "unknown input 'z'"),
    ],
)
def test_bad_feeds_raise_value_error_before_sending(bundle, feed, message):
    sess = Session(bundle, fixed("c001"))
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        sess.run(None, feed)
    assert sess.core.connection.links_opened == 0  # nothing was connected, let alone sent
    sess.close()


def test_unknown_output_and_split(bundle):
    with pytest.raises(BundleError, match="unknown candidate id 'c999'"):
        Session(bundle, fixed("c999"))
    with Session(bundle, fixed("c001")) as sess, \
            pytest.raises(InputError, match="unknown output"):
        sess.run(["nope"], {"x": np.ones((1, 16), np.float32)})


def test_slowdown_stretches_compute_time(monkeypatch):
    from types import SimpleNamespace

    from coinf.device import emulation
    from coinf.device.emulation import DeviceEmulation

    slept: list[float] = []
    monkeypatch.setattr(emulation, "time", SimpleNamespace(sleep=slept.append))
    emulated = DeviceEmulation(slowdown=4.0).stretch(0.02)
    assert emulated == pytest.approx(0.08)
    assert slept == [pytest.approx(0.06)]  # it really waits (K-1) x the compute time
    assert DeviceEmulation().stretch(0.02) == pytest.approx(0.02)
    assert len(slept) == 1  # no slowdown: no wait
    with pytest.raises(ValueError, match="slowdown must be >= 1"):
        DeviceEmulation(slowdown=0.5)


def test_session_applies_slowdown_to_head(bundle):
    x = np.ones((1, 16), np.float32)
    with Session(bundle, fixed("c002", emulation=EmulationOptions(slowdown=1000.0))) as sess:
        sess.run(None, {"x": x})
        assert sess.last_run is not None
        # 1000x the real compute of a 16x8 MatMul is still > 1 ms
        assert sess.last_run.head_ms > 1.0


@pytest.mark.parametrize("packing", ["f32", "f16", "q8", "q3"])
def test_packed_crossing_tensors(bundle, packing):
    x = np.random.default_rng(5).standard_normal((1, 16)).astype(np.float32)
    with Session(bundle, fixed("c001", packing)) as raw_sess:
        (y,) = raw_sess.run(None, {"x": x})
    ref = reference(bundle, x)
    if packing == "f32":
        np.testing.assert_array_equal(y, ref)
    else:
        # the quantised hidden layer perturbs the output, but boundedly
        assert np.max(np.abs(y - ref)) < {"f16": 1e-2, "q8": 0.5, "q3": 5.0}[packing]


def test_bad_packing_is_rejected(bundle):
    with pytest.raises(InputError, match=r"bits in 1\.\.16, got 99"):
        Session(bundle, fixed("c001", "q99"))


def test_large_results_travel_packed(tmp_path):
    from coinf.ble_protocol.tensors import decode_tensors
    from coinf.handheld.daemon import encode_results

    big = {"y": np.zeros((1, 4096), np.float32), "z": np.arange(3, dtype=np.float32)}
    blob = encode_results(big)
    assert len(blob) < 1000  # zeros compress; 3 floats stay raw
    out = decode_tensors(blob)
    np.testing.assert_array_equal(out["y"], big["y"])
    np.testing.assert_array_equal(out["z"], big["z"])
