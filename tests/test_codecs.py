"""QUANTZ (spec ``qzN``): quantized levels in a zstd frame. Round trips, density, hostile bodies,
the fallback without zstandard, and the accuracy of the trained digit model."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from coinf.ble_protocol import codecs
from coinf.ble_protocol import packing as P
from coinf.ble_protocol.messages import ErrorCode, ProtocolError
from coinf.ble_protocol.tensors import decode_tensors, encode_tensors
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

zstd = pytest.importorskip("zstandard")
RNG = np.random.default_rng(77)


def relu(shape: tuple[int, ...] = (1, 6, 24, 24)) -> np.ndarray:
    return np.maximum(RNG.standard_normal(shape).astype(np.float32) * 2.0 - 0.5, 0.0)


@pytest.mark.parametrize("bits", range(1, 17))
def test_every_bitwidth_round_trips_within_the_bound(bits: int) -> None:
    x = relu((2, 5, 11, 3)) - 0.25
    body = P.pack(x, f"qz{bits}")
    head = P.read_header(body)
    assert head.codec == P.QUANTZ and head.bits == bits
    y = P.unpack(body)
    assert y.shape == x.shape and y.dtype == x.dtype
    err = float(np.abs(y.astype(np.float64) - x).max())
    assert err <= P.quantization_bound(head.scale, float(np.abs(x).max()))
    # the same levels as QUANT: the tensor that comes back is the same one
    assert np.array_equal(y, P.unpack(P.pack(x, f"q{bits}")))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=hnp.arrays(np.float32, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0,
                                                    max_side=9),
                    elements=st.floats(-1e6, 1e6, allow_nan=False, width=32)),
       bits=st.integers(1, 16))
def test_round_trip_property(x: np.ndarray, bits: int) -> None:
    body = P.pack(x, P.PackSpec("qz", bits))
    y = P.unpack(body)
    assert y.shape == x.shape and y.dtype == x.dtype
    if x.size and float(x.max()) > float(x.min()):
        h = P.read_header(body)
        assert np.abs(y.astype(np.float64) - x).max() <= P.quantization_bound(
            h.scale, float(np.abs(x).max()))
    else:
        assert np.array_equal(y, x)


def test_spec_names() -> None:
    spec = P.PackSpec.parse("qz3")
    assert (spec.codec, spec.bits, str(spec)) == ("qz", 3, "qz3")
    assert not spec.lossless
    for bad in ("qz0", "qz17", "qz", "zq3"):
        with pytest.raises(ValueError):
            P.PackSpec.parse(bad)


def test_denser_than_bit_planes_and_lz4_on_relu_maps() -> None:
    xs = [relu() for _ in range(8)]
    q = sum(len(P.pack(x, "q3")) for x in xs)
    qz = sum(len(P.pack(x, "qz3")) for x in xs)
    assert qz < 0.9 * q, (qz, q)
    assert P.describe(P.pack(xs[0], "qz3"))["zstd"] is True


def test_incompressible_levels_travel_plain() -> None:
    x = np.random.default_rng(3).random(64).astype(np.float32)
    body = P.pack(x, "qz8")
    h = P.read_header(body)
    assert h.flags == 0 and h.packed_size == h.raw_size == 64
    assert np.abs(P.unpack(body) - x).max() <= P.quantization_bound(h.scale, 1.0)


def test_in_a_tensor_map_with_a_byte_budget() -> None:
    x = relu((1, 4, 10, 10))
    blob = encode_tensors({}, packed={"act": P.pack(x, "qz4")})
    assert decode_tensors(blob)["act"].shape == x.shape
    with pytest.raises(ProtocolError) as info:
        decode_tensors(blob, max_bytes=x.nbytes - 1)
    assert info.value.code == ErrorCode.TOO_LARGE


def test_fallback_without_zstandard(monkeypatch: pytest.MonkeyPatch) -> None:
    """A side without zstandard packs QUANT instead, and refuses QUANTZ with a clear error."""
    x = relu((1, 4, 10, 10))
    body = P.pack(x, "qz4")
    monkeypatch.setattr(codecs, "AVAILABLE", False)
    monkeypatch.setattr(codecs, "_zstd", None)
    fallback = P.pack(x, "qz4")
    assert P.read_header(fallback).codec == P.QUANT
    assert fallback == P.pack(x, "q4")
    with pytest.raises(ProtocolError) as info:
        P.unpack(body)
    assert info.value.code == ErrorCode.MALFORMED and "zstandard" in info.value.text


# --- hostile bodies ----------------------------------------------------------------------------

X = relu((1, 4, 10, 10))
BODY = P.pack(X, "qz4")
HEAD = P.read_header(BODY)
assert HEAD.flags == P.FLAG_ZSTD
START = HEAD.payload_offset
FRAME = BODY[START:]


def _frame(data: bytes, **kw: object) -> bytes:
    params = zstd.ZstdCompressionParameters.from_level(
        3, format=zstd.FORMAT_ZSTD1_MAGICLESS, write_checksum=False, **kw)
    return bytes(zstd.ZstdCompressor(compression_params=params).compress(data))


def _rejects(body: bytes, code: ErrorCode, max_bytes: int = 1 << 20) -> str:
    with pytest.raises(ProtocolError) as info:
        P.unpack(body, max_bytes=max_bytes)
    assert info.value.code == code, info.value
    return str(info.value)


LEVELS = bytes(400)  # what X's header promises: 400 one-byte levels


@pytest.mark.parametrize("name, body, code", [
    ("lz4 flag", struct.pack("<B", P.FLAG_LZ4).join([BODY[:4], BODY[5:]]), ErrorCode.MALFORMED),
    ("both flags", struct.pack("<B", 3).join([BODY[:4], BODY[5:]]), ErrorCode.MALFORMED),
    ("garbage frame", BODY[:START] + b"\xff" * len(FRAME), ErrorCode.MALFORMED),
    ("cut frame", BODY[:-3], ErrorCode.MALFORMED),
    ("trailing data", BODY + b"\0", ErrorCode.MALFORMED),
    ("second frame", BODY + FRAME, ErrorCode.MALFORMED),
    ("empty frame", BODY[:START], ErrorCode.MALFORMED),
    ("short output", BODY[:START] + _frame(LEVELS[:399]), ErrorCode.MALFORMED),
    ("long output", BODY[:START] + _frame(LEVELS + b"\0"), ErrorCode.MALFORMED),
    ("claims more", BODY[:START] + _frame(bytes(100_000), write_content_size=True),
     ErrorCode.MALFORMED),
    ("level over bits", BODY[:START] + _frame(b"\x10" * 400), ErrorCode.MALFORMED),
    ("plain level over bits", struct.pack("<B", 0).join([BODY[:4], BODY[5:START]])
     + b"\x20" * 400, ErrorCode.MALFORMED),
    ("plain short", struct.pack("<B", 0).join([BODY[:4], BODY[5:START]]) + bytes(399),
     ErrorCode.TRUNCATED),
    ("int dtype", struct.pack("<B", 7).join([BODY[:6], BODY[7:]]), ErrorCode.MALFORMED),
    ("bits 0", struct.pack("<B", 0).join([BODY[:5], BODY[6:]]), ErrorCode.MALFORMED),
])
def test_hostile_bodies_are_rejected(name: str, body: bytes, code: ErrorCode) -> None:
    _rejects(body, code)


def test_a_bomb_is_refused_before_decompressing() -> None:
    """A few bytes claiming a huge tensor: refused by the byte budget and the zstd ratio bound,
    both from the header alone, and never allocated."""
    huge = P._header(P.QUANTZ, P.FLAG_ZSTD, 4, 1, (1 << 30,), 0.5, 0.0) + FRAME[:8]
    assert "exceeds" in _rejects(huge, ErrorCode.TOO_LARGE, max_bytes=1 << 20)
    ratio = P._header(P.QUANTZ, P.FLAG_ZSTD, 4, 1, (P.ZSTD_MAX_RATIO * 4 + 1,), 0.5, 0.0)
    assert "cannot hold" in _rejects(ratio + b"\0\0\0\0", ErrorCode.MALFORMED, max_bytes=1 << 30)
    # a real frame of zeros larger than the header's shape cannot overflow the output buffer
    zeros = P._header(P.QUANTZ, P.FLAG_ZSTD, 4, 1, (1000,), 0.5, 0.0) + _frame(bytes(1 << 20))
    _rejects(zeros, ErrorCode.MALFORMED)


@settings(max_examples=300, deadline=None)
@given(edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1,
                      max_size=4), cut=st.integers(0, 6))
def test_corrupted_bodies_never_escape_validation(edits: list[tuple[int, int]], cut: int) -> None:
    body = bytearray(BODY)
    for pos, val in edits:
        body[pos % len(body)] = val
    body = body[: len(body) - cut]
    try:
        head = P.read_header(bytes(body), 4096)
        y = P.unpack(bytes(body), max_bytes=4096)
    except ProtocolError as exc:
        assert exc.code in (ErrorCode.MALFORMED, ErrorCode.TRUNCATED, ErrorCode.TOO_LARGE)
        return
    assert y.shape == head.shape and y.nbytes <= 4096


# --- accuracy on the trained digit model ------------------------------------------------------


def test_digit_model_accuracy_and_density(tmp_path: Path) -> None:
    """qz3 on LeNet's first ReLU: the very accuracy of q3 (same levels), measured against the
    labels within the calibration's tolerance, in fewer bytes."""
    from coinf.convert import calibrate as cal
    from coinf.convert.split import split_model
    from coinf.models.zoo import committed_path

    bundle = split_model(committed_path("lenet_digits"), tmp_path / "b")
    cand = next(c for c in bundle.candidates if c.label.startswith("Relu#1"))
    data = cal.load_dataset("digits", bundle, limit=150)
    rows = {r["spec"]: r for r in cal.calibrate_candidate(bundle, cand, data, ["q3", "qz3"])}
    assert rows["qz3"]["accuracy_drop_pp"] == pytest.approx(rows["q3"]["accuracy_drop_pp"],
                                                            abs=1e-9)
    assert rows["qz3"]["accuracy_drop_pp"] <= cal.DEFAULT_TOLERANCE_PP + 1.0  # 150 samples
    assert rows["qz3"]["ratio"] >= 1.3 * rows["q3"]["ratio"]
