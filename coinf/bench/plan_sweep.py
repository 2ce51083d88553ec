"""``coinf bench plan-sweep``: :mod:`coinf.bench.plan` over bundles x bandwidths x slowdowns."""

from coinf.bench.plan import register_sweep as register

__all__ = ["register"]
