"""``bench rate``'s learned points: every learned bottleneck of the bundle (``coinf compress``),
measured as it runs: head -> encoder -> the ``latent`` packing (rANS under its table) -> decoder
-> tail, on the same inputs and with the same task metric as the codecs and packings.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def learned_points(bundle: Any, data: Any, metric: Any, tolerance: float) -> list[dict[str, Any]]:
    """One point (family ``learned``) per learned compressor: mean packed bytes of the code,
    the metric's mean loss against the uncompressed model (pp) and its 95 % upper bound, the
    latent coder's median encode and decode ms."""
    from coinf.ble_protocol.packing import PackSpec, pack, unpack
    from coinf.convert.compressors import CodecRunner
    from coinf.convert.metrics import upper_bound_pp
    from coinf.convert.packcal import Runner

    learned = [c for c in bundle.compressors() if c.kind == "learned" and c.priors]
    if not learned:
        return []
    codecs = CodecRunner(bundle)
    outputs = [t.name for t in bundle.outputs]
    wanted = list(metric.outputs) or outputs[:1]
    whole = Runner(bundle, next(c for c in bundle.candidates if c.is_handheld_only))
    refs = [whole.run_tail(whole.run_head(data.feed(i))) for i in range(len(data))]
    points = []
    for comp in learned:
        cand = bundle.candidate(comp.candidate)
        runner = Runner(bundle, cand)
        spec = PackSpec("latent", priors=codecs.latent_tables[(comp.candidate, comp.gamma)])
        sizes, losses, enc, dec = [], [], [], []
        for i in range(len(data)):
            crossing = runner.run_head(data.feed(i))
            code = codecs.encode(comp, crossing)["code"]
            t0 = time.perf_counter()
            body = pack(code, spec)
            t1 = time.perf_counter()
            restored = codecs.decode(comp, {"code": unpack(body, max_bytes=comp.code.nbytes)})
            dec.append((time.perf_counter() - t1) * 1e3)
            enc.append((t1 - t0) * 1e3)
            sizes.append(len(body))
            out = runner.run_tail(restored)
            label = None if data.labels is None else int(data.labels[i])
            losses.append(metric.loss([refs[i][m] for m in wanted], [out[m] for m in wanted],
                                      label))
        total = max(cand.head.flops + cand.tail.flops, 1)
        arr = np.asarray(losses, np.float64)
        points.append({
            "family": "learned", "cut": cand.id, "label": cand.label,
            "wearable_share": round((cand.head.flops + comp.flops) / total, 4),
            "packing": f"g{comp.gamma}+latent", "method": "learned (latent, rANS)",
            "lambda": comp.lam, "bytes": float(np.mean(sizes)),
            "quality_loss": round(100.0 * float(arr.mean()), 4),
            "quality_loss_bound": round(upper_bound_pp(arr, 0.95), 4),
            "encode_ms": round(float(np.median(enc)), 3),
            "decode_ms": round(float(np.median(dec)), 3),
            "encoder_mflops": round(comp.flops / 1e6, 2)})
    return points


__all__ = ["learned_points"]
