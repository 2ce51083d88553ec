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
6, 7  PING, PONG   u32 nonce (liveness)
8-11  SENT, ACK,   loss recovery and credit sync (module :mod:`~coinf.ble_protocol.arq`)
      NACK, SYNC
====  ===========  =====================================================================
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from coinf.ble_protocol import arq
from coinf.ble_protocol.chunks import (
    CHUNK_HEADER,
    HEADER_BYTES,
    Reassembler,
    chunk_size_for_mtu,
    encode_chunks,
)
from coinf.ble_protocol.ctrl_frames import (
    DEFAULT_WINDOW,
    Ctrl,
    check_hello,
    ctrl_abort,
    ctrl_credit,
    ctrl_error,
    ctrl_json,
    ctrl_ping,
    make_hello,
    parse_ctrl,
    peer_ack,
    peer_heartbeat,
)
from coinf.ble_protocol.flow import MAX_WINDOW, CreditGate, CreditLedger, fresh
from coinf.ble_protocol.link import Link, LinkClosed
from coinf.ble_protocol.messages import (
    ErrorCode,
    Message,
    MsgType,
    ProtocolError,
    encode_error,
)
from coinf.ble_protocol.tasks import TaskSet

log = logging.getLogger(__name__)

_BASE = "c0f1{:04x}-5e7a-4b1e-9c3d-8f2a6b0e4d17"
SERVICE_UUID = _BASE.format(0x0000)
DATA_UP_UUID = _BASE.format(0x0001)
DATA_DOWN_UUID = _BASE.format(0x0002)
CONTROL_UUID = _BASE.format(0x0003)

