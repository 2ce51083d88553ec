"""The tail service: one front end for many wearables, batches on an engine.

A :class:`FleetService` speaks the daemon's protocol on every link a listener yields (the same
HELLO and bundle identity check, the same TLS pairing on ``tcp:``), for one or several bundles:
a link serves the bundle its HELLO names. It checks each REQUEST at its header as the daemon
does (size, header, one-hop STAGES; a TILE or a pipeline of several hops is UNSUPPORTED here),
queues it in the bundle's :class:`~handheld.fleet_queue.TailQueue`, which forms batches across
wearables, and an :class:`~handheld.engines.Engine` runs them (in this process, or on Ray
Serve's replicas). A wearable sees a handheld; STATUS adds the service's queueing delay
(``queue_ms``), which the wearable's planner adds to the cost of every offloaded plan.

Per link at most ``max_pending`` frames are in flight; more are refused with BUSY at once
(rpc.serve's admission), so a flooding wearable fills only its own queue; the batcher takes one
frame per link in turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterable, Sequence
from typing import Any

from coinf.ble_protocol import rpc
from coinf.ble_protocol.link import Link
from coinf.ble_protocol.messages import (
    ErrorCode,
    Message,
    MsgType,
    ProtocolError,
    decode_json,
    encode_json,
)
from coinf.ble_protocol.request import Kind
from coinf.ble_protocol.tasks import TaskSet
from coinf.device.emulation import DeviceEmulation
from coinf.device.profile import DeviceProfile
from coinf.handheld.daemon import HandheldDaemon, HelloFirst
from coinf.handheld.engines import Engine
from coinf.handheld.fleet_queue import TailQueue

from coinf.bundle import Bundle
from coinf.errors import InputError

log = logging.getLogger(__name__)


class FleetService:
    """Serves the tails of ``bundles`` to any number of wearables through ``engine``, with at
    most ``slots`` batches of a bundle in flight (default: the engine's ``concurrency``).

    An async context manager: entering starts the engine, leaving stops it and every link."""

    def __init__(self, bundles: Sequence[Bundle], engine: Engine, *, max_batch: int = 32,
                 max_wait_ms: float = 20.0, max_pending: int = 4, slots: int | None = None,
                 profile: DeviceProfile | None = None) -> None:
        if not bundles:
            raise InputError("the tail service needs at least one bundle")
        ids = [b.identity for b in bundles]
        if len(set(ids)) != len(ids):
            raise InputError("two of the bundles are the same model split the same way")
        if max_pending < 1:
            raise InputError("max_pending must be >= 1")
        self.engine = engine
        self.max_pending = max_pending
        # the daemon's checks and messages, one per bundle; its tails never load here
        self.fronts = {b.identity: HandheldDaemon(b, DeviceEmulation(), lru=1, profile=profile)
                       for b in bundles}
        self.queues = {i: TailQueue(self._runner(i), max_batch=max_batch,
                                    max_wait_s=max_wait_ms / 1e3,
                                    slots=slots or engine.concurrency) for i in ids}
        self.serve_stats = rpc.ServeStats()
        self.connections = 0
        self.started = time.monotonic()
        self._tasks = TaskSet()

    def _runner(self, identity: str) -> Any:
        async def run(payloads: Sequence[bytes]) -> Sequence[Any]:
            return await self.engine.run(identity, payloads)
        return run

    @property
    def bundles(self) -> list[Bundle]:
        return [d.bundle for d in self.fronts.values()]

    async def __aenter__(self) -> FleetService:
        await self.engine.start(self.bundles)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._tasks.cancel_all()
        for q in self.queues.values():
            await q.aclose()
        await self.engine.aclose()

    def start(self, link: Link) -> asyncio.Task[Any]:
        return self._tasks.spawn(self.serve(link))

    async def serve_listener(self, links: AsyncIterable[Link]) -> None:
        """Serve every link a listener yields, each in its own task, until it ends."""
        async for link in links:
            self.start(link)

    async def serve(self, link: Link) -> None:
        """Serve one wearable until its link closes; then close it."""
        self.connections += 1
        handler = LinkHandler(self, link)
        log.info("wearable connected over %s", link.description)
        try:
            await rpc.serve(link, HelloFirst(handler) if getattr(link, "unauthenticated", False)
                            else handler, self.max_pending, max_pending=self.max_pending,
                            stats=self.serve_stats)
        finally:
            for q in self.queues.values():
                q.forget(handler)
            await link.close()

    def status(self, identity: str) -> dict[str, Any]:
        """The daemon's STATUS plus the service's own figures: ``queue_ms`` (median wait of the
        last frames before their batch ran), and the engine's."""
        st = self.fronts[identity].status()
        q = self.queues[identity]
        st.update(requests=q.stats.frames, busy=self.serve_stats.busy,
                  uptime_s=round(time.monotonic() - self.started, 1),
                  queue_ms=q.stats.queue_ms(), waiting=q.waiting, batches=q.stats.batches,
                  service=self.engine.status())
        return st


class LinkHandler:
    """The messages of one link: HELLO binds it to the bundle it names."""

    def __init__(self, service: FleetService, link: Link) -> None:
        self.service = service
        self.link = link
        # one bundle: the link is bound from the start (STATUS before HELLO, as the daemon)
        self.identity: str | None = (next(iter(service.fronts))
                                     if len(service.fronts) == 1 else None)

    async def __call__(self, msg: Message) -> Message | None:
        if msg.type == MsgType.HELLO:
            return await self._hello(msg)
        if self.identity is None:
            raise ProtocolError(ErrorCode.UNSUPPORTED, "HELLO first: this service serves "
                                "several bundles and picks one by the HELLO's bundle identity")
        front = self.service.fronts[self.identity]
        if msg.type == MsgType.STATUS:
            return Message(MsgType.STATUS, msg.request_id,
                           encode_json(self.service.status(self.identity)))
        if msg.type == MsgType.REQUEST:
            request, _ = front.admit(msg.payload)  # size and header, before queueing
            if request.kind != Kind.STAGES or len(request.hops) != 1:
                raise ProtocolError(ErrorCode.UNSUPPORTED, "this tail service runs tails "
                                    "(one-hop requests); tiles and pipeline stages go to a "
                                    "coinf handheld")
            try:
                outcome = await self.service.queues[self.identity].submit(self, msg.payload)
            except ProtocolError:
                raise
            except Exception as exc:  # the engine could not run the batch (replicas gone)
                raise ProtocolError(ErrorCode.TAIL_FAILED, f"the tail service's engine "
                                    f"failed: {type(exc).__name__}: {exc}"[:200]) from None
            if outcome.payload is None:
                raise ProtocolError(_code(outcome.code), outcome.text)
            return Message(MsgType.RESULT, msg.request_id, outcome.payload)
        return await front.handle(msg)  # PROFILE, and the daemon's refusals

    async def _hello(self, msg: Message) -> Message | None:
        hello = decode_json(msg.payload)
        wanted = hello.get("bundle")
        fronts = self.service.fronts
        if wanted in fronts:
            self.identity = str(wanted)
        elif len(fronts) > 1:
            raise ProtocolError(ErrorCode.BUNDLE_MISMATCH,
                                f"wearable has bundle {str(wanted)[:80]}; this service serves "
                                f"{len(fronts)} others: split the same model on both sides")
        assert self.identity is not None
        return await fronts[self.identity].handle(msg)  # the daemon's checks and HELLO_ACK


def _code(value: int) -> ErrorCode:
    try:
        return ErrorCode(value)
    except ValueError:
        return ErrorCode.TAIL_FAILED


__all__ = ["FleetService", "LinkHandler"]
