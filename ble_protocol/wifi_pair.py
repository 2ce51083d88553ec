"""Wi-Fi pairing: two devices pin each other's TLS certificate, proven by a one-time 6-digit
code (docs/PROTOCOL.md §15.3).

The *responder* (``coinf wifi pair --listen``, typically the helper) opens a pairing window: a
TCP port, a fresh random code shown to the user, a deadline and a number of wrong attempts it
tolerates. The *initiator* (``coinf wifi pair --connect``) is given the code at a prompt and
connects. Both run SPAKE2 (a password-authenticated key exchange) over the 2048-bit MODP group
of RFC 3526 (id 14), keyed by the code, with both certificates' fingerprints in the transcript:
each side learns the other's certificate, and a key confirmation proves that the other side
knew the code and saw the same two certificates. Someone without the code, even in the middle,
gets one guess per attempt (1 in 10^6) and nothing to test guesses against offline. The
certificates themselves are public; only their binding to the code matters.

Frames (both ways): ``u8 type | u16 length (LE) | body``, body at most 4096 bytes::

    1 START    initiator: u8 version (1) | u8 n | name | u16 n | cert (DER) | X (256 B)
    2 REPLY    responder: u8 n | name | u16 n | cert (DER) | Y (256 B) | confirm_R (32 B)
    3 CONFIRM  initiator: confirm_I (32 B)
    4 DONE     responder: empty (it has pinned the initiator)
    5 FAIL     either:    u8 reason (1 wrong code, 2 window closed, 3 busy, 4 malformed) | text
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import secrets
import struct
import time
from dataclasses import dataclass

from coinf.ble_protocol.admission import Admission
from coinf.ble_protocol.tls_store import PeerEntry, TlsStore, fingerprint

from coinf.errors import InputError, PairingError
from coinf.errors import PairingFailure as F

log = logging.getLogger(__name__)

VERSION = 1
DEFAULT_PORT = 7879
DEFAULT_WINDOW_S = 120.0
DEFAULT_ATTEMPTS = 3
#: seconds each step of one attempt may take (a Pi Zero computes its SPAKE2 in ~1 s)
STEP_TIMEOUT_S = 20.0
#: seconds from connecting to a complete START (the initiator computes its share first)
START_TIMEOUT_S = 5.0
#: connections at once that have not delivered a valid START, in all and from one host
MAX_PENDING, MAX_PENDING_PER_HOST = 16, 2
MAX_BODY = 4096
START, REPLY, CONFIRM, DONE, FAIL = 1, 2, 3, 4, 5
WRONG_CODE, CLOSED, BUSY, MALFORMED = 1, 2, 3, 4
_REASONS = {WRONG_CODE: "wrong code", CLOSED: "pairing window closed", BUSY: "busy",
            MALFORMED: "malformed"}

# -- SPAKE2 over RFC 3526 group 14 -----------------------------------------------------------
P = int(
    "FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A0879"
    "8E3404DDEF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B"
    "0BFF5CB6F406B7EDEE386BFB5A899FA5AE9F24117C4B1FE649286651ECE45B3DC2007CB8A163BF0598DA4836"
    "1C55D39A69163FA8FD24CF5F83655D23DCA3AD961C62F356208552BB9ED529077096966D670C354E4ABC9804"
    "F1746C08CA18217C32905E462E36CE3BE39E772C180E86039B2783A2EC07A28FB5C55DF06F4C52C9DE2BCBF6"
    "955817183995497CEA956AE515D2261898FA051015728E5A8AACAA68FFFFFFFFFFFFFFFF", 16)
Q = (P - 1) // 2  # prime: the quadratic residues form the group of order Q
G = 4  # 2^2: a quadratic residue, so a generator of that group
ELEMENT = 256  # bytes of a group element
LABEL = b"coinf wifi pair v1"


def _hash_to_group(tag: bytes) -> int:
    """A group element nobody knows the logarithm of: a hash, squared."""
    h = int.from_bytes(hashlib.shake_256(LABEL + b" " + tag).digest(ELEMENT + 32), "big") % P
    return pow(h, 2, P)


M, N = _hash_to_group(b"M"), _hash_to_group(b"N")


def code_scalar(code: str) -> int:
    return int.from_bytes(hashlib.sha256(LABEL + b" code " + code.encode()).digest(), "big")


def check_code(code: str) -> str:
    """A pairing code as typed (spaces ignored): 6 digits, else :class:`InputError`."""
    code = "".join(code.split())
    if len(code) != 6 or not code.isdigit() or not code.isascii():
        raise InputError("a pairing code is the 6 digits the other device shows")
    return code


def new_code() -> str:
    return f"{secrets.randbelow(10 ** 6):06d}"


def _element(data: bytes) -> int:
    value = int.from_bytes(data, "big")
    if len(data) != ELEMENT or not 1 < value < P - 1 or pow(value, Q, P) != 1:
        raise _Malformed("not a group element")
    return value


def _share(w: int, blind: int) -> tuple[int, bytes]:
    secret = secrets.randbits(320) | 1
    return secret, (pow(G, secret, P) * pow(blind, w, P) % P).to_bytes(ELEMENT, "big")


def _confirmations(w: int, secret: int, other: int, blind: int, fp_i: str, fp_r: str,
                   x: bytes, y: bytes) -> tuple[bytes, bytes]:
    """(confirm_I, confirm_R) over the transcript."""
    k = pow(other * pow(blind, -w, P) % P, secret, P).to_bytes(ELEMENT, "big")
    parts = [LABEL, bytes.fromhex(fp_i[7:]), bytes.fromhex(fp_r[7:]), x, y, k,
             w.to_bytes(32, "big")]
    digest = hashlib.sha256(b"".join(struct.pack(">I", len(p)) + p for p in parts)).digest()
    kc_i = hmac.new(digest, b"initiator confirmation", hashlib.sha256).digest()
    kc_r = hmac.new(digest, b"responder confirmation", hashlib.sha256).digest()
    return (hmac.new(kc_i, digest, hashlib.sha256).digest(),
            hmac.new(kc_r, digest, hashlib.sha256).digest())


# -- frames --------------------------------------------------------------------------------------
class _Malformed(ValueError):
    """A pairing frame that is not what the protocol says (docs/PROTOCOL.md §15.3)."""


class _Cursor:
    def __init__(self, body: bytes) -> None:
        self.body, self.at = body, 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.body):
            raise _Malformed("frame too short")
        out = self.body[self.at:self.at + n]
        self.at += n
        return out

    def short(self, width: int) -> bytes:
        n = int.from_bytes(self.take(width), "little")
        return self.take(n)

    def end(self) -> None:
        if self.at != len(self.body):
            raise _Malformed("trailing bytes")


def _frame(kind: int, body: bytes) -> bytes:
    return struct.pack("<BH", kind, len(body)) + body


def _fail(reason: int, text: str) -> bytes:
    return _frame(FAIL, bytes([reason]) + text.encode()[:200])


async def _read(reader: asyncio.StreamReader, timeout: float) -> tuple[int, bytes]:
    async with asyncio.timeout(max(0.0, timeout)):
        kind, length = struct.unpack("<BH", await reader.readexactly(3))
        if length > MAX_BODY:
            raise _Malformed(f"frame of {length} B")
        return kind, await reader.readexactly(length)


def _name_cert(cur: _Cursor) -> tuple[str, bytes]:
    try:
        name = cur.short(1).decode("utf-8")
    except UnicodeDecodeError:
        raise _Malformed("name is not UTF-8") from None
    cert = cur.short(2)
    try:
        from cryptography import x509
    except ImportError:
        pass
    else:
        import warnings

        try:  # hostile bytes into a third-party parser: any failure means "not a certificate"
            with warnings.catch_warnings():  # nor may a stranger fill the log with its warnings
                warnings.simplefilter("ignore")
                x509.load_der_x509_certificate(cert)
        except Exception:  # ValueError, and InvalidVersion, which is none (found by bench fuzz)
            raise _Malformed("not a DER certificate") from None
    if not name.isprintable() or not 0 < len(name) <= 64:
        raise _Malformed("bad name")
    return name, cert


def parse_start(body: bytes) -> tuple[str, bytes, bytes, int]:
    """A START body (version, name, certificate, the initiator's share): (name, DER
    certificate, share bytes, share value). Raises ``_Malformed`` (a ValueError) on anything
    else: what the responder reads from a stranger."""
    cur = _Cursor(body)
    if cur.take(1)[0] != VERSION:
        raise _Malformed(f"pairing version {body[0]}, this side speaks {VERSION}")
    name, cert = _name_cert(cur)
    x = cur.take(ELEMENT)
    cur.end()
    return name, cert, x, _element(x)


def parse_reply(body: bytes) -> tuple[str, bytes, bytes, bytes]:
    """A REPLY body: (name, DER certificate, the responder's share, its confirmation).
    Raises ``_Malformed`` (a ValueError)."""
    cur = _Cursor(body)
    name, cert = _name_cert(cur)
    y = cur.take(ELEMENT)
    confirm = cur.take(32)
    cur.end()
    _element(y)
    return name, cert, y, confirm


def _name_cert_bytes(name: str, cert: bytes) -> bytes:
    raw = name.encode()[:64]
    return bytes([len(raw)]) + raw + struct.pack("<H", len(cert)) + cert


def _failure(body: bytes) -> str:
    reason = _REASONS.get(body[0] if body else 0, "refused")
    text = body[1:].decode("utf-8", "replace")
    return f"{reason}: {text}" if text else reason


# -- the responder -------------------------------------------------------------------------------
@dataclass
class _State:
    attempts_left: int
    result: PeerEntry | None = None


@dataclass
class WindowCounts:
    """What one Wi-Fi pairing window saw (every host together)."""

    connections: int = 0
    #: ended without a valid START: silence past START_TIMEOUT_S, a malformed START, a close
    broken: int = 0
    busy: int = 0  # refused: too many connections without a START (in all or from one host)
    throttled: int = 0  # refused: the host's connections kept breaking
    wrong: int = 0  # exchanges that did not confirm (each spends an attempt)
    hosts: set[str] | None = None

    def as_dict(self) -> dict[str, int]:
        return {"connections": self.connections, "broken": self.broken, "busy": self.busy,
                "throttled": self.throttled, "wrong": self.wrong,
                "hosts": len(self.hosts or ())}

    def summary(self) -> str:
        return (f"{self.connections} connection(s) from {len(self.hosts or ())} host(s): "
                f"{self.wrong} wrong code(s), {self.broken} broken before the exchange, "
                f"{self.busy + self.throttled} refused")


class PairingWindow:
    """The responder's side: ``async with PairingWindow(store, ...) as window``, show
    ``window.code``, then ``await window.wait()`` -> the initiator's :class:`PeerEntry` (pinned
    in ``store``), or :class:`~coinf.errors.PairingError` when the deadline passes or the wrong
    attempts run out. One exchange at a time (a second valid START waits for it); every
    exchange that saw this side's confirmation and did not confirm counts as wrong. A
    connection must deliver its START within :data:`START_TIMEOUT_S`; until then it holds no
    exchange, and at most :data:`MAX_PENDING` such connections (:data:`MAX_PENDING_PER_HOST`
    per host) are kept. A connection that breaks before a valid START counts against its host,
    throttled as BLE addresses are (:class:`~coinf.ble_protocol.admission.Admission`).
    ``counts`` says what the window saw."""

    def __init__(self, store: TlsStore, address: str = f"tcp:0.0.0.0:{DEFAULT_PORT}", *,
                 name: str = "coinf", window_s: float = DEFAULT_WINDOW_S,
                 attempts: int = DEFAULT_ATTEMPTS, code: str | None = None) -> None:
        from coinf.ble_protocol.loopback import parse_address

        kind, target = parse_address(address)
        if kind != "tcp" or not isinstance(target, tuple):
            raise InputError(f"a pairing window listens on tcp:HOST:PORT, not {address}")
        if not (window_s > 0 and attempts >= 1):
            raise InputError("the pairing window needs a time > 0 and at least one attempt")
        self.store = store
        self.target = target
        self.name = name
        self.window_s = float(window_s)
        self.code = check_code(code) if code is not None else new_code()
        self.deadline = 0.0
        #: where it listens (``tcp:HOST:PORT``, port 0 resolved), once entered
        self.address = ""
        self.wrong = 0
        self.counts = WindowCounts(hosts=set())
        self._throttle = Admission()
        self._pending: dict[str, int] = {}  # host -> connections without a START yet
        self._exchange = asyncio.Lock()
        self._state = _State(attempts)
        self._done = asyncio.Event()
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> PairingWindow:
        self.store.ensure_identity()
        try:
            self._server = await asyncio.start_server(self._handle, *self.target)
        except OSError as exc:
            raise InputError(f"cannot listen on tcp:{self.target[0]}:{self.target[1]}: "
                             f"{exc.strerror or exc}") from None
        host, port = self._server.sockets[0].getsockname()[:2]
        self.address = f"tcp:{host}:{port}"
        self.deadline = time.monotonic() + self.window_s
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    async def wait(self) -> PeerEntry:
        left = self.deadline - time.monotonic()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._done.wait(), max(0.0, left))
        self._close_window()
        if self._state.result is not None:
            return self._state.result
        if self._state.attempts_left <= 0:
            raise PairingError(F.REPEATED_ATTEMPTS, f"{self.wrong} wrong attempt(s); the window is "
                               f"closed (open a new one for a new code); "
                               f"{self.counts.summary()}")
        raise PairingError(F.TIMEOUT, f"no device paired within {self.window_s:g} s; the window "
                           f"is closed; {self.counts.summary()}")

    def _close_window(self) -> None:
        if self._server is not None:
            self._server.close()

    def _open(self) -> bool:
        return (self._state.result is None and self._state.attempts_left > 0
                and time.monotonic() < self.deadline)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        peer = writer.get_extra_info("peername")
        who = str(peer[0]) if isinstance(peer, tuple) else "?"
        try:
            refusal = self._refusal(who)
            if refusal is not None:
                writer.write(refusal)
            else:
                self._pending[who] = self._pending.get(who, 0) + 1
                try:
                    start = await self._read_start(reader, writer, who)
                finally:
                    self._pending[who] -= 1
                if start is not None:
                    await self._exchange_with(start, reader, writer, who)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.drain(), 2.0)
        finally:
            writer.close()
            if task is not None:
                self._tasks.discard(task)

    def _refusal(self, who: str) -> bytes | None:
        """The FAIL frame a new connection from ``who`` gets at once, or None to go on."""
        if not self._open():
            return _fail(CLOSED, "the pairing window is closed")
        counts = self.counts
        counts.connections += 1
        if counts.hosts is not None and len(counts.hosts) < 4096:
            counts.hosts.add(who)
        wait = self._throttle.throttled_for(who)
        if wait > 0:
            counts.throttled += 1
            return _fail(BUSY, f"too many broken attempts from {who}: wait {wait:.0f} s")
        if (sum(self._pending.values()) >= MAX_PENDING
                or self._pending.get(who, 0) >= MAX_PENDING_PER_HOST):
            counts.busy += 1
            return _fail(BUSY, "too many devices are connecting")
        return None

    def _timeout(self) -> float:
        return min(STEP_TIMEOUT_S, self.deadline - time.monotonic())

    async def _read_start(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          who: str) -> tuple[str, bytes, bytes, int] | None:
        """The parsed START of a new connection, or None (the connection broke: counted
        against ``who``, answered with FAIL malformed)."""
        try:
            limit = min(START_TIMEOUT_S, self.deadline - time.monotonic())
            kind, body = await _read(reader, limit)
            if kind != START:
                raise _Malformed(f"expected START, got frame type {kind}")
            if body[:1] != bytes([VERSION]):
                raise _Malformed(f"this side speaks pairing version {VERSION}")
            return parse_start(body)
        except (_Malformed, asyncio.IncompleteReadError, TimeoutError, ConnectionError) as exc:
            why = str(exc) or f"no START within {START_TIMEOUT_S:g} s"
            log.info("pairing: attempt from %s dropped before the exchange: %s", who, why)
            self.counts.broken += 1
            self._throttle.failed(who)
            with contextlib.suppress(Exception):
                writer.write(_fail(MALFORMED, why))
            return None

    async def _exchange_with(self, start: tuple[str, bytes, bytes, int],
                             reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                             who: str) -> None:
        """Wait for the exchange slot (bounded), then run the exchange."""
        try:
            async with asyncio.timeout(max(0.0, self._timeout())):
                await self._exchange.acquire()
        except TimeoutError:
            self.counts.busy += 1
            writer.write(_fail(BUSY, "another device is pairing"))
            return
        try:
            if not self._open():
                writer.write(_fail(CLOSED, "the pairing window is closed"))
                return
            self._throttle.served(who)
            await self._attempt(start, reader, writer, who)
        finally:
            self._exchange.release()

    async def _attempt(self, start: tuple[str, bytes, bytes, int],
                       reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       who: str) -> None:
        their_name, their_cert, x, x_value = start
        w = code_scalar(self.code)
        mine = self.store.certificate_der()
        fp_i, fp_r = fingerprint(their_cert), fingerprint(mine)
        secret, y = _share(w, N)
        confirm_i, confirm_r = _confirmations(w, secret, x_value, M, fp_i, fp_r, x, y)
        # from here on the attempt counts unless the initiator proves the code
        self._state.attempts_left -= 1
        self.wrong += 1
        writer.write(_frame(REPLY, _name_cert_bytes(self.name, mine) + y + confirm_r))
        try:
            await writer.drain()
            kind, body = await _read(reader, self._timeout())
        except (_Malformed, asyncio.IncompleteReadError, TimeoutError, ConnectionError):
            kind, body = FAIL, b""
        if kind == CONFIRM and hmac.compare_digest(body, confirm_i) and self._open_after():
            entry = self.store.pin(their_name, their_cert, who)
            self.wrong -= 1
            self._state.attempts_left += 1
            self._state.result = entry
            writer.write(_frame(DONE, b""))
            log.info("pairing: paired with %s (%s) at %s", their_name, entry.fingerprint, who)
            self._done.set()
            return
        self.counts.wrong += 1
        log.info("pairing: wrong code from %s (%d attempt(s) left)", who,
                 self._state.attempts_left)
        writer.write(_fail(WRONG_CODE, f"{max(0, self._state.attempts_left)} attempt(s) left"))
        if self._state.attempts_left <= 0:
            self._done.set()

    def _open_after(self) -> bool:
        return time.monotonic() < self.deadline


# -- the initiator -------------------------------------------------------------------------------
async def pair_with(address: str, code: str, store: TlsStore, *, name: str = "coinf",
                    timeout: float = STEP_TIMEOUT_S) -> PeerEntry:
    """Pair with the device showing ``code`` at ``address`` (``tcp:HOST:PORT`` of its pairing
    window): returns its entry, pinned in ``store``; :class:`~coinf.errors.PairingError` if the
    code is wrong, the window closed, or the peer breaks the exchange."""
    from coinf.ble_protocol.loopback import parse_address

    code = check_code(code)
    try:
        scheme, target = parse_address(address)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if scheme != "tcp" or not isinstance(target, tuple):
        raise InputError(f"pairing runs over tcp:HOST:PORT, not {address}")
    mine = store.certificate_der()
    w = code_scalar(code)
    secret, x = _share(w, M)  # before connecting: START must arrive within START_TIMEOUT_S
    start = _frame(START, bytes([VERSION]) + _name_cert_bytes(name, mine) + x)
    give_up = time.monotonic() + timeout
    reader, writer = await _connect(address, target, timeout)
    try:
        while True:
            writer.write(start)
            await writer.drain()
            kind, body = await _read(reader, timeout)
            if kind != FAIL or body[:1] != bytes([BUSY]) or time.monotonic() > give_up:
                break
            writer.close()  # busy (others are connecting): again shortly, within ``timeout``
            await asyncio.sleep(0.5)
            reader, writer = await _connect(address, target, timeout)
        if kind == FAIL:
            raise PairingError(F.WINDOW_CLOSED, f"{address} refused: {_failure(body)}",
                               peer=address)
        if kind != REPLY:
            raise _Malformed(f"expected REPLY, got frame type {kind}")
        their_name, their_cert, y, confirm_r = parse_reply(body)
        fp_i, fp_r = fingerprint(mine), fingerprint(their_cert)
        confirm_i, want_r = _confirmations(w, secret, _element(y), N, fp_i, fp_r, x, y)
        if not hmac.compare_digest(confirm_r, want_r):
            writer.write(_fail(WRONG_CODE, "the confirmation did not match"))
            await writer.drain()
            raise PairingError(F.WRONG_PASSKEY, f"wrong code (or not the device that shows it); "
                               f"{address} counts the attempt", peer=address)
        writer.write(_frame(CONFIRM, confirm_i))
        await writer.drain()
        kind, body = await _read(reader, timeout)
        if kind != DONE:
            raise PairingError(F.OTHER, f"{address} did not confirm: "
                               f"{_failure(body) if kind == FAIL else 'unexpected frame'}",
                               peer=address)
        return store.pin(their_name, their_cert, address)
    except _Malformed as exc:
        raise PairingError(F.OTHER, f"{address} broke the pairing exchange: {exc}",
                           peer=address) from None
    except asyncio.IncompleteReadError:
        raise PairingError(F.OTHER, f"{address} closed the connection during pairing",
                           peer=address) from None
    except TimeoutError:
        raise PairingError(F.TIMEOUT, f"{address} did not answer within {timeout:g} s",
                           peer=address) from None
    except ConnectionError as exc:
        raise PairingError(F.OTHER, f"{address}: {exc}", peer=address) from None
    finally:
        writer.close()


async def _connect(address: str, target: tuple[str, int],
                   timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    try:
        return await asyncio.wait_for(asyncio.open_connection(*target), timeout)
    except (OSError, TimeoutError) as exc:
        raise PairingError(F.WINDOW_CLOSED, f"cannot reach a pairing window at {address}: {exc}",
                           peer=address) from None


__all__ = ["DEFAULT_ATTEMPTS", "DEFAULT_PORT", "DEFAULT_WINDOW_S", "MAX_PENDING",
           "MAX_PENDING_PER_HOST", "START_TIMEOUT_S", "PairingWindow", "WindowCounts",
           "check_code", "new_code", "pair_with"]
