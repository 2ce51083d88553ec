"""Checks of the paths a command will write, made before it does any work.

A profile run or a benchmark can take tens of minutes; an output path that cannot be written
must be refused at the start, not after the work (``UserError`` naming the flag and the path).
The directories the output needs are created here, as the command would create them anyway.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from coinf.errors import UserError


def _make_dir(path: Path, flag: str, target: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserError(f"{flag} {target}: cannot be created, because a part of {path} is a "
                        f"file, not a directory") from None
    except OSError as exc:
        raise UserError(f"{flag} {target}: cannot create {path} "
                        f"({exc.strerror or exc})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {target}: the directory {path} is not writable")


def writable_dir(path: str | Path, flag: str) -> Path:
    """``path`` as a writable directory (created if missing), else ``UserError``."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UserError(f"{flag} {p}: exists and is not a directory (expected a directory)")
    _make_dir(p, flag, p)
    return p


def writable_file(path: str | Path, flag: str, *, make_folder: bool = True) -> Path:
    """``path`` as a file that can be written, created or replaced, else ``UserError``. Its
    folder is created if missing, or with ``make_folder=False`` must exist already."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{flag} {p}: is a folder; give the name of a file in it")
    if make_folder:
        _make_dir(p.parent, flag, p)
    elif not p.parent.is_dir():
        raise UserError(f"{flag} {p}: the folder {p.parent} does not exist (create it first)")
    elif not os.access(p.parent, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {p}: the folder {p.parent} is not writable")
    return p


@contextmanager
def naming(flag: str, path: str | Path | None) -> Iterator[None]:
    """A :class:`UserError` raised while reading ``path`` (given by ``flag``) names both, so a
    malformed file is not reported as just "device profile is not valid"."""
    try:
        yield
    except UserError as exc:
        if path is None or str(path) in str(exc):
            raise
        raise type(exc)(f"{flag} {path}: {exc}") from None
