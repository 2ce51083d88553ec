"""The packing codec: round trips, lossless modes, density, and rejection of bad packets."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from coinf.ble_protocol import bitplanes
from coinf.ble_protocol import packing as P
from coinf.ble_protocol.messages import ErrorCode, ProtocolError
from coinf.ble_protocol.tensors import decode_tensors, encode_tensors
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

RNG = np.random.default_rng(1234)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def relu_activation(shape: tuple[int, ...] = (1, 8, 9, 7)) -> np.ndarray:
    return np.maximum(RNG.standard_normal(shape).astype(np.float32) * 3.0, 0.0)


def finite_floats(dtype: str) -> st.SearchStrategy[np.ndarray]:
    width = {"f2": 16, "f4": 32, "f8": 64}[dtype]
    bound = 32768.0 if dtype == "f2" else 2.0**100
    return hnp.arrays(
        np.dtype(dtype),
        hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=9),
        elements=st.floats(-bound, bound, allow_nan=False, width=width),
    )


# --- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("bits", range(1, 17))
def test_every_bitwidth_round_trips_within_the_bound(bits: int) -> None:
    x = relu_activation((2, 5, 11, 3)) - 1.0
    body = P.pack(x, P.PackSpec("q", bits))
    y = P.unpack(body)
    assert y.shape == x.shape and y.dtype == x.dtype
    head = P.read_header(body)
    assert head.codec == P.QUANT and head.bits == bits
    span = float(x.max()) - float(x.min())
    assert head.scale == pytest.approx(span / (2**bits - 1))
    bound = P.quantization_bound(head.scale, float(np.abs(x).max()))
    err = float(np.abs(y.astype(np.float64) - x).max())
    assert err <= bound
    # the extremes are levels 0 and 2**bits - 1, so they come back (almost) exactly
    assert abs(float(y.min()) - float(x.min())) <= 1e-6 * (1 + abs(float(x.min())))
    if bits >= 2:  # and the error is not trivially zero: quantization really happened
        assert err > 0 or bits == 16


@FAST
@given(x=finite_floats("f4"), bits=st.integers(1, 16))
@example(x=np.array([1e-45, 0.0], np.float32), bits=2)  # a step float32 flushes to 0
def test_quantized_round_trip_property(x: np.ndarray, bits: int) -> None:
    y = P.unpack(P.pack(x, P.PackSpec("q", bits)))
    assert y.shape == x.shape and y.dtype == x.dtype
    if x.size:
        span = float(x.max()) - float(x.min())
        scale = span / (2**bits - 1)
        bound = P.quantization_bound(scale, float(np.abs(x).max()))
        assert float(np.abs(y.astype(np.float64) - x.astype(np.float64)).max()) <= bound


@pytest.mark.parametrize("bits", [2, 8, 16])
def test_a_subnormal_step_round_trips_within_the_bound(bits: int) -> None:
    """A tensor whose step is below float32's normal range (1e-40 over 65,535 levels is about
    one subnormal unit) decodes in float64: float32 arithmetic would round the step by up to
    half a unit and multiply that error by the level."""
    x = np.linspace(0.0, 1e-40, 1000, dtype=np.float32)
    y = P.unpack(P.pack(x, P.PackSpec("q", bits)))
    scale = (float(x.max()) - float(x.min())) / (2**bits - 1)
    err = float(np.abs(y.astype(np.float64) - x.astype(np.float64)).max())
    assert err <= P.quantization_bound(scale, float(np.abs(x).max()))
    assert float(y.max()) == pytest.approx(1e-40, rel=1e-4)  # the top level is not lost


@FAST
@given(x=st.one_of(finite_floats("f2"), finite_floats("f8")), bits=st.sampled_from([2, 5, 8, 13]))
def test_quantized_round_trip_other_float_dtypes(x: np.ndarray, bits: int) -> None:
    y = P.unpack(P.pack(x, P.PackSpec("q", bits)))
    assert y.dtype == x.dtype and y.shape == x.shape
    if x.size:
        span = float(x.max()) - float(x.min())
        bound = P.quantization_bound(span / (2**bits - 1), float(np.abs(x).max()), x.dtype)
        assert float(np.abs(y.astype(np.float64) - x.astype(np.float64)).max()) <= bound


def test_quantization_is_per_input() -> None:
    small, big = relu_activation(), relu_activation() * 1000.0
    for x in (small, big):
        head = P.read_header(P.pack(x, "q4"))
        assert head.offset == float(x.min())
        assert head.scale == pytest.approx((float(x.max()) - float(x.min())) / 15)


def test_dense_bits_per_value() -> None:
    # uniform noise does not compress, so LZ4 is skipped and the planes show through
    n = 1001
    x = RNG.random(n).astype(np.float32)
    for bits in (1, 3, 5, 7, 9, 11, 16):
        body = P.pack(x, P.PackSpec("q", bits))
        head = P.read_header(body)
        assert head.raw_size == bits * ((n + 7) // 8)
        assert len(body) == P.HEADER_SIZE + 2 + P.PARAMS.size + head.raw_size  # 1001: 2-B varint


@FAST
@given(
    x=hnp.arrays(
        st.sampled_from([np.dtype(t) for t in ("f4", "f8", "f2")]),
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=20),
    )
)
def test_lossless_is_bit_exact_including_nan_inf(x: np.ndarray) -> None:
    y = P.unpack(P.pack(x, "f32"))
    assert y.dtype == x.dtype and y.shape == x.shape
    assert y.tobytes() == x.tobytes()


@pytest.mark.parametrize("spec", ["q3", "f16", "f32", "raw"])
@pytest.mark.parametrize("dtype", ["i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "?"])
def test_non_float_tensors_travel_losslessly(spec: str, dtype: str) -> None:
    info = np.iinfo(dtype) if dtype != "?" else None
    if info is None:
        x = RNG.random((3, 17)) > 0.5
    else:
        x = RNG.integers(info.min, info.max, size=(3, 17), dtype=dtype, endpoint=True)
    body = P.pack(x, spec)
    y = P.unpack(body)
    assert y.dtype == x.dtype and np.array_equal(x, y)
    assert P.read_header(body).codec in (P.LOSSLESS, P.RAW)


def test_nan_under_quantization_falls_back_to_lossless() -> None:
    x = relu_activation()
    x[0, 0, 0, 0] = np.nan
    x[0, 1, 0, 0] = np.inf
    body = P.pack(x, "q4")
    assert P.read_header(body).codec == P.LOSSLESS
    assert P.unpack(body).tobytes() == x.tobytes()


def test_half_is_float16_precision() -> None:
    x = relu_activation() * 7.0
    body = P.pack(x, "f16")
    assert P.read_header(body).codec == P.HALF
    y = P.unpack(body)
    assert y.dtype == np.float32
    assert np.array_equal(y, x.astype(np.float16).astype(np.float32))
    # values exactly representable in float16 come back exactly
    z = np.array([0.5, -2.0, 1024.0, 0.0], dtype=np.float32)
    assert np.array_equal(P.unpack(P.pack(z, "f16")), z)


def test_half_overflow_keeps_the_tensor_exact() -> None:
    for x in (np.array([1.0, 1e6, -3.5], dtype=np.float32),
              np.array([np.nan, 1e6, np.inf], dtype=np.float32)):
        body = P.pack(x, "f16")
        assert P.read_header(body).codec == P.LOSSLESS
        assert P.unpack(body).tobytes() == x.tobytes()
    nan = np.array([np.nan, 2.0, -np.inf], dtype=np.float32)  # non-finite but representable
    assert P.read_header(P.pack(nan, "f16")).codec == P.HALF
    assert np.array_equal(P.unpack(P.pack(nan, "f16")), nan, equal_nan=True)


@pytest.mark.parametrize("value", [0.0, -3.25, 1e-30])
@pytest.mark.parametrize("dtype", ["f2", "f4", "f8"])
def test_constant_tensors(value: float, dtype: str) -> None:
    x = np.full((4, 5), value, dtype=dtype)
    body = P.pack(x, "q2")
    assert P.read_header(body).codec == P.CONST
    assert len(body) == P.HEADER_SIZE + 2 + P.VALUE.size
    y = P.unpack(body)
    assert y.dtype == x.dtype and np.array_equal(x, y)


def test_empty_and_scalar_tensors() -> None:
    for x in (np.zeros((0, 3), np.float32), np.float32(2.5), np.zeros(0, np.int64)):
        for spec in ("q4", "f16", "f32", "raw"):
            y = P.unpack(P.pack(np.asarray(x), spec))
            assert y.shape == np.shape(x)
            assert np.array_equal(y, np.asarray(x))


def test_relu_activations_compress() -> None:
    x = relu_activation((1, 16, 32, 32))
    x[:, :, :16] = 0.0  # sparse, as real ReLU maps are
    sizes = {s: len(P.pack(x, s)) for s in ("raw", "f32", "q8", "q4", "q2")}
    assert sizes["raw"] > sizes["f32"] > sizes["q8"] > sizes["q4"] > sizes["q2"]
    assert x.nbytes / sizes["q4"] > 8  # beyond what 4-bit quantization alone gives


def test_numpy_fallback_is_byte_identical_to_bitshuffle() -> None:
    if bitplanes._bitshuffle is None:
        pytest.skip("bitshuffle not installed; the numpy path is the only one")
    for dtype in ("u1", "<u2", "<f4", "<f8"):
        v = P._pad8((RNG.random(77) * 250).astype(dtype))
        lib = bitplanes.bit_planes(v, use_library=True)
        ref = bitplanes.bit_planes(v, use_library=False)
        assert np.array_equal(lib, ref)
        assert np.array_equal(bitplanes.from_bit_planes(lib, v.dtype, use_library=False), v)
        assert np.array_equal(bitplanes.from_bit_planes(ref, v.dtype, use_library=True), v)
    # plane k holds bit k of each element, element i in bit i of each byte
    one = bitplanes.bit_planes(np.array([1, 2, 0, 0, 0, 0, 0, 0], np.uint8), use_library=False)
    assert one[:, 0].tolist() == [1, 2, 0, 0, 0, 0, 0, 0]


def test_spec_parsing_and_validation() -> None:
    assert P.PackSpec.parse("q4") == P.PackSpec("q", 4)
    assert P.PackSpec.parse(12) == P.PackSpec("q", 12)
    assert P.PackSpec.parse("half") == P.PackSpec("f16")
    assert str(P.PackSpec("q", 7)) == "q7"
    for bad in ("q0", "q17", "f64", "", "q"):
        with pytest.raises(ValueError):
            P.PackSpec.parse(bad)
    with pytest.raises(ValueError):
        P.PackSpec("f16", 8)
    with pytest.raises(ValueError, match="cannot be packed"):
        P.pack(np.array(["a"]), "q4")


def test_packed_bodies_travel_in_tensor_maps() -> None:
    x = relu_activation()
    ids = np.arange(5, dtype=np.int64)
    blob = encode_tensors({}, packed=P.pack_tensors({"ids": ids, "act": x}, "q6"))
    out = decode_tensors(blob)
    assert np.array_equal(out["ids"], ids)
    scale = (float(x.max()) - float(x.min())) / 63
    assert np.abs(out["act"] - x).max() <= P.quantization_bound(scale, float(x.max()))
    with pytest.raises(ProtocolError) as info:
        decode_tensors(blob, max_bytes=x.nbytes - 1)
    assert info.value.code == ErrorCode.TOO_LARGE


# --- malformed packets -----------------------------------------------------------------------


def _with(body: bytes, fmt: str, offset: int, *values: object) -> bytes:
    b = bytearray(body)
    struct.pack_into(fmt, b, offset, *values)
    return bytes(b)


def _rejects(body: bytes, code: ErrorCode | None = None, max_bytes: int = 1 << 24) -> None:
    with pytest.raises(ProtocolError) as info:
        P.unpack(body, max_bytes=max_bytes)
    if code is not None:
        assert info.value.code == code, info.value


QBODY = P.pack(relu_activation((1, 4, 10, 10)), "q4")
ZBODY = P.pack(np.pad(relu_activation((1, 4, 10, 10)), ((0, 0), (0, 0), (0, 30), (0, 0))), "q4")
assert P.read_header(ZBODY).flags & P.FLAG_LZ4
LBODY = P.pack(relu_activation((1, 4, 10, 10)), "f32")
NBODY = P.pack(np.random.default_rng(1).random(64).astype(np.float32), "q8")  # noise: no LZ4
assert not P.read_header(NBODY).flags


Q = P.HEADER_SIZE + 4  # QBODY's params: its 4 dims (1, 4, 10, 10) are one varint byte each
assert P.read_header(QBODY).payload_offset == Q + P.PARAMS.size


@pytest.mark.parametrize(
    "name, body, code",
    [
        ("empty", b"", ErrorCode.TRUNCATED),
        ("short header", QBODY[:5], ErrorCode.TRUNCATED),
        ("short dims", QBODY[: P.HEADER_SIZE + 2], ErrorCode.TRUNCATED),
        ("short params", QBODY[: Q + 10], ErrorCode.TRUNCATED),
        ("short payload", NBODY[:-1], ErrorCode.TRUNCATED),
        ("short lz4 payload", ZBODY[:-1], ErrorCode.MALFORMED),
        ("trailing byte", NBODY + b"\0", ErrorCode.MALFORMED),
        ("trailing lz4 byte", ZBODY + b"\0", ErrorCode.MALFORMED),
        ("magic", b"XP2" + QBODY[3:], ErrorCode.MALFORMED),
        ("old format", b"CPK1" + QBODY[3:], ErrorCode.MALFORMED),
        ("codec", _with(QBODY, "<B", 3, 9), ErrorCode.MALFORMED),
        ("flags", _with(QBODY, "<B", 4, 3), ErrorCode.MALFORMED),
        ("bits 0", _with(QBODY, "<B", 5, 0), ErrorCode.MALFORMED),
        ("bits 17", _with(QBODY, "<B", 5, 17), ErrorCode.MALFORMED),
        ("dtype", _with(QBODY, "<B", 6, 99), ErrorCode.MALFORMED),
        ("quant int dtype", _with(QBODY, "<B", 6, 6), ErrorCode.MALFORMED),
        ("ndim", _with(QBODY, "<B", 7, 9), ErrorCode.MALFORMED),
        ("scale 0", _with(QBODY, "<d", Q, 0.0), ErrorCode.MALFORMED),
        ("scale nan", _with(QBODY, "<d", Q, float("nan")), ErrorCode.MALFORMED),
        ("offset inf", _with(QBODY, "<d", Q + 8, float("inf")), ErrorCode.MALFORMED),
        ("dim vs size", _with(QBODY, "<B", P.HEADER_SIZE + 3, 40), None),
        ("huge shape", P._header(P.LOSSLESS, 0, 0, 1, (1 << 31, 4), 0.0, 0.0) + b"\0" * 8,
         ErrorCode.TOO_LARGE),
        ("dim > u32", P.HEADER.pack(P.MAGIC, P.LOSSLESS, 0, 0, 1, 1) + b"\xff" * 4 + b"\x7f",
         ErrorCode.MALFORMED),
        ("dim varint 6 B", P.HEADER.pack(P.MAGIC, P.LOSSLESS, 0, 0, 1, 1) + b"\x81" * 5 + b"\0",
         ErrorCode.MALFORMED),
        ("dim not minimal", P.HEADER.pack(P.MAGIC, P.LOSSLESS, 0, 0, 1, 1) + b"\x81\x00",
         ErrorCode.MALFORMED),
        ("lossless bits", _with(LBODY, "<B", 5, 3), ErrorCode.MALFORMED),
        ("lz4 garbage", ZBODY[: Q + 20] + b"\xff" * (len(ZBODY) - Q - 20), ErrorCode.MALFORMED),
    ],
)
def test_malformed_packets_are_rejected(name: str, body: bytes, code: ErrorCode | None) -> None:
    _rejects(body, code)


def test_size_is_checked_before_decompressing() -> None:
    """A tiny packet claiming a huge tensor is refused from its header alone."""
    x = np.zeros((64, 1024, 1024), np.float32)  # 256 MiB of zeros LZ4s to ~1 MiB
    body = P.pack(x[:1, :64], "f32")
    head = P.read_header(body)
    assert head.flags & P.FLAG_LZ4
    _rejects(body, ErrorCode.TOO_LARGE, max_bytes=head.nbytes - 1)
    assert P.unpack(body, max_bytes=head.nbytes).shape == (1, 64, 1024)
    # a header that claims more than LZ4 could ever expand to is inconsistent
    fake = P._header(P.LOSSLESS, P.FLAG_LZ4, 0, 1, (1 << 20,), 0.0, 0.0) + b"\0" * 8
    _rejects(fake, ErrorCode.MALFORMED, max_bytes=1 << 30)


def test_constant_header_is_checked() -> None:
    body = P.pack(np.full(3, 2.0, np.float16), "q4")
    _rejects(_with(body, "<d", P.HEADER_SIZE + 1, 1e9), ErrorCode.MALFORMED)  # not a float16
    _rejects(_with(body, "<B", 4, 1), ErrorCode.MALFORMED)  # const cannot be compressed
    _rejects(_with(body, "<B", 6, 6), ErrorCode.MALFORMED)  # const int
    _rejects(body + b"\0", ErrorCode.MALFORMED)  # const has no payload


VALID = [
    P.pack(relu_activation((2, 3, 5)), s) for s in ("q1", "q4", "q11", "f16", "f32", "raw")
] + [P.pack(np.arange(30, dtype=np.int64), "q4"), P.pack(np.ones(9, np.float32), "q3")]


@settings(max_examples=400, deadline=None)
@given(
    which=st.integers(0, len(VALID) - 1),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.integers(0, 10_000),
)
def test_corrupted_packets_never_escape_validation(
    which: int, edits: list[tuple[int, int]], cut: int
) -> None:
    """Any corruption either raises ProtocolError or yields exactly what the header declares."""
    body = bytearray(VALID[which])
    for pos, val in edits:
        body[pos % len(body)] = val
    body = body[: len(body) - cut % 4]
    max_bytes = 4096
    try:
        head = P.read_header(bytes(body), max_bytes)
        y = P.unpack(bytes(body), max_bytes=max_bytes)
    except ProtocolError as exc:
        assert exc.code in (ErrorCode.MALFORMED, ErrorCode.TRUNCATED, ErrorCode.TOO_LARGE)
        return
    assert y.shape == head.shape and y.dtype == head.dtype.newbyteorder("=")
    assert y.nbytes <= max_bytes


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200))
def test_random_bytes_are_rejected(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        P.unpack(data)


@settings(max_examples=300, deadline=None)
@given(codec=st.integers(0, 4), flags=st.integers(0, 1), bits=st.integers(0, 16),
       dtype=st.sampled_from([1, 6, 7, 10, 11]), ndim=st.integers(0, 8),
       rest=st.binary(max_size=120))
def test_random_bytes_after_a_valid_fixed_header_never_crash(
    codec: int, flags: int, bits: int, dtype: int, ndim: int, rest: bytes
) -> None:
    """Whatever follows a well-formed fixed header (dims varints, parameters, payload):
    ProtocolError or a tensor no larger than its declared shape allows."""
    body = P.HEADER.pack(P.MAGIC, codec, flags, bits, dtype, ndim) + rest
    try:
        y = P.unpack(body, max_bytes=1 << 16)
    except ProtocolError:
        return
    assert y.nbytes <= 1 << 16


@settings(max_examples=200, deadline=None)
@given(tail=st.binary(max_size=64), ndim=st.integers(0, 8), codec=st.integers(0, 5),
       bits=st.integers(0, 20), dtype=st.integers(0, 14))
def test_random_payloads_behind_plausible_headers(
    tail: bytes, ndim: int, codec: int, bits: int, dtype: int
) -> None:
    dims = [3] * ndim
    flags = P.FLAG_LZ4 if len(tail) % 2 else 0
    body = P.HEADER.pack(P.MAGIC, codec, flags, bits, dtype, ndim) + bytes(dims)
    if codec == P.QUANT:
        body += P.PARAMS.pack(0.5, -1.0)
    elif codec == P.CONST:
        body += P.VALUE.pack(-1.0)
    body += tail
    try:
        y = P.unpack(body, max_bytes=1 << 16)
    except ProtocolError:
        return
    assert y.shape == tuple(dims)


def test_pack_output_does_not_depend_on_bitshuffle(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Pi without the compiled bitshuffle sends the very same bytes."""
    x = relu_activation((1, 6, 13, 13))
    specs = ("q2", "q5", "q12", "f16", "f32")
    with_lib = [P.pack(x, s) for s in specs]
    monkeypatch.setattr(bitplanes, "USE_BITSHUFFLE", False)
    assert [P.pack(x, s) for s in specs] == with_lib
    for body, s in zip(with_lib, specs, strict=True):
        assert np.array_equal(P.unpack(body), P.unpack(P.pack(x, s)))


