"""``bench attack``'s registry and arena: :data:`ATTACKERS` (``@attacker``), :class:`Outcome`
and :class:`Arena`, a paired helper and wearable on 127.0.0.1 (see :mod:`coinf.cli.bench.attack`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

AttackFn = Callable[["Arena"], Awaitable["Outcome"]]


@dataclass
class Outcome:
    """What one attacker got (module docstring); ``detail``: counters that explain it."""

    served: int = 0
    #: None: does not apply (a paired helper reads what it is sent by design)
    tensors_read: int | None = 0
    results_accepted: int = 0
    lockout_s: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Attacker:
    name: str
    link: str  # "tcp" or "ble"
    help: str
    run: AttackFn


ATTACKERS: dict[str, Attacker] = {}


def attacker(name: str, link: str, help_text: str) -> Callable[[AttackFn], AttackFn]:
    """Register ``async def f(arena) -> Outcome`` as the attacker ``name``."""
    def register(fn: AttackFn) -> AttackFn:
        ATTACKERS[name] = Attacker(name, link, help_text, fn)
        return fn
    return register


class Arena:
    """A paired helper and wearable on 127.0.0.1 (module docstring), for one attacker."""

    def __init__(self, bundle: Any, root: Path, probe_s: float, duration_s: float) -> None:
        from coinf.ble_protocol.tls_store import TlsStore

        self.bundle, self.root = bundle, root
        self.probe_s, self.duration_s = probe_s, duration_s
        self.radios = 1  # a BLE attacker's radios (``--radios``)
        self.helper_store = TlsStore(root / "helper")
        self.wearable_store = TlsStore(root / "wearable")
        for a, b in ((self.helper_store, self.wearable_store),
                     (self.wearable_store, self.helper_store)):
            a.pin("peer", b.certificate_der())
        self.daemon: Any = None
        self.listener: Any = None
        self.address = ""
        self._stack = contextlib.AsyncExitStack()

    def store(self, name: str, *, trusts: Any = None) -> Any:
        """Another device's store (its own key), trusting ``trusts``' certificate if given."""
        from coinf.ble_protocol.tls_store import TlsStore

        store = TlsStore(self.root / name)
        store.ensure_identity()
        if trusts is not None:
            store.pin("victim", trusts.certificate_der())
        return store

    async def __aenter__(self) -> Arena:
        from coinf.ble_protocol.listen import open_listener
        from coinf.handheld.daemon import HandheldDaemon

        self.daemon = await self._stack.enter_async_context(HandheldDaemon(self.bundle))
        self.listener = await self._stack.enter_async_context(
            open_listener("tcp:127.0.0.1:0", tls=self.helper_store))
        self.address = self.listener.address
        self.daemon.spawn(self.daemon.serve_listener(self.listener))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def paired_attempt(self, timeout: float) -> bool:
        """One paired device's try: a fresh TLS link, HELLO, PROBE."""
        from coinf.ble_protocol.loopback import connect_socket
        from coinf.ble_protocol.messages import PROTOCOL_VERSION, MsgType, encode_json
        from coinf.ble_protocol.rpc import RpcClient
        from coinf.errors import CoinfError

        rpc = None
        try:
            async with asyncio.timeout(timeout):
                rpc = RpcClient(await connect_socket(self.address, timeout,
                                                     tls=self.wearable_store))
                hello = {"protocol": PROTOCOL_VERSION, "bundle": self.bundle.identity}
                await rpc.request(MsgType.HELLO, encode_json(hello), timeout)
                await rpc.request(MsgType.PROBE, b"paired", timeout)
            return True
        except (CoinfError, TimeoutError, OSError):
            return False
        finally:
            if rpc is not None:
                with contextlib.suppress(Exception):
                    await rpc.close()

    async def watch(self, stop: asyncio.Event) -> float:
        """The paired device tries every ``probe_s`` until ``stop``: the lockout (s)."""
        worst, failing_since = 0.0, None
        while not stop.is_set():
            t0 = time.monotonic()
            ok = await self.paired_attempt(max(1.0, 10 * self.probe_s))
            if ok:
                if failing_since is not None:
                    worst = max(worst, t0 - failing_since)
                failing_since = None
            elif failing_since is None:
                failing_since = t0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.probe_s)
        if failing_since is not None:
            worst = max(worst, time.monotonic() - failing_since)
        return worst

    async def under_watch(self, attack: Awaitable[Outcome]) -> Outcome:
        """Run ``attack`` while the paired device keeps trying; its lockout goes in."""
        stop = asyncio.Event()
        watcher = asyncio.ensure_future(self.watch(stop))
        try:
            outcome = await attack
        finally:
            stop.set()
            lockout = await watcher
        outcome.lockout_s = round(lockout, 3)
        return outcome
