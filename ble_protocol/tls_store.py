"""This device's TLS identity and the certificates it trusts, kept private (docs/PROTOCOL.md §15).

One directory per device (default ``<config dir>/coinf/tls``, the directory of ``coinf
policy``'s file, or ``$COINF_TLS_DIR``), 0700, holding two 0600 files:

* ``identity.pem``: this device's long-lived key pair (ECDSA P-256) and its self-signed X.509
  certificate, created on first use (needs the ``cryptography`` package);
* ``peers.json``: the pairing records, each ``{"name", "fingerprint", "cert" (PEM),
  "address", "added"}``. A peer's fingerprint is ``sha256:`` and the hex SHA-256 of its DER
  certificate. Trust comes only from these records: the device does **not** trust its own
  certificate (a process that copied ``identity.pem`` is not let in as this device), so two
  roles on one machine that share a store trust each other only once a record names that
  certificate (``coinf wifi trust-self``, or :meth:`TlsStore.pin` of it).

Rules (as for BLE bond stores, :mod:`coinf.ble_protocol.bonds`): a missing directory is created
0700; an existing one that group or others can access, or that another user owns, is refused
(:class:`TlsStoreError`); a file owned by another user is refused, one readable by others is
tightened to 0600 (with a warning for ``identity.pem``: its key may have been copied). Every
write is atomic (a 0600 temporary file, then a rename); the identity is created with a hard
link, so two processes starting at once end up with the same one.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coinf.deps import require
from coinf.errors import InputError, UserError
from coinf.files import private_directory

FILE_MODE = 0o600
IDENTITY_FILE = "identity.pem"
PEERS_FILE = "peers.json"
PREFIX = "sha256:"
#: the most peers a trust store keeps (a pairing beyond is refused)
MAX_PEERS = 256
_HEX64 = re.compile(r"[0-9a-f]{64}")
log = logging.getLogger(__name__)


class TlsStoreError(UserError):
    """The TLS store cannot be kept private or read; the message says how to fix it."""


def fingerprint(der: bytes) -> str:
    """``sha256:<hex>`` of a DER certificate."""
    return PREFIX + hashlib.sha256(der).hexdigest()


def parse_fingerprint(text: Any) -> str:
    """A fingerprint as written by a user (``sha256:`` + 64 hex digits, colons and case
    ignored; the bare 64 digits too) in its canonical form; else :class:`InputError`."""
    if not isinstance(text, str):
        raise InputError(f"a fingerprint is 'sha256:' and 64 hex digits, got {text!r}")
    body = text.strip().lower()
    body = body[len(PREFIX):] if body.startswith(PREFIX) else body
    body = body.replace(":", "")
    if not _HEX64.fullmatch(body):
        raise InputError(f"a fingerprint is 'sha256:' and 64 hex digits, got {text[:80]!r}")
    return PREFIX + body


def default_tls_dir() -> Path:
    """``$COINF_TLS_DIR``, else ``tls`` next to the policy file (``$COINF_CONFIG``'s
    directory, else ``<XDG config dir>/coinf``)."""
    env = os.environ.get("COINF_TLS_DIR")
    if env:
        return Path(env).expanduser()
    config = os.environ.get("COINF_CONFIG")
    if config:
        return Path(config).expanduser().parent / "tls"
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(Path.home(), ".config")
    return Path(base) / "coinf" / "tls"


def private_dir(directory: Path) -> Path:
    """Create (0700) or check ``directory``; raises :class:`TlsStoreError`."""
    return private_directory(
        directory, "the TLS store", "it holds this device's private key, so keep it private: "
        f"`chmod 700 {directory}` (or set COINF_TLS_DIR to a private directory)", TlsStoreError)


def _check_file(file: Path) -> bool:
    """Whether ``file`` exists (a regular file of this user, tightened to 0600 if it was
    not); another user's file, or a symbolic link, raises :class:`TlsStoreError`."""
    try:
        st = os.lstat(file)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode):
        raise TlsStoreError(f"{file} is not a regular file")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise TlsStoreError(f"{file} belongs to another user (uid {st.st_uid}): the TLS store "
                            f"must be this user's alone; run coinf as its owner or remove it")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        os.chmod(file, FILE_MODE)
        if file.name == IDENTITY_FILE:
            log.warning("%s was mode %04o (readable by other users): tightened to 0600; its key "
                        "may have been copied: remove it and pair again for a new identity",
                        file, mode)
    return True