@pytest.mark.parametrize("bits", [1, 4, 16])
def test_extreme_ranges_do_not_overflow(bits: int) -> None:
    big = float(np.finfo(np.float32).max)
    x = np.array([big, -big, 1e37, 0.0], dtype=np.float32)
    y = P.unpack(P.pack(x, P.PackSpec("q", bits)))
    assert np.isfinite(y).all()
    scale = (2 * big) / (2**bits - 1)
    assert np.abs(y.astype(np.float64) - x).max() <= P.quantization_bound(scale, big)
    tiny = np.array([0.0, 1e-45, 3e-45], dtype=np.float32)  # subnormal span
    assert np.abs(P.unpack(P.pack(tiny, P.PackSpec("q", bits))) - tiny).max() <= 3e-45


def test_big_endian_and_strided_inputs() -> None:
    x = relu_activation((3, 4, 5))
    for arr in (x.astype(">f4"), x[:, ::2, 1:], np.asfortranarray(x)):
        for spec in ("q6", "f32"):
            y = P.unpack(P.pack(arr, spec))
            assert y.dtype == np.float32 and y.shape == arr.shape
            assert np.abs(y - arr).max() <= P.quantization_bound(
                (float(arr.max()) - float(arr.min())) / 63, float(arr.max()))


def test_bitshuffle_runs_on_one_openmp_thread_in_every_thread() -> None:
    """bitshuffle's private OpenMP runtime must not fan a tiny transpose out to every core (under
    load that cost 10-30 ms per tensor): each thread that packs is limited to one OpenMP thread."""
    import ctypes
    import glob
    import os
    import threading

    bitshuffle = pytest.importorskip("bitshuffle")
    libs = glob.glob(os.path.join(os.path.dirname(bitshuffle.__file__), os.pardir,
                                  "bitshuffle.libs", "libgomp*"))
    if not libs:
        pytest.skip("this bitshuffle build has no private OpenMP runtime")
    omp = ctypes.CDLL(libs[0])
    seen: list[int] = []  # before and after packing, in a fresh thread

    def pack_here() -> None:
        before = omp.omp_get_max_threads()
        P.unpack(P.pack(np.arange(64, dtype=np.float32), "lossless"))
        seen.extend([before, omp.omp_get_max_threads()])

    t = threading.Thread(target=pack_here)
    t.start()
    t.join()
    assert seen[1] == 1
    assert seen[0] >= 1
