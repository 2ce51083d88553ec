"""The standard codecs' decoders under ``coinf bench fuzz`` (ble_protocol/media.py): valid
bodies of photo-like and speech-like tensors, crafted bodies (bombs, spliced sizes, headers
that claim other shapes) and mutations; a decoder may only raise ProtocolError or return a
tensor of exactly the declared shape and dtype."""

from __future__ import annotations

import contextlib
import random
import struct
import warnings
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from coinf.ble_protocol import media, packing
from coinf.cli.bench.fuzz_engine import WrongResult, fuzz_one, mutate
from coinf.errors import ProtocolError

#: codec -> the packing its seeds are made with
CODEC_SPECS = {"jpeg": "jpeg-q75", "webp": "webp-q75", "png": "png", "pcm16": "pcm16",
               "flac": "flac"}
#: inputs per codec decoder by default (capped by ``--inputs``): a codec decodes in ~0.1 ms
#: but runs native code on every input, and a few thousand cover the crafted bodies and the
#: mutation mix in a few seconds
CODEC_INPUTS = 2000
BOMB_SIDE = 20000
IMAGE_SHAPES = ((1, 3, 48, 64), (1, 1, 40, 56), (1, 32, 40, 3))
AUDIO_SHAPES = ((1, 1600), (1, 1, 700))


def photo_like(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """An image-like float32 model input: smooth shading, a few discs, a little sensor noise,
    normalized like ImageNet (per channel mean/std)."""
    lay = media.image_layout(shape)
    assert lay is not None
    last, c, h, w = lay
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    img = np.empty((h, w, c))
    for k in range(c):
        fx, fy, ph = rng.uniform(0.3, 1.5), rng.uniform(0.3, 1.5), rng.uniform(0, 6.3)
        img[:, :, k] = 0.5 + 0.35 * np.sin(2 * np.pi * (fx * x + fy * y) + ph)
    for _ in range(4):
        cy, cx = rng.uniform(0, 1, 2) * (h, w) / max(h, w)
        r = rng.uniform(0.05, 0.25)
        disc = (y - cy) ** 2 + (x - cx) ** 2 < r * r
        img[disc] = rng.uniform(0, 1, c)
    img = np.clip(img + rng.normal(0, 0.02, img.shape), 0, 1)
    mean, std = (np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])) if c == 3 \
        else (np.array([0.449]), np.array([0.226]))
    norm = ((img - mean) / std).astype(np.float32)
    return (norm if last else norm.transpose(2, 0, 1)).reshape(shape)


