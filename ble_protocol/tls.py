"""TLS 1.3 with pinned certificates on the TCP links between devices (docs/PROTOCOL.md §15).

Both ends present their own self-signed certificate (:mod:`coinf.ble_protocol.tls_store`);
no CA is involved. The server asks for the client's certificate and trusts exactly the
certificates of its trust store (the peers it paired with): any other client fails the
handshake and never reaches the protocol. The client checks the server's certificate after the
handshake, before it sends a byte of its own: its fingerprint must be the one pinned for that
helper (a config file's ``fingerprint``, a DNS-SD record's, verified as paired) or, when none is
given, one of its trust store's; anything else is :class:`~coinf.errors.UntrustedPeer`. Trust
comes only from pairing records: a device does not trust its own certificate (a process that
copied ``identity.pem`` does not get in as the device), unless a record names it.

Schemes: ``tcp:HOST:PORT`` is TLS; ``tcp+insecure:HOST:PORT`` is plain TCP (tests, a loopback
benchmark); ``unix:/path`` stays plain (one machine; the socket file's permissions guard it).
Plain TCP (``tcp+insecure:``, or ``tls=False`` on ``tcp:``) is opt-in twice: the scheme and
``allow_insecure=True`` (command line: ``--insecure-plaintext``); without the flag it is refused
(:func:`resolve_store`), with it every start logs a WARNING (:func:`warn_insecure`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

from coinf.ble_protocol.tls_store import TlsStore, default_store, fingerprint

from coinf.errors import InputError, UntrustedPeer

INSECURE = "tcp+insecure"
#: the API argument that allows plain TCP, and the command line's flag
ALLOW_INSECURE = "allow_insecure"
INSECURE_FLAG = "--insecure-plaintext"
log = logging.getLogger(__name__)
#: the pairing hint every refusal carries
PAIR_HINT = "pair the two devices first: `coinf wifi pair` (docs/PROTOCOL.md §15.3)"


def split_scheme(spec: str) -> tuple[str, bool]:
    """``spec`` with ``tcp+insecure:`` rewritten to ``tcp:``, and whether it asks for TLS
    (``tcp:``: yes; ``tcp+insecure:`` and ``unix:``: no)."""
    scheme, _, rest = spec.partition(":")
    if scheme == INSECURE:
        return f"tcp:{rest}", False
    return spec, scheme == "tcp"


def insecure_refusal(spec: str) -> str:
    """The one line that refuses plain TCP asked for without the flag."""
    return (f"{spec} is plain TCP (no encryption, no authentication: anyone on the network "
            f"can read the tensors, answer as the handheld and use its slots); to run it anyway "
            f"pass {ALLOW_INSECURE}=True ({INSECURE_FLAG} on the command line), or use "
            f"tcp:HOST:PORT (TLS, `coinf wifi pair`)")


def warn_insecure(spec: str, role: str) -> None:
    """The WARNING every start of a plain TCP connector or listener logs."""
    log.warning("INSECURE: %s %s is plain TCP (%s): no encryption, no authentication; for "
                "tests and loopback benchmarks only (docs/SECURITY.md)", role, spec, ALLOW_INSECURE)


def is_plain_tcp(spec: str, tls: Any) -> bool:
    """Whether a socket link of ``spec`` with ``tls`` would be plain TCP."""
    scheme = spec.partition(":")[0]
    return scheme == INSECURE or (scheme == "tcp" and tls is False)


def resolve_store(spec: str, tls: Any, allow_insecure: bool = False) -> TlsStore | None:
    """The store a socket link of ``spec`` uses, None for a plain one. ``tls``: None or True
    (the default store), False (plain) or a :class:`TlsStore`. ``tcp+insecure:`` and ``unix:``
    are plain and take no store. Plain TCP needs ``allow_insecure`` (else
    :class:`~coinf.errors.InputError`, :func:`insecure_refusal`)."""
    _, wants = split_scheme(spec)
    if tls is not None and not isinstance(tls, bool | TlsStore):
        raise InputError(f"tls must be True, False or a TlsStore, got {type(tls).__name__}")
    if not isinstance(allow_insecure, bool):
        raise InputError(f"{ALLOW_INSECURE} must be True or False, got {allow_insecure!r}")
    if is_plain_tcp(spec, tls) and not allow_insecure:
        raise InputError(insecure_refusal(spec))
    if not wants:
        if tls not in (None, False):
            raise InputError(f"{spec} is a plain link: TLS runs on tcp:HOST:PORT")
        return None
    if tls is False:
        return None
    return tls if isinstance(tls, TlsStore) else default_store()


def _base(purpose: ssl.Purpose, store: TlsStore) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if purpose is ssl.Purpose.CLIENT_AUTH
                         else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(str(store.ensure_identity()))
    return ctx


def server_context(store: TlsStore) -> ssl.SSLContext:
    """A server context that requires a client certificate named by a pairing record of the
    trust store, never this device's own unless a record names it (rebuilt when the trust
    store changes: a peer paired or revoked while a daemon runs counts at once). With no
    record, every client fails the handshake."""
    peers = store.peers()
    key = tuple(p.fingerprint for p in peers)
    cached = store.contexts.get("server")
    if cached is not None and cached[0] == key:
        return cached[1]
    ctx = _base(ssl.Purpose.CLIENT_AUTH, store)
    ctx.verify_mode = ssl.CERT_REQUIRED  # exactly the paired peers' certificates
    if peers:
        ctx.load_verify_locations(cadata="".join(p.cert for p in peers))
    store.contexts["server"] = (key, ctx)
    return ctx


def client_context(store: TlsStore) -> ssl.SSLContext:
    """A client context that presents this device's certificate; the server's is checked by
    fingerprint after the handshake (:func:`check_server`), not by a CA."""
    ctx = store.contexts.get("client")
    if ctx is None:
        ctx = _base(ssl.Purpose.SERVER_AUTH, store)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        store.contexts["client"] = ctx
    return ctx


def peer_fingerprint(writer: asyncio.StreamWriter) -> str | None:
    """The fingerprint of the certificate the peer presented on this TLS stream, or None."""
    obj = writer.get_extra_info("ssl_object")
    der = obj.getpeercert(binary_form=True) if obj is not None else None
    return fingerprint(der) if der else None


def check_server(fp: str | None, store: TlsStore, pin: str | None, where: str) -> str:
    """The server's fingerprint, if it is ``pin`` (given) or a paired peer's (no pin); else
    :class:`~coinf.errors.UntrustedPeer`."""
    if fp is None:
        raise UntrustedPeer(f"{where} presented no certificate")
    if pin is not None:
        if fp != pin:
            raise UntrustedPeer(f"{where} is not the pinned helper: it presented {fp}, the "
                                f"pinned fingerprint is {pin} (another device holds that "
                                f"address?)", fp)
        return fp
    if not store.trusts(fp):
        raise UntrustedPeer(f"{where} presented certificate {fp}, which is not paired with "
                            f"this device; {PAIR_HINT}", fp)
    return fp


def refused_by_server(where: str, exc: BaseException) -> UntrustedPeer:
    """The error when a server ended the TLS session this device opened (its alert: it does
    not trust this device's certificate)."""
    return UntrustedPeer(f"{where} refused this device's certificate ({exc}); {PAIR_HINT}")


__all__ = ["ALLOW_INSECURE", "INSECURE", "INSECURE_FLAG", "check_server", "client_context",
           "insecure_refusal", "is_plain_tcp", "peer_fingerprint", "refused_by_server",
           "resolve_store", "server_context", "split_scheme", "warn_insecure"]
