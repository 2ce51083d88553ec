"""Which runtime runs a slice: onnxruntime, or LiteRT on the bundle's ``.tflite`` twin.

A runtime is asked for per device (``PlacementOptions.runtime`` for the wearable's stages,
``coinf handheld --runtime`` / ``PlacementOptions.handheld_runtime`` for a handheld's tails) as
``onnxruntime``, ``litert`` or ``auto``, and resolved per slice:

- ``onnxruntime``: always.
- ``litert``: the TFLite slice when the bundle ships one for that slice (``coinf convert tflite``
  verified it) and a LiteRT runtime is installed; a slice left out of the TFLite set runs on
  onnxruntime (the plan shows it).
- ``auto``: whichever was faster for that slice in the device's profile (``coinf profile``
  measures both); onnxruntime when the profile has no LiteRT time for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coinf.bundle import Bundle, Candidate
from coinf.deps import litert_interpreter, litert_package
from coinf.errors import BundleError, InputError

ONNXRUNTIME = "onnxruntime"
LITERT = "litert"
RUNTIMES = (ONNXRUNTIME, LITERT)
REQUESTS = (*RUNTIMES, "auto")
#: profile key suffix of a runtime's slice time (``head_ms`` for onnxruntime, ``head_ms_litert``)
SUFFIX = {ONNXRUNTIME: "", LITERT: "_litert"}


def tflite_entry(cand: Candidate, part: str) -> dict[str, Any] | None:
    """The manifest record of ``cand``'s verified TFLite ``part`` (None when there is none)."""
    rec = cand.extra.get("tflite")
    entry = rec.get(part) if isinstance(rec, dict) else None
    if not isinstance(entry, dict) or "error" in entry or "inputs" not in entry:
        return None
    return entry


def has_tflite(bundle: Bundle) -> bool:
    return any(tflite_entry(c, p) is not None for c in bundle.candidates for p in ("head", "tail"))


def check_runtime(requested: str, bundle: Bundle, what: str = "runtime") -> str:
    """Validate a requested runtime before any work: a known name; for ``litert``, a bundle with
    TFLite slices and a LiteRT runtime installed."""
    if requested not in REQUESTS:
        raise InputError(f"{what} must be one of {', '.join(REQUESTS)}, got {requested!r}")
    if requested == LITERT:
        if not has_tflite(bundle):
            raise BundleError(f"{what}='litert' but bundle {bundle.root} has no TFLite slices; "
                              f"add them with `coinf convert tflite {bundle.root}`")
        litert_interpreter()  # MissingDependency naming the packages
    return requested


def measured_ms(profile: Any, identity: str, cid: str, part: str, runtime: str,
                ) -> float | None:
    """A profile's measured time of one slice under ``runtime`` (None when not measured)."""
    models = getattr(profile, "models", None) or {}
    mp = models.get(identity)
    if mp is None:
        return None
    value = mp.candidates.get(cid, {}).get(f"{part}_ms{SUFFIX[runtime]}")
    return None if value is None else float(value)


def resolve(requested: str, bundle: Bundle, cand: Candidate, part: str,
            profile: Any = None, have_litert: bool | None = None) -> str:
    """The runtime that runs ``cand``'s ``part`` (``head``/``tail``) on this device."""
    if requested == ONNXRUNTIME or tflite_entry(cand, part) is None:
        return ONNXRUNTIME
    if have_litert is None:
        have_litert = litert_package() is not None
    if not have_litert:
        return ONNXRUNTIME
    if requested == LITERT:
        return LITERT
    ort = measured_ms(profile, bundle.identity, cand.id, part, ONNXRUNTIME)
    lite = measured_ms(profile, bundle.identity, cand.id, part, LITERT)
    return LITERT if ort is not None and lite is not None and lite < ort else ONNXRUNTIME


def resolved_ms(profile: Any, identity: str, cand: Candidate, part: str, runtime: str,
                ) -> float | None:
    """The measured time of the slice under the runtime that will run it (× slowdown)."""
    ms = measured_ms(profile, identity, cand.id, part, runtime)
    return None if ms is None else ms * float(getattr(profile, "slowdown", 1.0))


def open_litert(bundle: Bundle, cand: Candidate, part: str, threads: int = 0) -> Any:
    """A :class:`~coinf.convert.litert.LiteRTSlice` of ``cand``'s verified TFLite ``part``."""
    from coinf.convert.litert import LiteRTSlice

    entry = tflite_entry(cand, part)
    if entry is None:
        raise BundleError(f"candidate {cand.id} has no verified TFLite {part}")
    file = entry.get("file")
    return LiteRTSlice(bundle.path(str(file)) if file else None, entry, threads)


def litert_times(bundle: Bundle, cand: Candidate, part: str, feeds: Mapping[str, Any],
                 threads: int = 1, warmup: int = 2, repeats: int = 5) -> dict[str, float]:
    """``{"<part>_ms_litert": median ms}`` of the slice's TFLite twin on ``feeds`` (the ONNX
    slice's random inputs), or ``{}`` when there is no twin or no LiteRT runtime here."""
    from coinf.device.sweep import time_session

    if tflite_entry(cand, part) is None or litert_package() is None:
        return {}
    sess = open_litert(bundle, cand, part, threads)
    return {f"{part}_ms{SUFFIX[LITERT]}": time_session(sess, dict(feeds), warmup, repeats, 5.0)}
