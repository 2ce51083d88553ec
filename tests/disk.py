"""A full disk for tests: every file opened for writing (so truncated) fails half-way through."""

from __future__ import annotations

import io
from typing import Any

import pytest


class _DiskFull:
    def __init__(self, f: Any) -> None:
        self.f = f

    def write(self, data: Any) -> int:
        self.f.write(data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    def __enter__(self) -> _DiskFull:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()


def fill_the_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now until ``monkeypatch.undo()``, writes through ``io.open`` (``open``,
    ``Path.write_text``, ``os.fdopen``) write half their data and raise ENOSPC."""
    real_open = io.open

    def open_on_a_full_disk(file: Any, mode: str = "r", *args: Any, **kw: Any) -> Any:
        f = real_open(file, mode, *args, **kw)
        return _DiskFull(f) if "w" in mode else f

    monkeypatch.setattr(io, "open", open_on_a_full_disk)