def speech_like(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A speech-like float32 waveform at 16 kHz: a gliding voiced tone (8 harmonics) under a
    syllable envelope, plus breath noise."""
    n = shape[-1]
    t = np.arange(n) / 16000.0
    f0 = rng.uniform(100, 180) + rng.uniform(20, 60) * np.sin(2 * np.pi * rng.uniform(2, 5) * t)
    phase = 2 * np.pi * np.cumsum(f0) / 16000.0
    voiced = sum(np.sin(k * phase + rng.uniform(0, 6.3)) / k for k in range(1, 9))
    envelope = 0.5 - 0.5 * np.cos(2 * np.pi * rng.uniform(3, 6) * t)
    wave = 0.25 * envelope * voiced + rng.normal(0, 0.005, n)
    return wave.astype(np.float32).reshape(shape)


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bomb(h: int, w: int, grey: bool = False, inflated: int = 4096) -> bytes:
    """A PNG whose IHDR claims ``h`` x ``w`` pixels (valid CRCs) over an IDAT that inflates to
    ``inflated`` zero bytes."""
    z = zlib.compressobj(9)
    block = bytes(1 << 20)
    idat = b"".join(z.compress(block[:min(len(block), inflated - k)])
                    for k in range(0, inflated, len(block))) + z.flush()
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0 if grey else 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat)
            + _png_chunk(b"IEND", b""))


def _jpeg_claims(jpeg: bytes, h: int, w: int) -> bytes:
    """``jpeg`` with its SOF's height and width replaced (JPEG has no checksum)."""
    out = bytearray(jpeg)
    pos = 2
    while pos + 4 <= len(out) and out[pos] == 0xFF:
        marker, (size,) = out[pos + 1], struct.unpack_from(">H", out, pos + 2)
        if marker in (0xC0, 0xC1, 0xC2):
            struct.pack_into(">HH", out, pos + 5, h, w)
            return bytes(out)
        pos += 2 + size
    raise ValueError("no SOF marker")


def _webp_claims(webp: bytes, h: int, w: int) -> bytes:
    """A lossy ``webp`` (RIFF/VP8) whose key frame claims ``w`` x ``h`` (14 bits each)."""
    out = bytearray(webp)
    at = out.find(b"\x9d\x01\x2a")  # the VP8 key frame start code, then width, height
    if out[12:16] != b"VP8 " or at < 0:
        raise ValueError("not a simple lossy WebP")
    struct.pack_into("<HH", out, at + 3, w & 0x3FFF, h & 0x3FFF)
    return bytes(out)


def _flac_claims(flac: bytes, samples: int) -> bytes:
    """``flac`` whose STREAMINFO claims ``samples`` samples (36 bits; no MD5 check on open)."""
    out = bytearray(flac)
    if out[:4] != b"fLaC" or out[4] & 0x7F != 0:
        raise ValueError("no STREAMINFO")
    (word,) = struct.unpack_from(">Q", out, 18)  # rate 20, channels 3, bits 5, samples 36
    struct.pack_into(">Q", out, 18, (word & ~((1 << 36) - 1)) | (samples & ((1 << 36) - 1)))
    return bytes(out)


def _split_body(body: bytes) -> tuple[bytes, bytes]:
    at = packing.read_header(body).payload_offset
    return body[:at], body[at:]


def _header_for(name: str, shape: tuple[int, ...]) -> bytes:
    """A valid packed float32 header of codec ``name`` declaring ``shape`` (built, not packed:
    the shape may be huge)."""
    wire = media.WIRE[name]
    bits = 75 if name in media.QUALITY else 8 if name in media.IMAGE else 16
    dims = b""
    for d in shape:  # minimal LEB128
        while d > 0x7F:
            dims += bytes([d & 0x7F | 0x80])
            d >>= 7
        dims += bytes([d])
    size = media.params_size(wire, shape)
    assert size is not None
    params = (media.PAIR.pack(1 / 255, 0.0) * (size // media.PAIR.size) if name in media.IMAGE
              else media.SCALE.pack(1 / 32767))
    return packing.HEADER.pack(packing.MAGIC, wire, 0, bits, 1, len(shape)) + dims + params


def _crafted(name: str, rng: np.random.Generator, seeds: list[tuple[tuple[int, ...], bytes]],
             budget: int) -> dict[str, tuple[bytes, bool]]:
    """what -> (body, must be refused). The others may decode (to the declared shape): a
    1-channel JPEG under an RGB header is converted, a PNG whose IDAT holds far more than its
    image is decoded up to the image and no further."""
    spec = CODEC_SPECS[name]
    out: dict[str, tuple[bytes, bool]] = {}
    for shape, body in seeds:
        head, payload = _split_body(body)
        label = "x".join(map(str, shape))
        if name in media.IMAGE:
            last, c, h, w = media.image_layout(shape)  # type: ignore[misc]
            sizes = [(h + 8, w), (h, w - 8), (w, h)] if h != w else [(h + 8, w), (h, w - 8)]
            for hh, ww in sizes:  # a valid image of another size spliced under the header
                s = (1, hh, ww, c) if last else (1, c, hh, ww)
                out[f"{label} header over a {hh}x{ww} {name}"] = (head + _split_body(
                    packing.pack(photo_like(rng, s), spec))[1], True)
            s = (1, h, w, 4 - c) if last else (1, 4 - c, h, w)  # RGB under grey, grey under RGB
            out[f"{label} header over a {4 - c}-channel {name}"] = (head + _split_body(
                packing.pack(photo_like(rng, s), spec))[1], name == "png")
            bomb = png_bomb(BOMB_SIDE, BOMB_SIDE, grey=c == 1)
            out[f"{label} header over a PNG bomb {BOMB_SIDE}x{BOMB_SIDE}"] = (head + bomb, True)
            out[f"{label} header over a PNG bomb 10000x10000 (under Pillow's own limit)"] = (
                head + png_bomb(10000, 10000, grey=c == 1), True)
            if name == "png":
                out[f"{label} header over a PNG of the right size inflating to 16 MB"] = (
                    head + png_bomb(h, w, grey=c == 1, inflated=16 << 20), False)
                own = (1, BOMB_SIDE, BOMB_SIDE, c) if last else (1, c, BOMB_SIDE, BOMB_SIDE)
                out[f"PNG bomb under a header declaring its own {BOMB_SIDE}x{BOMB_SIDE}"] = (
                    _header_for(name, own) + bomb, True)
            elif name == "jpeg":
                out[f"{label} header over a JPEG whose SOF claims {BOMB_SIDE}x{BOMB_SIDE}"] = (
                    head + _jpeg_claims(payload, BOMB_SIDE, BOMB_SIDE), True)
            else:
                out[f"{label} header over a WebP claiming 16383x16383"] = (
                    head + _webp_claims(payload, 16383, 16383), True)
        else:
            n = shape[-1]
            for m in (n - 1, n + 1, 2 * n):  # a valid stream of another length
                out[f"{label} header over a {m}-sample {name}"] = (head + _split_body(
                    packing.pack(speech_like(rng, (1, m)), spec))[1], True)
            if name == "flac":
                out[f"{label} header over a FLAC whose STREAMINFO claims 2**36-1 samples"] = (
                    head + _flac_claims(payload, (1 << 36) - 1), True)
                out[f"{label} header over a FLAC claiming {n + 1} samples"] = (
                    head + _flac_claims(payload, n + 1), True)
                for m in (n - 1, n + 1):  # a stream of another length claiming the right one
                    stream = _split_body(packing.pack(speech_like(rng, (1, m)), spec))[1]
                    out[f"{label} header over a {m}-sample FLAC claiming {n}"] = (
                        head + _flac_claims(stream, n), m < n)
            out[f"{label} header over a PNG bomb {BOMB_SIDE}x{BOMB_SIDE}"] = (
                head + png_bomb(BOMB_SIDE, BOMB_SIDE), True)
    big = budget // 4 + 1  # a waveform/image just over the receiver's budget
    out["header declaring more than the budget"] = (_header_for(
        name, (1, 1, big) if name in media.AUDIO else (1, 1, 8, big // 8 + 1))
        + seeds[0][1][-64:], True)
    return out


def codec_mutator(pool: list[bytes]) -> Callable[[random.Random, bytes], bytes]:
    """Mutants of a packed codec body: the generic ones on the whole body, or on its payload
    only, or on its header only, or its header over a random payload of ``pool`` (other
    codecs, other sizes, random bytes), as is or mutated."""
    def mutant(rng: random.Random, body: bytes) -> bytes:
        try:
            head, payload = _split_body(body)
        except ProtocolError:  # a crafted body over the budget
            return mutate(rng, body)
        op = rng.randrange(5)
        if op == 0:
            return mutate(rng, body)
        if op == 1:
            return head + mutate(rng, payload)
        if op == 2:
            return mutate(rng, head) + payload
        if op == 3:
            return head + rng.choice(pool)
        return head + mutate(rng, rng.choice(pool))
    return mutant


def codec_seeds(rng: np.random.Generator) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """``codec_NAME`` -> its case (``valid`` and ``crafted`` bodies, ``decode``,
    ``budget``, ``mutator``, ``tally`` of what reached the codec), and codec -> why skipped."""
    have = media.available()
    skipped = {c: f"not available here: {media.INSTALL} ({media._package(c)})"
               for c in CODEC_SPECS if c not in have}
    names = [c for c in CODEC_SPECS if c in have]
    bodies: dict[str, list[tuple[tuple[int, ...], bytes]]] = {}
    for name in names:
        shapes = IMAGE_SHAPES if name in media.IMAGE else AUDIO_SHAPES
        make = photo_like if name in media.IMAGE else speech_like
        bodies[name] = [(s, packing.pack(make(rng, s), CODEC_SPECS[name])) for s in shapes]
    pool = [_split_body(b)[1] for seeds in bodies.values() for _, b in seeds]
    pool += [bytes(rng.integers(0, 256, k, dtype=np.uint8)) for k in (0, 1, 64, 2048)]
    pool.append(png_bomb(BOMB_SIDE, BOMB_SIDE))
    cases: dict[str, dict[str, Any]] = {}
    for name in names:
        seeds = bodies[name]
        budget = max(int(np.prod(s)) * 4 for s, _ in seeds)
        crafted = _crafted(name, rng, seeds, budget)
        tally: dict[str, Any] = {"reached_codec": 0, "codec_decoded": 0, "codec_refused": 0,
                                 "warnings": 0, "crafted": dict.fromkeys(crafted, "not fed")}
        cases[f"codec_{name}"] = {
            "valid": [b for _, b in seeds], "crafted": [b for b, _ in crafted.values()],
            "budget": budget,
            "decode": _codec_decoder(name, budget, {b: (w, refuse) for w, (b, refuse)
                                                    in crafted.items()}, tally),
            "mutator": codec_mutator(pool), "tally": tally}
    return cases, skipped


def _codec_decoder(name: str, budget: int, crafted: dict[bytes, tuple[str, bool]],
                   tally: dict[str, Any]) -> Callable[[bytes], np.ndarray]:
    """``packing.unpack`` under the receiver's ``budget``, checked: an array of exactly the
    shape and dtype the input's header declares, and no crafted body that must be refused
    accepted. Warnings (e.g. numpy overflow on hostile parameters) are counted, not shown."""
    wire = media.WIRE[name]

    def decode(data: bytes) -> np.ndarray:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                return checked(data)
            finally:
                if caught:
                    tally["warnings"] += 1
                    tally.setdefault("warning_example", f"{caught[0].category.__name__}: "
                                     f"{caught[0].message} ({caught[0].filename.rsplit('/', 1)[-1]}"
                                     f":{caught[0].lineno})")

    def checked(data: bytes) -> np.ndarray:
        return checked_unpack(data, budget, wire, name, crafted, tally)

    return decode


def fuzz_codec(name: str, case: dict[str, Any], n: int, rng: random.Random,
               rss: bool = False) -> dict[str, Any]:
    """``fuzz_one`` of a ``codec_seeds`` case: its valid bodies, then every crafted body, then
    mutants of both; plus what reached the codec and how each crafted body ended."""
    crafted = case["crafted"]
    if rss:  # the codec libraries' one-time allocations and code pages are not per-input costs
        for data in case["valid"] + crafted:
            with contextlib.suppress(ProtocolError):
                packing.unpack(data, max_bytes=case["budget"])
    stats = fuzz_one(name, case["valid"] + crafted, case["decode"],
                     max(n, len(case["valid"]) + len(crafted)), rng, case["budget"],
                     mutator=case["mutator"], rss=rss)
    tally = case["tally"]
    stats.update({k: tally[k] for k in ("reached_codec", "codec_decoded", "codec_refused",
                                        "warnings", "warning_example") if k in tally})
    stats["crafted"] = dict(tally["crafted"])
    return stats


def checked_unpack(data: bytes, budget: int, wire: int, name: str,
                   crafted: Mapping[bytes, tuple[str | None, bool]],
                   tally: dict[str, Any]) -> np.ndarray:
    """``packing.unpack`` of a fuzzed body under ``budget``, checked: exactly the declared
    shape and dtype, and a crafted body that must be refused never accepted; counts how often
    the codec ``wire`` was reached, refused and decoded."""
    try:
        h: packing.PackedHeader | None = packing.read_header(data, budget)
    except ProtocolError:
        h = None
    reached = h is not None and h.codec == wire
    tally["reached_codec"] += reached
    what, must_refuse = crafted.get(data, (None, False))
    try:
        out = packing.unpack(data, max_bytes=budget)
    except ProtocolError as exc:
        tally["codec_refused"] += reached
        if what is not None:
            tally["crafted"][what] = f"refused ({exc.code.name})"
        raise
    if h is None:
        raise WrongResult("unpack decoded a body whose header read_header refuses")
    want = h.dtype.newbyteorder("=")
    if not isinstance(out, np.ndarray) or out.shape != h.shape or out.dtype != want:
        got = (getattr(out, "shape", None), getattr(out, "dtype", type(out).__name__))
        raise WrongResult(f"{name}: got {got[0]} {got[1]}; the header declares "
                          f"{h.shape} {want}")
    if what is not None:
        tally["crafted"][what] = "ACCEPTED" if must_refuse else "decoded (may be)"
        if must_refuse:
            raise WrongResult(f"{name}: a crafted body was accepted: {what}")
    tally["codec_decoded"] += reached
    return out
