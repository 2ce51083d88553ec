"""Standard codecs as packings: JPEG, WebP and PNG for image-like tensors, PCM16 and FLAC for
audio-like ones (docs/PACKING.md, "Standard codecs").

A user who offloads a camera frame sends a JPEG, not 110 kB of float32; these packings make that
a candidate the planner can weigh against every split. Each one maps the float tensor to
integer samples with an input-specific affine map, like ``q8``/``q16``, and hands those to a
maintained encoder:

* image-like (float, batch 1, 1 or 3 channels, ``H, W >= 8``; ``[1,C,H,W]`` or ``[1,H,W,C]``,
  the layout follows from the shape): per channel ``level = round((x - min) / scale)``,
  ``scale = (max - min) / 255``, as uint8 pixels; JPEG (``jpeg-qNN``, simplejpeg, else Pillow),
  WebP (``webp-qNN``, Pillow/libwebp, method 4; ``webp-ll`` lossless, VP8L) or PNG (``png``,
  Pillow); ``webp-ll`` and ``png`` are lossless on the pixels.
  Parameters on the wire: ``C`` pairs of little-endian float32 (scale, offset).
* audio-like (a float waveform ``[N]``, ``[1,N]`` or ``[1,1,N]``, ``N >= 64``): ``level =
  round(x / scale)``, ``scale = max|x| / 32767``, as int16 samples; ``pcm16`` (the samples,
  little-endian) or ``flac`` (soundfile/libsndfile, mono, 16 bit, lossless on the samples).
  Parameter on the wire: one float32 scale.

Decoding trusts nothing: the image's or stream's own header must state exactly the shape the
packed header declares (itself bounded by the receiver's budget) before any pixel or sample is
decoded, and any decoder failure is a :class:`ProtocolError` (MALFORMED).
"""

from __future__ import annotations

import io
import math
import struct
from functools import cache
from typing import Any

import numpy as np
from coinf.ble_protocol.messages import ErrorCode, ProtocolError

from coinf.errors import MissingDependency

#: wire codec numbers (the ``codec`` byte of a packed header, docs/PACKING.md)
JPEG, WEBP, PNG, PCM16, FLAC = 6, 7, 8, 9, 10
WIRE = {"jpeg": JPEG, "webp": WEBP, "png": PNG, "pcm16": PCM16, "flac": FLAC}
NAMES = {v: k for k, v in WIRE.items()}
IMAGE = ("jpeg", "webp", "png")
AUDIO = ("pcm16", "flac")
QUALITY = ("jpeg", "webp")  # codecs that take a quality 1..100
#: the quality field of a lossless WebP body (``webp-ll``: no quality of its own)
LOSSLESS_QUALITY = 100
MIN_SIDE = 8
MIN_SAMPLES = 64
WEBP_METHOD = 4  # libwebp effort 0..6: 4 is ~20% smaller than 0 for ~2.3x the time, 6 adds ~6%
PNG_LEVEL = 6  # zlib level: 7% smaller than level 1 for ~2.3x the time (96-224 px frames)
FLAC_RATE = 16000  # written into the FLAC stream; the receiver ignores it
PAIR = struct.Struct("<ff")
SCALE = struct.Struct("<f")
INSTALL = "pip install 'coinf[codecs]'"


def image_layout(shape: tuple[int, ...]) -> tuple[bool, int, int, int] | None:
    """``(channels_last, C, H, W)`` of an image-like shape, else None. At most one layout
    fits: ``[1,C,H,W]`` needs ``W >= 8`` and ``[1,H,W,C]`` needs ``C`` in (1, 3)."""
    if len(shape) != 4 or shape[0] != 1:
        return None
    _, a, b, c = shape
    if a in (1, 3) and b >= MIN_SIDE and c >= MIN_SIDE:
        return False, a, b, c
    if c in (1, 3) and a >= MIN_SIDE and b >= MIN_SIDE:
        return True, c, a, b
    return None


def audio_length(shape: tuple[int, ...]) -> int | None:
    """Samples of an audio-like shape (``[N]``, ``[1,N]``, ``[1,1,N]``, ``N >= 64``), else None."""
    if not 1 <= len(shape) <= 3 or any(d != 1 for d in shape[:-1]):
        return None
    return shape[-1] if shape[-1] >= MIN_SAMPLES else None


def applies(codec: str, shape: tuple[int, ...]) -> bool:
    """Whether ``codec`` can pack a float tensor of ``shape``."""
    if codec in IMAGE:
        return image_layout(tuple(shape)) is not None
    return codec in AUDIO and audio_length(tuple(shape)) is not None


