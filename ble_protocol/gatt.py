"""The coinf GATT service and the :class:`GattLink` both sides build on (docs/PROTOCOL.md).

Service ``c0f10000-5e7a-4b1e-9c3d-8f2a6b0e4d17`` with three characteristics:

* ``DATA_UP``   (…0001, notify): data chunks wearable -> handheld.
* ``DATA_DOWN`` (…0002, write without response): data chunks handheld -> wearable.
* ``CONTROL``   (…0003, write with response + notify): control frames (handshake, credits,
  aborts, errors). Control frames are never subject to credits.

All three require an encrypted (paired) link. Data chunks follow :mod:`ble_protocol.frames`; a
control frame is ``u8 kind | body``:

====  ===========  =====================================================================
kind  name         body
====  ===========  =====================================================================
1     HELLO        UTF-8 JSON (handheld -> wearable), see :func:`make_hello`
2     HELLO_ACK    UTF-8 JSON (wearable -> handheld), same keys
3     CREDIT       u16 n: the sender of this frame accepts ``n`` more data chunks
4     ERROR        u16 error code | UTF-8 text; the link is then closed
5     ABORT        u8 message type | u32 request id: drop that partial message
====  ===========  =====================================================================
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from enum import IntEnum
from typing import Any

from coinf.ble_protocol.chunks import (
    CHUNK_HEADER,
    HEADER_BYTES,
    Reassembler,
    chunk_size_for_mtu,
    encode_chunks,
)
from coinf.ble_protocol.flow import MAX_WINDOW, CreditGate, CreditLedger, fresh
from coinf.ble_protocol.link import Link, LinkClosed
from coinf.ble_protocol.messages import (
    PROTOCOL_VERSION,
    ErrorCode,
    Message,
    MsgType,
    ProtocolError,
    decode_json,
    encode_error,
)
from coinf.ble_protocol.tasks import TaskSet

log = logging.getLogger(__name__)

_BASE = "c0f1{:04x}-5e7a-4b1e-9c3d-8f2a6b0e4d17"
SERVICE_UUID = _BASE.format(0x0000)
DATA_UP_UUID = _BASE.format(0x0001)
DATA_DOWN_UUID = _BASE.format(0x0002)
CONTROL_UUID = _BASE.format(0x0003)

HEARTBEAT_S = 1.0  # PING a peer silent this long (only one that announced "heartbeat")
SILENCE_LIMIT_S = 3.0  # a peer silent this long is gone
DEFAULT_WINDOW = 128  # chunks a receiver accepts before returning credits
DEFAULT_MTU = 517


class Ctrl(IntEnum):
    HELLO = 1
    HELLO_ACK = 2
    CREDIT = 3
    ERROR = 4
    ABORT = 5
    PING = 6  # u32 nonce: "are you there?" (only to a peer that announced "heartbeat")
    PONG = 7  # u32 nonce of the PING it answers


# --- control frames ----------------------------------------------------------------------------


def ctrl_json(kind: Ctrl, obj: dict[str, Any]) -> bytes:
    data = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    if len(data) + 1 > 512:
        raise ValueError("handshake does not fit one ATT value")
    return bytes([kind]) + data


def ctrl_credit(n: int) -> bytes:
    return bytes([Ctrl.CREDIT]) + struct.pack("<H", n)


def ctrl_error(code: ErrorCode, text: str) -> bytes:
    """A fatal control ERROR: ``u16 code | UTF-8 text``, at most 500 B (no hop byte: the
    message-level ERROR of ``messages.encode_error`` has one)."""
    return (bytes([Ctrl.ERROR]) + struct.pack("<H", int(code)) + text.encode("utf-8"))[:500]


def ctrl_ping(nonce: int, pong: bool = False) -> bytes:
    return bytes([Ctrl.PONG if pong else Ctrl.PING]) + struct.pack("<I", nonce & 0xFFFFFFFF)


def ctrl_abort(mtype: int, rid: int) -> bytes:
    return bytes([Ctrl.ABORT]) + struct.pack("<BI", mtype, rid)


def parse_ctrl(frame: bytes) -> tuple[Ctrl, Any]:
    """Decode a control frame. Raises :class:`ProtocolError` on anything malformed."""
    if not frame:
        raise ProtocolError(ErrorCode.TRUNCATED, "empty control frame")
    try:
        kind = Ctrl(frame[0])
    except ValueError:
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown control frame {frame[0]}") from None
    body = bytes(frame[1:])
    if kind in (Ctrl.HELLO, Ctrl.HELLO_ACK):
        return kind, decode_json(body, what="handshake")
    if kind == Ctrl.CREDIT:
        if len(body) != 2:
            raise ProtocolError(ErrorCode.MALFORMED, "CREDIT frame must carry exactly a u16")
        return kind, struct.unpack("<H", body)[0]
    if kind == Ctrl.ERROR:
        if len(body) < 2:
            raise ProtocolError(ErrorCode.TRUNCATED, "ERROR frame shorter than 2 bytes")
        (raw,) = struct.unpack_from("<H", body)
        try:
            code = ErrorCode(raw)
        except ValueError:
            code = ErrorCode.MALFORMED
        return kind, ProtocolError(code, "peer: " + body[2:].decode("utf-8", "replace"))
    if kind in (Ctrl.PING, Ctrl.PONG):
        if len(body) != 4:
            raise ProtocolError(ErrorCode.MALFORMED, f"{kind.name} frame must carry a u32")
        return kind, struct.unpack("<I", body)[0]
    if len(body) != 5:
        raise ProtocolError(ErrorCode.MALFORMED, "ABORT frame must be u8 type + u32 id")
    return kind, struct.unpack("<BI", body)


# --- handshake ---------------------------------------------------------------------------------


def make_hello(
    bundle_identity: str,
    mtu: int,
    window: int = DEFAULT_WINDOW,
    max_message_bytes: int = 64 * 1024 * 1024,
    protocol: int = PROTOCOL_VERSION,
    role: str = "handheld",
) -> dict[str, Any]:
    return {
        "protocol": protocol,
        "bundle": bundle_identity,
        "mtu": mtu,
        "role": role,
        "capabilities": {"window": window, "max_message_bytes": max_message_bytes, "crc32": True,
                         "heartbeat": True},
    }


def peer_heartbeat(obj: dict[str, Any]) -> bool:
    """Whether a (checked) handshake announced that its sender answers PING with PONG."""
    caps = obj.get("capabilities")
    return isinstance(caps, dict) and caps.get("heartbeat") is True


def check_hello(
    obj: dict[str, Any], bundle_identity: str, protocol: int = PROTOCOL_VERSION
) -> tuple[int, int, int]:
    """Validate a peer's handshake; returns (mtu, window, max_message_bytes)."""
    peer_version = obj.get("protocol")
    if peer_version != protocol:
        raise ProtocolError(
            ErrorCode.BAD_VERSION,
            f"peer speaks protocol {peer_version!r}, this side speaks {protocol}",
        )
    if obj.get("bundle") != bundle_identity:
        raise ProtocolError(
            ErrorCode.BUNDLE_MISMATCH,
            f"peer runs bundle {str(obj.get('bundle'))[:80]!r}, this side runs {bundle_identity!r}",
        )
    caps = obj.get("capabilities")
    mtu = obj.get("mtu")
    if not isinstance(caps, dict) or not isinstance(mtu, int) or not 23 <= mtu <= 517:
        raise ProtocolError(ErrorCode.MALFORMED, "handshake lacks a valid mtu or capabilities")
    window, limit = caps.get("window"), caps.get("max_message_bytes")
    if not isinstance(window, int) or not 1 <= window <= MAX_WINDOW:
        raise ProtocolError(ErrorCode.MALFORMED, f"handshake window {window!r} is invalid")
    if not isinstance(limit, int) or limit < 1:
        raise ProtocolError(ErrorCode.MALFORMED, f"handshake max_message_bytes {limit!r} invalid")
    return mtu, window, limit


