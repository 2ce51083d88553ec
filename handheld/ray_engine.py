"""The fleet service's batches on Ray Serve (the ``serve`` extra; docs/DEPLOY.md, "A tail
service for many wearables").

One Serve application per bundle, each a deployment of :class:`~handheld.batch.BatchRunner`
replicas: processes, autoscaled between ``min_replicas`` and ``max_replicas`` on the batches in
flight, restarted by Serve when one dies. The front end (:mod:`handheld.fleet`) has already
formed a batch; ``@serve.batch`` in the replica merges the batches of several front ends that
arrive together (``batch_size_fn`` counts frames, not calls). A batch whose replica died is
sent again (tails are pure functions of their inputs: a frame answered twice is answered once
on the wire, by the front end), until it runs or :data:`RETRY_S` passed.

Only coinf's own processes exchange data through Ray (pickled lists of bytes): what came over
the air is decoded and checked inside the replica by the daemon's own checks.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from coinf.handheld.engines import Engine, EngineOptions

from coinf.bundle import Bundle
from coinf.deps import require
from coinf.errors import InputError

log = logging.getLogger(__name__)

#: how long a batch is retried after its replica died (Serve restarts one in a few seconds)
RETRY_S = 30.0
#: batches in flight per replica that the autoscaler aims for
TARGET_ONGOING = 2
#: Ray Serve's own switch for fewer thread hops per call (ray/serve/_private/constants.py)
THROUGHPUT_ENV = "RAY_SERVE_THROUGHPUT_OPTIMIZED"
#: how often STATUS asks Serve how many replicas run, s
STATUS_EVERY_S = 2.0


def _deployment() -> Any:
    """The Serve deployment class (built on first use: importing Ray takes seconds)."""
    from ray import serve

    @serve.deployment(max_ongoing_requests=16, health_check_period_s=2,
                      health_check_timeout_s=10)
    class TailReplica:
        def __init__(self, bundle_dir: str, threads: int) -> None:
            from coinf.handheld.batch import BatchRunner

            self.runner = BatchRunner(bundle_dir, threads=threads)

        @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.0,
                     batch_size_fn=lambda calls: sum(len(c) for c in calls))
        async def run(self, calls: list[list[bytes]]) -> list[list[Any]]:
            flat = [p for call in calls for p in call]
            outcomes = await asyncio.to_thread(self.runner.run, flat)
            out, at = [], 0
            for call in calls:
                out.append([tuple(o) for o in outcomes[at:at + len(call)]])
                at += len(call)
            return out

        def pid(self) -> int:
            return os.getpid()

    return TailReplica


class RayEngine(Engine):
    """Ray Serve: local (``ray``) or a running cluster (``ray:ADDRESS``)."""

    def __init__(self, address: str = "", options: EngineOptions | None = None) -> None:
        require("ray", "serve", "the ray engine (coinf serve --engine ray)")
        # Serve's throughput mode (its router in the caller's event loop, replica code on the
        # replica's loop, gRPC between them): read when ray.serve is imported, passed on to the
        # replicas; a quarter less CPU a frame here (docs/BENCHMARKS.md, "bench fleet")
        os.environ.setdefault(THROUGHPUT_ENV, "1")
        self.address = check_address(address) or None
        self.options = options or EngineOptions()
        self.description = (f"Ray Serve on {address}" if address else "Ray Serve (local)") + (
            f", {self.options.min_replicas}-{self.options.max_replicas} replicas per bundle")
        self._handles: dict[str, Any] = {}
        self._apps: list[str] = []
        self.retried = 0
        self._replicas: int | None = None
        self._replicas_at = -STATUS_EVERY_S
        self._ask = ThreadPoolExecutor(1, thread_name_prefix="coinf-serve-status")
        self._asking: Future[int | None] | None = None

    @property
    def concurrency(self) -> int:
        """One batch more than the most replicas want at their target: the autoscaler sees
        the demand above its target and adds replicas."""
        return self.options.max_replicas * TARGET_ONGOING + 1

    async def start(self, bundles: Sequence[Bundle]) -> None:
        # in the calling (main) thread: Ray's processes started from a worker thread stopped
        # answering here (GCS unreachable after a minute); the service is not serving yet
        self._start(list(bundles))

    def _start(self, bundles: list[Bundle]) -> None:
        import ray
        from ray import serve

        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
            if self.address is None:
                kwargs.update(include_dashboard=False, num_cpus=os.cpu_count() or 1)
            ray.init(address=self.address, **kwargs)
        quiet = {"log_level": "WARNING", "enable_access_log": False}  # no line per request
        serve.start(proxy_location="Disabled", logging_config=quiet)
        cls = _deployment()
        opts = self.options
        for bundle in bundles:
            name = "coinf-" + hashlib.sha256(bundle.identity.encode()).hexdigest()[:12]
            app = cls.options(
                name=name,
                autoscaling_config={"min_replicas": opts.min_replicas,
                                    "max_replicas": opts.max_replicas,
                                    "target_ongoing_requests": TARGET_ONGOING,
                                    "upscale_delay_s": 2.0, "downscale_delay_s": 60.0,
                                    "look_back_period_s": 10.0},
                ray_actor_options={"num_cpus": min(opts.threads, os.cpu_count() or 1),
                                   "runtime_env": {"env_vars": {
                                       THROUGHPUT_ENV: os.environ[THROUGHPUT_ENV]}}},
                logging_config=quiet,
            ).bind(str(Path(bundle.root).resolve()), opts.threads)
            self._handles[bundle.identity] = serve.run(app, name=name, route_prefix=None)
            self._apps.append(name)

    async def run(self, identity: str, payloads: Sequence[bytes]) -> Sequence[Any]:
        from coinf.handheld.batch import Outcome
        from ray import exceptions as rex
        from ray.serve import exceptions as sex

        handle = self._handles[identity]
        self._refresh()  # STATUS then has a recent replica count
        give_up = time.monotonic() + RETRY_S
        delay = 0.05
        while True:
            try:
                rows = await handle.run.remote(list(payloads))
                return [Outcome(*row) for row in rows]
            except (rex.RayActorError, rex.ActorUnavailableError, sex.ReplicaUnavailableError,
                    sex.DeploymentUnavailableError) as exc:
                if time.monotonic() + delay > give_up:
                    raise
                self.retried += 1
                log.info("replica gone (%s): batch of %d sent again", type(exc).__name__,
                         len(payloads))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    def status(self) -> dict[str, Any]:
        """The engine, batches sent again, and the replicas running now (every application;
        asked of Serve's controller at most every :data:`STATUS_EVERY_S`)."""
        self._refresh()
        return {"engine": self.description, "retried_batches": self.retried,
                "replicas": self._replicas}

    def _refresh(self) -> None:
        """Take the last answer about the replicas; ask again when it is stale (in a thread: a
        controller that does not answer must not stall the event loop)."""
        if self._asking is not None and self._asking.done():
            self._replicas, self._asking = self._asking.result(), None
        now = time.monotonic()
        if self._asking is None and now - self._replicas_at > STATUS_EVERY_S and self._apps:
            self._replicas_at = now
            self._asking = self._ask.submit(self._running)

    def _running(self) -> int | None:
        from ray import serve

        try:
            apps = serve.status().applications
            return sum(int(n) for name in self._apps if name in apps
                       for dep in apps[name].deployments.values()
                       for state, n in dep.replica_states.items()
                       if getattr(state, "value", state) == "RUNNING")
        except Exception as exc:  # a figure for STATUS, never fatal
            log.info("replica count unavailable: %s", exc)
            return None

    async def aclose(self) -> None:
        self._ask.shutdown(wait=False, cancel_futures=True)
        if self._apps:
            self._stop()

    def _stop(self) -> None:
        import ray
        from ray import serve

        for name in self._apps:
            try:
                serve.delete(name)
            except Exception as exc:
                log.warning("could not delete Serve application %s: %s", name, exc)
        self._apps.clear()
        if self.address is None:
            serve.shutdown()
            ray.shutdown()


def check_address(address: str) -> str:
    """``auto`` or ``HOST:PORT``."""
    if address and address != "auto" and ":" not in address:
        raise InputError(f"engine ray:{address}: expected ray:auto or ray:HOST:PORT")
    return address


__all__ = ["RETRY_S", "RayEngine"]