@cache
def _pil_formats() -> frozenset[str]:
    try:
        from PIL import features
    except ImportError:
        return frozenset()
    return frozenset(n for n, f in (("jpeg", "jpg"), ("webp", "webp"), ("png", "zlib"))
                     if features.check(f))


@cache
def _simplejpeg() -> Any:
    try:
        import simplejpeg
    except ImportError:
        return None
    return simplejpeg


@cache
def _soundfile() -> Any:
    try:
        import soundfile
    except (ImportError, OSError):  # OSError: the wheel's libsndfile does not load
        return None
    return soundfile


@cache
def available() -> frozenset[str]:
    """The codec packings this side can encode and decode (its libraries are installed)."""
    have = set(_pil_formats()) | {"pcm16"}
    if _simplejpeg() is not None:
        have.add("jpeg")
    if _soundfile() is not None:
        have.add("flac")
    return frozenset(have)


def _package(codec: str) -> str:
    return {"flac": "soundfile", "jpeg": "simplejpeg or Pillow"}.get(codec, "Pillow")


def require(codec: str) -> None:
    """Raise :class:`MissingDependency` when ``codec`` cannot be used here."""
    if codec not in available():
        raise MissingDependency(f"packing {codec!r} needs {_package(codec)}: {INSTALL}")


def params_size(wire: int, shape: tuple[int, ...]) -> int | None:
    """Bytes of the codec's parameters after the dims, or None if ``shape`` does not fit it."""
    if NAMES[wire] in IMAGE:
        lay = image_layout(shape)
        return None if lay is None else lay[1] * PAIR.size
    return None if audio_length(shape) is None else SCALE.size


# --- encoding --------------------------------------------------------------------------------


Ranges = tuple[tuple[float, float], ...] | None


def encode(codec: str, quality: int | None, x: np.ndarray,
           ranges: Ranges = None) -> tuple[bytes, bytes]:
    """``(parameters, payload)`` of a finite float tensor ``x`` that ``applies``. ``ranges``:
    the calibrated value range per channel (values outside it are clipped), else this
    input's own. A model input made from 8-bit pixels comes back to exactly those pixels
    under the range calibrated over many inputs, so PNG is then lossless on it."""
    require(codec)
    if codec in IMAGE:
        return _encode_image(codec, quality, x, ranges)
    return _encode_audio(codec, x, ranges)


def channel_ranges(x: np.ndarray) -> list[tuple[float, float]] | None:
    """Per channel ``(min, max)`` of an image-like tensor, ``(-peak, peak)`` of a waveform
    (what calibration accumulates over its inputs); None if ``x`` is neither."""
    lay = image_layout(x.shape)
    if lay is not None:
        hwc = _hwc(x, lay)
        return [(float(a), float(b)) for a, b in zip(hwc.min(axis=(0, 1)),
                                                     hwc.max(axis=(0, 1)), strict=True)]
    if audio_length(x.shape) is not None:
        peak = float(np.abs(x).max())
        return [(-peak, peak)]
    return None


def _hwc(x: np.ndarray, lay: tuple[bool, int, int, int]) -> np.ndarray:
    last, c, h, w = lay
    return x.reshape(h, w, c) if last else x.reshape(c, h, w).transpose(1, 2, 0)


def _encode_image(codec: str, quality: int | None, x: np.ndarray,
                  ranges: Ranges) -> tuple[bytes, bytes]:
    lay = image_layout(x.shape)
    assert lay is not None
    hwc = _hwc(x, lay)
    if ranges is not None and len(ranges) == lay[1]:
        lo = np.array([r[0] for r in ranges], np.float64)
        hi = np.maximum(np.array([r[1] for r in ranges], np.float64), lo)
    else:
        lo = hwc.min(axis=(0, 1)).astype(np.float64)
        hi = hwc.max(axis=(0, 1)).astype(np.float64)
    scale = ((hi - lo) / 255.0).astype(np.float32).astype(np.float64)
    offset = lo.astype(np.float32)
    safe = np.where(scale > 0, scale, 1.0)
    levels = np.rint((hwc - offset.astype(np.float64)) / safe)
    pixels = np.ascontiguousarray(np.clip(levels, 0, 255).astype(np.uint8))
    params = b"".join(PAIR.pack(float(s), float(o)) for s, o in zip(scale, offset, strict=True))
    return params, _image_bytes(codec, quality, pixels)


