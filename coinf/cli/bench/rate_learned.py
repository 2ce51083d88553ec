"""``bench rate``'s learned points: every learned bottleneck of the bundle (``coinf compress``),
measured as it runs: head -> encoder -> the ``latent`` packing (rANS under its table) -> decoder
-> tail, on the same inputs, task metric and criterion (labels, or the stable inputs with the
noise floor) as the codecs and packings.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def learned_points(bundle: Any, data: Any, opts: Any) -> list[dict[str, Any]]:
    """One point (family ``learned``) per learned compressor, judged as the packings are
    (:func:`coinf.convert.packcal.judge_roundtrips`: same inputs, criterion and bound): mean
    packed bytes of the code, the loss (pp) and its 95 % upper bound, the latent coder's median
    encode and decode ms."""
    from coinf.ble_protocol.packing import PackSpec, pack, unpack
    from coinf.convert.compressors import CodecRunner
    from coinf.convert.packcal import judge_roundtrips

    learned = [c for c in bundle.compressors() if c.kind == "learned" and c.priors]
    if not learned:
        return []
    codecs = CodecRunner(bundle)
    points = []
    for cid in dict.fromkeys(c.candidate for c in learned):
        cand = bundle.candidate(cid)
        here = [c for c in learned if c.candidate == cid]

        def through(comp: Any) -> Any:
            spec = PackSpec("latent", priors=codecs.latent_tables[(comp.candidate, comp.gamma)])

            def roundtrip(crossing: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int,
                                                                     float, float]:
                code = codecs.encode(comp, crossing)["code"]
                t0 = time.perf_counter()
                body = pack(code, spec)
                t1 = time.perf_counter()
                restored = codecs.decode(comp, {"code": unpack(body,
                                                               max_bytes=comp.code.nbytes)})
                return restored, len(body), t1 - t0, time.perf_counter() - t1
            return roundtrip

        judged = judge_roundtrips(bundle, cand, data, opts,
                                  {str(c.gamma): through(c) for c in here})
        total = max(cand.head.flops + cand.tail.flops, 1)
        for comp in here:
            j = judged[str(comp.gamma)]
            points.append({
                "family": "learned", "cut": cand.id, "label": cand.label,
                "wearable_share": round((cand.head.flops + comp.flops) / total, 4),
                "packing": f"g{comp.gamma}+latent", "method": "learned (latent, rANS)",
                "lambda": comp.lam, "bytes": j["bytes"],
                "quality_loss": j["quality_loss"], "quality_loss_bound": j["quality_loss_bound"],
                "criterion": j["criterion"], "encode_ms": j["encode_ms"],
                "decode_ms": j["decode_ms"], "encoder_mflops": round(comp.flops / 1e6, 2)})
    return points


__all__ = ["learned_points"]
