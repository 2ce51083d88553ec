"""The socket listener: ``tcp:HOST:PORT``, ``tcp+insecure:HOST:PORT`` and ``unix:/path`` of
:func:`~coinf.ble_protocol.listen.open_listener`, with its slots, deadlines and byte budget."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from coinf.ble_protocol.link import Link
from coinf.ble_protocol.listen import HeldLink, Listener

from coinf.errors import InputError

if TYPE_CHECKING:
    from coinf.ble_protocol.loopback import SocketLink

#: the listener's logger: its records keep the name they had before the class had a module
log = logging.getLogger("coinf.ble_protocol.listen")

#: SocketListener defaults (docs/PROTOCOL.md §13): connections at once, per source address
MAX_LINKS, MAX_LINKS_PER_PEER = 16, 4
#: seconds to complete the HELLO; seconds of silence before an idle link is closed
HANDSHAKE_TIMEOUT, IDLE_TIMEOUT = 5.0, 120.0
#: every frame under way moves >= MIN_RATE_BPS * FRAME_TIMEOUT bytes per FRAME_TIMEOUT seconds
FRAME_TIMEOUT, MIN_RATE_BPS = 10.0, 16_000.0
#: the largest frame before the handshake (a HELLO is <= 4096 B)
HANDSHAKE_MAX_BYTES = 64 * 1024
#: bytes of incoming frames all of a listener's links may hold at once
MAX_BUFFERED_BYTES = 12 * 1024 * 1024

_SOCKET_OPTIONS = ("tls", "allow_insecure", "max_links", "max_links_per_peer",
                   "handshake_timeout", "idle_timeout", "frame_timeout", "min_rate_bps",
                   "max_message_bytes", "max_buffered_bytes", "handshake_max_bytes")


@dataclass(eq=False)
class _Conn:
    """One connection a socket listener holds."""

    link: SocketLink
    held: HeldLink
    peer: str | None
    opened: float = field(default_factory=time.monotonic)
    #: past the TLS handshake with a pinned certificate (a plain link: at once)
    secured: bool = False


class SocketListener(Listener):
    """``tcp:HOST:PORT`` or ``unix:/path``: an asyncio server (:func:`serve_socket`); each
    connection is one link. A stale unix socket file is replaced, and removed on close.

    ``tcp:`` runs TLS 1.3 first (option ``tls``): a client whose certificate is not in the trust
    store fails the handshake and is closed before a frame is read (``tls_refused``); the TLS
    handshake counts against ``handshake_timeout`` and holds a slot like any connection.

    Slots and deadlines (every bound is an option; a timeout of None turns it off):

    * ``max_links`` (16) connections at once, at most ``max_links_per_peer`` (4) from one
      source address (TCP; a unix socket has one peer: only ``max_links`` applies). A
      connection beyond either takes the place of the oldest one that has not completed its
      handshake (from that address, resp. from any; one still in its TLS handshake first),
      else it is closed at once;
    * ``handshake_timeout`` (5 s): a connection whose TLS handshake and HELLO were not done
      (a HELLO_ACK sent) by then is closed; until then a frame may declare at most
      ``handshake_max_bytes``
      (64 KiB; a HELLO is at most 4 KiB);
    * ``idle_timeout`` (120 s): a connection on which no byte came in and no message went out
      for that long, with none of its requests waiting for a reply, is closed (a wearable
      simply reconnects);
    * ``frame_timeout`` (10 s) and ``min_rate_bps`` (16 kB/s): a frame under way, either way,
      must move ``min_rate_bps * frame_timeout`` bytes (or its rest) in every ``frame_timeout``
      seconds, else the link is closed (slowloris; a peer that does not read);
    * ``max_message_bytes`` (64 MiB): the largest frame; a frame's buffer grows only as its
      bytes arrive;
    * ``max_buffered_bytes`` (12 MiB): what the frames under way on all links may hold at once
      (:class:`~coinf.ble_protocol.loopback.ByteBudget`); a frame waits, reading nothing, until
      its declared length fits, so N hostile peers cost at most this much, not N frames.

    Counters: ``refused`` (no slot), ``refused_peer`` (the address had all its slots),
    ``evicted``, ``tls_refused`` (TLS handshake failed: not paired, not TLS), ``tls_timeouts``
    (TLS not done in time, also in ``handshake_timeouts``), ``handshake_timeouts``,
    ``idle_timeouts``, ``slow_frames``; ``open_links``
    and ``buffered`` (bytes held of incoming frames under way) are live figures.
    """

    def __init__(
        self,
        spec: str,
        *,
        max_links: int = MAX_LINKS,
        max_links_per_peer: int = MAX_LINKS_PER_PEER,
        handshake_timeout: float | None = HANDSHAKE_TIMEOUT,
        idle_timeout: float | None = IDLE_TIMEOUT,
        frame_timeout: float | None = FRAME_TIMEOUT,
        min_rate_bps: float = MIN_RATE_BPS,
        max_message_bytes: int = Link.max_message_bytes,
        max_buffered_bytes: int = MAX_BUFFERED_BYTES,
        handshake_max_bytes: int = HANDSHAKE_MAX_BYTES,
        tls: Any = None,
        allow_insecure: bool = False,
        **options: Any,
    ) -> None:
        from coinf.ble_protocol.loopback import ByteBudget, parse_address
        from coinf.ble_protocol.tls import resolve_store

        super().__init__()
        if options:
            raise InputError(
                f"unknown option {sorted(options)[0]!r} for listener {spec!r}: it takes "
                f"{', '.join(_SOCKET_OPTIONS)}"
            )
        for name, value in (("max_links", max_links), ("max_links_per_peer", max_links_per_peer),
                            ("max_message_bytes", max_message_bytes),
                            ("max_buffered_bytes", max_buffered_bytes),
                            ("handshake_max_bytes", handshake_max_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name} must be an integer >= 1, got {value!r}")
        for name, limit in (("handshake_timeout", handshake_timeout),
                            ("idle_timeout", idle_timeout), ("frame_timeout", frame_timeout)):
            if limit is not None and not (isinstance(limit, int | float) and limit > 0):
                raise InputError(f"{name} must be > 0 s (or None: no limit), got {limit!r}")
        if not (isinstance(min_rate_bps, int | float) and min_rate_bps >= 0):
            raise InputError(f"min_rate_bps must be >= 0, got {min_rate_bps!r}")
        self.max_links = max_links
        self.max_links_per_peer = max_links_per_peer
        self.handshake_timeout = handshake_timeout
        self.idle_timeout = idle_timeout
        self.frame_timeout = frame_timeout
        self.min_rate_bps = float(min_rate_bps)
        self.max_message_bytes = max_message_bytes
        self.handshake_max_bytes = handshake_max_bytes
        #: bytes of incoming frames held over all links (``budget.peak``: the most so far)
        self.budget = ByteBudget(max_buffered_bytes)
        self.refused = 0
        self.refused_peer = 0
        self.evicted = 0
        self.handshake_timeouts = 0
        self.idle_timeouts = 0
        self.slow_frames = 0
        self.tls_refused = 0
        self.tls_timeouts = 0
        try:
            self._kind, self._target = parse_address(spec)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        self.spec = spec
        #: the trust store TLS checks clients against, None: plain
        self.store = resolve_store(spec, tls, allow_insecure)
        self._plain_tcp = self._kind == "tcp" and self.store is None
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self._live: dict[int, _Conn] = {}  # by id(link); insertion order: oldest first
        self._made_path: str | None = None

    @property
    def address(self) -> str:
        """The spec actually listened on (``tcp:...:0`` becomes the port the OS chose)."""
        sockets = getattr(self._server, "sockets", None)  # an asyncio.Server's, once bound
        if self._kind == "tcp" and sockets:
            host, port = sockets[0].getsockname()[:2]
            return f"{'tcp' if self.store is not None else 'tcp+insecure'}:{host}:{port}"
        return self.spec

    @property
    def description(self) -> str:
        return self.address

    @property
    def open_links(self) -> int:
        """Connections held now (handed out or waiting to be)."""
        return len(self._live)

    @property
    def buffered(self) -> int:
        """Bytes held now of incoming frames under way, over every connection."""
        return sum(conn.link.buffered for conn in self._live.values())

    async def _open(self) -> None:
        from coinf.ble_protocol.loopback import serve_socket

        if self.store is not None:
            from coinf.ble_protocol.tls import server_context

            server_context(self.store)  # the identity exists (made now if not) before a client
            if not self.store.peers():
                log.info("%s: no paired device yet: every client is refused until one pairs "
                         "(coinf wifi pair)", self.spec)
        if self._plain_tcp:
            from coinf.ble_protocol.tls import warn_insecure

            warn_insecure(self.spec, "listener on")
        if self._kind == "unix":
            path = str(self._target)
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISSOCK(os.stat(path).st_mode):
                    os.unlink(path)  # left by a daemon that did not exit cleanly
        try:
            self._server = await serve_socket(
                self.spec, self._on_link, tls=self.store is not None,
                max_message_bytes=self.max_message_bytes,
                frame_timeout=self.frame_timeout, min_rate_bps=self.min_rate_bps,
                budget=self.budget)
        except OSError as exc:
            raise InputError(f"cannot listen on {self.spec}: {exc.strerror or exc}") from None
        if self._kind == "unix":
            self._made_path = str(self._target)

    def _make_room(self, peer: str | None) -> bool:
        """Whether a new connection from ``peer`` may be held, after closing the oldest one not
        handshaken if that makes room (counted in ``evicted``)."""
        if peer is not None:
            mine = [c for c in self._live.values() if c.peer == peer]
            if len(mine) >= self.max_links_per_peer and not self._evict(mine):
                self.refused_peer += 1
                log.warning("%s: refused a connection from %s, it has %d (max_links_per_peer)",
                            self.description, peer, len(mine))
                return False
        if len(self._live) >= self.max_links and not self._evict(list(self._live.values())):
            self.refused += 1
            log.warning("%s: refused a connection, %d links are out (max_links)",
                        self.description, len(self._live))
            return False
        return True

    def _evict(self, conns: list[_Conn]) -> bool:
        # oldest first, one still in its TLS handshake before one of a paired device
        for conn in sorted(conns, key=lambda c: c.secured):
            if not conn.held.handshaken:
                self._live.pop(id(conn.link), None)
                self.evicted += 1
                log.info("%s: closed a connection from %s that had not completed its handshake "
                         "to make room", self.description, conn.peer or "a local peer")
                self._spawn(conn.held.close())
                return True
        return False

    async def _on_link(self, link: SocketLink) -> None:
        """Runs in the server's task for one connection: hand the link out, watch its
        deadlines until the consumer released it (serve_socket then closes it)."""
        peer = link.peer
        if not self._make_room(peer):
            return  # serve_socket closes it
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        if self.handshake_timeout is not None:
            link.frame_limit = self.handshake_max_bytes
        held = HeldLink(link)

        def handshaken() -> None:
            link.frame_limit = None

        held._on_handshake = handshaken
        conn = _Conn(link, held, peer, secured=self.store is None)
        self._live[id(link)] = conn
        try:
            if not conn.secured and not await self._secure(conn):
                return
            self._offer(link, held)
            await self._watch(conn)
        finally:
            if self._live.get(id(link)) is conn:
                del self._live[id(link)]
            if link.timed_out:
                self.slow_frames += 1
            self._forget(held)
            if task is not None:
                self._connections.discard(task)

    async def _secure(self, conn: _Conn) -> bool:
        """The TLS handshake of a new connection, within what is left of its handshake deadline
        (or until it is evicted); whether it completed with a paired client."""
        from coinf.ble_protocol.tls import server_context

        assert self.store is not None
        who = conn.peer or "a local peer"
        left = (None if self.handshake_timeout is None
                else max(0.0, conn.opened + self.handshake_timeout - time.monotonic()))
        handshake = asyncio.ensure_future(conn.link.start_tls(server_context(self.store), left))
        released = asyncio.ensure_future(conn.held.released.wait())
        try:
            done, _ = await asyncio.wait({handshake, released}, timeout=left,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (handshake, released):
                task.cancel()
            await asyncio.gather(handshake, released, return_exceptions=True)
        if released in done or self._live.get(id(conn.link)) is not conn:
            return False  # evicted, or the listener closes
        if handshake not in done:
            self.tls_timeouts += 1
            self.handshake_timeouts += 1
            log.info("%s: closed a connection from %s: no TLS handshake within %g s",
                     self.description, who, self.handshake_timeout)
            await conn.held.close()
            return False
        exc = handshake.exception()
        fp = conn.link.fingerprint
        if exc is None and fp is not None and self.store.trusts(fp):
            conn.secured = True
            return True
        self.tls_refused += 1
        log.info("%s: refused a TLS client from %s: %s", self.description, who,
                 exc if exc is not None else f"certificate {fp} is not paired")
        await conn.held.close()
        return False

    async def _watch(self, conn: _Conn) -> None:
        """Until the link is released: close it when its handshake or idle deadline passes."""
        held, link = conn.held, conn.link
        while not held.released.is_set():
            now = time.monotonic()
            wake = float("inf")
            if self.handshake_timeout is not None and not held.handshaken:
                due = conn.opened + self.handshake_timeout
                if now >= due:
                    self.handshake_timeouts += 1
                    log.info("%s: closed a connection from %s: no handshake within %g s",
                             self.description, conn.peer or "a local peer",
                             self.handshake_timeout)
                    await held.close()
                    return
                wake = due
            if self.idle_timeout is not None:
                due = max(link.last_rx, held.last_sent, conn.opened) + self.idle_timeout
                if held.waiting or link.buffered:  # the peer waits for us, or a frame is under
                    due = now + self.idle_timeout  # way (the frame floor bounds that)
                elif now >= due:
                    self.idle_timeouts += 1
                    log.info("%s: closed a connection from %s, idle for %g s",
                             self.description, conn.peer or "a local peer", self.idle_timeout)
                    await held.close()
                    return
                wake = min(wake, due)
            try:
                async with asyncio.timeout(None if wake == float("inf") else wake - now):
                    await held.released.wait()
            except TimeoutError:
                pass

    async def _release(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        if self._connections:  # released by aclose: each closes its socket and returns
            _, late = await asyncio.wait(list(self._connections), timeout=5.0)
            for task in late:
                task.cancel()
            if late:
                await asyncio.gather(*late, return_exceptions=True)
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5.0)
        if self._made_path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._made_path)
            self._made_path = None


__all__ = ["SocketListener"]
