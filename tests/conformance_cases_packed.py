"""Conformance cases of PACKED bodies (docs/PROTOCOL.md §6.7), standard codecs included."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
from coinf.ble_protocol.packing import pack

F32 = 1
#: vectors whose bytes a codec library made: the generator keeps them as first committed
LIBRARY_MADE = frozenset({"packed-quantz-zstd", "packed-png", "packed-webp-ll", "packed-flac",
                          "packed-png-flags", "packed-png-int-over-budget", "packed-png-int",
                          "packed-png-shape", "packed-png-bits", "packed-png-size",
                          "packed-png-garbage"})


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def body(codec: int, flags: int, bits: int, dtype: int, dims: list[int], rest: bytes = b"",
         *, raw_dims: bytes | None = None) -> bytes:
    """A packed body built by hand: header, dims (``raw_dims`` as given), then ``rest``."""
    dim_bytes = raw_dims if raw_dims is not None else b"".join(_varint(d) for d in dims)
    return b"CP2" + bytes([codec, flags, bits, dtype, len(dims)]) + dim_bytes + rest


def _case(cid: str, intent: str, note: str, data: bytes, *, gaps: list[int] | None = None,
          spec: str | None = None, needs: str | None = None, max_bytes: int | None = None
          ) -> dict[str, Any]:
    out: dict[str, Any] = {"id": f"packed-{cid}", "layer": "packed", "section": "§6.7"}
    if gaps:
        out["gaps"] = gaps
    out["note"] = note
    out["hex"] = data.hex()
    if max_bytes is not None:
        out["params"] = {"max_bytes": max_bytes}
    if needs is not None:
        out["needs"] = needs
    if spec is not None:
        out["reencode"] = {"spec": spec}
    out["intent"] = intent
    return out


def _valid() -> Iterator[dict[str, Any]]:
    example = np.array([[0, .25, 1], [-.5, .7, .1]], np.float32)
    small = np.array([1.0, -2.5, 3.25, 0.0], np.float32)
    wave = ((np.arange(64, dtype=np.float32) / 32 - 1) * np.float32(0.5))[None]
    image = (np.arange(64, dtype=np.float32).reshape(1, 1, 8, 8) / 63)
    yield _case("q3", "ok", "§6.7's worked example: QUANT, 3 bits", pack(example, "q3"),
                spec="q3")
    yield _case("const", "ok", "CONST: a float32 2x3 tensor of 1.5",
                pack(np.full((2, 3), 1.5, np.float32), "q8"), spec="q8")
    yield _case("lossless", "ok", "LOSSLESS, payload sent plain", pack(small, "f32"),
                spec="f32")
    yield _case("lossless-lz4", "ok", "LOSSLESS, one LZ4 block (flag 1)",
                pack(np.zeros(64, np.float32), "f32"), spec="f32")
    yield _case("half", "ok", "HALF", pack(small, "f16"), spec="f16")
    yield _case("raw", "ok", "RAW", pack(small, "raw"), spec="raw")
    yield _case("int64", "ok", "an int64 tensor travels LOSSLESS whatever the spec",
                pack(np.array([3, -7], np.int64), "q4"), spec="q4")
    yield _case("empty", "ok", "a tensor with count 0: empty payload",
                pack(np.zeros((0, 3), np.float32), "f32"), spec="f32")
    yield _case("quantz-plain", "ok", "QUANTZ, flag 0: one level byte per element",
                body(5, 0, 4, F32, [4], struct.pack("<dd", 0.5, -1.0) + bytes([0, 1, 2, 15])))
    yield _case("quantz-zstd", "ok", "QUANTZ, flag 2: a magicless zstd frame",
                pack(np.linspace(-1, 1, 64, dtype=np.float32), "qz4"), needs="zstd")
    yield _case("pcm16", "ok", "§6.7's PCM16 example (142 bytes)", pack(wave, "pcm16"),
                spec="pcm16")
    yield _case("png", "ok", "PNG, an 8x8 grey image-like tensor", pack(image, "png"),
                needs="png")
    yield _case("webp-ll", "ok", "lossless WebP (VP8L, bits 100)", pack(image, "webp-ll"),
                needs="webp")
    yield _case("flac", "ok", "FLAC, 64 samples", pack(wave[0], "flac"), needs="flac")


def _header_order() -> Iterator[dict[str, Any]]:
    q = struct.pack("<dd", 0.5, 0.0)
    yield _case("short", "TRUNCATED", "7 bytes: shorter than the 8-byte header", b"CP2\x03\x00"
                b"\x03\x01")
    yield _case("magic", "MALFORMED", "magic CP1", b"CP1" + body(3, 0, 3, F32, [1], q)[3:])
    yield _case("codec-13", "MALFORMED", "codec 13", body(13, 0, 0, F32, [1]))
    yield _case("quantz-lz4", "MALFORMED", "flag bit 0 on QUANTZ", body(5, 1, 4, F32, [1], q))
    yield _case("raw-lz4", "MALFORMED", "RAW is never compressed", body(0, 1, 0, F32, [1],
                                                                         bytes(4)))
    yield _case("dtype-8", "MALFORMED", "dtype 8 (string) is not a wire dtype",
                body(0, 0, 0, 8, [1], b"x"))
    yield _case("ndim-9", "MALFORMED", "ndim 9", body(0, 0, 0, F32, [1] * 9, bytes(4)))
    yield _case("dims-cut", "TRUNCATED", "the dims end early", body(0, 0, 0, F32, [1, 1],
                                                                    raw_dims=b"\x01"))
    yield _case("varint-long", "MALFORMED", "a dimension varint not minimally encoded",
                body(0, 0, 0, F32, [1], raw_dims=b"\x81\x00"))
    yield _case("params-cut", "TRUNCATED", "QUANT's scale and offset cut short",
                body(3, 0, 3, F32, [1], q[:9]))
    yield _case("too-large-first", "TOO_LARGE", "2000 float32 over a 4096-byte budget, and "
                "17 bits: the budget is checked before the codec's fields", body(
                    3, 0, 17, F32, [2000], q), gaps=[8])
    yield _case("bits-17", "MALFORMED", "QUANT with 17 bits", body(3, 0, 17, F32, [1], q))
    yield _case("scale-0", "MALFORMED", "QUANT scale 0", body(3, 0, 3, F32, [1],
                                                              struct.pack("<dd", 0.0, 0.0)))
    yield _case("payload-short", "TRUNCATED", "QUANT 3 bits of 9 elements needs 6 bytes",
                body(3, 0, 3, F32, [9], q + bytes(5)))
    yield _case("payload-long", "MALFORMED", "a byte after the payload",
                body(3, 0, 3, F32, [9], q + bytes(7)))
    yield _case("lz4-ratio", "MALFORMED", "1 byte of LZ4 cannot hold 256 bytes",
                body(1, 1, 0, F32, [64], b"\x00"))
    yield _case("const-inexact", "MALFORMED", "CONST 0.1 is not a float32 value",
                body(4, 0, 0, F32, [2], struct.pack("<d", 0.1)))
    yield _case("quantz-level", "MALFORMED", "a QUANTZ level above 2^bits - 1",
                body(5, 0, 2, F32, [2], q + bytes([1, 4])))
    yield _case("ans-short", "TRUNCATED", "an ANS stream under 4 bytes",
                body(11, 0, 4, F32, [4], q + b"\x01\x02"))
    yield _case("ans-unknown-key", "MALFORMED", "an ANS table this side does not have",
                body(11, 0, 4, F32, [4], q + b"\xde\xad\xbe\xef\x01\x00" + bytes(4)))
    yield _case("latent-unknown-key", "MALFORMED", "a LATENT table this side does not have",
                body(12, 0, 0, F32, [1, 1, 2], b"\xde\xad\xbe\xef\x01\x00" + bytes(4)))


def _media_order() -> Iterator[dict[str, Any]]:
    image = (np.arange(64, dtype=np.float32).reshape(1, 1, 8, 8) / 63)
    png = pack(image, "png")
    head, params, payload = png[:12], png[12:20], png[20:]
    wave = pack(np.zeros(64, np.float32) + np.float32(0.25), "pcm16")
    small = pack((np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4) / 15), "f32")
    g = [8]
    yield _case("png-flags", "MALFORMED", "flags 1 on PNG, [1,1,64,64] over the budget: the "
                "flags first", body(8, 1, 8, F32, [1, 1, 64, 64], params + payload), gaps=g)
    yield _case("png-int-over-budget", "TOO_LARGE", "int32 [1,1,64,64] over the budget: the "
                "budget before the dtype check", body(8, 0, 8, 6, [1, 1, 64, 64],
                                                      params + payload), gaps=g)
    yield _case("png-int", "MALFORMED", "PNG needs a float dtype", body(8, 0, 8, 6, [1, 1, 8, 8],
                                                                       params + payload), gaps=g)
    yield _case("png-shape", "MALFORMED", "[1,1,4,4] is not image-like (H, W >= 8), with bits "
                "7 too: the shape first", body(8, 0, 7, F32, [1, 1, 4, 4], params + payload),
                gaps=g)
    yield _case("png-bits", "MALFORMED", "PNG with bits 7", png[:5] + b"\x07" + png[6:], gaps=g)
    yield _case("png-params-cut", "TRUNCATED", "PNG's scale and offset cut short", head
                + params[:5], gaps=g)
    yield _case("png-scale-nan", "MALFORMED", "a NaN scale, and no payload: the parameters "
                "before the payload", head + struct.pack("<ff", float("nan"), 0.0), gaps=g)
    yield _case("png-no-payload", "TRUNCATED", "PNG without a payload", head + params, gaps=g)
    yield _case("png-size", "MALFORMED", "a 4x4 PNG file in a header that declares 8x8, "
                "refused from the file's own header", head + params
                + pack(np.zeros((1, 1, 4, 4), np.float32) + np.float32(0.5), "png")[20:],
                gaps=g, needs="png")
    yield _case("png-garbage", "MALFORMED", "a payload that is no PNG file",
                head + params + b"not a png file", gaps=g, needs="png")
    yield _case("pcm16-short", "TRUNCATED", "PCM16 payload of 127 bytes for 64 samples",
                wave[:-1], gaps=g)
    yield _case("pcm16-long", "MALFORMED", "PCM16 payload of 129 bytes for 64 samples",
                wave + b"\x00", gaps=g)
    yield _case("small-lossless", "ok", "(for contrast) the same 4x4 map LOSSLESS",
                small, spec="f32")


def packed_cases() -> Iterator[dict[str, Any]]:
    yield from _valid()
    yield from _header_order()
    yield from _media_order()
