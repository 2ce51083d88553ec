"""Built-in compute models of the default devices, used when no measured profile exists.

:class:`OpRates` gives effective fp32 throughput per kernel group (onnxruntime, the default
thread count of the device) plus a cost per kernel and per run, so an unprofiled device is
planned per op type instead of with one flat GFLOP/s figure. Every number is an *estimate*;
docs/PLANNER.md ("Default profiles") lists where each comes from. ``coinf profile`` replaces
them with measurements.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from coinf.device.features import FREE_OPS, NodeFeatures

#: kernel groups with a rate of their own; every other kind uses ``memory_gflops`` (element ops)
GROUPS = ("conv", "conv_pw", "conv_dw", "gemm", "rnn")


@dataclass(frozen=True)
class OpRates:
    """Effective GFLOP/s per kernel group and fixed costs (ms)."""

    conv_gflops: float        # dense k x k convolution
    conv_pw_gflops: float     # 1 x 1 (pointwise) convolution
    conv_dw_gflops: float     # depthwise convolution (memory-bound)
    gemm_gflops: float        # Gemm / MatMul at batch 1 (weight-streaming, memory-bound)
    rnn_gflops: float         # LSTM / GRU
    memory_gflops: float      # element-wise, pooling, norm, copies: elements (flops) per ns
    kernel_ms: float          # dispatch cost of each kernel
    run_ms: float             # cost of one session run

    def __post_init__(self) -> None:
        for k, v in asdict(self).items():
            lo = 0.0 if k.endswith("_ms") else 1e-6
            if not isinstance(v, (int, float)) or not lo <= v < 1e6:
                raise ValueError(f"op rates: {k} must be a number >= {lo:g}, got {v!r}")

    def rate(self, f: NodeFeatures) -> float:
        if f.kind == "conv":
            if f.tree[3]:
                return self.conv_dw_gflops
            return self.conv_pw_gflops if f.tree[1] <= 1 else self.conv_gflops
        return {"gemm": self.gemm_gflops, "rnn": self.rnn_gflops}.get(f.kind,
                                                                       self.memory_gflops)

    def node_ms(self, f: NodeFeatures) -> float:
        """One node's time: 0 for metadata ops and nodes fused into the one before them."""
        if f.op_type in FREE_OPS or f.fused:
            return 0.0
        return f.flops / (self.rate(f) * 1e6) + self.kernel_ms

    def node_map(self, feats: Iterable[NodeFeatures]) -> dict[str, float]:
        return {f.name: self.node_ms(f) for f in feats}

    def model_ms(self, feats: Iterable[NodeFeatures]) -> float:
        """A whole model: every node plus one run."""
        return sum(self.node_ms(f) for f in feats) + self.run_ms

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Any) -> OpRates:
        try:
            return cls(**{k: float(obj[k]) for k in cls.__dataclass_fields__})
        except (KeyError, TypeError) as exc:
            raise ValueError(f"op rates need {list(cls.__dataclass_fields__)}: {exc}") from None


# Raspberry Pi Zero 2 W: RP3A0 (BCM2710A1), 4x Cortex-A53 @ 1 GHz, NEON, 512 MB LPDDR2.
# Peak fp32 ~16 GFLOP/s (4 cores x 1 GHz x 4 FLOP/cycle: a 128-bit FMLA issues every other
# cycle on the A53's 64-bit NEON datapath). Dense convolutions in onnxruntime/MLAS reach roughly
# a fifth of peak with 4 threads; depthwise convolutions, batch-1 Gemm and element-wise ops are
# bound by LPDDR2 bandwidth (~1-2 GB/s effective). Estimates: see docs/PLANNER.md.
PI_ZERO_2W_RATES = OpRates(conv_gflops=3.0, conv_pw_gflops=2.5, conv_dw_gflops=0.5,
                           gemm_gflops=0.8, rnn_gflops=1.0, memory_gflops=0.2,
                           kernel_ms=0.02, run_ms=0.15)

# A laptop-class handheld: 4 cores with AVX2/FMA at ~3 GHz (peak ~380 GFLOP/s fp32); effective
# rates set below what one core of this project's x86 dev machine measured in context
# (docs/BENCHMARKS.md, "`bench predict`"), leaving room for a thermally limited ultrabook.
LAPTOP_RATES = OpRates(conv_gflops=50.0, conv_pw_gflops=35.0, conv_dw_gflops=8.0,
                       gemm_gflops=8.0, rnn_gflops=15.0, memory_gflops=1.5,
                       kernel_ms=0.004, run_ms=0.03)
