"""What packing costs and who can take it: the planner's packed configurations.

A packed configuration (``c000~jpeg-q90``, ``c003~qz6``, ``c002~ans4``) costs the wearable its
packing and the handheld its unpacking. Packing is not DNN compute: quantizing, bit shuffling,
LZ4/zstd, rANS and the media encoders are integer and memory-bound work, which a Pi Zero 2 W
core does about ``CODEC_SLOWDOWN`` times slower than one x86-64 core, whatever its (much
larger) slowdown on convolutions. Each side's time is what its profile measured (``coinf
profile --bundle``, :func:`coinf.convert.codec_speed.codec_times`), stretched as an emulated device
stretches packing (:func:`packing_stretch`), else the calibrating machine's time (the calibration
row's ``encode_ms``/``decode_ms``), the encoding scaled by :func:`codec_factor`; a row calibrated
before packings were timed falls back to :func:`estimated_pack_ms`. A configuration this
wearable cannot encode or the handheld does not decode (its HELLO_ACK ``decoders``) is never
offered; a packing fixed by the caller is refused before sending (:func:`check_decodable`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

#: packing work (a standard codec, quantize + shuffle + LZ4, rANS) on the wearable over its time
#: where it was calibrated (one x86-64 core): an estimate for a 1 GHz Cortex-A53, the same
#: ratio ``coinf bench pack --pi-slowdown`` assumes; used until the device is profiled
CODEC_SLOWDOWN = 10.0


def parse_config_spec(spec: str) -> tuple[int | None, str]:
    """A configuration's spec -> (compressor gamma or None, packing): ``"q8"`` -> (None,
    "q8"), ``"g4"`` -> (4, "raw"), ``"g4+q8"`` -> (4, "q8")."""
    if spec.startswith("g") and spec[1:2].isdigit():
        gamma, _, packing = spec[1:].partition("+")
        return int(gamma), packing or "raw"
    return None, spec


def packing_stretch(slowdown: float, codec_slowdown: float = CODEC_SLOWDOWN) -> float:
    """How much a device emulated ``slowdown`` x slower than this machine stretches packing
    done here: ``min(slowdown, codec_slowdown)`` (the executor's ``_pack``), 1 for a real one.
    A K x slower copy of this machine is K x slower at convolutions, but packing on the device
    it plays costs ``codec_slowdown`` x at most."""
    return min(max(float(slowdown), 1.0), codec_slowdown)


def is_packing_work(packing: str) -> bool:
    """Whether a packing (its name, ``q7``, or its ``PackSpec.codec``, ``q``) costs the
    wearable packing time: every one but ``raw``. The planner charges it (:func:`codec_ms`,
    :func:`estimated_pack_ms`) and an emulated wearable stretches it (:func:`packing_stretch`)
    for exactly these."""
    return packing != "raw"


def codec_factor(wearable: Any, codec_slowdown: float = CODEC_SLOWDOWN) -> float:
    """Packing time on the wearable over its calibrated time: ``codec_slowdown`` for a device
    profile (absolute rates), the emulation's stretch (:func:`packing_stretch`) for an emulated
    one (``slowdown`` > 1: a slower copy of this machine)."""
    k = float(wearable.slowdown)
    return packing_stretch(k, codec_slowdown) if k > 1 else codec_slowdown


def estimated_pack_ms(nbytes: float, wearable: Any, pack_mb_s: float,
                      codec_slowdown: float = CODEC_SLOWDOWN) -> float:
    """Packing time of ``nbytes`` of tensors on the wearable when no time was measured (a
    calibration from before packings were timed): ``pack_mb_s`` is a Pi Zero 2 W core's rate,
    so this machine packs ``codec_slowdown`` x faster and an emulated wearable stretches that
    by :func:`codec_factor`."""
    return nbytes / (pack_mb_s * 1e3) * codec_factor(wearable, codec_slowdown) / codec_slowdown


def calibrated_ms(cand: Any, spec: str) -> tuple[float, float] | None:
    """(encode ms, decode ms) the calibration row of packing ``spec`` measured (every packing
    calibrated since packings were timed; before, standard codecs and ``ansN`` only), else
    None."""
    from coinf.convert.calibrate import packing_rows

    for row in packing_rows(cand):
        if row.get("spec") == spec and "encode_ms" in row:
            return float(row["encode_ms"]), float(row.get("decode_ms", 0.0))
    return None


def codec_ms(planner: Any, cand: Any, spec: str) -> tuple[float, float] | None:
    """(wearable pack ms, handheld unpack ms) of configuration ``cand~spec``: each device's
    profiled time (stretched by :func:`packing_stretch` on an emulated device), else the
    calibrated one (an unpacking never timed counts 0); None when the wearable's packing was
    never timed (the planner estimates it, :func:`estimated_pack_ms`)."""
    calibrated = calibrated_ms(cand, spec)
    ident = planner.bundle.identity
    times: list[float | None] = []
    for prof, key, fallback in (
            (planner.wearable, f"encode_{spec}_ms", None if calibrated is None else
             calibrated[0] * codec_factor(planner.wearable, planner.codec_slowdown)),
            (planner.handheld, f"decode_{spec}_ms", None if calibrated is None
             else calibrated[1])):
        mp = prof.models.get(ident)
        got = None if mp is None else mp.candidates.get(cand.id, {}).get(key)
        times.append(fallback if got is None
                     else float(got) * packing_stretch(prof.slowdown, planner.codec_slowdown))
    return None if times[0] is None else (times[0], times[1] or 0.0)


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
