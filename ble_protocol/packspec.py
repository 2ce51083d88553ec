"""A packing spec: the codec (and its bits or quality) one tensor is packed with, by name.

The short names (``q4``, ``qz4``, ``ans4``, ``f16``, ``f32``, ``raw``, ``jpeg-q90``,
``webp-q75``, ``webp-ll``, ``png``, ``pcm16``, ``flac``, ``latent``) are the ones
docs/PACKING.md and the packing spec fields of the wire (docs/PROTOCOL.md §6.7) use;
:func:`ble_protocol.packing.pack` packs a tensor with one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from coinf.ble_protocol import media, priors

#: QUANT and QUANTZ levels have at most this many bits
MAX_BITS = 16

_SPEC_RE = re.compile(
    r"^(?:(qz?|ans)(\d{1,2})|(jpeg|webp)-?q(\d{1,3})|f32|f16|raw|lossless|half|png|webp-ll"
    r"|pcm16|flac|latent)$")
SPEC_NAMES = "q1..q16, qz1..qz16, ans1..ans8, f16, f32, raw, jpeg-q1..jpeg-q100, " \
    "webp-q1..webp-q100, webp-ll, png, pcm16, flac or latent"


@dataclass(frozen=True)
class PackSpec:
    """How to pack a tensor: ``codec`` is ``"q"`` or ``"qz"`` (quantized levels + zstd; both with
    ``bits`` 1..16), ``"ans"`` (levels + rANS, ``bits`` 1..8, with ``priors``: a
    :class:`~ble_protocol.priors.TensorPriors` or its key; without, it packs as ``qz``),
    ``"f32"``, ``"f16"``, ``"raw"``, or a standard codec
    (:mod:`ble_protocol.media`): ``"jpeg"``/``"webp"`` with ``quality`` 1..100, ``"png"``,
    ``"pcm16"``, ``"flac"``. ``str(spec)`` and :meth:`parse` use the short names ``q4``,
    ``qz4``, ``f16``, ``f32``, ``raw``, ``jpeg-q90``, ``webp-q75``, ``png``, ``pcm16``,
    ``flac``."""

    codec: str
    bits: int | None = None
    quality: int | None = None
    #: a standard codec's calibrated value range, per channel ``(lo, hi)`` (images) or one
    #: ``(-peak, peak)`` (audio); None = this input's own range. Not part of the name.
    ranges: tuple[tuple[float, float], ...] | None = field(default=None, compare=False)
    priors: Any = field(default=None, compare=False)  # ans: the tensor's calibrated table

    def __post_init__(self) -> None:
        if self.codec == "webp" and self.quality is None and not self.bits:
            return  # lossless WebP (webp-ll)
        if self.codec in media.QUALITY:
            if not isinstance(self.quality, int) or not 1 <= self.quality <= 100 or self.bits:
                raise ValueError(f"packing {self.codec!r} needs a quality in 1..100 and no "
                                 f"bits, got quality {self.quality}")
            return
        if self.quality is not None:
            raise ValueError(f"packing {self.codec!r} takes no quality (got {self.quality})")
        if self.codec in ("q", "qz", "ans"):
            top = priors.MAX_BITS if self.codec == "ans" else MAX_BITS
            if not isinstance(self.bits, int) or not 1 <= self.bits <= top:
                raise ValueError(f"{self.codec} packing needs bits in 1..{top}, got {self.bits}")
        elif self.codec in ("f32", "f16", "raw", "png", "pcm16", "flac", "latent"):
            if self.bits is not None:
                raise ValueError(f"packing {self.codec!r} takes no bits (got {self.bits})")
        else:
            raise ValueError(f"unknown packing codec {self.codec!r}; expected q, qz, ans, f32, "
                             "f16, raw, jpeg, webp, png, pcm16, flac or latent")

    def __str__(self) -> str:
        if self.codec == "webp" and self.quality is None:
            return "webp-ll"
        if self.codec in media.QUALITY:
            return f"{self.codec}-q{self.quality}"
        return f"{self.codec}{self.bits}" if self.codec in ("q", "qz", "ans") else self.codec

    @property
    def is_media(self) -> bool:
        """A standard image or audio codec (:mod:`ble_protocol.media`)."""
        return self.codec in media.WIRE

    @property
    def sample_bits(self) -> int:
        """Bits per value before any entropy coding (a calibration row's ``bits``)."""
        if self.bits is not None:
            return self.bits
        return {"f16": 16, "pcm16": 16, "flac": 16}.get(
            self.codec, 8 if self.codec in media.IMAGE else 32)

    @property
    def lossless(self) -> bool:
        return self.codec in ("f32", "raw")

    @classmethod
    def parse(cls, text: str | int) -> PackSpec:
        """``"q4"``/``4`` -> 4-bit; ``"qz4"`` -> 4-bit + zstd; ``"f16"``/``"half"``;
        ``"f32"``/``"lossless"``; ``"raw"``; ``"jpeg-q90"``, ``"webp-q75"``, ``"png"``,
        ``"pcm16"``, ``"flac"``."""
        if isinstance(text, int) and not isinstance(text, bool):
            return cls("q", text)
        m = _SPEC_RE.match(str(text).strip().lower())
        if not m:
            raise ValueError(f"bad packing {text!r}; expected {SPEC_NAMES}")
        if m.group(1) is not None:
            return cls(m.group(1), int(m.group(2)))
        if m.group(3) is not None:
            return cls(m.group(3), quality=int(m.group(4)))
        name = m.group(0)
        if name == "webp-ll":
            return cls("webp")
        return cls({"lossless": "f32", "half": "f16"}.get(name, name))


LOSSLESS_SPEC = PackSpec("f32")


__all__ = ["LOSSLESS_SPEC", "MAX_BITS", "SPEC_NAMES", "PackSpec"]
