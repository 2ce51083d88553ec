"""A Session's links to its handheld: the transport's own and ``LinkOptions.alternates``.

Each link has a name, a kind (``ble`` or ``wifi``: the radio the planner prices), its own
:class:`~coinf.wearable.connection.Connection` (connect, handshake, backoff, a passive BLE link
awaited in the background) and its own :class:`~coinf.wearable.planner.adapt.LinkEstimator`
(from its kind's preset, then its probes and transfers; the planner's, ``AutoPlan.add_link``).
What to send over which link is the planner's (``AutoPlan.choose_link``; a split fixed by the
caller goes over the link predicted fastest for its crossing); this module says which links
can carry a frame now:

* **up**: connected and handshaken; offered to the planner;
* **down**: it failed (a frame's exchange, or its probe); left out until its Connection has
  reconnected: a dialled link (``tcp:``) is probed again in the background once its backoff
  has passed, a passive one (``ble:``) comes back when the handheld reconnects;
* **refused**: its handshake failed for a reason retrying does not mend (another bundle,
  another protocol version, a failed pairing); never offered again in this Session.

A link that fails before ever carrying a frame (a listener that accepts and never answers, a
peer serving another bundle) is reported once: one log warning, then its state and reason in
``Session.links`` and ``Session.plan()``'s notes, whatever its later probes do. The first frame
awaits every link's first probe (the planner must know the links before deciding); later
probes never delay a frame.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from coinf.ble_protocol.transport import Connector, open_connector
from coinf.wearable.connection import Connection, OnConnect, ShapedConnector
from coinf.wearable.planner.adapt import LinkEstimate, LinkEstimator

from coinf.errors import LinkError

if TYPE_CHECKING:
    from coinf.wearable.autoplan import AutoPlan
    from coinf.wearable.frame import RunStats
    from coinf.wearable.options import LinkOptions
    from coinf.wearable.planner.costs import Decision

T = TypeVar("T")

log = logging.getLogger(__name__)


@dataclass(eq=False)
class SessionLink:
    """One link to the handheld and what the Session knows of it."""

    name: str
    kind: str
    conn: Connection
    estimator: LinkEstimator
    #: why it is never offered again (a fault retrying does not mend), else None
    refused: str | None = None
    #: why it is out now (its last failure), None while it carries frames
    down: str | None = None
    error: LinkError | None = None
    reported: bool = False  # its failure was logged (once until it carries a frame again)
    probing: bool = False
    carried: int = 0  # frames it carried

    @property
    def up(self) -> bool:
        return self.refused is None and self.conn.rpc_client is not None

    @property
    def state(self) -> str:
        if self.refused is not None:
            return "refused"
        if self.up:
            return "up"
        if self.probing:
            return "probing"
        return "down" if self.down is not None else "not connected"

    def summary(self) -> dict[str, Any]:
        return {"kind": self.kind, "transport": self.conn.connector.description,
                "state": self.state, "why": self.refused or (None if self.up else self.down),
                "frames": self.carried}


class SessionLinks:
    """Every link of a Session to its handheld, the first one the transport's."""

    def __init__(self, links: list[SessionLink]) -> None:
        if not links:
            raise ValueError("a Session has at least one link")
        self.links = links
        self._by_name = {lk.name: lk for lk in links}
        self._ready: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()

    @property
    def primary(self) -> SessionLink:
        return self.links[0]

    @property
    def multi(self) -> bool:
        """Several links: the planner chooses among them and frames move between them."""
        return len(self.links) > 1

    def __iter__(self) -> Iterator[SessionLink]:
        return iter(self.links)

    def get(self, name: str) -> SessionLink:
        return self._by_name[name]

    def up(self) -> list[SessionLink]:
        """The links that can carry a frame now, in the order they were given."""
        return [lk for lk in self.links if lk.up]

    @property
    def offline(self) -> str | None:
        """Why no link carries frames now, or None when one does (or none has failed yet)."""
        if any(lk.up for lk in self.links) or all(lk.error is None for lk in self.links):
            return None
        return "; ".join(f"{lk.name}: {lk.refused or lk.down or lk.state}" for lk in self.links)

    # -- probing ------------------------------------------------------------------------------
    async def ready(self) -> None:
        """The first time: probe every link at once and wait for all of them (concurrent
        callers share the one attempt). Raises the first link's error when every link is
        refused (a configuration fault, as a Session with one link raises it)."""
        if self._ready is None:
            self._ready = asyncio.get_running_loop().create_task(self._probe_all())
        await asyncio.shield(self._ready)
        if all(lk.refused is not None for lk in self.links):
            err = self.primary.error
            assert err is not None
            raise err

    async def connect(self) -> dict[str, Any]:
        """``AsyncSession.connect`` with several links: every link probed; the handshake
        reply of the first link up, else the first link's error."""
        await self.ready()
        up = self.up()
        if not up:
            err = self.primary.error
            raise err if err is not None else LinkError("no link to the handheld is up")
        assert up[0].conn.info is not None
        return up[0].conn.info

    async def _probe_all(self) -> None:
        await asyncio.gather(*(self._probe(lk) for lk in self.links))

    def tend(self) -> None:
        """Probe, in the background, each link that is down and due: not refused, its
        backoff passed, and not a passive link its Connection already awaits."""
        if self._ready is None or not self._ready.done():
            return
        for lk in self.links:
            conn = lk.conn
            if lk.refused is not None or lk.probing or lk.up or conn.offline is not None:
                continue
            if conn.passive and conn.info is not None:
                continue  # the handheld reconnects; Connection awaits it in the background
            self._spawn(self._probe(lk))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _probe(self, lk: SessionLink) -> None:
        lk.probing = True
        try:
            await lk.conn.client()
        except LinkError as exc:
            await self.failed(lk, exc, probe=True)
        except Exception as exc:  # never end silently: the link stays out, saying why
            await self.failed(lk, LinkError(f"{type(exc).__name__}: {exc}"), probe=True)
        else:
            if lk.down is not None:
                log.info("link %s is up again: offered to the planner", lk.name)
        finally:
            lk.probing = False

    async def failed(self, lk: SessionLink, exc: LinkError, probe: bool = False) -> None:
        """``lk`` failed (a frame's exchange, or its probe): out of the decisions until its
        Connection reconnects; refused for good when retrying cannot mend it. Logged once
        (until it has carried a frame again)."""
        lk.error = exc
        if not exc.transient and probe:
            lk.refused = str(exc)
        elif lk.conn.offline is None or lk.down is None:  # already out: no second backoff
            lk.down = str(exc)
            await lk.conn.went_offline(exc, quiet=True)
        if lk.reported:
            log.info("link %s still out: %s", lk.name, exc)
            return
        lk.reported = True
        others = [o.name for o in self.links if o is not lk and o.up]
        where = f"frames go over {', '.join(others)}" if others else \
            "frames finish on the wearable"
        if lk.refused is not None:
            log.warning("link %s (%s) refused: %s; never offered to the planner again (%s)",
                        lk.name, lk.conn.connector.description, exc, where)
        elif lk.carried == 0 and probe:
            log.warning("link %s (%s) cannot carry frames: %s; not offered to the planner "
                        "until it answers (probed again in the background; %s)", lk.name,
                        lk.conn.connector.description, exc, where)
        else:
            log.warning("link %s (%s) failed: %s; %s until it reconnects", lk.name,
                        lk.conn.connector.description, exc, where)

    def carried_by(self, lk: SessionLink) -> None:
        """``lk`` carried a frame: its backoff resets, a later failure is reported again."""
        lk.carried += 1
        lk.conn.succeeded()
        lk.down, lk.reported = None, False

    # -- choosing, and moving a frame -----------------------------------------------------------
    def register(self, auto: AutoPlan) -> None:
        """Several links: the planner decides over each link's own estimator."""
        if self.multi:
            for lk in self.links:
                auto.add_link(lk.name, lk.estimator)

    def fixed_link(self, nbytes: int) -> SessionLink | None:
        """With the split fixed by the caller: the link up predicted to carry its ``nbytes``
        of crossing tensors fastest (the first given on a tie)."""
        up = self.up()
        return min(up, key=lambda lk: lk.estimator.estimate().up_ms(nbytes)) if up else None

    def others(self, dead: SessionLink, nbytes: int,
               left_s: float) -> tuple[list[SessionLink], list[str]]:
        """The links up other than ``dead`` that can carry ``nbytes`` in the ``left_s``
        seconds left of a frame's timeout, fastest first, and why the others cannot."""
        fits, why_not = [], []
        for lk in self.links:
            if lk is dead or not lk.up:
                continue
            ms = lk.estimator.estimate().up_ms(nbytes)
            if ms > left_s * 1e3:
                why_not.append(f"{lk.name} cannot carry {nbytes} B in the {left_s:.2f} s "
                               f"left (about {ms:.0f} ms)")
                continue
            fits.append(lk)
        fits.sort(key=lambda lk: lk.estimator.estimate().up_ms(nbytes))
        return fits, why_not

    async def fail_over(self, dead: SessionLink, exc: LinkError, stats: RunStats,
                        deadline: float,
                        send: Callable[[SessionLink, float], Awaitable[T]]) -> T | None:
        """``dead`` failed under a frame: leave it out, and ``send`` the frame again over
        another link up that can carry its ``stats.bytes_up`` before ``deadline``
        (``time.monotonic()``; each attempt is bounded by what is left: its timeout cancels
        it on both sides). ``stats.link`` and ``stats.failover`` say where it went and why;
        None: no link could, the caller finishes the frame here."""
        stats.failover = f"{dead.name}: {exc}"
        await self.failed(dead, exc)
        tried = {dead.name}
        while True:
            left = deadline - time.monotonic()
            fits, why_not = self.others(dead, stats.bytes_up, left)
            fits = [lk for lk in fits if lk.name not in tried]
            if not fits or left <= 0:
                if why_not:
                    stats.failover += "; " + "; ".join(why_not)
                return None
            alt = fits[0]
            tried.add(alt.name)
            try:
                result = await send(alt, left)
            except LinkError as again:
                if not again.transient:
                    raise
                stats.failover += f"; {alt.name}: {again}"
                await self.failed(alt, again)
                continue
            stats.link = alt.name
            self.carried_by(alt)
            log.info("a frame moved from link %s to %s", dead.name, alt.name)
            return result

    # -- reporting ----------------------------------------------------------------------------
    def decision(self, auto: AutoPlan, fixed: str | None = None) -> Decision:
        """``Session.plan()`` with several links: the decision over the links up (before the
        first frame: every link not yet failed), the link chosen and every link that is out
        in its notes; ``fixed``: a note that the caller fixed the split."""
        names = [lk.name for lk in self.up()] or \
            [lk.name for lk in self.links if lk.error is None and lk.refused is None]
        if names:
            choice = auto.link_choice(names)
            decision = dataclasses.replace(choice.decision,
                                           notes=[*choice.decision.notes, f"link: {choice.why}"])
        else:
            decision = dataclasses.replace(auto.decision())
            decision.notes = [*decision.notes, "no link is up: runs complete on the wearable "
                              "(wearable-only)"]
        decision.notes.extend(self.notes())
        if fixed:
            decision.notes.append(fixed)
        return decision

    def summary(self) -> dict[str, dict[str, Any]]:
        """Each link by name: ``kind``, ``transport``, ``state`` (up, down, refused, probing,
        not connected), ``why`` it is out, and the ``frames`` it carried."""
        return {lk.name: lk.summary() for lk in self.links}

    def notes(self) -> list[str]:
        """One line per link that is not up (``Session.plan()``'s notes)."""
        out = []
        for lk in self.links:
            if lk.refused is not None:
                out.append(f"link {lk.name} refused ({lk.conn.connector.description}): "
                           f"{lk.refused}; never offered to the planner")
            elif not lk.up and lk.down is not None:
                out.append(f"link {lk.name} down ({lk.conn.connector.description}): "
                           f"{lk.down}; offered again once it reconnects")
        return out

    async def close(self) -> None:
        """Cancel the probes under way, then close every link."""
        tasks = [*self._background, *([self._ready] if self._ready is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for lk in self.links:
            await lk.conn.close()


def open_links(bundle: Any, options: LinkOptions, primary: Connector,
               on_connect: Callable[[str], OnConnect]) -> SessionLinks:
    """The Session's links: ``primary`` (the transport's connector), then one per
    ``options.alternates`` (opened from its spec, shaped by its channel), each a
    :class:`Connection` with ``options``' timeouts; ``on_connect(name)`` is its probe."""
    connectors: list[tuple[str, str, Connector]] = [
        (options.link_name, options.link_kind, primary)]
    for name, alt in options.alternates.items():
        conn = open_connector(alt.transport, bundle=bundle, **alt.transport_options)
        connectors.append((name, str(alt.kind), conn if alt.channel is None
                           else ShapedConnector(conn, alt.channel)))
    return SessionLinks([SessionLink(name, kind, Connection(
        connector, bundle.identity, connect_timeout=options.effective_connect_timeout,
        reconnect_timeout=options.reconnect_timeout, request_timeout=options.timeout,
        max_backoff_s=options.max_backoff_s, on_connect=on_connect(name)),
        LinkEstimator(initial_estimate(kind))) for name, kind, connector in connectors])


def initial_estimate(kind: str) -> LinkEstimate:
    """What the planner assumes of a link of ``kind`` before it is measured: the Pi Zero 2
    W's BLE radio preset, or its Wi-Fi preset (``wearable/planner/links.py``)."""
    from coinf.wearable.planner.links import link_estimate

    return link_estimate("wifi" if kind == "wifi" else "ble")


__all__ = ["SessionLink", "SessionLinks", "initial_estimate", "open_links"]
