"""Where the fleet service's batches run: an engine, opened from one spec string.

=================  =========================================================================
spec               engine
=================  =========================================================================
``local``          this process: one :class:`~handheld.batch.BatchRunner` per worker thread
``local:N``        the same with N worker threads (default 1)
``ray``            Ray Serve on a Ray started here (``serve`` extra): replicas are processes,
                   autoscaled, restarted when they die (:mod:`handheld.ray_engine`)
``ray:ADDRESS``    Ray Serve on a running cluster (``ray:auto``, ``ray:HOST:6379``)
=================  =========================================================================

Every engine implements :class:`Engine`; an implementation is imported only when its spec is
opened (Ray takes seconds to import).
"""

from __future__ import annotations

import asyncio
import importlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from coinf.bundle import Bundle
from coinf.errors import InputError

#: engine name -> "module:class"
ENGINES = {"local": "coinf.handheld.engines:LocalEngine",
           "ray": "coinf.handheld.ray_engine:RayEngine"}


@dataclass(frozen=True)
class EngineOptions:
    """What every engine takes: onnxruntime threads per worker or replica; replicas (Ray: the
    autoscaling range, ``min_replicas`` .. ``max_replicas``); the largest batch."""

    threads: int = 1
    min_replicas: int = 1
    max_replicas: int = 2
    max_batch: int = 32

    def __post_init__(self) -> None:
        if self.threads < 1 or self.max_batch < 1:
            raise InputError("engine threads and max_batch must be >= 1")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise InputError(f"replicas must satisfy 1 <= min <= max, got "
                             f"{self.min_replicas}..{self.max_replicas}")


class Engine(ABC):
    """Runs batches of REQUEST payloads for the bundles it was started with."""

    #: one line for the ready message and logs
    description: str = ""

    @abstractmethod
    async def start(self, bundles: Sequence[Bundle]) -> None:
        """Load what the bundles need (replicas, sessions); returns when ready to run."""

    @abstractmethod
    async def run(self, identity: str, payloads: Sequence[bytes]) -> Sequence[Any]:
        """One :class:`~handheld.batch.Outcome` per payload, in order, for the bundle of
        ``identity``. Raises when the batch could not run at all."""

    @abstractmethod
    async def aclose(self) -> None:
        """Stop what :meth:`start` started."""

    def status(self) -> dict[str, Any]:
        """Engine figures for STATUS (replicas and the like)."""
        return {"engine": self.description}

    @property
    def concurrency(self) -> int:
        """Batches worth having in flight at once (the front end's dispatch slots)."""
        return 1


class LocalEngine(Engine):
    """Batches run in this process on ``workers`` threads, one runner per thread and bundle."""

    def __init__(self, address: str = "", options: EngineOptions | None = None) -> None:
        self.options = options or EngineOptions()
        try:
            self.workers = int(address) if address else 1
        except ValueError:
            raise InputError(f"engine local:{address}: expected local:N (worker threads)"
                             ) from None
        if not 1 <= self.workers <= 64:
            raise InputError(f"engine local:{address}: 1 to 64 worker threads")
        self.description = f"local ({self.workers} worker thread{'s' * (self.workers > 1)})"
        self._runners: dict[str, asyncio.Queue[Any]] = {}
        self._pool: ThreadPoolExecutor | None = None

    @property
    def concurrency(self) -> int:
        return self.workers

    async def start(self, bundles: Sequence[Bundle]) -> None:
        from coinf.handheld.batch import BatchRunner

        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="coinf-batch")
        for bundle in bundles:
            free: asyncio.Queue[Any] = asyncio.Queue()
            for _ in range(self.workers):
                free.put_nowait(BatchRunner(bundle, threads=self.options.threads))
            self._runners[bundle.identity] = free

    async def run(self, identity: str, payloads: Sequence[bytes]) -> Sequence[Any]:
        if self._pool is None:
            raise RuntimeError("engine not started")
        free = self._runners[identity]
        runner = await free.get()
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._pool, runner.run, list(payloads))
        finally:
            free.put_nowait(runner)

    async def aclose(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def open_engine(spec: str, options: EngineOptions | None = None) -> Engine:
    """The engine of ``spec`` (module docstring)."""
    name, _, address = spec.partition(":")
    target = ENGINES.get(name)
    if target is None:
        raise InputError(f"unknown engine {spec!r}: expected local, local:N, ray or ray:ADDRESS")
    module, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    engine: Engine = cls(address, options)
    return engine


__all__ = ["ENGINES", "Engine", "EngineOptions", "LocalEngine", "open_engine"]
