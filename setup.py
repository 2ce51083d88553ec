"""Everything about the package is in setup.cfg; this file only adds the Pi's lean wheel.

``make wheel`` builds the full wheel (the laptop's). ``make wheel-pi`` sets ``COINF_WHEEL=pi``
and builds the wheel a Pi Zero 2 W installs (docs/DEPLOY.md): the same packages minus what
the wearable runtime never imports -- the benchmarks (``coinf.cli.bench``), the latency-
prediction research (``coinf.research``), the zoo's PyTorch builders, the bottleneck trainer
(``coinf.convert.bottleneck_train``, with its tail normaliser ``coinf.convert.torchable*``)
and the committed zoo ONNX files (``coinf.models`` keeps its registry and the digits data,
which calibration reads).
``coinf bench`` and ``coinf models build`` on such an install say so in one line
(``coinf.deps.PI_LEFT_OUT``); ``make test-arm`` installs and tests this wheel.
"""

from __future__ import annotations

import os

from setuptools import setup
from setuptools.command.build_py import build_py

#: packages the Pi wheel leaves out, with their subpackages
PI_DROP_PACKAGES = ("coinf.cli.bench", "coinf.research")
#: modules the Pi wheel leaves out: the zoo builders, which import torch
PI_DROP_MODULES = frozenset({
    "coinf.models.architectures", "coinf.convert.compressor_set", "coinf.models.compressors",
    "coinf.models.digitnet", "coinf.models.export", "coinf.models.large",
    "coinf.models.pruning", "coinf.models.sequence", "coinf.models.training",
    "coinf.convert.bottleneck_train", "coinf.convert.bottleneck_nets", "coinf.convert.torchable",
    "coinf.convert.torchable_ops", "coinf.convert.torchable_resize",
})


def _dropped(package: str) -> bool:
    return any(package == p or package.startswith(p + ".") for p in PI_DROP_PACKAGES)


class PiBuildPy(build_py):
    """build_py without the dropped packages, modules and package data (models/onnx)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.packages = [p for p in self.packages or [] if not _dropped(p)]
        self.package_data = {}

    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if f"{m[0]}.{m[1]}" not in PI_DROP_MODULES]


if os.environ.get("COINF_WHEEL", "full") == "pi":
    setup(cmdclass={"build_py": PiBuildPy})
elif os.environ.get("COINF_WHEEL", "full") == "full":
    setup()
else:
    raise SystemExit(f"COINF_WHEEL={os.environ['COINF_WHEEL']!r}: expected 'full' or 'pi'")
