"""``make test-arm`` sets these up (.ci/arm/setup.sh); a plain ``pytest`` skips this folder."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

GUEST = Path(__file__).with_name("guest.py")
VARS = ("COINF_ARM_PYTHON", "COINF_ARM_SYSROOT", "COINF_ARM_SITE", "COINF_ARM_COINF")


@dataclass(frozen=True)
class ArmGuest:
    """Runs ``guest.py JOB ...`` as a Cortex-A53 (qemu user mode, aarch64 CPython)."""

    python: str
    sysroot: str
    path: str

    def run(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """``guest.py ARGS`` on the A53; an exit other than 0 fails the test."""
        proc = self.python_run(str(GUEST), *args, timeout=timeout)
        if proc.returncode != 0:
            raise AssertionError(f"guest {args[0]} failed (exit {proc.returncode}):\n"
                                 f"{proc.stderr[-4000:]}")
        return proc

    def python_run(self, *args: str, path: str | None = None,
                   timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """The guest's ``python3.11 ARGS`` (import path ``path``, default the wheel + site)."""
        env = {**os.environ, "COINF_ARM_PATH": self.path if path is None else path}
        return subprocess.run([self.python, self.sysroot, *args], env=env,
                              capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="session")
def arm() -> ArmGuest:
    missing = [v for v in VARS if not os.environ.get(v)]
    if missing:
        pytest.skip("the aarch64 guest is set up by `make test-arm` (missing "
                    f"{', '.join(missing)})")
    return ArmGuest(os.environ["COINF_ARM_PYTHON"], os.environ["COINF_ARM_SYSROOT"],
                    f"{os.environ['COINF_ARM_COINF']}:{os.environ['COINF_ARM_SITE']}")
