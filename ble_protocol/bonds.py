"""Bond stores (LTK, IRK of paired peers) kept private: the file 0600 in a 0700 directory.

bumble's :class:`~bumble.keys.JsonKeyStore` writes the keys in plain hex with the process umask
(typically 0644 in a 0755 directory): anyone on the machine could read a handheld's LTK and
impersonate it. :func:`open_bond_store` checks (and creates) the directory, tightens the file,
and returns a :class:`PrivateJsonKeyStore`, whose every save writes a 0600 file.

Rules: a missing directory is created 0700; an existing directory that group or others can
access is refused (:class:`BondStoreError`: we do not chmod a directory we did not create, it
may be shared); an existing file readable or writable by group or others is tightened to 0600.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from bumble.keys import JsonKeyStore, KeyStore, MemoryKeyStore

from coinf.errors import UserError

FILE_MODE = 0o600
DIR_MODE = 0o700


class BondStoreError(UserError):
    """The bond store cannot be kept private (its directory is open to others, or it is not
    a regular file). The message says how to fix it."""


def prepare_bond_store(path: str | os.PathLike[str]) -> Path:
    """Create or check the bond store's directory (0700) and file (0600); returns the
    resolved path. Raises :class:`BondStoreError`."""
    file = Path(path).expanduser().resolve()
    directory = file.parent
    if not directory.exists():
        try:
            directory.mkdir(mode=DIR_MODE, parents=True)
            os.chmod(directory, DIR_MODE)  # mkdir's mode is filtered by the umask
        except OSError as exc:
            raise BondStoreError(f"cannot create the bond store directory {directory}: "
                                 f"{exc.strerror}") from None
    st = directory.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise BondStoreError(f"{directory} (the bond store's directory) is not a directory")
    if st.st_mode & 0o077:
        raise BondStoreError(
            f"the bond store's directory {directory} is accessible to other users (mode "
            f"{stat.S_IMODE(st.st_mode):04o}); it holds pairing keys, so keep it private: "
            f"`chmod 700 {directory}` or choose a keystore path in a private directory")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise BondStoreError(f"the bond store's directory {directory} belongs to another user")
    if file.exists() or file.is_symlink():
        fst = os.lstat(file)
        if not stat.S_ISREG(fst.st_mode):
            raise BondStoreError(f"the bond store {file} is not a regular file")
        if stat.S_IMODE(fst.st_mode) & 0o077:
            os.chmod(file, FILE_MODE)
    return file


class PrivateJsonKeyStore(JsonKeyStore):
    """A :class:`JsonKeyStore` whose saves write a 0600 file in a 0700 directory (atomically:
    a temporary file created 0600, then renamed)."""

    def __init__(self, filename: str | os.PathLike[str], namespace: str | None = None) -> None:
        path = prepare_bond_store(filename)
        super().__init__(namespace, str(path))

    async def save(self, db: dict[str, dict[str, dict[str, Any]]]) -> None:
        prepare_bond_store(self.filename)
        temp = self.filename.with_name(self.filename.name + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as output:
            json.dump(db, output, sort_keys=True, indent=4)
        os.chmod(temp, FILE_MODE)
        os.replace(temp, self.filename)


def open_bond_store(path: str | os.PathLike[str] | None) -> KeyStore:
    """The device's key store: a private JSON file at ``path``, or memory when None."""
    return PrivateJsonKeyStore(path) if path else MemoryKeyStore()


__all__ = ["BondStoreError", "PrivateJsonKeyStore", "open_bond_store", "prepare_bond_store"]
