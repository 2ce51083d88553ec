"""Pipelined streaming: head, packing, radio and tail of consecutive frames overlap.

Stages: head (one thread) -> pack (one thread) -> link + handheld tail (the event loop) -> unpack
(the caller). Frame n+2's head runs while frame n+1 crosses the link and the handheld computes
frame n. At most ``depth`` frames are in flight and the input iterable is only
pulled when there is room, so a fast producer is held back instead of filling memory.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from coinf.wearable.session import FrameResult, RunStats, _transient

if TYPE_CHECKING:
    from coinf.convert.bundle import Candidate
    from coinf.wearable.session import Session


@dataclass
class _Pending:
    candidate: Candidate
    stats: RunStats
    start: float
    crossing: dict[str, Any] | None = None
    outputs: dict[str, Any] | None = None
    reply: bytes | None = None
    offload_error: BaseException | None = None  # transient: finish this frame on the wearable
    local_reason: str | None = None


def run_stream(
    session: Session,
    feeds: Iterable[Mapping[str, Any]],
    output_names: Sequence[str] | None,
    depth: int = 3,
) -> Iterator[FrameResult]:
    """Generator behind :meth:`Session.stream`."""
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    names = session._check_outputs(output_names)
    loop = session._loop_thread()
    head_pool = ThreadPoolExecutor(1, thread_name_prefix="coinf-head")
    pack_pool = ThreadPoolExecutor(1, thread_name_prefix="coinf-pack")
    inflight: deque[tuple[int, Future[_Pending]]] = deque()
    source = iter(feeds)
    exhausted = False
    index = 0

    def head_stage(feed: Mapping[str, Any]) -> _Pending:
        if session.autoplan is not None:
            session._plan_next()
        cand = session.split
        stats = RunStats(candidate=cand.id, packing=str(session.packing))
        pending = _Pending(cand, stats, time.perf_counter())
        checked = session._check_feed(feed)
        pending.crossing = session._run_head(cand, checked, pending.stats)
        return pending

    def pack_stage(pending: _Pending) -> _Pending:
        if pending.candidate.is_wearable_only:
            pending.outputs = pending.crossing
            pending.stats.local = True
        elif session.offline is not None:
            pending.local_reason = session.offline
        else:
            assert pending.crossing is not None
            pending.reply = session._pack(pending.candidate, pending.crossing, pending.stats)
        return pending

    def submit(feed: Mapping[str, Any]) -> Future[_Pending]:
        done: Future[_Pending] = Future()

        def failed(f: Future[Any]) -> bool:
            exc = f.exception()
            if exc is not None:
                done.set_exception(exc)
            return exc is not None

        def after_head(hf: Future[_Pending]) -> None:
            if not failed(hf):
                pack_pool.submit(pack_stage, hf.result()).add_done_callback(after_pack)

        def after_pack(pf: Future[_Pending]) -> None:
            if failed(pf):
                return
            pending = pf.result()
            if pending.reply is None:  # wearable-only, or the handheld is unavailable
                done.set_result(pending)
                return
            cf = asyncio.run_coroutine_threadsafe(
                session._exchange(pending.reply, pending.stats), loop.loop
            )

            def after_exchange(xf: Future[bytes]) -> None:
                exc = xf.exception()
                if exc is not None and session.fallback and _transient(exc):
                    pending.reply = None
                    pending.offload_error = exc
                    done.set_result(pending)
                elif not failed(xf):
                    pending.reply = xf.result()
                    done.set_result(pending)

            cf.add_done_callback(after_exchange)

        head_pool.submit(head_stage, feed).add_done_callback(after_head)
        return done

    if session.autoplan is not None:
        session.autoplan.set_streaming(depth > 1)
    try:
        while True:
            while not exhausted and len(inflight) < depth:
                try:
                    feed = next(source)
                except StopIteration:
                    exhausted = True
                    break
                inflight.append((index, submit(feed)))
                index += 1
            if not inflight:
                return
            i, fut = inflight.popleft()
            try:
                pending = fut.result(timeout=session.timeout + 10)
                outputs = pending.outputs
                if outputs is None and pending.reply is not None:
                    outputs = session._unpack(pending.reply, pending.stats)
                elif outputs is None:
                    if pending.offload_error is not None:
                        session._went_offline(pending.offload_error)
                    assert pending.crossing is not None
                    outputs = session._finish_locally(
                        pending.candidate,
                        pending.crossing,
                        pending.stats,
                        pending.local_reason or session._offline_reason,
                    )
                pending.crossing = None
                pending.stats.total_ms = (time.perf_counter() - pending.start) * 1e3
                session.last_run = pending.stats
                if session.autoplan is not None:
                    session.autoplan.finished(pending.stats)
                yield FrameResult(i, [outputs[n] for n in names], None, pending.stats)
            except Exception as exc:
                yield FrameResult(i, None, exc, None)
    finally:
        if session.autoplan is not None:
            session.autoplan.set_streaming(False)
        head_pool.shutdown(wait=True, cancel_futures=True)
        pack_pool.shutdown(wait=True, cancel_futures=True)


@dataclass
class RealtimeSource:
    """Frames that arrive at ``rate_hz`` whether or not the pipeline is ready.

    Iterating returns the newest frame that has arrived; frames that arrived while the pipeline was
    busy are dropped (counted in :attr:`dropped`), never queued. Frames are pulled lazily from
    ``frames`` (a frame that is dropped is still taken from it).
    """

    frames: Iterable[Mapping[str, Any]]
    rate_hz: float
    limit: int | None = None
    delivered: int = 0
    dropped: int = 0
    started: float | None = None
    _it: Iterator[Mapping[str, Any]] | None = field(default=None, repr=False)
    _next: int = 0

    def __post_init__(self) -> None:
        if not self.rate_hz > 0:
            raise ValueError(f"rate_hz must be > 0, got {self.rate_hz}")

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        self._it = iter(self.frames)
        self.started = time.perf_counter()
        self._next = 0
        return self

    def __next__(self) -> Mapping[str, Any]:
        assert self._it is not None and self.started is not None, "iterate with iter() first"
        now = time.perf_counter()
        arrived = int((now - self.started) * self.rate_hz) + 1  # frames that exist by now
        if self.limit is not None:
            arrived = min(arrived, self.limit)
        if self._next >= arrived:
            if self.limit is not None and self._next >= self.limit:
                raise StopIteration
            time.sleep(max(self.started + self._next / self.rate_hz - now, 0.0))
            arrived = self._next + 1
        frame: Mapping[str, Any] | None = None
        while self._next < arrived:  # keep the newest frame, drop the older ones
            try:
                frame = next(self._it)
            except StopIteration:
                if frame is None:
                    raise
                break
            self._next += 1
        assert frame is not None
        self.delivered += 1
        self.dropped = self._next - self.delivered
        return frame

    @property
    def offered(self) -> int:
        return self._next


def effective_accuracy(throughput_fps: float, accuracy: float, input_rate_hz: float) -> float:
    """Streaming paper §III: throughput x accuracy / input rate (capped by accuracy)."""
    return min(throughput_fps / input_rate_hz, 1.0) * accuracy