def _temp(file: Path, data: bytes) -> Path:
    temp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temp)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    return temp


def write_private(file: Path, data: bytes) -> None:
    """Write ``file`` (0600) atomically."""
    os.replace(_temp(file, data), file)


def make_identity(name: str = "coinf") -> bytes:
    """A fresh key pair and self-signed certificate, as PEM (key first). ECDSA P-256; valid from
    1970 (a Pi without a real-time clock may boot far in the past) to 9999. The subject is
    unique (``name`` and 64 random bits) and the key identifiers are set: trust anchors are
    looked up by subject, and two devices may share a host name."""
    require("cryptography", None, "TLS on Wi-Fi links (a device key pair)")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    unique = f"{name[:40] or 'coinf'} {secrets.token_hex(8)}"
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, unique)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    utc = datetime.UTC
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(datetime.datetime(1970, 1, 2, tzinfo=utc))
            .not_valid_after(datetime.datetime(9999, 12, 31, tzinfo=utc))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(ski, critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski),
                           critical=False)
            .sign(key, hashes.SHA256()))
    return (key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption())
            + cert.public_bytes(serialization.Encoding.PEM))


def pem_to_der(pem: str) -> bytes:
    """The DER bytes of the first certificate in ``pem``."""
    import ssl

    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    start = pem.find(begin)
    stop = pem.find(end, start)
    if start < 0 or stop < 0:
        raise TlsStoreError("no certificate in that PEM text")
    return ssl.PEM_cert_to_DER_cert(pem[start:stop + len(end)] + "\n")


@dataclass(frozen=True)
class PeerEntry:
    """A paired peer: its name, certificate (PEM), fingerprint, where it was paired at."""

    name: str
    fingerprint: str
    cert: str
    address: str = ""
    added: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "fingerprint": self.fingerprint, "cert": self.cert,
                "address": self.address, "added": round(self.added)}