HEARTBEAT_S = 0.25  # PING a peer silent this long (only one that announced "heartbeat")
SILENCE_LIMIT_S = 1.0  # a handheld silent this long is gone (the wearable then works alone)
#: a wearable silent this long is gone: the handheld is more patient, a slow wearable may stall
#: for a moment (loading a model) and the handheld gains nothing by giving up early
WEARABLE_SILENCE_LIMIT_S = 3.0
DEFAULT_MTU = 517


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
        ack: bool = False,
        heartbeat_s: float = HEARTBEAT_S,
        silence_limit_s: float | None = None,
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
        #: loss recovery (module arq): both handshakes announced "ack"
        self.ack = ack
        self.arq = arq.ArqStats()
        self._outbox = arq.Outbox()
        self._chunks_sent = 0  # data chunks written on this link (SENT / SYNC carry it)
        self._ledger = CreditLedger(window, slack=8 if ack else 0)
        self._reasm = Reassembler(
            max_message_bytes=max_message_bytes,
            budget_bytes=max_message_bytes + 64 * 1024,
            timeout_s=reassembly_timeout,
            remember_failed=not ack,
        )
        self._inbox: asyncio.Queue[Message | BaseException] = asyncio.Queue()
        self._inbox_bytes = 0
        self.inbox_cap = max(1 << 20, self.chunk_size * window)
        self._send_lock = asyncio.Lock()
        self._ctrl_queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._credit_pending = 0  # credits granted but not yet written (merged into one frame)
        self._ctrl_wakeup = asyncio.Event()
        self._open = True
        self._dropped = False  # the connection is down (or its disconnect was asked for)
        self._closing: BaseException | None = None
        self._name = name
        self._tasks = TaskSet()
        self._workers = [self._spawn(self._control_writer()), self._spawn(self._expiry())]
        self.heartbeat_s = heartbeat_s
        #: default: SILENCE_LIMIT_S on the wearable, WEARABLE_SILENCE_LIMIT_S on the handheld
        self.silence_limit_s = silence_limit_s if silence_limit_s is not None else (
            SILENCE_LIMIT_S if role == "wearable" else WEARABLE_SILENCE_LIMIT_S)
        self._granted_at = time.monotonic()
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
        await self._send_chunks(message)
        self.stats.count_sent(len(message.payload))

    async def _send_chunks(self, message: Message,
                           ranges: list[tuple[int, int]] | None = None) -> None:
        """Write ``message``'s chunks (only those over ``ranges``: a resend), then SENT."""
        async with self._send_lock:
            started = finished = False
            stats = self.stats
            stats.sending_done, stats.sending_since = 0, time.monotonic()
            stats.sending_total = len(message.payload)
            try:
                for chunk in encode_chunks(message, self.chunk_size, ranges=ranges):
                    await self._credit()
                    started = True
                    await self._write_data(chunk)
                    self._chunks_sent += 1
                    stats.sending_done += len(chunk) - HEADER_BYTES
                finished = True
            except asyncio.CancelledError:
                if started and not finished and self._open:
                    self._queue_control(ctrl_abort(int(message.type), message.request_id))
                raise
            except ProtocolError:
                raise
            except Exception as exc:  # the transport failed under us
                self.connection_lost(f"write failed: {exc}")
                raise self._closed_error() from None
            finally:
                stats.sending_total = 0
            if self.ack:
                self._outbox.hold(message)
                await self._in_order(bytes([Ctrl.SENT]) + arq.sent_body(
                    int(message.type), message.request_id, self._chunks_sent))

    async def _in_order(self, frame: bytes) -> None:
        """Write a control frame now, under the send lock: no data chunk written after it can
        overtake it (SENT and SYNC count the chunks written before them)."""
        try:
            await self._write_control(frame)
        except Exception as exc:
            self.connection_lost(f"control write failed: {exc}")
            raise self._closed_error() from None

    async def _credit(self) -> None:
        """One credit; with loss recovery, a SYNC every ``CREDIT_STALL_S`` while waiting."""
        if not self.ack or self._gate.credits > 0:
            await self._gate.acquire()
            return
        while True:
            try:
                async with asyncio.timeout(arq.CREDIT_STALL_S):
                    await self._gate.acquire()
                    return
            except TimeoutError:
                self.arq.syncs += 1
                await self._in_order(bytes([Ctrl.SYNC]) + arq.sync_body(self._chunks_sent))

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
                n = min(self._credit_pending, MAX_WINDOW)
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
        """Return credits once a batch is owed (or ``force``); also while chunks arrive slowly,
        at least every ``heartbeat_s``: the sender hears from us while it sends (liveness)."""
        now = time.monotonic()
        force = force or now - self._granted_at >= self.heartbeat_s
        n = self._ledger.take_grant(allowed=self._inbox_bytes < self.inbox_cap, force=force)
        if n and self._open:
            self._granted_at = now
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
            duplicates = self._reasm.stats.duplicates
            msg = self._reasm.feed(value)
            if self._reasm.stats.duplicates != duplicates:
                self._ledger.uncount()  # it brought nothing new: no credit is charged for it
        except ProtocolError as exc:
            rid = exc.request_id
            self._maybe_grant(force=True)
            if rid is None or exc.code == ErrorCode.BAD_VERSION:
                self._fail(exc)
            elif self.ack and exc.code == ErrorCode.BAD_CRC:
                log.info("%s: message %d failed its CRC; its SENT gets a NACK", self._name, rid)
            else:
                self._refuse((value[1], rid), exc)
            return
        if msg is not None:
            self._inbox_bytes += len(msg.payload)
            self._inbox.put_nowait(msg)
        self._maybe_grant()

    def _over_limit(self, chunk: bytes) -> bool:
        """Whether ``chunk`` belongs to a message over its :meth:`limit_incoming` bound (then
        dropped here, before the reassembler sees it)."""
        if len(chunk) < HEADER_BYTES:
            return False
        version, mtype, rid, total, _ = CHUNK_HEADER.unpack_from(chunk)
        if version != self._reasm.version:
            return False  # the reassembler reports it (fatal)
        key = (mtype, rid)
        if key in self._refused:
            return True  # a message refused once: its later chunks are dropped silently
        if self._incoming_limit is None:
            return False
        limit = self._incoming_limit(mtype, rid)
        if total <= limit:
            return False
        self._remember_refused(key)
        self._reasm.cancel(rid)  # a message its bound shrank under (its request was settled)
        log.warning("%s: refused message %d (type %d): it declares %d B, at most %d B expected",
                    self._name, rid, mtype, total, limit)
        if self._on_refused is not None:
            self._on_refused(rid, mtype, total, limit)
        return True

    def _remember_refused(self, key: tuple[int, int]) -> None:
        self._refused[key] = None
        while len(self._refused) > 64:
            self._refused.popitem(last=False)

    def _refuse(self, key: tuple[int, int], exc: ProtocolError) -> None:
        """A received message failed for good: report it once (one ERROR per message, not per
        chunk), drop what was held of it and every later chunk of it; its SENT gets an ACK
        (no resend)."""
        self._remember_refused(key)
        self._reasm.drop(*key)
        self._message_failed(key[1], exc)

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
            elif kind in (Ctrl.SENT, Ctrl.ACK, Ctrl.NACK, Ctrl.SYNC):
                if self.ack:  # else ignored: the peer's handshake or ours lacked "ack" (§3)
                    self._on_arq(kind, body)
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

    # --- loss recovery (module arq) --------------------------------------------------------
    def _on_arq(self, kind: Ctrl, body: Any) -> None:
        if kind == Ctrl.SENT:
            mtype, rid, chunks = body
            self._answer_sent(mtype, rid, chunks, first=True)
        elif kind == Ctrl.ACK:
            self._outbox.ack(body)
        elif kind == Ctrl.NACK:
            mtype, rid, ranges = body
            msg, failed = self._outbox.nack((mtype, rid))
            if failed:
                self.arq.given_up += 1
                self._message_failed(rid, ProtocolError(
                    ErrorCode.BAD_CRC, f"message {rid} still lost or corrupted after "
                    f"{arq.MAX_RESENDS} resends"))
            elif msg is not None:
                self.arq.resends += 1
                self._spawn(self._resend(msg, ranges))
        elif self._ledger.sync(body) > 0:  # SYNC
            self._maybe_grant(force=True)

    def _answer_sent(self, mtype: int, rid: int, chunks: int, first: bool = False) -> None:
        """ACK or NACK message (``mtype``, ``rid``) whose last chunk the peer has sent. The
        credit sync applies at once (the SENT came in order after the chunks it counts; the
        next message's may follow it at once); only a NACK waits ``ACK_GRACE_S``."""
        if first and self._ledger.sync(chunks) > 0:
            self._maybe_grant(force=True)
        missing = self._reasm.status(mtype, rid)
        done = missing is None or (mtype, rid) in self._refused
        if not done and first and arq.ACK_GRACE_S > 0:
            self._spawn(self._answer_later(mtype, rid, chunks))
            return
        if done:
            self.arq.acks += 1
            self._queue_control(bytes([Ctrl.ACK]) + arq.ack_body(mtype, rid))
        else:
            self.arq.nacks += 1
            self._queue_control(bytes([Ctrl.NACK]) + arq.nack_body(mtype, rid, missing or []))

    async def _answer_later(self, mtype: int, rid: int, chunks: int) -> None:
        await asyncio.sleep(arq.ACK_GRACE_S)
        if self._open:
            self._answer_sent(mtype, rid, chunks)

    async def _resend(self, message: Message, ranges: list[tuple[int, int]]) -> None:
        before = self._chunks_sent
        with contextlib.suppress(ProtocolError):
            await self._send_chunks(message, ranges or None)
        self.arq.resent_chunks += self._chunks_sent - before

    async def _watch_peer(self) -> None:
        """Liveness: after ``heartbeat_s`` without a frame from the peer, PING it; after
        ``silence_limit_s`` of silence the peer is gone (its process stopped or hung while the
        controllers keep the connection up): the link fails with :class:`LinkClosed` and the
        connection is dropped. A check that itself ran late (this process was not scheduled)
        judges nobody: the peer gets a fresh ``heartbeat_s`` and a PING."""
        tick = self.heartbeat_s / 2
        last = time.monotonic()
        while self._open:
            await asyncio.sleep(tick)
            now = time.monotonic()
            late, last = now - last - tick, now
            if late > self.heartbeat_s:
                self._last_heard = max(self._last_heard, now - self.heartbeat_s)
            silent = now - self._last_heard
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
            for key in self._reasm.expire_keys():
                rid = key[1]
                self._refuse(
                    key,
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
        await asyncio.sleep(0.05)  # an ERROR frame goes out first
        await self._drop()

    async def _drop(self) -> None:
        """Disconnect (once, bounded): a link that failed must not leave its connection up, or
        the wearable would neither be reachable nor advertise."""
        if self._dropped:
            return
        self._dropped = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._disconnect(), 5.0)

    def _closed_error(self) -> BaseException:
        return fresh(self._closing) if self._closing else LinkClosed(f"{self._name} closed")

    def connection_lost(self, reason: str = "disconnected") -> None:
        """The BLE connection dropped: fail everything pending with :class:`LinkClosed`."""
        self._dropped = True
        self._shutdown(LinkClosed(f"{self._name}: {reason}"))

    def _shutdown(self, exc: BaseException) -> None:
        if not self._open:
            return
        self._open = False
        self._closing = exc
        self._outbox.clear()
        self._gate.close(exc)
        self._inbox.put_nowait(exc)
        for task in self._workers:
            task.cancel()

    async def close(self) -> None:
        self._shutdown(LinkClosed(f"{self._name} closed locally"))
        await self._drop()  # also after a failure whose own disconnect has not run yet
        await self._tasks.cancel_all()


__all__ = ["CONTROL_UUID", "DATA_DOWN_UUID", "DATA_UP_UUID", "DEFAULT_MTU", "DEFAULT_WINDOW",
           "HEARTBEAT_S", "SERVICE_UUID", "SILENCE_LIMIT_S", "Ctrl", "GattLink", "check_hello",
           "ctrl_abort", "ctrl_credit", "ctrl_error", "ctrl_json", "ctrl_ping", "make_hello",
           "parse_ctrl", "peer_ack", "peer_heartbeat"]
