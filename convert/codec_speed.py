"""How fast this device packs and unpacks each packing a cut was calibrated for: the
``encode_SPEC_ms`` / ``decode_SPEC_ms`` that ``coinf profile --bundle`` stores in the device
profile, and the planner prefers to the calibrating machine's times
(:mod:`coinf.wearable.planner.codec_costs`)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from coinf.ble_protocol import media, packing
from coinf.ble_protocol.media import image_layout
from coinf.convert.calibrate import packing_rows
from coinf.convert.entropy_cal import missing_priors
from coinf.convert.packcal import tensor_specs


def codec_times(cand: Any, repeats: int = 5) -> dict[str, float]:
    """``encode_SPEC_ms`` and ``decode_SPEC_ms`` of every packing the candidate was calibrated
    for (standard codecs this device has, ``ansN`` with its calibrated priors, ``qN``, ``qzN``,
    ``f16``, ...), on this device: the median of ``repeats`` packs and unpacks of a
    camera-like frame (smooth, with edges and noise) or a harmonic waveform of the crossing
    shapes, with the calibrated range. The planner prefers them to the calibrating machine's
    times."""
    out: dict[str, float] = {}
    rng = np.random.default_rng(0)
    for row in packing_rows(cand):
        spec = packing.PackSpec.parse(str(row.get("spec")))
        if spec.codec == "raw" or (spec.is_media and spec.codec not in media.available()):
            continue
        if spec.codec == "ans" and missing_priors(cand, str(spec)):
            continue  # its tables are not here: the planner does not offer it either
        specs = tensor_specs(cand, spec)
        tensors = {t.name: _sample(t.shape, t.dtype, rng) for t in cand.crossing}
        enc, dec = [], []
        for _ in range(max(repeats, 1)):
            t0 = time.perf_counter()
            bodies = [packing.pack(a, specs.get(n, spec)) for n, a in tensors.items()]
            t1 = time.perf_counter()
            for body in bodies:
                packing.unpack(body)
            enc.append(t1 - t0)
            dec.append(time.perf_counter() - t1)
        out[f"encode_{spec}_ms"] = float(np.median(enc)) * 1e3
        out[f"decode_{spec}_ms"] = float(np.median(dec)) * 1e3
    return out


def _sample(shape: tuple[int, ...], dtype: str, rng: Any) -> Any:
    """A tensor a codec works as hard on as on a real one: a smooth field with edges and
    noise, laid out as the image codecs read the shape (:func:`coinf.ble_protocol.media.
    image_layout`: ``[1,C,H,W]`` or ``[1,H,W,C]``), or over the last two axes of any other
    4-D tensor; harmonics (waveforms); random values otherwise."""
    def field(h: int, w: int) -> Any:
        yy, xx = np.meshgrid(np.linspace(0, 6, h), np.linspace(0, 6, w), indexing="ij")
        return np.sin(yy) * np.cos(xx * 1.3) + (xx > 3) * 0.8

    n = int(np.prod(shape))
    if len(shape) == 4:
        lay = image_layout(tuple(shape))
        if lay is not None:
            last, _, h, w = lay
            base = field(h, w)[:, :, None] if last else field(h, w)
        else:  # a feature map: smooth over its last two axes
            base = field(shape[-2], shape[-1])
        x = np.broadcast_to(base, shape) + 0.05 * rng.standard_normal(shape)
    elif n >= 64:
        t = np.arange(n) / 16000.0
        x = (0.3 * np.sin(2 * np.pi * 220 * t) + 0.1 * np.sin(2 * np.pi * 660 * t)
             + 0.01 * rng.standard_normal(n)).reshape(shape)
    else:
        x = rng.standard_normal(shape)
    return np.asarray(x, dtype=np.dtype(dtype))
