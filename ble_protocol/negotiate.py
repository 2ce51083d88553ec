"""What each side decodes, and the nearest packing a peer can take (docs/PROTOCOL.md §6.5).

Both session handshake messages carry ``decoders``: the names of the packings and of the
general-purpose entropy stages the sender decodes. :func:`decodable` is this side's list,
:func:`peer_set` reads a peer's (normalised, so that a protocol-2 peer from before the
entropy stages were listed reads right), and :func:`fit` maps a packing to the nearest one a
peer decodes **without changing a decoded value**: ``ansN`` -> ``qzN`` -> ``qN`` (the same
quantization levels, only their entropy coding differs). A standard codec (``jpeg``...) has no
such substitute: :func:`fit` leaves it and :func:`missing` says why.

Names (every one a peer may list):

* mandatory, every protocol-2 peer decodes them: ``raw``, ``f32``, ``f16``, ``q`` (QUANT and
  CONST) and ``lz4`` (flag bit 0 of QUANT, LOSSLESS and HALF bodies);
* optional: ``zstd`` (the ``zstandard`` library: QUANTZ bodies with flag bit 1), ``qz``
  (QUANTZ; listed with ``zstd``), ``ans`` (ANS; only with the same entropy tables: HELLO_ACK
  ``priors``), ``latent`` (LATENT: a learned compressor's code under its own table, which the
  bundle identity covers), and the standard codecs whose libraries are importable (``jpeg``,
  ``webp``, ``png``, ``pcm16``, ``flac``). A learned code a peer cannot take as ``latent`` goes
  as ``f32``: the very same integers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coinf.ble_protocol import codecs, media, priors
from coinf.ble_protocol.packing import PackSpec

#: what every protocol-2 peer decodes, listed or not
MANDATORY = frozenset({"raw", "f32", "f16", "q", "lz4"})
#: what a peer that sends no ``decoders`` list decodes (protocol 2 before codec packings)
LEGACY_DECODERS = frozenset({"f16", "f32", "q", "qz", "raw"})
#: the most entries of a peer's list that are read
MAX_LISTED = 64


def decodable() -> list[str]:
    """This side's ``decoders``: the mandatory names, ``qz`` and ``zstd`` when ``zstandard``
    is installed, ``ans`` when a loaded bundle has entropy priors, then the installed standard
    codecs, sorted."""
    return ["f16", "f32", "latent", "q", "raw", "lz4"] + (
        ["qz", "zstd"] if codecs.AVAILABLE else []) + (
        ["ans"] if priors.available() else []) + sorted(media.available())


def peer_set(listed: Any, same_priors: bool = True) -> frozenset[str]:
    """A peer's ``decoders`` value as a set: the first :data:`MAX_LISTED` string entries (not
    a list: :data:`LEGACY_DECODERS`), plus the mandatory names; ``qz`` implies ``zstd`` (a
    peer from before ``zstd`` was listed lists ``qz`` exactly when it has zstandard); ``ans``
    is dropped unless ``same_priors`` (its tables are the sender's)."""
    if isinstance(listed, list):
        names = {x for x in listed[:MAX_LISTED] if isinstance(x, str)}
    else:
        names = set(LEGACY_DECODERS)
    names |= MANDATORY
    if "qz" in names:
        names.add("zstd")
    if not same_priors:
        names.discard("ans")
    return frozenset(names)


def hello_decoders(hello: Mapping[str, Any] | None, priors_digest: str | None
                   ) -> frozenset[str]:
    """What the sender of handshake message ``hello`` decodes; ``ans`` only when its
    ``priors`` equal ``priors_digest`` (this side's entropy tables)."""
    hello = hello or {}
    same = priors_digest is not None and hello.get("priors") == priors_digest
    return peer_set(hello.get("decoders"), same)


def needs(spec: PackSpec) -> frozenset[str]:
    """The names a peer must decode to take ``spec`` as it is."""
    codec = spec.codec
    if codec == "qz":
        return frozenset({"qz", "zstd"})
    if codec in ("q", "f16", "f32"):
        return frozenset({codec, "lz4"})
    return frozenset({codec})


def missing(spec: PackSpec, decoders: frozenset[str]) -> str | None:
    """Why a peer decoding ``decoders`` cannot take ``spec``, or None when it can."""
    lack = sorted(needs(spec) - decoders - MANDATORY)
    if not lack:
        return None
    if lack == ["ans"]:
        return "the handheld cannot decode ans (it has other entropy tables, or none)"
    have = ", ".join(sorted(decoders))
    return f"the handheld cannot decode {', '.join(lack)} (it decodes {have})"


def fit(spec: PackSpec, decoders: frozenset[str]) -> tuple[PackSpec, str | None]:
    """The nearest packing to ``spec`` the peer decodes with the same decoded values, and why
    it differs (None: ``spec`` itself). ``ansN`` -> ``qzN`` -> ``qN``, ``latent`` -> ``f32``; a
    standard codec the
    peer lacks is returned unchanged (no exact substitute: the caller refuses it)."""
    out, why = spec, None
    if out.codec == "latent" and "latent" not in decoders:  # the same integers, exactly
        return PackSpec("f32"), f"{spec} sent as f32: {missing(out, decoders)}"
    if out.codec == "ans" and "ans" not in decoders:
        why = missing(out, decoders)
        out = PackSpec("qz", out.bits)
    if out.codec == "qz" and not needs(out) <= decoders | MANDATORY:
        why = why or missing(out, decoders)
        out = PackSpec("q", out.bits)
    return out, (f"{spec} sent as {out}: {why}" if why else None)


__all__ = ["LEGACY_DECODERS", "MANDATORY", "MAX_LISTED", "decodable", "fit", "hello_decoders",
           "missing", "needs", "peer_set"]
