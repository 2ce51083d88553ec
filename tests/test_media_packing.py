"""Standard codecs as packings (ble_protocol/media.py): round trips, applicability, and hostile
bytes (wrong sizes, decompression bombs, corruption) refused as ProtocolError."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from coinf.ble_protocol import media
from coinf.ble_protocol import packing as P
from coinf.ble_protocol.messages import ErrorCode, ProtocolError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

PIL = pytest.importorskip("PIL.Image")
MEAN = np.array([0.485, 0.456, 0.406])
STD = np.array([0.229, 0.224, 0.225])


def photo(size: int = 64, channels_last: bool = False) -> np.ndarray:
    """A real photo (scikit-learn's sample), ImageNet-normalised, batch 1."""
    datasets = pytest.importorskip("sklearn.datasets")
    img = datasets.load_sample_images().images[1][100:100 + size, 200:200 + size] / 255.0
    x = ((img - MEAN) / STD).astype(np.float32)[None]
    return x if channels_last else np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def waveform(n: int = 4000) -> np.ndarray:
    t = np.arange(n) / 16000
    rng = np.random.default_rng(0)
    return (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + 0.2 * np.sin(2 * np.pi * 3 * t))
            + 0.01 * rng.standard_normal(n)).astype(np.float32)[None]


def _header_of(body: bytes) -> P.PackedHeader:
    return P.read_header(body)


@pytest.mark.parametrize("spec,tol", [("jpeg-q95", 0.25), ("jpeg-q50", 0.6), ("webp-q75", 0.6),
                                      ("png", 0.02)])
@pytest.mark.parametrize("last", [False, True])
def test_images_round_trip_in_their_layout(spec: str, tol: float, last: bool) -> None:
    if P.PackSpec.parse(spec).codec not in media.available():
        pytest.skip(f"{spec} not available here")
    x = photo(channels_last=last)
    body = P.pack(x, spec)
    y = P.unpack(body)
    assert y.shape == x.shape and y.dtype == np.float32
    assert float(np.abs(y - x).mean()) < tol / 4
    assert float(np.abs(y - x).max()) < tol * 4  # a few pixels may move more than the mean
    assert P.describe(body)["codec"] == spec.split("-")[0]
    assert len(body) < x.nbytes / 3


def test_png_is_exact_up_to_the_pixel_map() -> None:
    x = photo()
    y = P.unpack(P.pack(x, "png"))
    span = x.max(axis=(0, 2, 3)) - x.min(axis=(0, 2, 3))
    assert np.all(np.abs(y - x).max(axis=(0, 2, 3)) <= span / 255 * 0.5 + 1e-5)


@pytest.mark.parametrize("last", [False, True])
def test_lossless_webp_decodes_to_exactly_what_png_does_in_fewer_bytes(last: bool) -> None:
    """``webp-ll`` is lossless on the pixels: the same decoded tensor as PNG, bit for bit (both
    are the same 8-bit map of the same ranges), in fewer bytes on a real photo; its header's
    quality field is 100 and any WebP decoder reads it."""
    x = photo(channels_last=last)
    ll, png = P.pack(x, "webp-ll"), P.pack(x, "png")
    assert np.array_equal(P.unpack(ll), P.unpack(png))
    assert len(ll) < len(png)
    assert P.describe(ll)["codec"] == "webp" and P.read_header(ll).bits == 100
    spec = P.PackSpec.parse("webp-ll")
    assert str(spec) == "webp-ll" and spec.quality is None and not spec.lossless
    assert P.PackSpec.parse("WEBP-LL") == spec and P.PackSpec.parse("webp-q100") != spec
    with pytest.raises(ValueError, match="webp-ll"):
        P.PackSpec.parse("webp-lossless")


def test_grey_images_in_every_codec() -> None:
    x = photo()[:, :1]
    for spec in ("jpeg-q90", "webp-q90", "webp-ll", "png"):
        y = P.unpack(P.pack(x, spec))
        assert y.shape == x.shape and float(np.abs(y - x).mean()) < 0.05, spec


def test_an_8bit_grey_image_survives_png_exactly() -> None:
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (1, 1, 20, 30)).astype(np.float32)
    pixels[0, 0, 0, :2] = (0, 255)  # the full range: the map is the identity
    assert np.array_equal(P.unpack(P.pack(pixels, "png")), pixels)


