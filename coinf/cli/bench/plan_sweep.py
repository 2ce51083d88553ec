"""``coinf bench plan-sweep``: :mod:`coinf.cli.bench.plan` over bundles x bandwidths x slowdowns."""

from coinf.cli.bench.plan import register_sweep as register

__all__ = ["register"]
