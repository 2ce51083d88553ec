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


def undecodable(spec: str, peer_decoders: frozenset[str] | None, cand: Any = None,
                peer_compressors: frozenset[tuple[str, int]] | None = None) -> str | None:
    """Why configuration ``spec`` cannot be sent: this wearable cannot encode it (a codec
    library missing; for ``ansN`` at ``cand``, a priors table its calibration row names), the
    handheld cannot decode it (:func:`coinf.ble_protocol.negotiate.missing`) or lacks its
    compressor (``peer_compressors``: HELLO_ACK ``compressors``, None = all); None when it
    can."""
    from coinf.ble_protocol import media, negotiate
    from coinf.ble_protocol.packing import PackSpec

    gamma, packing = parse_config_spec(spec)
    codec = PackSpec.parse(packing).codec
    if codec in media.WIRE and codec not in media.available():
        return f"this device cannot encode {codec}: {media.INSTALL}"
    if codec == "ans" and cand is not None:
        from coinf.convert.entropy_cal import missing_priors

        missing = missing_priors(cand, packing)
        if missing:
            return f"this device lacks the entropy priors of {packing} ({missing})"
    if gamma and cand is not None and peer_compressors is not None \
            and (cand.id, gamma) not in peer_compressors:
        return f"the handheld has no compressor g{gamma} at {cand.id}"
    if peer_decoders is None:
        return None
    return negotiate.missing(PackSpec.parse(packing), peer_decoders)


def peer_decoders(hello_ack: Mapping[str, Any] | None, priors: str | None) -> frozenset[str]:
    """The packings and entropy stages the handheld decodes: its HELLO_ACK ``decoders``
    (:func:`coinf.ble_protocol.negotiate.peer_set`), without ``ans`` unless its ``priors``
    are this bundle's (``priors``: :attr:`coinf.bundle.Bundle.priors_digest`)."""
    from coinf.ble_protocol.negotiate import MAX_LISTED

    ack = hello_ack or {}
    got = ack.get("decoders")
    listed = tuple(x for x in got[:MAX_LISTED] if isinstance(x, str)) \
        if isinstance(got, list) else None
    return _decoders(listed, priors is not None and ack.get("priors") == priors)


def peer_compressors(hello_ack: Mapping[str, Any] | None
                     ) -> frozenset[tuple[str, int]] | None:
    """The compressors the handheld decodes, as (cut, gamma) (HELLO_ACK ``compressors``:
    ``{"cut": "c002", "gamma": 4}`` objects; an entry of another shape is ignored); None
    when it lists none (a peer from before the list: every compressor of the bundle)."""
    got = (hello_ack or {}).get("compressors")
    if not isinstance(got, list):
        return None
    return frozenset((x["cut"], x["gamma"]) for x in got[:1024]
                     if isinstance(x, dict) and isinstance(x.get("cut"), str)
                     and type(x.get("gamma")) is int)


@functools.lru_cache(maxsize=64)
def _decoders(listed: tuple[str, ...] | None, same_priors: bool) -> frozenset[str]:
    """(Called for every frame: cached per HELLO_ACK's list.)"""
    from coinf.ble_protocol.negotiate import peer_set

    return peer_set(list(listed) if listed is not None else None, same_priors)


def check_decodable(packing: Any, decoders: frozenset[str]) -> None:
    """Refuse, before anything is sent, a packing the handheld cannot decode and that has no
    exact substitute (a standard codec fixed by the caller; the planner never picks one).
    ``qzN`` and ``ansN`` are not refused: the executor sends them as the nearest packing the
    handheld decodes (:func:`coinf.ble_protocol.negotiate.fit`)."""
    from coinf.ble_protocol.negotiate import fit, missing

    why = missing(fit(packing, decoders)[0], decoders)
    if why is not None:
        from coinf.errors import InputError

        raise InputError(f"packing {packing} cannot be sent: {why} (install coinf[codecs] "
                         f"there, or choose another packing)")