def _image_bytes(codec: str, quality: int | None, pixels: np.ndarray) -> bytes:
    sj = _simplejpeg()
    grey = pixels.shape[2] == 1
    if codec == "jpeg" and sj is not None:
        return bytes(sj.encode_jpeg(pixels, quality=quality, colorspace="GRAY" if grey else "RGB",
                                    colorsubsampling="420"))
    from PIL import Image

    img = Image.fromarray(pixels[:, :, 0] if grey else pixels, "L" if grey else "RGB")
    buf = io.BytesIO()
    if codec == "jpeg":
        img.save(buf, "JPEG", quality=quality, subsampling=2)
    elif codec == "webp" and quality is None:  # lossless (VP8L): the pixels exactly
        img.save(buf, "WEBP", lossless=True, method=WEBP_METHOD)
    elif codec == "webp":
        img.save(buf, "WEBP", quality=quality, method=WEBP_METHOD)
    else:
        img.save(buf, "PNG", compress_level=PNG_LEVEL)
    return buf.getvalue()


def _encode_audio(codec: str, x: np.ndarray, ranges: Ranges) -> tuple[bytes, bytes]:
    flat = x.reshape(-1).astype(np.float64)
    peak = float(ranges[0][1]) if ranges and len(ranges) == 1 and ranges[0][1] > 0 else (
        float(np.abs(flat).max()) if flat.size else 0.0)
    scale = float(np.float32(peak / 32767.0))
    if scale > 0 and peak / scale > 32767.5:  # float32 rounding of the scale went down
        scale = float(np.nextafter(np.float32(scale), np.float32(np.inf)))
    samples = (np.zeros(flat.size) if scale == 0 else np.rint(flat / scale))
    pcm = np.clip(samples, -32767, 32767).astype("<i2")
    if codec == "pcm16":
        return SCALE.pack(scale), pcm.tobytes()
    sf = _soundfile()
    buf = io.BytesIO()
    sf.write(buf, pcm, FLAC_RATE, format="FLAC", subtype="PCM_16")
    return SCALE.pack(scale), buf.getvalue()


# --- decoding (hostile bytes) ----------------------------------------------------------------


def _bad(text: str) -> ProtocolError:
    return ProtocolError(ErrorCode.MALFORMED, f"packed tensor: {text}")


def check_params(wire: int, params: bytes | memoryview) -> None:
    """Every scale finite and >= 0, every offset finite, the top value finite in float32."""
    name = NAMES[wire]
    with np.errstate(over="ignore"):  # a hostile finite scale may overflow float32: refused
        _check_params(name, params)


