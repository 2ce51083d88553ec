"""``Session``: run a split model like ``onnxruntime.InferenceSession``, offloading the rest.

>>> opts = SessionOptions(placement=PlacementOptions(split="c012"))
>>> sess = Session("bundles/mobilenetv2", opts)
>>> probs, = sess.run(None, {"input": x})
>>> sess.last_run.transfer_ms

A thin synchronous front over :class:`~coinf.wearable.core.AsyncSession`, which it drives on a
private event-loop thread. Everything an inference does lives in the core; this class only
carries calls across the thread boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Never

import numpy as np
from coinf.ble_protocol.link import Link
from coinf.ble_protocol.packing import PackSpec
from coinf.wearable.autoplan import AutoPlan
from coinf.wearable.core import AsyncSession, ModelMetadata
from coinf.wearable.frame import FrameResult, NodeArg, RunStats
from coinf.wearable.loop import LoopThread
from coinf.wearable.options import (
    EmulationOptions,
    LinkOptions,
    PlacementOptions,
    PlannerOptions,
    RunOptions,
    SessionOptions,
)
from coinf.wearable.planner.costs import Decision

from coinf.bundle import Bundle, Candidate, Compressor
from coinf.errors import CoinfError


class Session:
    """Runs ``bundle`` split between this wearable and a handheld (docs/ARCHITECTURE.md).

    Like ``onnxruntime.InferenceSession(path, sess_options, providers)``: ``sess_options`` is a
    frozen :class:`SessionOptions` (``SessionOptions(placement=PlacementOptions(split="c007"),
    link=LinkOptions(transport="tcp:127.0.0.1:7878"))``). An option given as a keyword
    (``Session(b, split="c007")``) is an :class:`~coinf.errors.InputError` naming its group.
    """

    def __init__(
        self,
        bundle: str | Path | Bundle,
        sess_options: SessionOptions | None = None,
        providers: Sequence[str] | None = None,
        **misplaced: Never,
    ) -> None:
        self._core = AsyncSession(bundle, sess_options, providers, **misplaced)
        self._loop: LoopThread | None = None

    # -- onnxruntime's surface ------------------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return self._core.get_inputs()

    def get_outputs(self) -> list[NodeArg]:
        return self._core.get_outputs()

    def get_providers(self) -> list[str]:
        return self._core.get_providers()

    def get_session_options(self) -> SessionOptions:
        return self._core.get_session_options()

    def get_modelmeta(self) -> ModelMetadata:
        return self._core.get_modelmeta()

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        run_options: RunOptions | None = None,
    ) -> list[np.ndarray]:
        """One inference; the requested outputs (every output for ``None`` or ``[]``).

        Wrong input names, shapes or dtypes raise :class:`~coinf.errors.InputError` before
        anything is computed or sent. ``last_run`` has the timings.
        """
        return self._thread().run(self._core.run(output_names, input_feed, run_options))

    def stream(
        self,
        feeds: Iterable[Mapping[str, Any]],
        output_names: Sequence[str] | None = None,
        *,
        depth: int | None = None,
        pipelined: bool = True,
    ) -> Iterator[FrameResult]:
        """Run a stream of inputs, pipelined; one :class:`FrameResult` per input, in order
        (see :meth:`AsyncSession.astream`). Closing the iterator cancels frames in flight."""
        loop = self._thread()
        agen = self._core.astream(feeds, output_names, depth=depth, pipelined=pipelined)

        async def step() -> FrameResult | None:
            try:
                return await anext(agen)
            except StopAsyncIteration:
                return None

        try:
            while (item := loop.run(step())) is not None:
                yield item
        finally:
            with contextlib.suppress(Exception):
                loop.run(agen.aclose(), timeout=30)

    async def astream(
        self,
        feeds: AsyncIterable[Mapping[str, Any]] | Iterable[Mapping[str, Any]],
        output_names: Sequence[str] | None = None,
        *,
        depth: int | None = None,
        pipelined: bool = True,
    ) -> AsyncIterator[FrameResult]:
        """:meth:`stream` for a caller's own event loop; ``feeds`` may be async. (A program that
        is asyncio throughout can use :class:`~coinf.AsyncSession` directly.)"""
        caller = asyncio.get_running_loop()
        loop = self._thread().loop
        if isinstance(feeds, AsyncIterable):
            source = aiter(feeds)

            async def relay() -> AsyncIterator[Mapping[str, Any]]:
                while True:  # each item is pulled on the caller's loop
                    fut = asyncio.run_coroutine_threadsafe(_anext_or_none(source), caller)
                    item = await asyncio.wrap_future(fut)
                    if item is None:
                        return
                    yield item

            inner: AsyncIterable[Mapping[str, Any]] | Iterable[Mapping[str, Any]] = relay()
        else:
            inner = feeds
        agen = self._core.astream(inner, output_names, depth=depth, pipelined=pipelined)
        try:
            while True:
                fut = asyncio.run_coroutine_threadsafe(_anext_or_none(agen), loop)
                item = await asyncio.wrap_future(fut)
                if item is None:
                    return
                yield item
        finally:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(agen.aclose(), loop))

    # -- planning and state -------------------------------------------------------------------
    @property
    def bundle(self) -> Bundle:
        return self._core.bundle

    @property
    def options(self) -> SessionOptions:
        return self._core.options

    @property
    def split(self) -> Candidate:
        return self._core.split

    @property
    def packing(self) -> PackSpec:
        return self._core.packing

    @property
    def compressor(self) -> Compressor | None:
        """The compressor whose code an offloaded run sends (``c013~g5+latent``), or None."""
        return self._core.compressor

    @property
    def last_run(self) -> RunStats | None:
        return self._core.last_run

    @property
    def offline(self) -> str | None:
        return self._core.offline

    @property
    def strategies(self) -> dict[str, Any] | None:
        """With helpers and no fixed split or plan: every strategy compared now, the chosen
        one (``chosen``, ``why``), its ``plan`` and ``version``, the helpers ``left_out``, the
        ``history`` of plan changes, and why spatial partition is never run (``spatial``)."""
        return self._core.strategies

    @property
    def links(self) -> dict[str, dict[str, Any]]:
        """Every link to the handheld by name: kind, transport, state, why it is out, frames
        carried (:attr:`AsyncSession.links`)."""
        return self._core.links

    @property
    def handheld_info(self) -> dict[str, Any] | None:
        return self._core.handheld_info

    @property
    def link(self) -> Link | None:
        """The link to the handheld, once connected (several: the one sending now, else the
        first one up)."""
        open_links = [lk.conn.rpc_client.link for lk in self._core.handheld_links
                      if lk.conn.rpc_client is not None]
        sending = [link for link in open_links if link.stats.sending() is not None]
        return next(iter(sending or open_links), None)

    @property
    def autoplan(self) -> AutoPlan | None:
        """The planner choosing each run's split, or None when the split is fixed."""
        return self._core.autoplan

    @property
    def core(self) -> AsyncSession:
        """The async core this front drives."""
        return self._core

    def set_split(self, split: str | None, packing: str | PackSpec | None = None) -> None:
        """Fix the split (``packing``: a packing, or ``gN[+packing]`` to send compressor
        ``gN``'s code); ``None`` gives the choice back to the planner."""
        self._core.set_split(split, packing)

    def plan(self) -> Decision:
        return self._core.plan()

    # -- lifecycle ------------------------------------------------------------------------------
    def connect(self) -> dict[str, Any]:
        """Connect and handshake now (otherwise done on the first offloaded run)."""
        return self._thread().run(self._core.connect())

    def close(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        with contextlib.suppress(Exception):
            loop.run(self._core.close(), timeout=15)
        loop.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def _thread(self) -> LoopThread:
        if self._loop is None:
            self._loop = LoopThread()
        return self._loop


async def _anext_or_none(agen: Any) -> Any:
    try:
        return await anext(agen)
    except StopAsyncIteration:
        return None


__all__ = ["CoinfError", "EmulationOptions", "FrameResult", "LinkOptions", "NodeArg",
           "PlacementOptions", "PlannerOptions", "RunOptions", "RunStats", "Session",
           "SessionOptions"]
