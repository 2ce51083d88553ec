"""Bond stores (LTK, IRK of paired peers) kept private: the file 0600 in a 0700 directory.

bumble's :class:`~bumble.keys.JsonKeyStore` writes the keys in plain hex with the process umask
(typically 0644 in a 0755 directory): anyone on the machine could read a handheld's LTK and
impersonate it. :func:`open_bond_store` checks (and creates) the directory, tightens the file,
and returns a :class:`PrivateJsonKeyStore`, whose every save writes a 0600 file.

Each bond also records when it was made (``coinf_paired_at``, UTC ISO 8601, next to bumble's
fields). :func:`list_bonds` describes the bonds of a store without their key material (for
``coinf doctor``); :func:`revoke_bond` removes one.

Rules: a missing directory is created 0700; an existing directory that group or others can
access is refused (:class:`BondStoreError`: we do not chmod a directory we did not create, it
may be shared); an existing file of another user is refused; one readable or writable by group
or others is tightened to 0600.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bumble.keys import JsonKeyStore, KeyStore, MemoryKeyStore, PairingKeys

from coinf.errors import UserError
from coinf.files import private_directory, write_atomically

FILE_MODE = 0o600


class BondStoreError(UserError):
    """The bond store cannot be kept private (its directory is open to others, or it is not
    a regular file). The message says how to fix it."""


def prepare_bond_store(path: str | os.PathLike[str]) -> Path:
    """Create or check the bond store's directory (0700) and file (0600); returns the
    resolved path. Raises :class:`BondStoreError`."""
    file = Path(path).expanduser().resolve()
    directory = file.parent
    private_directory(directory, "the bond store's directory", "it holds pairing keys, so "
                      f"keep it private: `chmod 700 {directory}` or choose a keystore path in a "
                      "private directory", BondStoreError)
    if file.exists() or file.is_symlink():
        fst = os.lstat(file)
        if not stat.S_ISREG(fst.st_mode):
            raise BondStoreError(f"the bond store {file} is not a regular file")
        if hasattr(os, "getuid") and fst.st_uid != os.getuid():
            raise BondStoreError(f"the bond store {file} belongs to another user (uid "
                                 f"{fst.st_uid}): run coinf as its owner, or choose another "
                                 "keystore")
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
        _write(self.filename, db)

    async def update(self, name: str, keys: PairingKeys) -> None:
        """Store a pairing's keys (they replace the peer's old ones) and when it was made."""
        db, key_map = await self.load()
        key_map[name] = {**keys.to_dict(), PAIRED_AT: time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        await self.save(db)


#: the field of a bond entry holding when it was made (ours; bumble ignores it)
PAIRED_AT = "coinf_paired_at"


@dataclass(frozen=True)
class BondInfo:
    """One bond of a store, without key material."""

    address: str  # the peer's identity address
    key_type: str  # le-sc-authenticated, le-sc-unauthenticated, legacy or none
    has_irk: bool  # the peer gave an IRK (its private addresses resolve to it)
    paired_at: str | None  # UTC, when coinf stored it (None: stored by an older coinf)

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "key_type": self.key_type, "irk": self.has_irk,
                "paired_at": self.paired_at}


def _key_type(entry: dict[str, Any]) -> str:
    ltk = entry.get("ltk")
    if isinstance(ltk, dict):
        return "le-sc-authenticated" if ltk.get("authenticated") else "le-sc-unauthenticated"
    if entry.get("ltk_central") or entry.get("ltk_peripheral"):
        return "legacy"
    return "none"


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise BondStoreError(f"the bond store {path} is unreadable: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise BondStoreError(f"the bond store {path} is not a bumble key store")
    return data


def list_bonds(path: str | os.PathLike[str]) -> list[BondInfo]:
    """The bonds in the store at ``path`` (every namespace), never their keys."""
    bonds = []
    for key_map in _load(Path(path)).values():
        for address, entry in key_map.items():
            if isinstance(entry, dict):
                bonds.append(BondInfo(str(address), _key_type(entry), "irk" in entry,
                                      entry.get(PAIRED_AT)))
    return bonds


def revoke_bond(path: str | os.PathLike[str], address: str) -> bool:
    """Remove the bond with ``address`` (any case) from the store at ``path``; False if there
    was none. The file stays 0600 (rewritten atomically)."""
    file = prepare_bond_store(path)
    data = _load(file)
    found = False
    for key_map in data.values():
        for name in [n for n in key_map if n.upper() == address.upper()]:
            del key_map[name]
            found = True
    if found:
        _write(file, data)
    return found


def _write(file: Path, db: dict[str, Any]) -> None:
    """The store as JSON, written whole (a temporary 0600 file renamed over it)."""
    write_atomically(file, json.dumps(db, sort_keys=True, indent=4).encode(), mode=FILE_MODE)


def open_bond_store(path: str | os.PathLike[str] | None) -> KeyStore:
    """The device's key store: a private JSON file at ``path``, or memory when None."""
    return PrivateJsonKeyStore(path) if path else MemoryKeyStore()


__all__ = ["PAIRED_AT", "BondInfo", "BondStoreError", "PrivateJsonKeyStore", "list_bonds",
           "open_bond_store", "prepare_bond_store", "revoke_bond"]
