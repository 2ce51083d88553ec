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
        env = {**os.environ, "COINF_ARM_PATH": self.path}
        proc = subprocess.run([self.python, self.sysroot, str(GUEST), *args], env=env,
                              capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise AssertionError(f"guest {args[0]} failed (exit {proc.returncode}):\n"
                                 f"{proc.stderr[-4000:]}")
        return proc


@pytest.fixture(scope="session")
def arm() -> ArmGuest:
    missing = [v for v in VARS if not os.environ.get(v)]
    if missing:
        pytest.skip("the aarch64 guest is set up by `make test-arm` (missing "
                    f"{', '.join(missing)})")
    return ArmGuest(os.environ["COINF_ARM_PYTHON"], os.environ["COINF_ARM_SYSROOT"],
                    f"{os.environ['COINF_ARM_COINF']}:{os.environ['COINF_ARM_SITE']}")
