"""Tasks an object starts and owns: kept until they end, cancelled and awaited when it closes.

Every server, link, host and daemon that starts background work holds one :class:`TaskSet`, so
no task is ever left running unowned (``asyncio`` keeps only weak references to tasks).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from typing import Any


class TaskSet:
    """A set of live tasks: :meth:`spawn` adds one, it leaves the set when it ends."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` as a task this set keeps."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(list(self._tasks))

    async def cancel_all(self, timeout: float | None = None) -> None:
        """Cancel every live task and wait for them to finish (at most ``timeout`` seconds when
        given: a task waiting on a controller may take a while to unwind)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        if timeout is None:
            await asyncio.gather(*tasks, return_exceptions=True)
        else:
            await asyncio.wait(tasks, timeout=timeout)
