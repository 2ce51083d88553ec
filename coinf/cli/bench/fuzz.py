"""``coinf bench fuzz``: generated hostile inputs against every wire decoder.

For each decoder: valid encodings as seeds, then mutants (bit flips, truncation, insertions,
boundary integers spliced over length fields, duplication) and random bytes. Every input must end
in the decoder's documented error (a ProtocolError; a ProfileError for profiles) or a value; any
other exception is counted and the first few are shown. Per input the peak of Python-tracked
memory (numpy included) and the time are recorded.

The standard codecs (``codec_jpeg``, ``codec_webp``, ``codec_png``, ``codec_pcm16``,
``codec_flac``; those :func:`media.available` lacks are skipped and listed) get their own seeds:
packed bodies of a photo-like image ``[1,3,H,W]``, a grey one ``[1,1,H,W]``, one channels-last,
and speech-like waveforms ``[1,N]``. Mutants also keep a header and swap its payload (for
another codec's, another size's, random bytes) or mutate only the payload or only the header.
Crafted bodies are fed first; most must be refused: a valid image or stream of another size
under a header, decompression bombs (a tiny PNG whose IHDR claims 20000x20000 or 10000x10000,
a JPEG/WebP/FLAC whose own header claims a huge size), a header declaring more than the budget.
A few may decode, to the declared shape (an image of the other channel count, which JPEG and
WebP convert; a PNG whose IDAT inflates to 16 MB; a FLAC holding one sample more than it and
the header claim). Beyond the exception check, a codec decoder fails when it returns anything
but an array of exactly the shape and dtype the input's header declares, or accepts a crafted
body that must be refused. Pillow's, libjpeg's and libsndfile's buffers are invisible to
tracemalloc, so the run also records each input's growth of the peak RSS (Linux VmHWM, reset
per input, after a warm-up) against the receiver's byte budget.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import struct
import time
import tracemalloc
import warnings
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from coinf.ble_protocol import gatt, media, packing
from coinf.ble_protocol.frames import Reassembler, encode_chunks
from coinf.ble_protocol.messages import (
    Message,
    MsgType,
    decode_error,
    decode_json,
    decode_request,
    decode_result,
    encode_error,
    encode_json,
    encode_request,
    encode_result,
)
from coinf.ble_protocol.tensors import decode_tensors, encode_tensors
from coinf.cli import argtypes
from coinf.cli.bench import emit, progress
from coinf.device.profile import DeviceProfile, ProfileError
from coinf.device.status import DeviceStatus, decode_status_reply
from coinf.errors import ErrorCode, ProtocolError

#: Decoders whose output is tensors: bounded by the receiver's signature budget, not the input
#: size (a valid compressed body is meant to expand).
TENSOR_DECODERS = ("tensor_map", "packed_tensor", "request", "result", "reassembly")
BOUNDARY = [0, 1, 2, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000,
            0xFFFFFFFF]


def _tensors(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "a": rng.standard_normal((1, 16, 16, 16)).astype(np.float32),  # 16 KB: a real cut
        "b": np.arange(5, dtype=np.int64),
        "s": np.array(3.5, np.float32),
        "e": np.zeros((0, 3), np.float32),
    }


BUDGET = sum(a.nbytes for a in _tensors(np.random.default_rng(0)).values())


def seeds(rng: np.random.Generator) -> dict[str, tuple[list[bytes], Callable[[bytes], Any]]]:
    """decoder name -> (valid inputs, decode function). Budgets are what the receiver knows
    from the model's signature: the seeds' decoded size, never what a header declares."""
    t = _tensors(rng)
    budget = BUDGET
    packed = {n: packing.pack(a, s) for (n, a), s in zip(t.items(), ["q4", "f32", "q8", "f16"],
                                                          strict=True)}
    blob_raw = encode_tensors(t)
    blob_packed = encode_tensors({}, packed=packed)
    hello = gatt.make_hello("model-1234", 247, role="handheld")
    message = Message(MsgType.REQUEST, 7, encode_request("c001", blob_raw))
    chunks = list(encode_chunks(message, 244))[:40] + list(encode_chunks(message, 244))[-2:]
    status = encode_json({"device": DeviceStatus(cpu_load=0.3, battery_pct=80.0).to_json(),
                          "role": "handheld", "requests": 3})

    def reassemble(data: bytes) -> Any:
        r = Reassembler(max_message_bytes=len(message.payload) + 64)
        out = None
        for chunk in _split(data):
            out = r.feed(chunk) or out
        return out

    def hello_check(data: bytes) -> Any:
        kind, body = gatt.parse_ctrl(data)
        if kind in (gatt.Ctrl.HELLO, gatt.Ctrl.HELLO_ACK):
            return gatt.check_hello(body, "model-1234")
        return body

    def decode_err(data: bytes) -> Any:
        err = decode_error(data)
        assert isinstance(err, ProtocolError)
        return err

    def profile(data: bytes) -> Any:
        try:
            return DeviceProfile.from_bytes(data)
        except ProfileError as exc:  # the profile decoder's documented error
            raise ProtocolError(ErrorCode.MALFORMED, str(exc)) from None

    return {
        "frames": ([bytes(c) for c in chunks], lambda d: Reassembler().feed(d)),
        "reassembly": ([_join(chunks), _join(chunks[::-1])], reassemble),
        "tensor_map": ([blob_raw, blob_packed], lambda d: decode_tensors(d, max_bytes=budget)),
        "packed_tensor": ([*packed.values(), *(packing.pack(a, "qz3") for a in t.values())],
                          lambda d: packing.unpack(d, max_bytes=budget)),
        "control_frame": ([gatt.ctrl_json(gatt.Ctrl.HELLO, hello), gatt.ctrl_credit(12),
                           gatt.ctrl_abort(3, 9), gatt.ctrl_error(ErrorCode.BUSY, "busy")],
                          hello_check),
        "json_hello": ([encode_json(hello)], decode_json),
        "status_reply": ([status], decode_status_reply),
        "profile_reply": ([encode_json(DeviceProfile.default("handheld").to_json())], profile),
        "request": ([encode_request("c001", blob_raw)], lambda d: decode_tensors(
            decode_request(d)[1], max_bytes=budget)),
        "result": ([encode_result(1234, blob_packed)], lambda d: decode_tensors(
            decode_result(d)[1], max_bytes=budget)),
        "error": ([encode_error(ErrorCode.TAIL_FAILED, "tail failed")], decode_err),
    }


def _join(chunks: list[bytes]) -> bytes:
    """Several chunks as one input: u16 length before each."""
    return b"".join(struct.pack("<H", len(c)) + c for c in chunks)


def _split(data: bytes) -> list[bytes]:
    out: list[bytes] = []
    pos = 0
    while pos + 2 <= len(data) and len(out) < 64:
        (n,) = struct.unpack_from("<H", data, pos)
        out.append(data[pos + 2: pos + 2 + n])
        pos += 2 + n
    return out


def mutate(rng: random.Random, seed: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        if op == 0 and data:  # flip bits
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif op == 1 and data:  # truncate
            del data[rng.randrange(len(data)):]
        elif op == 2:  # insert random bytes
            at = rng.randrange(len(data) + 1)
            data[at:at] = rng.randbytes(rng.randint(1, 16))
        elif op == 3 and len(data) >= 4:  # a boundary integer over a (likely) length field
            at = rng.randrange(len(data) - 3)
            fmt = rng.choice(["<I", "<H", "<B"])
            value = rng.choice(BOUNDARY) & {"<I": 0xFFFFFFFF, "<H": 0xFFFF, "<B": 0xFF}[fmt]
            struct.pack_into(fmt, data, at, value)
        elif op == 4 and data:  # duplicate a slice
            a = rng.randrange(len(data))
            b = min(len(data), a + rng.randint(1, 64))
            data[b:b] = data[a:b]
        elif op == 5:  # extend with zeros
            data += bytes(rng.randint(1, 32))
        elif op == 6 and data:  # overwrite a byte with 0x00/0xFF
            data[rng.randrange(len(data))] = rng.choice([0, 0xFF])
    return bytes(data)


class WrongResult(Exception):
    """A decoder returned something other than what its input declares (shape, dtype), or
    accepted a crafted input that must be refused: a failure, counted apart from foreign
    exceptions."""


def fuzz_one(name: str, valid: list[bytes], decode: Callable[[bytes], Any], n: int,
             rng: random.Random, budget: int | None = None,
             mutator: Callable[[random.Random, bytes], bytes] = mutate,
             rss: bool = False) -> dict[str, Any]:
    """``n`` inputs: ``valid`` first, then mutants of them (``mutator``) and random bytes.
    ``rss``: also the growth of the peak RSS per input (resets this process's VmHWM)."""
    stats: dict[str, Any] = {"inputs": 0, "protocol_errors": 0, "decoded": 0,
                             "other_exceptions": 0, "wrong_results": 0, "peak_bytes": 0,
                             "max_ms": 0.0, "largest_input": 0, "examples": []}
    rss = rss and _rss_resettable()
    if rss:
        stats["peak_rss_growth_bytes"] = 0
    for i in range(n):
        if i < len(valid):
            data = valid[i]
        elif rng.random() < 0.1:
            data = rng.randbytes(rng.randint(0, 300))
        else:
            data = mutator(rng, rng.choice(valid))
        stats["largest_input"] = max(stats["largest_input"], len(data))
        if rss:
            rss_before = _reset_rss_peak()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        try:
            decode(data)
            stats["decoded"] += 1
        except ProtocolError:
            stats["protocol_errors"] += 1
        except WrongResult as exc:
            stats["wrong_results"] += 1
            if len(stats["examples"]) < 3:
                stats["examples"].append(f"wrong result: {exc} <- {data[:48].hex()}")
        except Exception as exc:
            stats["other_exceptions"] += 1
            if len(stats["examples"]) < 3:
                stats["examples"].append(f"{type(exc).__name__}: {exc} <- {data[:48].hex()}")
        ms = (time.perf_counter() - t0) * 1e3
        stats["max_ms"] = max(stats["max_ms"], round(ms, 3))
        stats["peak_bytes"] = max(stats["peak_bytes"], tracemalloc.get_traced_memory()[1] - base)
        if rss:
            stats["peak_rss_growth_bytes"] = max(stats["peak_rss_growth_bytes"],
                                                 _status_kb("VmHWM") * 1024 - rss_before)
        stats["inputs"] += 1
        if (i + 1) % 20_000 == 0:
            progress(f"{name}: {i + 1}/{n}")
    stats["peak_over_largest_input"] = round(stats["peak_bytes"] / max(stats["largest_input"], 1),
                                             2)
    if budget is not None:  # decoders of tensors may expand (compression) up to the signature
        stats["budget_bytes"] = budget
        stats["peak_over_budget"] = round(stats["peak_bytes"] / budget, 2)
        if rss:
            stats["peak_rss_growth_over_budget"] = round(
                stats["peak_rss_growth_bytes"] / budget, 2)
    if not stats["examples"]:
        del stats["examples"]
    return stats


# --- peak RSS per input (Linux) --------------------------------------------------------------


def _status_kb(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"no {field} in /proc/self/status")


def _reset_rss_peak() -> int:
    """Reset VmHWM to the current RSS (``clear_refs`` 5); return that RSS in bytes."""
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")
    return _status_kb("VmRSS") * 1024


def _rss_resettable() -> bool:
    try:
        _reset_rss_peak()
        _status_kb("VmHWM")
    except (OSError, ValueError):
        return False
    return True


# --- standard codecs (ble_protocol/media.py) -------------------------------------------------

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


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    table = seeds(np.random.default_rng(args.seed))
    codecs, skipped = codec_seeds(np.random.default_rng(args.seed))
    names = [*table, *codecs]
    skipped_names = [f"codec_{c}" for c in skipped]
    chosen = args.decoders or names
    unknown = sorted(set(chosen) - set(names) - set(skipped_names))
    if unknown:
        from coinf.errors import UserError

        raise UserError(f"unknown decoder {unknown[0]!r}; expected some of {', '.join(names)}")
    codec_inputs = min(args.inputs, args.codec_inputs)
    tracemalloc.start()
    out: dict[str, Any] = {}
    try:
        for name in chosen:
            if name in codecs:
                out[name] = fuzz_codec(name, codecs[name], codec_inputs, rng, rss=True)
            elif name in table:
                valid, decode = table[name]
                out[name] = fuzz_one(name, valid, decode, args.inputs, rng,
                                     BUDGET if name in TENSOR_DECODERS else None)
    finally:
        tracemalloc.stop()
    run_codecs = [n for n in out if n in codecs]
    emit({
        "inputs_per_decoder": args.inputs,
        "inputs_per_codec_decoder": codec_inputs,
        "seed": args.seed,
        "codecs": {"fuzzed": [n.removeprefix("codec_") for n in run_codecs],
                   "skipped": skipped},
        "decoders": out,
        "other_exceptions": sum(d["other_exceptions"] for d in out.values()),
        "wrong_results": sum(d["wrong_results"] for d in out.values()),
        "failures": sum(d["other_exceptions"] + d["wrong_results"] for d in out.values()),
        "worst_peak_over_largest_input": max(
            (d["peak_over_largest_input"] for d in out.values()), default=0),
        "worst_peak_over_budget": max((d.get("peak_over_budget", 0) for d in out.values()),
                                      default=0),
        "codec_peak_rss_measured": _rss_resettable() if run_codecs else None,
        "worst_codec_peak_rss_growth_over_budget": max(
            (out[n].get("peak_rss_growth_over_budget", 0) for n in run_codecs), default=None),
        "worst_max_ms": max((d["max_ms"] for d in out.values()), default=0),
        "targets": {"other_exceptions": 0, "wrong_results": 0, "peak_over_largest_input": 4,
                    "max_ms": 100},
    })
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--inputs", type=argtypes.positive_int, default=100_000,
                        help="inputs per decoder")
    parser.add_argument("--codec-inputs", type=argtypes.count, default=CODEC_INPUTS,
                        help="inputs per standard-codec decoder (codec_*), at most --inputs")
    parser.add_argument("--seed", type=argtypes.seed, default=1)
    parser.add_argument("--decoders", nargs="*", help="only these decoders")
    parser.add_argument("--json", action="store_true", help="(always JSON)")
    parser.set_defaults(func=run)