# --- the link ------------------------------------------------------------------------------------

Writer = Callable[[bytes], Awaitable[None]]
#: (message type, request id) -> the largest payload this receiver accepts for that message
IncomingLimit = Callable[[int, int], int]
#: told of a message refused by its declared size: (request id, type, declared, limit)
Refused = Callable[[int, int, int, int], None]


class GattLink(Link):
    """A :class:`Link` over two GATT pipes: chunks on a data characteristic, frames on control.

    The transport side calls :meth:`feed_data` / :meth:`feed_control` with every received value
    and :meth:`connection_lost` on disconnect. A link never survives a disconnection: pending
    sends and receives raise :class:`LinkClosed` at once and a new link must be accepted /
    connected (the wearable's server keeps advertising; the handheld reconnects with backoff).
    """

    def __init__(
        self,
        *,
        role: str,
        mtu: int,
        peer_window: int,
        peer_max_message_bytes: int,
        write_data: Writer,
        write_control: Writer,
        disconnect: Callable[[], Awaitable[None]],
        window: int = DEFAULT_WINDOW,
        max_message_bytes: int = 64 * 1024 * 1024,
        reassembly_timeout: float = 30.0,
        name: str = "gatt",
        heartbeat: bool = False,
        heartbeat_s: float = HEARTBEAT_S,
        silence_limit_s: float = SILENCE_LIMIT_S,
        flushed: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__()
        self.role = role  # "wearable" (RPC client) or "handheld" (RPC server)
        self.mtu = mtu
        self.chunk_size = chunk_size_for_mtu(mtu)
        self.max_message_bytes = max_message_bytes
        self.peer_max_message_bytes = peer_max_message_bytes
        self._write_data, self._write_control, self._disconnect = (
            write_data,
            write_control,
            disconnect,
        )
        self._gate = CreditGate(peer_window)
        self._ledger = CreditLedger(window)
        self._reasm = Reassembler(
            max_message_bytes=max_message_bytes,
            budget_bytes=max_message_bytes + 64 * 1024,
            timeout_s=reassembly_timeout,
        )
        self._inbox: asyncio.Queue[Message | BaseException] = asyncio.Queue()
        self._inbox_bytes = 0
        self.inbox_cap = max(1 << 20, self.chunk_size * window)
        self._send_lock = asyncio.Lock()
        self._ctrl_queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._credit_pending = 0  # credits granted but not yet written (merged into one frame)
        self._ctrl_wakeup = asyncio.Event()
        self._open = True
        self._closing: BaseException | None = None
        self._name = name
        self._tasks = TaskSet()
        self._workers = [self._spawn(self._control_writer()), self._spawn(self._expiry())]
        self.heartbeat_s, self.silence_limit_s = heartbeat_s, silence_limit_s
        self._flushed = flushed  # the transport's "every packet queued so far is on the air"
        self._last_heard = time.monotonic()
        self._pings = 0
        if heartbeat:  # the peer answers PING: watch that it stays alive
            self._workers.append(self._spawn(self._watch_peer()))
        self._incoming_limit: IncomingLimit | None = None
        self._on_refused: Refused | None = None
        self._refused: OrderedDict[tuple[int, int], None] = OrderedDict()

    def limit_incoming(self, limit: IncomingLimit, refused: Refused) -> None:
        """Bound each incoming message by ``limit(type, request_id)`` bytes (the receiver's
        expectation, e.g. an RPC client's per-request reply bound), on top of
        ``max_message_bytes``. It is checked on every chunk's header before reassembly holds
        any of its data: a message over its bound is dropped, its later chunks too, and
        ``refused(request_id, type, declared, limit)`` is told (the link stays up)."""
        self._incoming_limit, self._on_refused = limit, refused

    @property
    def description(self) -> str:
        return f"{self._name} (mtu {self.mtu}, chunk {self.chunk_size} B)"

    @property
    def is_open(self) -> bool:
        return self._open

    # --- sending -------------------------------------------------------------------------
    def delivered(self) -> Awaitable[None] | None:
        return self._flushed() if self._flushed is not None and self._open else None

    async def send(self, message: Message) -> None:
        if not self._open:
            raise self._closed_error()
        if len(message.payload) > self.peer_max_message_bytes:
            raise ProtocolError(
                ErrorCode.TOO_LARGE,
                f"message of {len(message.payload)} B exceeds the peer's limit of "
                f"{self.peer_max_message_bytes} B",
            )
        async with self._send_lock:
            started = finished = False
            stats = self.stats
            stats.sending_done, stats.sending_since = 0, time.monotonic()
            stats.sending_total = len(message.payload)
            try:
                for chunk in encode_chunks(message, self.chunk_size):
                    await self._gate.acquire()
                    started = True
                    await self._write_data(chunk)
                    stats.sending_done += len(chunk) - HEADER_BYTES
                finished = True
            except asyncio.CancelledError:
                if started and not finished and self._open:
                    self._ctrl_queue.put_nowait(ctrl_abort(int(message.type), message.request_id))
                    self._ctrl_wakeup.set()
                raise
            except ProtocolError:
                raise
            except Exception as exc:  # the transport failed under us
                self.connection_lost(f"write failed: {exc}")
                raise self._closed_error() from None
            finally:
                stats.sending_total = 0
        self.stats.count_sent(len(message.payload))

    async def _control_writer(self) -> None:
        """Writes control frames one at a time. Credits granted while a write is in flight are
        merged, so a slow write (with response) never limits the credit rate."""
        while True:
            await self._ctrl_wakeup.wait()
            self._ctrl_wakeup.clear()
            frames = []
            while not self._ctrl_queue.empty():
                frames.append(self._ctrl_queue.get_nowait())
            if self._credit_pending:
                n = min(self._credit_pending, 0xFFFF)
                self._credit_pending -= n
                frames.append(ctrl_credit(n))
                if self._credit_pending:
                    self._ctrl_wakeup.set()
            for frame in frames:
                try:
                    await self._write_control(frame)
                except Exception as exc:
                    self.connection_lost(f"control write failed: {exc}")
                    return

    # --- receiving -----------------------------------------------------------------------
    async def receive(self) -> Message:
        if not self._open and self._inbox.empty():
            raise self._closed_error()
        item = await self._inbox.get()
        if isinstance(item, BaseException):
            self._inbox.put_nowait(item)  # every later receive fails the same way
            raise fresh(item)
        self._inbox_bytes -= len(item.payload)
        self._maybe_grant()
        self.stats.count_received(len(item.payload))
        return item

    def _maybe_grant(self, force: bool = False) -> None:
        n = self._ledger.take_grant(allowed=self._inbox_bytes < self.inbox_cap, force=force)
        if n and self._open:
            self._credit_pending += n
            self._ctrl_wakeup.set()

    def feed_data(self, value: bytes) -> None:
        """One data chunk arrived from the peer."""
        if not self._open:
            return
        self._last_heard = time.monotonic()
        try:
            self._ledger.on_chunk()
            if self._over_limit(value):
                self._maybe_grant()
                return
            msg = self._reasm.feed(value)
        except ProtocolError as exc:
            rid = exc.request_id
            self._maybe_grant(force=True)
            if rid is None or exc.code == ErrorCode.BAD_VERSION:
                self._fail(exc)
            else:
                self._message_failed(rid, exc)
            return
        if msg is not None:
            self._inbox_bytes += len(msg.payload)
            self._inbox.put_nowait(msg)
        self._maybe_grant()

    def _over_limit(self, chunk: bytes) -> bool:
        """Whether ``chunk`` belongs to a message over its :meth:`limit_incoming` bound (then
        dropped here, before the reassembler sees it)."""
        if self._incoming_limit is None or len(chunk) < HEADER_BYTES:
            return False
        version, mtype, rid, total, _ = CHUNK_HEADER.unpack_from(chunk)
        if version != self._reasm.version:
            return False  # the reassembler reports it (fatal)
        key = (mtype, rid)
        if key in self._refused:
            return True
        limit = self._incoming_limit(mtype, rid)
        if total <= limit:
            return False
        self._refused[key] = None
        while len(self._refused) > 64:
            self._refused.popitem(last=False)
        self._reasm.cancel(rid)  # a message its bound shrank under (its request was settled)
        log.warning("%s: refused message %d (type %d): it declares %d B, at most %d B expected",
                    self._name, rid, mtype, total, limit)
        if self._on_refused is not None:
            self._on_refused(rid, mtype, total, limit)
        return True

    def _message_failed(self, rid: int, exc: ProtocolError) -> None:
        """A single message was bad: fail the local waiter (wearable) or tell the peer."""
        log.warning("%s: dropped message %d: %s", self._name, rid, exc)
        err = Message(MsgType.ERROR, rid, encode_error(exc.code, exc.text, exc.hop))
        if self.role == "wearable":
            self._inbox.put_nowait(err)
        else:
            self._spawn(self._send_quietly(err))

    async def _send_quietly(self, msg: Message) -> None:
        with contextlib.suppress(ProtocolError):
            await self.send(msg)

    def feed_control(self, value: bytes) -> None:
        """One control frame arrived from the peer (after the handshake)."""
        if not self._open:
            return
        self._last_heard = time.monotonic()
        try:
            kind, body = parse_ctrl(value)
            if kind == Ctrl.PING:
                self._queue_control(ctrl_ping(body, pong=True))
            elif kind == Ctrl.PONG:
                pass  # hearing it was the point
            elif kind == Ctrl.CREDIT:
                self._gate.grant(body)
            elif kind == Ctrl.ERROR:
                self._fail(body, tell_peer=False)
            elif kind == Ctrl.ABORT:
                self._reasm.cancel(body[1])
            else:
                raise ProtocolError(ErrorCode.MALFORMED, f"unexpected {kind.name} after handshake")
        except (ProtocolError, ValueError) as exc:
            err = (
                exc
                if isinstance(exc, ProtocolError)
                else ProtocolError(ErrorCode.MALFORMED, str(exc))
            )
            self._fail(err)

    def _queue_control(self, frame: bytes) -> None:
        self._ctrl_queue.put_nowait(frame)
        self._ctrl_wakeup.set()

    async def _watch_peer(self) -> None:
        """Liveness: after ``heartbeat_s`` without a frame from the peer, PING it; after
        ``silence_limit_s`` of silence the peer is gone (its process stopped or hung while the
        controllers keep the connection up): the link fails with :class:`LinkClosed`."""
        while self._open:
            await asyncio.sleep(self.heartbeat_s / 2)
            silent = time.monotonic() - self._last_heard
            if silent > self.silence_limit_s:
                log.warning("%s: peer silent for %.1f s; closing", self._name, silent)
                self._shutdown(LinkClosed(f"{self._name}: peer silent for {silent:.1f} s"))
                self._spawn(self._disconnect_later())
                return
            if silent >= self.heartbeat_s:
                self._pings += 1
                self._queue_control(ctrl_ping(self._pings))

    async def _expiry(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self._reasm.timeout_s / 4))
            for rid in self._reasm.expire():
                self._message_failed(
                    rid,
                    ProtocolError(
                        ErrorCode.TIMEOUT,
                        f"message {rid} incomplete: no data for {self._reasm.timeout_s:.0f} s "
                        f"or slower than {self._reasm.min_rate_bps / 1e3:g} kB/s",
                    ),
                )

    # --- teardown ------------------------------------------------------------------------
    def _fail(self, exc: ProtocolError, tell_peer: bool = True) -> None:
        log.warning("%s: closing after protocol error: %s", self._name, exc)
        if tell_peer and self._open:
            frame = ctrl_error(exc.code, exc.text)
            self._spawn(self._write_quietly(frame))
        self._shutdown(exc)
        self._spawn(self._disconnect_later())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A task this link keeps until it ends, and cancels (and awaits) in :meth:`close`."""
        return self._tasks.spawn(coro)

    async def _write_quietly(self, frame: bytes) -> None:
        with contextlib.suppress(Exception):
            await self._write_control(frame)

    async def _disconnect_later(self) -> None:
        await asyncio.sleep(0.05)
        with contextlib.suppress(Exception):
            await self._disconnect()

    def _closed_error(self) -> BaseException:
        return fresh(self._closing) if self._closing else LinkClosed(f"{self._name} closed")

    def connection_lost(self, reason: str = "disconnected") -> None:
        """The BLE connection dropped: fail everything pending with :class:`LinkClosed`."""
        self._shutdown(LinkClosed(f"{self._name}: {reason}"))

    def _shutdown(self, exc: BaseException) -> None:
        if not self._open:
            return
        self._open = False
        self._closing = exc
        self._gate.close(exc)
        self._inbox.put_nowait(exc)
        for task in self._workers:
            task.cancel()

    async def close(self) -> None:
        was_open = self._open
        self._shutdown(LinkClosed(f"{self._name} closed locally"))
        if was_open:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._disconnect(), 5.0)
        await self._tasks.cancel_all()
