"""A private asyncio loop on a daemon thread, so synchronous APIs can drive async links."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """Runs an event loop on a background thread; :meth:`run` blocks until a coroutine is done."""

    def __init__(self, name: str = "coinf-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for it. On ``timeout`` (or Ctrl-C) the coroutine is
        cancelled, and its cancellation awaited, before this raises: nothing is left running."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("LoopThread.run called from its own loop; await the coroutine")

        async def guarded() -> T:
            # Once the caller gave up (Ctrl-C, timeout), nobody reads this task's outcome: an
            # error it still ends with (LinkClosed as the session closes) must not be logged as
            # "Task exception was never retrieved".
            task = asyncio.current_task()
            assert task is not None
            task.add_done_callback(_consume)
            return await coro

        fut = asyncio.run_coroutine_threadsafe(guarded(), self.loop)
        try:
            return fut.result(timeout)
        except BaseException:
            if not fut.done():
                fut.cancel()  # cancels the task on the loop
                with contextlib.suppress(BaseException):
                    fut.result(10)
            raise

    def close(self) -> None:
        if self.loop.is_closed():
            return

        async def _drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_drain(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self.loop.close()


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
