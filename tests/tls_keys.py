"""TLS identities for the suite: every ``tcp:`` link in a test runs TLS 1.3 with pinned keys.

:func:`install_session_store` (conftest, once per session) makes a private store with one
identity that trusts itself and points ``COINF_TLS_DIR`` at it, so every daemon, helper and
wearable of a test (subprocesses too: they inherit the environment) is the same paired device.
:func:`make_store` makes more (another device, an attacker)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from coinf.ble_protocol.tls_store import TlsStore

ENV = "COINF_TLS_DIR"


def make_store(directory: str | os.PathLike[str], *, trust_self: bool = True) -> TlsStore:
    """A store with a fresh identity (that trusts itself, by default)."""
    store = TlsStore(directory)
    store.ensure_identity()
    if trust_self:
        store.pin("self", store.certificate_der(), "test")
    return store


def pair(a: TlsStore, b: TlsStore) -> None:
    """Pin each one's certificate in the other's trust store."""
    a.pin("peer", b.certificate_der())
    b.pin("peer", a.certificate_der())


def install_session_store() -> str:
    top = tempfile.mkdtemp(prefix="coinf-tls-")  # 0700
    make_store(Path(top) / "device")
    os.environ[ENV] = str(Path(top) / "device")
    return top


def remove_session_store(top: str | None) -> None:
    if top:
        shutil.rmtree(top, ignore_errors=True)
