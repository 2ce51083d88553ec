"""Writing a file whole or not at all (the bottom layer: imports nothing of coinf)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary sibling renamed over it, creating the
    folder if missing. A crash or a full disk leaves the old file (or none), never part of the
    new one, and no temporary file behind. The file gets the permissions a plain write gives."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
