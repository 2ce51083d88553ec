"""Inference runtimes on this device: their versions, and the versions known to break it.

``coinf doctor`` reports them; ``setup.cfg`` excludes the known-bad ones from the install, and
``tests/test_wheels_aarch64.py`` checks that both lists agree.
"""

from __future__ import annotations

from importlib import metadata

#: (distribution, version) -> why it must not be used on the wearable
KNOWN_BAD: dict[tuple[str, str], str] = {
    ("onnxruntime", "1.21.0"): "dies with SIGILL at import on a Cortex-A53 such as the Pi Zero "
                               "2 W's (an ARMv8.2 FP16 instruction in a static initializer; "
                               "onnxruntime issue 23957); install another version",
}

#: distributions that can run a slice, in the order they are reported
RUNTIMES = ("onnxruntime", "ai-edge-litert", "tflite-runtime", "numpy")


def installed_versions() -> dict[str, str | None]:
    """Version of every runtime distribution, None when it is not installed."""
    out: dict[str, str | None] = {}
    for dist in RUNTIMES:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def known_bad(dist: str, version: str | None) -> str | None:
    """Why ``dist==version`` is known to break the wearable, or None."""
    return None if version is None else KNOWN_BAD.get((dist, version))
