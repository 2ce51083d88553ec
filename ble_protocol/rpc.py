"""Request/response over a :class:`~ble_protocol.link.Link`.

The wearable side (:class:`RpcClient`) numbers requests, matches replies by ``request_id``,
enforces per-request timeouts and sends CANCEL for abandoned requests. The handheld side
(:func:`serve`) answers HELLO, PROBE and REQUEST messages with a user handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable

from coinf.ble_protocol.link import Link, LinkClosed
from coinf.ble_protocol.messages import (
    ErrorCode,
    Message,
    MsgType,
    ProtocolError,
    decode_error,
    encode_error,
)

log = logging.getLogger(__name__)

Handler = Callable[[Message], Awaitable[Message | None]]


class RpcClient:
    """Send requests over a link and await their replies. One reader task per client."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._reader: asyncio.Task[None] | None = None
        self.on_unsolicited: Callable[[Message], None] | None = None

    def _ensure_reader(self) -> None:
        if self._reader is None or self._reader.done():
            self._reader = asyncio.get_running_loop().create_task(self._read_loop())

    async def _read_loop(self) -> None:
        error: ProtocolError = LinkClosed()
        try:
            while True:
                msg = await self.link.receive()
                fut = self._pending.pop(msg.request_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
                elif self.on_unsolicited is not None:
                    self.on_unsolicited(msg)
        except ProtocolError as exc:
            error = exc
        except asyncio.CancelledError:
            error = LinkClosed("client closed")
            raise
        finally:
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(error)
            self._pending.clear()

    async def request(
        self,
        mtype: MsgType,
        payload: bytes,
        timeout: float | None,
        marks: dict[str, float] | None = None,
    ) -> Message:
        """Send one message and wait for its reply. ERROR replies raise :class:`ProtocolError`.

        ``marks``, if given, receives ``perf_counter`` times: ``sent`` (the link took the whole
        message) and ``replied`` (the reply arrived).
        """
        if not self.link.is_open:
            raise LinkClosed(f"{self.link.description} is not connected")
        self._ensure_reader()
        rid = next(self._ids) & 0xFFFFFFFF
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            await asyncio.wait_for(self.link.send(Message(mtype, rid, payload)), timeout)
            if marks is not None:
                marks["sent"] = time.perf_counter()
            reply = await asyncio.wait_for(asyncio.shield(fut), timeout)
            if marks is not None:
                marks["replied"] = time.perf_counter()
        except ProtocolError:
            self._pending.pop(rid, None)  # the send failed: nobody will resolve this future
            if not fut.done():
                fut.cancel()
            raise
        except TimeoutError:
            self._pending.pop(rid, None)
            with contextlib.suppress(ProtocolError, TimeoutError):
                await asyncio.wait_for(self.link.send(Message(MsgType.CANCEL, rid)), 1.0)
            raise ProtocolError(ErrorCode.TIMEOUT, f"no reply within {timeout:.1f} s") from None
        except asyncio.CancelledError:
            self._pending.pop(rid, None)
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


async def serve(link: Link, handler: Handler, max_concurrent: int = 1) -> None:
    """Answer messages on ``link`` until it closes.

    PROBE is echoed by this loop; CANCEL cancels the matching in-flight request; everything else
    goes to ``handler``, whose reply (if any) is sent back. A handler exception becomes an ERROR
    reply; a :class:`ProtocolError` keeps its code.
    """
    inflight: dict[int, asyncio.Task[None]] = {}
    slots = asyncio.Semaphore(max_concurrent)

    async def run_one(msg: Message) -> None:
        reply: Message | None
        try:
            async with slots:
                reply = await handler(msg)
        except asyncio.CancelledError:
            return
        except ProtocolError as exc:
            reply = Message(MsgType.ERROR, msg.request_id, encode_error(exc.code, exc.text))
        except Exception as exc:  # a bug or a tail failure: report it, keep serving
            log.exception("handler failed on request %d", msg.request_id)
            reply = Message(
                MsgType.ERROR,
                msg.request_id,
                encode_error(ErrorCode.TAIL_FAILED, f"{type(exc).__name__}: {exc}"),
            )
        finally:
            inflight.pop(msg.request_id, None)
        # Sent outside the slot: the next request computes while this reply travels.
        if reply is not None:
            with contextlib.suppress(LinkClosed):
                await link.send(reply)

    try:
        while True:
            try:
                msg = await link.receive()
            except LinkClosed:
                return
            except ProtocolError as exc:
                log.warning("dropping link after protocol error: %s", exc)
                return
            if msg.type == MsgType.PROBE:
                await link.send(Message(MsgType.PROBE, msg.request_id, msg.payload))
            elif msg.type == MsgType.CANCEL:
                task = inflight.pop(msg.request_id, None)
                if task is not None:
                    task.cancel()
            else:
                inflight[msg.request_id] = asyncio.get_running_loop().create_task(run_one(msg))
    finally:
        for task in list(inflight.values()):
            task.cancel()
