"""Hostile and edge-case bytes each decoder must answer with a ProtocolError (nothing else), and
edge-case tensors the encoder must round-trip on every install (issue 11)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from coinf.ble_protocol import bitplanes, packing
from coinf.ble_protocol.gatt import parse_ctrl
from coinf.ble_protocol.messages import decode_json
from coinf.ble_protocol.tensors import decode_tensors
from coinf.device.profile import DeviceProfile, ProfileError

from coinf.errors import ProtocolError


@pytest.mark.parametrize(
    "payload",
    [b"[" * 1000, b'{"a":' * 5000 + b"1" + b"}" * 5000, b'{"threads": Infinity}',
     b'{"x": NaN}', b"\xff\xfe", b"[]", b'{"deep": ' + b"[" * 40 + b"]" * 40 + b"}"],
)
def test_wire_json_is_bounded(payload):
    with pytest.raises(ProtocolError):
        decode_json(payload, max_bytes=1 << 20)


def test_control_handshake_json_is_bounded():
    with pytest.raises(ProtocolError):
        parse_ctrl(bytes([1]) + b"[" * 400)


@pytest.mark.parametrize("raw", [b"{}", b'{"threads": Infinity}', b"[" * 1000, b"null"])
def test_a_bad_profile_is_a_profile_error(raw):
    with pytest.raises(ProfileError):
        DeviceProfile.from_bytes(raw)


def test_an_empty_tensor_with_impossible_dims_is_malformed():
    dims = (0, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF)
    body = struct.pack(f"<BB{len(dims)}I", 1, len(dims), *dims)
    blob = struct.pack("<H", 1) + struct.pack("<H", 1) + b"x" + struct.pack("<BI", 0, len(body))
    with pytest.raises(ProtocolError):
        decode_tensors(blob + body)


@pytest.mark.parametrize("n", [0, 1, 2, 7, 8, 9])
@pytest.mark.parametrize("spec", ["f32", "f16", "q8", "q3"])
def test_small_tensors_round_trip_without_the_bitshuffle_library(monkeypatch, n, spec):
    monkeypatch.setattr(bitplanes, "USE_BITSHUFFLE", False)  # what a Pi install runs
    for shape in ((n,), () if n == 1 else (n, 1)):
        a = (np.arange(n, dtype=np.float32) * 0.37).reshape(shape)
        out = packing.unpack(packing.pack(a, spec))
        assert out.shape == a.shape
        np.testing.assert_allclose(out, a, atol=0.37 * max(n, 1) / 4)


@pytest.mark.parametrize("spec", ["q8", "q16", "f32", "f16"])
def test_float64_extremes_pack_into_bodies_the_decoder_accepts(spec):
    a = np.array([-1.7e308, 1.7e308, 0.0, 5e-324])
    out = packing.unpack(packing.pack(a, spec))
    assert out.shape == a.shape and np.isfinite(out).all()


@pytest.mark.parametrize("bad", ["../../../../etc/passwd", "/etc/passwd"])
def test_manifest_paths_stay_inside_the_bundle(tmp_path, bad):
    import json

    from coinf.bundle import Bundle
    from coinf.errors import BundleError
    from tests.bundles import make_tiny_bundle

    bundle = make_tiny_bundle(tmp_path / "tiny")
    manifest = bundle.root / "manifest.json"
    obj = json.loads(manifest.read_text())
    obj["candidates"][1]["head"]["file"] = bad
    manifest.write_text(json.dumps(obj))
    with pytest.raises(BundleError, match="outside the bundle"):
        Bundle.load(bundle.root)