@pytest.mark.parametrize("spec", ["pcm16", "flac"])
def test_audio_round_trip(spec: str) -> None:
    if spec not in media.available():
        pytest.skip(f"{spec} not available here")
    x = waveform()
    y = P.unpack(P.pack(x, spec))
    peak = float(np.abs(x).max())
    assert y.shape == x.shape and np.abs(y - x).max() <= peak / 32767 * 0.51 + 1e-7


def test_flac_is_smaller_than_pcm16_on_a_tone() -> None:
    if "flac" not in media.available():
        pytest.skip("soundfile missing")
    x = waveform(16000)
    assert len(P.pack(x, "flac")) < 0.8 * len(P.pack(x, "pcm16"))


@pytest.mark.parametrize("shape,image,audio", [
    ((1, 3, 32, 32), True, False), ((1, 32, 32, 3), True, False), ((1, 1, 8, 8), True, False),
    ((1, 4, 32, 32), False, False), ((2, 3, 32, 32), False, False), ((1, 3, 7, 32), False, False),
    ((1, 16000), False, True), ((16000,), False, True), ((1, 1, 100), False, True),
    ((2, 16000), False, False), ((1, 63), False, False), ((1, 3, 32), False, False)])
def test_which_tensors_the_codecs_apply_to(shape: tuple[int, ...], image: bool,
                                           audio: bool) -> None:
    assert media.applies("jpeg", shape) is image
    assert media.applies("flac", shape) is audio


def test_a_tensor_that_does_not_fit_travels_exactly() -> None:
    x = np.random.default_rng(2).standard_normal((1, 16, 10, 10)).astype(np.float32)
    for spec in ("jpeg-q75", "flac"):
        body = P.pack(x, spec)
        assert P.describe(body)["codec"] == "lossless"
        assert np.array_equal(P.unpack(body), x)
    bad = photo()
    bad[0, 0, 0, 0] = np.nan
    assert P.describe(P.pack(bad, "jpeg-q75"))["codec"] == "lossless"


def test_constant_channels_and_float64() -> None:
    x = np.zeros((1, 3, 16, 16))
    x[0, 1] = 2.5
    y = P.unpack(P.pack(x, "jpeg-q90"))
    assert y.dtype == np.float64 and np.allclose(y, x, atol=1e-6)


def test_spec_names() -> None:
    assert str(P.PackSpec.parse("JPEG-Q90")) == "jpeg-q90"
    assert str(P.PackSpec.parse("webp-q5")) == "webp-q5"
    assert P.PackSpec.parse("flac").sample_bits == 16
    assert P.PackSpec.parse("png").sample_bits == 8
    for bad in ("jpeg-q0", "jpeg-q101", "jpeg", "png-q5", "flac8"):
        with pytest.raises(ValueError):
            P.PackSpec.parse(bad)


# --- hostile bytes ---------------------------------------------------------------------------

def _swap_payload(body: bytes, payload: bytes) -> bytes:
    h = _header_of(body)
    return body[:h.payload_offset] + payload


