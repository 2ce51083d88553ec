"""Start ``coinf`` subprocesses for cross-process tests and wait until they are ready."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def coinf_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "coinf", *args]


@contextmanager
def handheld_daemon(bundle: Path, address: str, *extra: str,
                    env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """Run ``coinf handheld`` until the block exits; yields once it prints its ready line.
    ``env``: variables set on top of this process's environment."""
    env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(
        coinf_cmd("handheld", "--bundle", str(bundle), "--listen", address, *extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "serving" not in line:
            proc.kill()
            _, err = proc.communicate(timeout=10)
            raise RuntimeError(f"handheld daemon did not start: {line!r} {err}")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