def _check_params(name: str, params: bytes | memoryview) -> None:
    if name in IMAGE:
        for k in range(len(params) // PAIR.size):
            s, o = PAIR.unpack_from(params, k * PAIR.size)
            if not (math.isfinite(s) and s >= 0 and math.isfinite(o)
                    and math.isfinite(float(np.float32(o) + np.float32(s) * np.float32(255)))):
                raise _bad(f"{name} channel {k}: scale {s} / offset {o} must be finite, scale >= 0")
    else:
        (s,) = SCALE.unpack_from(params)
        if not (math.isfinite(s) and s >= 0 and math.isfinite(float(np.float32(s) * 32767))):
            raise _bad(f"{name}: scale {s} must be finite and >= 0")


def decode(wire: int, params: bytes | memoryview, payload: bytes | memoryview,
           shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The tensor of ``shape`` and ``dtype`` from a codec payload; ProtocolError otherwise."""
    name = NAMES[wire]
    if name not in available():
        raise _bad(f"codec {name} cannot be decoded on this side: {INSTALL} "
                   f"({_package(name)})")
    data = bytes(payload)
    try:
        if name in IMAGE:
            return _decode_image(name, params, data, shape, dtype)
        return _decode_audio(name, params, data, shape, dtype)
    except ProtocolError:
        raise
    except Exception as exc:  # any decoder error on hostile bytes is a malformed message
        raise _bad(f"{name} payload does not decode: {type(exc).__name__}: {exc}") from None


def _decode_image(name: str, params: bytes | memoryview, data: bytes, shape: tuple[int, ...],
                  dtype: np.dtype) -> np.ndarray:
    lay = image_layout(shape)
    assert lay is not None
    last, c, h, w = lay
    pixels = _pixels(name, data, c, h, w)
    pairs = np.array([PAIR.unpack_from(params, k * PAIR.size) for k in range(c)], np.float32)
    hwc = pixels.astype(np.float32) * pairs[:, 0] + pairs[:, 1]
    out = hwc if last else hwc.transpose(2, 0, 1)
    return np.ascontiguousarray(out.reshape(shape)).astype(dtype.newbyteorder("="), copy=False)


def _pixels(name: str, data: bytes, c: int, h: int, w: int) -> np.ndarray:
    """``(h, w, c)`` uint8 pixels; the image's own header must state that size and mode before
    any pixel is decoded (a decompression bomb is refused unopened)."""
    sj = _simplejpeg()
    if name == "jpeg" and sj is not None:
        hh, ww, space, _ = sj.decode_jpeg_header(data)
        _same_size(name, (hh, ww), (h, w))
        if (space == "Gray") != (c == 1):  # as Pillow's mode check below: no silent conversion
            raise _bad(f"jpeg image is {space}; expected {'Gray' if c == 1 else 'colour'}")
        px = sj.decode_jpeg(data, colorspace="GRAY" if c == 1 else "RGB")
    else:
        import warnings

        from PIL import Image

        if name == "webp":  # Pillow's WebP open allocates the canvas its header claims
            _same_size(name, webp_size(data), (h, w))
        with warnings.catch_warnings():  # its bomb warning: the size is checked right below
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img: Any = Image.open(io.BytesIO(data), formats=[{"jpeg": "JPEG", "webp": "WEBP",
                                                         "png": "PNG"}[name]])
        _same_size(name, (img.size[1], img.size[0]), (h, w))
        want = "L" if c == 1 else "RGB"
        grey_webp = name == "webp" and c == 1 and img.mode == "RGB"  # WebP has no grey mode
        if img.mode != want and not grey_webp:
            raise _bad(f"{name} image has mode {img.mode}; expected {want}")
        img.load()
        if grey_webp:
            img = img.convert("L")  # equal R, G, B: the grey level exactly
        px = np.asarray(img)
    px = np.asarray(px, dtype=np.uint8).reshape(h, w, -1)
    if px.shape != (h, w, c):
        raise _bad(f"{name} image decoded to {px.shape}; expected {(h, w, c)}")
    return px


def webp_size(data: bytes) -> tuple[int, int]:
    """(height, width) a WebP file claims, read from its first chunk (RIFF container; ``VP8 ``
    key frame, ``VP8L`` or ``VP8X`` canvas) without decoding anything. Raises ProtocolError
    on anything else."""
    if len(data) < 30 or data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        raise _bad("webp body is not a RIFF/WEBP file")
    kind, body = data[12:16], data[20:]
    if kind == b"VP8 " and body[3:6] == b"\x9d\x01\x2a":
        w, h = struct.unpack_from("<HH", body, 6)
        return h & 0x3FFF, w & 0x3FFF
    if kind == b"VP8L" and body[0] == 0x2F:
        bits = int.from_bytes(body[1:5], "little")
        return ((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1
    if kind == b"VP8X":
        return int.from_bytes(body[7:10], "little") + 1, int.from_bytes(body[4:7], "little") + 1
    raise _bad(f"webp first chunk {kind!r} is not VP8, VP8L or VP8X")


def _same_size(name: str, got: tuple[int, int], want: tuple[int, int]) -> None:
    if tuple(got) != tuple(want):
        raise _bad(f"{name} image is {got[0]}x{got[1]}; the header declares {want[0]}x{want[1]}")


def _decode_audio(name: str, params: bytes | memoryview, data: bytes, shape: tuple[int, ...],
                  dtype: np.dtype) -> np.ndarray:
    n = audio_length(shape)
    assert n is not None
    if name == "pcm16":
        if len(data) != 2 * n:
            raise ProtocolError(ErrorCode.TRUNCATED if len(data) < 2 * n else ErrorCode.MALFORMED,
                                f"packed tensor: pcm16 payload has {len(data)} B; expected {2 * n}")
        pcm = np.frombuffer(data, dtype="<i2")
    else:
        sf = _soundfile()
        with sf.SoundFile(io.BytesIO(data)) as f:
            if f.format != "FLAC" or f.channels != 1 or f.frames != n:
                raise _bad(f"flac stream is {f.format}, {f.channels} channel(s), {f.frames} "
                           f"samples; expected FLAC, 1 channel, {n} samples")
            pcm = f.read(frames=n, dtype="int16", always_2d=False)
        if pcm.shape != (n,):
            raise _bad(f"flac stream gave {pcm.shape[0]} samples; expected {n}")
    (scale,) = SCALE.unpack_from(params)
    out = pcm.astype(np.float32) * np.float32(scale)
    return out.reshape(shape).astype(dtype.newbyteorder("="), copy=False)