def _png(h: int, w: int, mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    PIL.new(mode, (w, h)).save(buf, "PNG")
    return buf.getvalue()


def test_an_image_of_another_size_is_refused_before_decoding() -> None:
    body = P.pack(photo(32), "png")
    for payload in (_png(33, 32), _png(32, 32, "L"), _png(32, 32, "RGBA")):
        with pytest.raises(ProtocolError) as info:
            P.unpack(_swap_payload(body, payload))
        assert info.value.code == ErrorCode.MALFORMED


def test_a_decompression_bomb_is_refused_unopened(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny PNG whose IHDR claims 10000x10000 (300 MB of pixels, under Pillow's own bomb
    limit) under a packed header of 32x32."""
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data))

    bomb = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 10000, 10000, 8, 2,
                                                             0, 0, 0)) \
        + chunk(b"IDAT", zlib.compress(b"\0" * 1000)) + chunk(b"IEND", b"")
    body = P.pack(photo(32), "png")
    loaded: list[bool] = []
    orig = PIL.Image.load
    monkeypatch.setattr(PIL.Image, "load", lambda self: loaded.append(True) or orig(self))
    with pytest.raises(ProtocolError, match="10000x10000"):
        P.unpack(_swap_payload(body, bomb))
    assert not loaded
    # and a header declaring the bomb's own size is refused by the byte budget first
    big = bytearray(body)
    with pytest.raises(ProtocolError) as info:
        P.unpack(P.pack(np.zeros((1, 3, 3000, 3000), np.float32), "png"), max_bytes=1 << 20)
    assert info.value.code == ErrorCode.TOO_LARGE
    assert big  # the original stays untouched


@pytest.mark.skipif("webp" not in media.available(), reason="no WebP in this Pillow")
@pytest.mark.parametrize("lossless, alpha", [(False, False), (True, False), (False, True)])
def test_a_webp_claiming_a_big_canvas_is_refused_unopened(
        monkeypatch: pytest.MonkeyPatch, lossless: bool, alpha: bool) -> None:
    """Pillow's WebP open allocates the canvas the file claims (~31 MB RGBA at 2800x2800, seen
    in ``bench fuzz``): the size is read from the RIFF chunk first, for VP8, VP8L and VP8X."""
    import io

    img = PIL.fromarray(np.zeros((32, 32, 4 if alpha else 3), np.uint8))
    out = io.BytesIO()
    img.save(out, "WEBP", lossless=lossless)
    data = bytearray(out.getvalue())
    kind = bytes(data[12:16])
    assert kind == {(False, False): b"VP8 ", (True, False): b"VP8L",
                    (False, True): b"VP8X"}[(lossless, alpha)]
    assert media.webp_size(bytes(data)) == (32, 32)
    if kind == b"VP8 ":
        struct.pack_into("<HH", data, 26, 2800, 2800)
    elif kind == b"VP8L":
        bits = int.from_bytes(data[21:25], "little") & ~((1 << 28) - 1)
        data[21:25] = (bits | 2799 | (2799 << 14)).to_bytes(4, "little")
    else:
        data[24:27] = data[27:30] = (2799).to_bytes(3, "little")
    assert media.webp_size(bytes(data)) == (2800, 2800)
    body = P.pack(photo(32), "webp-q90")
    opened: list[bool] = []
    orig = PIL.open
    monkeypatch.setattr(PIL, "open", lambda *a, **k: opened.append(True) or orig(*a, **k))
    with pytest.raises(ProtocolError, match="2800x2800"):
        P.unpack(_swap_payload(body, bytes(data)))
    assert not opened


def test_bad_parameters_and_wrong_shapes() -> None:
    body = bytearray(P.pack(photo(16), "jpeg-q80"))
    h = _header_of(bytes(body))
    start = h.payload_offset - 24
    for value in (float("nan"), -1.0, float("inf")):
        bad = bytearray(body)
        struct.pack_into("<f", bad, start, value)
        with pytest.raises(ProtocolError, match="scale"):
            P.unpack(bytes(bad))
    bad = bytearray(body)
    bad[5] = 0  # quality 0
    with pytest.raises(ProtocolError, match="quality"):
        P.unpack(bytes(bad))
    wave = P.pack(waveform(), "pcm16")
    with pytest.raises(ProtocolError) as info:
        P.unpack(wave[:-2])
    assert info.value.code == ErrorCode.TRUNCATED
    with pytest.raises(ProtocolError):
        P.unpack(wave + b"\0\0")
    hdr = _header_of(wave)
    with pytest.raises(ProtocolError, match="payload"):
        P.unpack(wave[:hdr.payload_offset])


def test_flac_with_another_length_is_refused() -> None:
    if "flac" not in media.available():
        pytest.skip("soundfile missing")
    short = P.pack(waveform(1000), "flac")
    body = P.pack(waveform(4000), "flac")
    with pytest.raises(ProtocolError, match="1000 samples"):
        P.unpack(_swap_payload(body, _header_of_payload(short)))


def _header_of_payload(body: bytes) -> bytes:
    return body[_header_of(body).payload_offset:]


@pytest.mark.parametrize("spec", ["jpeg-q75", "webp-q60", "png", "flac", "pcm16"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_corrupted_codec_bodies_give_a_protocol_error_or_the_declared_tensor(
        spec: str, data: st.DataObject) -> None:
    if P.PackSpec.parse(spec).codec not in media.available():
        pytest.skip(f"{spec} not available here")
    x = waveform(800) if spec in ("flac", "pcm16") else photo(24)
    body = bytearray(P.pack(x, spec))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(body) - 1))
        body[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(8, len(body)))
    try:
        y = P.unpack(bytes(body[:cut]), max_bytes=1 << 20)
    except ProtocolError:
        return
    h = _header_of(bytes(body[:cut]))
    assert y.shape == h.shape and y.dtype == h.dtype.newbyteorder("=")
