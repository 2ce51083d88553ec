"""Request/response over a :class:`~ble_protocol.link.Link`.

The wearable side (:class:`RpcClient`) numbers requests, matches replies by ``request_id``,
enforces per-request timeouts, sends CANCEL for abandoned requests and bounds what it accepts:
each request's reply by the largest valid answer to it (docs/PROTOCOL.md §6.13), checked on the
declared size before the link reassembles or allocates anything. The handheld side
(:func:`serve`) answers HELLO, PROBE and REQUEST messages with a user handler, admitting a
bounded number of requests at a time (the rest get ERROR BUSY).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from coinf.ble_protocol.link import Link, LinkClosed
from coinf.ble_protocol.messages import (
    MAX_CONTROL_BYTES,
    ErrorCode,
    Message,
    MsgType,
    ProtocolError,
    decode_error,
    encode_error,
    reply_bound,
    reply_type,
)

from coinf.errors import CoinfError, PeerResultError

log = logging.getLogger(__name__)

Handler = Callable[[Message], Awaitable[Message | None]]


class RpcClient:
    """Send requests over a link and await their replies. One reader task per client.

    Memory is bounded by what is expected: every request registers the largest reply payload
    it can validly get (``max_reply``, else :func:`~ble_protocol.messages.reply_bound` of its
    type), and a message that declares more is refused from its header, before the link holds
    its payload: a link with per-message limits (``limit_incoming``, the BLE link) refuses just
    that message; any other link is capped at the largest reply still expected
    (``link.max_message_bytes``; a socket link then drops the connection). Messages nobody
    expects (unsolicited, or an ERROR) are accepted up to ``unsolicited_bytes``. A reply over
    its bound fails its request with :class:`~coinf.errors.PeerResultError` (transient).
    """

    #: replies of abandoned (timed-out, cancelled) requests stay accepted for this many requests
    ABANDONED_KEPT = 64

    def __init__(self, link: Link, *, unsolicited_bytes: int = MAX_CONTROL_BYTES) -> None:
        self.link = link
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._reader: asyncio.Task[None] | None = None
        self.on_unsolicited: Callable[[Message], None] | None = None
        #: the link's own limit; no bound is ever raised above it
        self.ceiling = link.max_message_bytes
        self.unsolicited_bytes = min(unsolicited_bytes, self.ceiling)
        #: request id -> (the reply type expected or None for any, its largest payload)
        self._expect: dict[int, tuple[MsgType | None, int]] = {}
        self._abandoned: deque[int] = deque()
        hook = getattr(link, "limit_incoming", None)  # a link that checks each message
        self._per_message = False
        if callable(hook):
            hook(self.incoming_limit, self._refused)
            self._per_message = True
        self._apply_limit()

    # -- the receiver's bound -------------------------------------------------------------------
    def incoming_limit(self, mtype: int, request_id: int) -> int:
        """The largest payload accepted for a message of ``mtype`` with ``request_id``."""
        expected = self._expect.get(request_id)
        if expected is not None and expected[0] in (None, mtype):
            return max(expected[1], 0)
        return self.unsolicited_bytes

    @property
    def expected_bytes(self) -> int:
        """The largest message this client accepts right now (every request's bound)."""
        return max((b for _, b in self._expect.values()), default=0)

    def _apply_limit(self) -> None:
        """A link without per-message limits is capped at the largest reply still expected."""
        if not self._per_message:
            self.link.max_message_bytes = max(self.unsolicited_bytes, self.expected_bytes)

    def _expect_reply(self, rid: int, mtype: MsgType, payload: bytes,
                      max_reply: int | None) -> None:
        bound = max_reply if max_reply is not None else reply_bound(mtype, len(payload))
        limit = self.ceiling if bound is None else min(max(bound, 0), self.ceiling)
        self._expect[rid] = (reply_type(mtype), limit)
        self._apply_limit()

    def _settled(self, rid: int) -> None:
        if self._expect.pop(rid, None) is not None:
            self._apply_limit()

    def _abandon(self, rid: int) -> None:
        """Its reply may still come (it may be on its way): keep accepting it, for a while."""
        self._abandoned.append(rid)
        while len(self._abandoned) > self.ABANDONED_KEPT:
            self._settled(self._abandoned.popleft())

    def _refused(self, rid: int, mtype: int, declared: int, limit: int) -> None:
        """The link refused message ``rid`` (``declared`` bytes over ``limit``) from its header."""
        self._settled(rid)
        fut = self._pending.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_exception(_too_large(rid, declared, limit))

    def _ensure_reader(self) -> None:
        if self._reader is None or self._reader.done():
            self._reader = asyncio.get_running_loop().create_task(self._read_loop())

    async def _read_loop(self) -> None:
        error: ProtocolError = LinkClosed()
        try:
            while True:
                msg = await self.link.receive()
                limit = self.incoming_limit(msg.type, msg.request_id)
                self._settled(msg.request_id)
                fut = self._pending.pop(msg.request_id, None)
                if len(msg.payload) > limit:  # a link that holds whole messages (in-process)
                    exc = _too_large(msg.request_id, len(msg.payload), limit)
                    if fut is not None and not fut.done():
                        fut.set_exception(exc)
                    else:
                        log.warning("dropped %s: %s", msg.type.name, exc)
                elif fut is not None and not fut.done():
                    fut.set_result(msg)
                elif self.on_unsolicited is not None:
                    self.on_unsolicited(msg)
        except ProtocolError as exc:
            error = exc
            if exc.code == ErrorCode.TOO_LARGE and not self._per_message:
                # the link refused a frame over the cap this client set: the peer's fault
                error = PeerResultError(f"the peer sent more than this client accepts now "
                                        f"({self.link.max_message_bytes} B): {exc.text}")
        except asyncio.CancelledError:
            error = LinkClosed("client closed")
            raise
        finally:
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(error)
            self._pending.clear()
            self._expect.clear()
            self._abandoned.clear()
            self._apply_limit()

    async def request(
        self,
        mtype: MsgType,
        payload: bytes,
        timeout: float | None,
        marks: dict[str, float] | None = None,
        *,
        max_reply: int | None = None,
    ) -> Message:
        """Send one message and wait for its reply. ERROR replies raise :class:`ProtocolError`.
        ``timeout`` bounds the whole exchange (sending and the reply); on expiry CANCEL is sent
        and :class:`ProtocolError` (TIMEOUT) raised. ``max_reply`` is the largest reply payload
        that can be valid (a REQUEST's: its RESULT bound); without it the bound of the type
        (:func:`~ble_protocol.messages.reply_bound`; a REQUEST: the link's own limit). A reply
        declaring more raises :class:`~coinf.errors.PeerResultError` without being received.

        ``marks``, if given, receives ``perf_counter`` times: ``sent`` (the link took the whole
        message), ``delivered`` (it left this device, :meth:`Link.delivered`; a BLE link takes
        a message into its buffers before it is on the air) and ``replied`` (the reply arrived).
        """
        if not self.link.is_open:
            raise LinkClosed(f"{self.link.description} is not connected")
        self._ensure_reader()
        rid = next(self._ids) & 0xFFFFFFFF
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        self._expect_reply(rid, mtype, payload, max_reply)
        try:
            async with asyncio.timeout(timeout):  # one deadline for sending and the reply
                await self.link.send(Message(mtype, rid, payload))
                if marks is not None:
                    marks["sent"] = time.perf_counter()
                    delivered = self.link.delivered()
                    if delivered is not None:
                        out = asyncio.ensure_future(delivered)
                        out.add_done_callback(functools.partial(_mark_delivered, marks))
                        fut.add_done_callback(functools.partial(_cancel, out))
                reply = await fut
            if marks is not None:
                marks["replied"] = time.perf_counter()
        except ProtocolError:
            # the send failed (nobody will resolve this future), or the reply was refused
            if self._pending.pop(rid, None) is not None:
                self._abandon(rid)  # part of it may have left: its reply may still come
            _discard(fut)
            raise
        except TimeoutError:
            if self._pending.pop(rid, None) is not None:
                self._abandon(rid)
            _discard(fut)
            with contextlib.suppress(ProtocolError, TimeoutError):
                await asyncio.wait_for(self.link.send(Message(MsgType.CANCEL, rid)), 1.0)
            raise ProtocolError(ErrorCode.TIMEOUT, f"no reply within {timeout:.1f} s") from None
        except asyncio.CancelledError:
            if self._pending.pop(rid, None) is not None:
                self._abandon(rid)
            # Interrupted (Ctrl-C closes the session): the reader may already have failed this
            # future with LinkClosed; nobody awaits it now, so retrieve it here, or asyncio logs
            # "Future exception was never retrieved" at exit.
            _discard(fut)
            with contextlib.suppress(ProtocolError, TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self.link.send(Message(MsgType.CANCEL, rid)), 1.0)
            raise
        if reply.type == MsgType.ERROR:
            raise decode_error(reply.payload)
        return reply

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        await self.link.close()


def _too_large(rid: int, declared: int, limit: int) -> PeerResultError:
    return PeerResultError(f"reply to request {rid} declares {declared} B; no valid reply to it "
                           f"exceeds {limit} B")


def _cancel(out: asyncio.Future[None], _done: asyncio.Future[Message]) -> None:
    out.cancel()


def _mark_delivered(marks: dict[str, float], out: asyncio.Future[None]) -> None:
    if not out.cancelled() and out.exception() is None:
        marks["delivered"] = time.perf_counter()


def _discard(fut: asyncio.Future[Message]) -> None:
    """Drop a reply future nobody will await: cancel it, or consume the error it already holds."""
    if not fut.done():
        fut.cancel()
    elif not fut.cancelled():
        fut.exception()


@dataclass
class ServeStats:
    """What :func:`serve` did. One object may be shared by several links (a daemon's totals)."""

    #: requests handed to the handler (a task was created)
    admitted: int = 0
    #: requests refused at admission with ERROR BUSY (no task was created)
    busy: int = 0
    #: in-flight requests cancelled by the peer's CANCEL (no reply is sent for them)
    cancelled: int = 0
    #: requests whose reply (RESULT or ERROR) the link took
    replied: int = 0
    #: requests whose handler raised (answered with ERROR)
    failed: int = 0
    #: messages dropped unanswered because their request id was in flight (§6.4)
    duplicates: int = 0


async def serve(
    link: Link,
    handler: Handler,
    max_concurrent: int = 1,
    *,
    max_pending: int = 4,
    stats: ServeStats | None = None,
    on_cancel: Callable[[int], None] | None = None,
) -> None:
    """Answer messages on ``link`` until it closes (or this coroutine is cancelled).

    PROBE is echoed by this loop; CANCEL cancels the matching in-flight request (no reply is sent
    for it; ``on_cancel(request_id)`` is called and ``stats.cancelled`` counted); everything else
    goes to ``handler``, whose reply (if any) is sent back. A handler exception becomes an ERROR
    reply; a :class:`ProtocolError` keeps its code.

    Admission is bounded: at most ``max_pending`` requests are in flight (waiting for one of the
    ``max_concurrent`` execution slots, running, or having their reply sent). A request beyond
    that is answered at once with ERROR BUSY and no task is created for it. A message (PROBE
    included) whose request id is in flight is dropped unanswered (``stats.duplicates``): any
    reply would carry that id and be taken for the first request's. Once the link took a
    request's reply its id is free again. Every task this function creates is cancelled and
    awaited before it returns.
    """
    if max_concurrent < 1 or max_pending < 1:
        raise ValueError("max_concurrent and max_pending must be >= 1")
    counts = stats if stats is not None else ServeStats()
    inflight: dict[int, asyncio.Task[None]] = {}
    slots = asyncio.Semaphore(max_concurrent)
    loop = asyncio.get_running_loop()

    async def run_one(msg: Message) -> None:
        reply = await _answer(handler, msg, slots, counts)
        # Sent outside the slot: the next request computes while this reply travels. The
        # request stays admitted (and cancellable) until the link took its reply.
        if reply is not None and await _send_reply(link, reply):
            counts.replied += 1

    def forget(rid: int, task: asyncio.Task[None]) -> None:
        if inflight.get(rid) is task:
            del inflight[rid]

    async def refuse(rid: int, code: ErrorCode, text: str) -> None:
        await link.send(Message(MsgType.ERROR, rid, encode_error(code, text)))

    try:
        while True:
            try:
                msg = await link.receive()
            except LinkClosed:
                return
            except ProtocolError as exc:
                log.warning("dropping link after protocol error: %s", exc)
                return
            try:
                if msg.type == MsgType.CANCEL:
                    _cancel_request(inflight, msg.request_id, counts, on_cancel)
                elif msg.request_id in inflight:  # its one reply is the first request's
                    counts.duplicates += 1
                    log.warning("dropped %s %d: that request id is in flight",
                                msg.type.name, msg.request_id)
                elif msg.type == MsgType.PROBE:
                    await link.send(Message(MsgType.PROBE, msg.request_id, msg.payload))
                elif len(inflight) >= max_pending:
                    counts.busy += 1
                    await refuse(msg.request_id, ErrorCode.BUSY,
                                 f"{len(inflight)} requests in flight, at most {max_pending}")
                else:
                    counts.admitted += 1
                    task = loop.create_task(run_one(msg))
                    inflight[msg.request_id] = task
                    task.add_done_callback(functools.partial(forget, msg.request_id))
            except LinkClosed:
                return
            except ProtocolError as exc:  # e.g. an echo larger than the peer accepts
                log.warning("cannot answer %s %d: %s", msg.type.name, msg.request_id, exc)
    finally:
        await _cancel_all(inflight)


async def _answer(handler: Handler, msg: Message, slots: asyncio.Semaphore,
                  counts: ServeStats) -> Message | None:
    """``handler``'s reply to ``msg``, run in one of the ``slots``; an exception it raises
    becomes an ERROR reply (a :class:`ProtocolError` keeps its code, anything else is
    TAIL_FAILED) and counts in ``counts.failed``."""
    try:
        async with slots:
            return await handler(msg)
    except ProtocolError as exc:
        counts.failed += 1
        return Message(MsgType.ERROR, msg.request_id, encode_error(exc.code, exc.text, exc.hop))
    except Exception as exc:  # a bug or a tail failure: report it, keep serving
        counts.failed += 1
        if isinstance(exc, CoinfError):  # a known cause (e.g. a damaged bundle file): one line
            log.error("request %d failed: %s", msg.request_id, exc)
        else:
            log.exception("handler failed on request %d", msg.request_id)
        return Message(
            MsgType.ERROR,
            msg.request_id,
            encode_error(ErrorCode.TAIL_FAILED, f"{type(exc).__name__}: {exc}"),
        )


def _cancel_request(inflight: dict[int, asyncio.Task[None]], rid: int, counts: ServeStats,
                    on_cancel: Callable[[int], None] | None) -> None:
    """The peer's CANCEL of request ``rid``: cancel its task if it still runs (no reply is sent
    for it), count it and tell ``on_cancel``."""
    task = inflight.pop(rid, None)
    if task is not None and not task.done():
        task.cancel()
        counts.cancelled += 1
        if on_cancel is not None:
            on_cancel(rid)


async def _cancel_all(inflight: dict[int, asyncio.Task[None]]) -> None:
    """Cancel every in-flight request's task and wait until each has ended."""
    tasks = list(inflight.values())
    inflight.clear()
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


async def _send_reply(link: Link, reply: Message) -> bool:
    """Send a handler's reply; True once the link took it. A reply the link refuses (e.g.
    larger than the peer accepts) becomes an ERROR with the link's code, so the peer is not left
    waiting for its timeout."""
    try:
        await link.send(reply)
        return True
    except LinkClosed:
        return False
    except ProtocolError as exc:
        if reply.type == MsgType.ERROR:
            log.warning("could not send ERROR for request %d: %s", reply.request_id, exc)
            return False
        log.warning("could not send reply to request %d: %s", reply.request_id, exc)
        with contextlib.suppress(ProtocolError):
            await link.send(
                Message(MsgType.ERROR, reply.request_id, encode_error(exc.code, exc.text, exc.hop))
            )
            return True
        return False
