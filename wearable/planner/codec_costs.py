"""What a standard codec costs and who can take it: the planner's codec configurations.

A codec configuration (``c000~jpeg-q90``) costs the wearable its encoding and the handheld its
decoding. Each is what the device's profile measured (``coinf profile --bundle``,
:func:`coinf.device.profile.codec_times`), else the calibrating machine's time (the
calibration row's ``encode_ms``/``decode_ms``), the encoding scaled by :func:`codec_factor`.
A configuration this wearable cannot encode or the handheld does not decode (its HELLO_ACK
``decoders``) is never offered; a packing fixed by the caller is refused before sending
(:func:`check_decodable`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

#: a standard codec's encode time on the wearable over its time where it was calibrated (one
#: x86-64 core): an estimate for libjpeg-turbo/libwebp/libFLAC on a 1 GHz Cortex-A53, the same
#: ratio ``coinf bench pack --pi-slowdown`` assumes; used until the device is profiled
CODEC_SLOWDOWN = 10.0


def parse_config_spec(spec: str) -> tuple[int | None, str]:
    """A configuration's spec -> (compressor gamma or None, packing): ``"q8"`` -> (None,
    "q8"), ``"g4"`` -> (4, "raw"), ``"g4+q8"`` -> (4, "q8")."""
    if spec.startswith("g") and spec[1:2].isdigit():
        gamma, _, packing = spec[1:].partition("+")
        return int(gamma), packing or "raw"
    return None, spec


def codec_factor(wearable: Any, codec_slowdown: float = CODEC_SLOWDOWN) -> float:
    """A codec's encode time on the wearable over its calibrated time: ``codec_slowdown`` for a
    device profile (absolute rates), at most the profile's own slowdown for an emulated one (a
    K x slower copy of this machine stretches encoding the same way, wearable/core.py)."""
    k = float(wearable.slowdown)
    return min(k, codec_slowdown) if k > 1 else codec_slowdown


def calibrated_ms(cand: Any, spec: str) -> tuple[float, float] | None:
    """(encode ms, decode ms) a standard codec's calibration row measured, else None."""
    from coinf.convert.calibrate import packing_rows

    for row in packing_rows(cand):
        if row.get("spec") == spec and "encode_ms" in row:
            return float(row["encode_ms"]), float(row.get("decode_ms", 0.0))
    return None


def codec_ms(planner: Any, cand: Any, spec: str) -> tuple[float, float] | None:
    """(wearable encode ms, handheld decode ms) of configuration ``cand~spec``, None when
    ``spec`` is no calibrated codec: each device's profiled time, else the calibrated one."""
    calibrated = calibrated_ms(cand, spec)
    if calibrated is None:
        return None
    ident = planner.bundle.identity
    times = []
    for prof, key, fallback in (
            (planner.wearable, f"encode_{spec}_ms",
             calibrated[0] * codec_factor(planner.wearable, planner.codec_slowdown)),
            (planner.handheld, f"decode_{spec}_ms", calibrated[1])):
        mp = prof.models.get(ident)
        got = None if mp is None else mp.candidates.get(cand.id, {}).get(key)
        times.append(fallback if got is None else float(got) * prof.slowdown)
    return times[0], times[1]


def undecodable(spec: str, peer_decoders: frozenset[str] | None,
                cand: Any = None) -> str | None:
    """Why configuration ``spec`` cannot be sent: this wearable cannot encode it (a codec
    library missing; for ``ansN`` at ``cand``, a priors table its calibration row names) or
    the handheld cannot decode it; None when it can."""
    from coinf.ble_protocol import media
    from coinf.ble_protocol.packing import PackSpec

    packing = parse_config_spec(spec)[1]
    codec = PackSpec.parse(packing).codec
    if codec in media.WIRE and codec not in media.available():
        return f"this device cannot encode {codec}: {media.INSTALL}"
    if codec == "ans" and cand is not None:
        from coinf.convert.entropy_cal import missing_priors

        missing = missing_priors(cand, packing)
        if missing:
            return f"this device lacks the entropy priors of {packing} ({missing})"
    if peer_decoders is None or codec in peer_decoders:
        return None
    return f"the handheld cannot decode {codec} (it decodes {', '.join(sorted(peer_decoders))})"


def peer_decoders(hello_ack: Mapping[str, Any] | None, priors: str | None) -> frozenset[str]:
    """The packings the handheld decodes: its HELLO_ACK ``decoders`` (a peer that lists none:
    the packings before codec packings), without ``ans`` unless its ``priors`` are this
    bundle's (``priors``: :attr:`coinf.bundle.Bundle.priors_digest`)."""
    ack = hello_ack or {}
    got = ack.get("decoders")
    listed = tuple(got[:64]) if isinstance(got, list) else None
    same = priors is not None and ack.get("priors") == priors
    try:
        return _decoders(listed, same)
    except TypeError:  # an unhashable entry from the wire: read it the slow way
        return _decoders(tuple(map(str, listed or ())), same)


@functools.lru_cache(maxsize=64)
def _decoders(listed: tuple[Any, ...] | None, same_priors: bool) -> frozenset[str]:
    """(Called for every frame: cached per HELLO_ACK's list.)"""
    from coinf.ble_protocol.packing import LEGACY_DECODERS

    names = frozenset(map(str, listed)) if listed is not None else LEGACY_DECODERS
    return names if same_priors else names - {"ans"}


def check_decodable(packing: Any, hello_ack: Mapping[str, Any] | None,
                    priors: str | None = None) -> None:
    """Refuse, before anything is sent, a packing the handheld cannot decode (a packing fixed
    by the caller; the planner never picks one)."""
    names = peer_decoders(hello_ack, priors)
    if packing.codec not in names:
        from coinf.errors import InputError

        if packing.codec == "ans":
            raise InputError(f"packing {packing} cannot be sent: the handheld's bundle has "
                             f"other entropy tables, or none (coinf push this bundle there)")
        raise InputError(f"packing {packing} cannot be sent: the handheld decodes only "
                         f"{', '.join(sorted(names))} (install coinf[codecs] there, or choose "
                         f"another packing)")