class TlsStore:
    """This device's identity and trust store in ``directory`` (module docstring)."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self.directory = Path(directory).expanduser() if directory else default_tls_dir()
        self.identity_file = self.directory / IDENTITY_FILE
        self.peers_file = self.directory / PEERS_FILE
        self._fingerprint: str | None = None
        self._peers_key: tuple[int, int] | None = None
        self._peers: list[PeerEntry] = []
        #: SSL contexts built from this store (:mod:`coinf.ble_protocol.tls`)
        self.contexts: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"TlsStore({str(self.directory)!r})"

    # -- identity ---------------------------------------------------------------------------
    def ensure_identity(self) -> Path:
        """The identity file, created (key pair and certificate) if there is none."""
        private_dir(self.directory)
        if _check_file(self.identity_file):
            return self.identity_file
        temp = _temp(self.identity_file, make_identity(f"coinf {os.uname().nodename}"))
        try:
            os.link(temp, self.identity_file)  # fails if another process made one meanwhile
        except FileExistsError:
            pass
        finally:
            os.unlink(temp)
        return self.identity_file

    def certificate_pem(self) -> str:
        text = self.ensure_identity().read_text()
        start = text.find("-----BEGIN CERTIFICATE-----")
        if start < 0:
            raise TlsStoreError(f"{self.identity_file} has no certificate: remove it to make "
                                f"a new identity (then pair again)")
        return text[start:]

    def certificate_der(self) -> bytes:
        return pem_to_der(self.certificate_pem())

    @property
    def fingerprint(self) -> str:
        """This device's fingerprint (``sha256:...``)."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.certificate_der())
        return self._fingerprint

    # -- trust store ------------------------------------------------------------------------
    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.peers_file)
        except FileNotFoundError:
            return None
        return st.st_mtime_ns, st.st_size

    def peers(self) -> list[PeerEntry]:
        """The paired peers (re-read when the file changed)."""
        stamp = self._stamp()
        if stamp == self._peers_key:
            return list(self._peers)
        private_dir(self.directory)
        peers: list[PeerEntry] = []
        if _check_file(self.peers_file):
            try:
                obj = json.loads(self.peers_file.read_text())
                for e in obj["peers"][:MAX_PEERS]:
                    peers.append(PeerEntry(str(e["name"]), parse_fingerprint(e["fingerprint"]),
                                           str(e["cert"]), str(e.get("address", "")),
                                           float(e.get("added", 0))))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise TlsStoreError(f"{self.peers_file} is not a coinf trust store ({exc}); "
                                    f"fix or remove it (then pair again)") from None
        self._peers, self._peers_key = peers, stamp
        return list(peers)

    def pinned(self, fp: str) -> PeerEntry | None:
        """The paired peer with this fingerprint, or None."""
        return next((p for p in self.peers() if p.fingerprint == fp), None)

    def trusts(self, fp: str) -> bool:
        """Whether a peer presenting this fingerprint is trusted: only a pairing record names
        it. This device's own certificate is not trusted unless a record names it: the key is
        not the trust anchor for itself (docs/SECURITY.md)."""
        return self.pinned(fp) is not None

    def trusts_itself(self) -> bool:
        """Whether a pairing record names this device's own certificate (then any process
        that copies ``identity.pem`` is trusted as a paired peer; ``coinf doctor`` warns)."""
        return self.pinned(self.fingerprint) is not None

    def pin(self, name: str, cert_der: bytes, address: str = "") -> PeerEntry:
        """Trust the peer with this certificate (replacing an entry of the same fingerprint)."""
        import ssl

        entry = PeerEntry(name, fingerprint(cert_der), ssl.DER_cert_to_PEM_cert(cert_der),
                          address, time.time())
        kept = [p for p in self.peers() if p.fingerprint != entry.fingerprint]
        if len(kept) >= MAX_PEERS:
            raise TlsStoreError(f"{self.peers_file} already has {MAX_PEERS} peers: revoke some")
        self._save([*kept, entry])
        return entry

    def revoke(self, which: str) -> list[PeerEntry]:
        """Forget the peers named ``which`` or with that fingerprint; returns them."""
        fp = None
        with contextlib.suppress(InputError):
            fp = parse_fingerprint(which)
        gone = [p for p in self.peers() if p.name == which or p.fingerprint == fp]
        if gone:
            self._save([p for p in self.peers() if p not in gone])
        return gone

    def _save(self, peers: list[PeerEntry]) -> None:
        private_dir(self.directory)
        data = json.dumps({"version": 1, "peers": [p.to_json() for p in peers]}, indent=1)
        write_private(self.peers_file, data.encode())
        self._peers_key = None  # re-read (and stamp) on the next look


def one_machine_store(directory: str | os.PathLike[str]) -> TlsStore:
    """A fresh store whose one pairing record names its own certificate, so that the roles
    a benchmark or the demo runs on one machine (wearable, handheld, helpers) act as one paired
    device. Only for a throwaway directory, never the device's real store: there, a record of
    its own certificate would let any process that copies ``identity.pem`` in."""
    store = TlsStore(directory)
    store.ensure_identity()
    store.pin("this machine (one-off)", store.certificate_der(), "local")
    return store


@contextlib.contextmanager
def one_machine_env() -> Iterator[TlsStore]:
    """A :func:`one_machine_store` in a private temporary directory, made the default store
    (``$COINF_TLS_DIR``, inherited by subprocesses) until the block ends, then removed."""
    import shutil
    import tempfile

    top = tempfile.mkdtemp(prefix="coinf-tls-")  # 0700
    old = os.environ.get("COINF_TLS_DIR")
    try:
        store = one_machine_store(Path(top) / "device")
        os.environ["COINF_TLS_DIR"] = str(store.directory)
        yield store
    finally:
        if old is None:
            os.environ.pop("COINF_TLS_DIR", None)
        else:
            os.environ["COINF_TLS_DIR"] = old
        _STORES.pop(Path(top) / "device", None)
        shutil.rmtree(top, ignore_errors=True)


_STORES: dict[Path, TlsStore] = {}


def default_store() -> TlsStore:
    """The store at :func:`default_tls_dir` (one object per directory, per process)."""
    directory = default_tls_dir()
    store = _STORES.get(directory)
    if store is None:
        store = _STORES[directory] = TlsStore(directory)
    return store


__all__ = ["FILE_MODE", "PREFIX", "PeerEntry", "TlsStore", "TlsStoreError", "default_store",
           "default_tls_dir", "fingerprint", "make_identity", "one_machine_env",
           "one_machine_store", "parse_fingerprint"]
