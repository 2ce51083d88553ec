"""Loopback links: in-process (asyncio queues) and cross-process (unix or TCP socket).

Socket frame (all little-endian)::

    b"CF" | u8 version | u8 type | u32 request_id | u32 payload_len | payload | u32 crc32

``crc32`` covers everything before it. ``payload_len`` is checked against the receiver's
``max_message_bytes`` before the payload is read, and the payload is read into a buffer that
grows as its bytes arrive.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
import struct
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from coinf.ble_protocol.link import Link, LinkClosed
from coinf.ble_protocol.messages import (
    PROTOCOL_VERSION,
    ErrorCode,
    Message,
    ProtocolError,
    parse_type,
)

_HEADER = struct.Struct("<2sBBII")
_MAGIC = b"CF"


class InProcessLink(Link):
    """One end of an in-process pipe. Create both ends with :meth:`pair`."""

    def __init__(self, inbox: asyncio.Queue[Message | None], outbox: asyncio.Queue[Message | None]):
        super().__init__()
        self._inbox, self._outbox = inbox, outbox
        self._open = True
        self.peer: InProcessLink | None = None

    @classmethod
    def pair(cls, depth: int = 8) -> tuple[InProcessLink, InProcessLink]:
        """Two connected ends; each queue holds at most ``depth`` messages (back-pressure)."""
        a: asyncio.Queue[Message | None] = asyncio.Queue(depth)
        b: asyncio.Queue[Message | None] = asyncio.Queue(depth)
        left, right = cls(a, b), cls(b, a)
        left.peer, right.peer = right, left
        return left, right

    async def send(self, message: Message) -> None:
        if not self._open or (self.peer is not None and not self.peer._open):
            raise LinkClosed("in-process link closed")
        await self._outbox.put(message)
        if self.peer is not None and not self.peer._open:  # it closed while we waited for room
            raise LinkClosed("peer closed the in-process link")
        self.stats.count_sent(len(message.payload))

    async def receive(self) -> Message:
        if not self._open:
            raise LinkClosed("in-process link closed")
        if self._inbox.empty() and self.peer is not None and not self.peer._open:
            # the peer's close marker did not fit in our full queue; we have read it empty now
            self._open = False
            raise LinkClosed("peer closed the in-process link")
        msg = await self._inbox.get()
        if msg is None:
            self._open = False
            raise LinkClosed("peer closed the in-process link")
        self.stats.count_received(len(msg.payload))
        return msg

    async def close(self) -> None:
        if self._open:
            self._open = False
            # Unread messages are dropped (nobody will read them): that also frees a peer's
            # send waiting for room in our queue, which then sees we closed and fails.
            while not self._inbox.empty():
                self._inbox.get_nowait()
            self._inbox.put_nowait(None)  # wakes our own pending receive
            with contextlib.suppress(asyncio.QueueFull):  # full: the peer's receive checks us
                self._outbox.put_nowait(None)

    @property
    def is_open(self) -> bool:
        return self._open and (self.peer is None or self.peer._open)


class SocketLink(Link):
    """A link over an asyncio stream (unix socket or TCP).

    A frame's payload is read in pieces into a buffer that grows as bytes arrive (a declared
    length is checked against the limit, never allocated up front). With ``frame_timeout``
    (a listener's links; None: no bound) every frame under way, in and out, must move at
    least ``max(1, min_rate_bps * frame_timeout)`` bytes (or what is left of it) in every
    ``frame_timeout`` seconds: an incoming frame that trickles in slower is dropped with TIMEOUT
    and the link closed (slowloris), and so is a send the peer does not read. The wait for a
    frame's first byte is not bounded here (a listener's idle timeout is).

    With a ``budget`` (a :class:`ByteBudget` its listener shares among its links), the body of
    a frame over :data:`UNCOUNTED_BYTES` is read only once the budget has room for all of it
    (its declared length is counted, not allocated); while it waits the link reads nothing
    (TCP holds the peer back) and the rate floor does not run: the frames holding the budget
    are the ones that must keep to it, so a frame holds its room until it is read whole or
    dropped, and none waits for ever.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        name: str = "socket",
        max_message_bytes: int | None = None,
        *,
        frame_timeout: float | None = None,
        min_rate_bps: float = 0.0,
        budget: ByteBudget | None = None,
    ) -> None:
        super().__init__()
        self._reader, self._writer = reader, writer
        self.budget = budget
        self._name = name
        self._open = True
        self._send_lock = asyncio.Lock()
        if max_message_bytes is not None:
            self.max_message_bytes = max_message_bytes
        self.frame_timeout = frame_timeout
        self.min_rate_bps = min_rate_bps
        #: a lower cap on incoming frames for now (a listener's, until the handshake), or None
        self.frame_limit: int | None = None
        #: ``time.monotonic()`` of the last bytes received / of the last message sent
        self.last_rx = self.last_tx = time.monotonic()
        #: bytes held of an incoming frame under way (0 between frames)
        self.buffered = 0
        #: a frame was dropped because its bytes moved slower than the floor (either way)
        self.timed_out = False
        #: the fingerprint of the peer's certificate on a TLS link (``sha256:...``), else None
        self.fingerprint: str | None = None

    async def start_tls(self, context: ssl.SSLContext, timeout: float | None) -> None:
        """Server side: run the TLS handshake on this accepted connection (within ``timeout``
        seconds), before any frame; sets :attr:`fingerprint`. Raises ``ssl.SSLError``,
        ``OSError`` or ``TimeoutError``; the connection is closed then."""
        from coinf.ble_protocol.tls import peer_fingerprint

        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        try:
            transport = await loop.start_tls(self._writer.transport, protocol, context,
                                             server_side=True, ssl_handshake_timeout=timeout)
            if transport is None:  # the peer left as the handshake ended
                raise ConnectionResetError("the peer left during the TLS handshake")
        except BaseException:
            self._open = False
            self._writer.transport.abort()
            raise
        protocol.connection_made(transport)
        self._reader = reader
        self._writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        self.fingerprint = peer_fingerprint(self._writer)

    @property
    def description(self) -> str:
        return self._name

    @property
    def unauthenticated(self) -> bool:
        """A TCP connection without TLS (``tcp+insecure:``): nothing says who the peer is. A
        handheld serves such a link nothing but HELLO until a HELLO succeeded (§6.5)."""
        return self.peer is not None and self.fingerprint is None

    @property
    def peer(self) -> str | None:
        """The peer's host (TCP), None on a unix socket."""
        name = self._writer.get_extra_info("peername")
        if isinstance(name, tuple) and name:
            return str(name[0])
        return None

    async def send(self, message: Message) -> None:
        if not self._open:
            raise LinkClosed(f"{self._name} closed")
        header = _HEADER.pack(
            _MAGIC, PROTOCOL_VERSION, int(message.type), message.request_id, len(message.payload)
        )
        crc = zlib.crc32(message.payload, zlib.crc32(header))
        async with self._send_lock:
            try:
                self._writer.write(header)
                self._writer.write(message.payload)
                self._writer.write(struct.pack("<I", crc))
                if self.frame_timeout is None:
                    await self._writer.drain()
                else:
                    await self._drain_bounded(len(message.payload) + _HEADER.size + 4)
            except (ConnectionError, OSError) as exc:
                self._open = False
                raise LinkClosed(f"{self._name}: {exc}") from None
            except ProtocolError:
                await self.close()
                raise
        self.last_tx = time.monotonic()
        self.stats.count_sent(len(message.payload))

    async def _drain_bounded(self, size: int) -> None:
        """``drain`` while the peer reads at least the floor (a peer that stops reading makes a
        plain drain wait forever)."""
        assert self.frame_timeout is not None
        transport = self._writer.transport
        floor = _Floor(self.frame_timeout, self.min_rate_bps, size)
        while True:
            try:
                async with asyncio.timeout(floor.left()):
                    await self._writer.drain()
                return
            except TimeoutError:
                pending = transport.get_write_buffer_size()
                if not floor.moved(size - pending):
                    self.timed_out = True
                    raise ProtocolError(
                        ErrorCode.TIMEOUT, f"{self._name}: the peer read {floor.window_bytes} B "
                        f"of a {size} B frame in {self.frame_timeout:g} s (floor "
                        f"{self.min_rate_bps:g} B/s)") from None

    async def receive(self) -> Message:
        if not self._open:
            raise LinkClosed(f"{self._name} closed")
        try:
            first = await self._reader.readexactly(1)  # unbounded: idleness is the listener's
            self.last_rx = time.monotonic()
            floor = (None if self.frame_timeout is None
                     else _Floor(self.frame_timeout, self.min_rate_bps, _HEADER.size))
            header = first + bytes(await self._read(_HEADER.size - 1, floor))
            magic, version, mtype, rid, length = _HEADER.unpack(header)
            if magic != _MAGIC:
                raise ProtocolError(ErrorCode.MALFORMED, f"bad frame magic {magic!r}")
            if version != PROTOCOL_VERSION:
                raise ProtocolError(
                    ErrorCode.BAD_VERSION,
                    f"peer speaks protocol {version}, this side speaks {PROTOCOL_VERSION}",
                )
            limit = self.max_message_bytes
            if self.frame_limit is not None and self.frame_limit < limit:
                limit = self.frame_limit
            if length > limit:
                before = " before the handshake" if limit != self.max_message_bytes else ""
                raise ProtocolError(
                    ErrorCode.TOO_LARGE, f"frame declares {length} B, limit is {limit} B{before}"
                )
            crc = zlib.crc32(header)
            counted = self.budget is not None and length + 4 > UNCOUNTED_BYTES
            if counted:  # room for the whole frame first (nothing allocated)
                assert self.budget is not None
                await self.budget.take(length + 4)
            try:
                if floor is not None:  # the wait for room was the budget's, not the peer's
                    floor.restart(length + 4)
                body = await self._read(length + 4, floor)
                payload = bytes(memoryview(body)[:length])
                (want,) = struct.unpack("<I", memoryview(body)[length:])
                del body
            finally:
                if counted:
                    assert self.budget is not None
                    self.budget.give(length + 4)
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            self._open = False
            self.buffered = 0
            if self.fingerprint is not None and not self.stats.messages_received:
                from coinf.ble_protocol.tls import PAIR_HINT

                why = exc.reason if isinstance(exc, ssl.SSLError) else type(exc).__name__
                raise LinkClosed(f"{self._name}: the peer ended the TLS session before any "
                                 f"frame ({why}): does it trust this device? {PAIR_HINT}"
                                 ) from None
            raise LinkClosed(f"{self._name}: peer disconnected ({type(exc).__name__})") from None
        except ProtocolError:
            self.buffered = 0
            await self.close()
            raise
        self.buffered = 0
        if zlib.crc32(payload, crc) != want:
            await self.close()
            raise ProtocolError(ErrorCode.BAD_CRC, "frame CRC32 mismatch")
        self.stats.count_received(length)
        return Message(parse_type(mtype), rid, payload)

    async def _read(self, n: int, floor: _Floor | None) -> bytearray:
        """``n`` bytes, in pieces as they arrive (the buffer holds only what came), each piece
        within the floor's deadline. On any failure the buffer is emptied at once (a traceback
        that keeps this frame alive must not keep the bytes)."""
        buf = bytearray()
        try:
            while len(buf) < n:
                want = min(n - len(buf), _PIECE)
                if floor is None:
                    piece = await self._reader.read(want)
                else:
                    try:
                        async with asyncio.timeout(floor.left()):
                            piece = await self._reader.read(want)
                    except TimeoutError:
                        if floor.moved(len(buf)):  # this window got its share: a new one
                            continue
                        self.timed_out = True
                        raise ProtocolError(
                            ErrorCode.TIMEOUT, f"{self._name}: frame dropped, "
                            f"{floor.window_bytes} B of it came in {self.frame_timeout:g} s "
                            f"(floor {self.min_rate_bps:g} B/s), {len(buf)} of {n} B received"
                        ) from None
                if not piece:
                    raise asyncio.IncompleteReadError(b"", n)
                buf += piece
                self.buffered = len(buf)
                self.last_rx = time.monotonic()
                if floor is not None:
                    floor.moved(len(buf))
        except BaseException:
            buf.clear()
            self.buffered = 0
            raise
        return buf

    async def close(self) -> None:
        if not self._open and self._writer.is_closing():
            return
        self._open = False
        self._writer.close()  # flushes what is queued first: a peer that does not read ...
        with contextlib.suppress(Exception):
            try:
                async with asyncio.timeout(2.0):
                    await self._writer.wait_closed()
            except TimeoutError:  # ... would keep it open forever
                self._writer.transport.abort()

    @property
    def is_open(self) -> bool:
        return self._open and not self._writer.is_closing()


#: the most read from a stream at once into a frame buffer
_PIECE = 256 * 1024
#: frames this small never wait for a listener's budget (a HELLO, PROBE, STATUS or CANCEL
#: must get through while large frames fill it; they cost at most this much per link)
UNCOUNTED_BYTES = 64 * 1024


class ByteBudget:
    """Bytes of incoming frames that the links of one listener may hold at once.

    :meth:`take` waits until ``n`` more bytes fit, the oldest waiter first, though a small
    frame may pass a large one that does not fit yet (a wearable's usual frame is much smaller
    than the largest a helper accepts); a take is always let through when nothing is held, so
    one frame larger than the budget still passes, alone.
    :meth:`give` returns them. ``held`` and ``peak`` are live figures; ``waits`` counts the
    takes that waited.
    """

    def __init__(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"a byte budget must be an integer >= 1, got {limit!r}")
        self.limit = limit
        self.held = 0
        self.peak = 0
        self.waits = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def _fits(self, n: int) -> bool:
        return not self.held or self.held + n <= self.limit

    def _grant(self, n: int) -> None:
        self.held += n
        self.peak = max(self.peak, self.held)

    async def take(self, n: int) -> None:
        if self._fits(n):
            self._grant(n)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((n, waiter))
        self.waits += 1
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.give(n)  # granted, then cancelled before it could be used
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove((n, waiter))
                self._wake()
            raise

    def give(self, n: int) -> None:
        self.held = max(0, self.held - n)
        self._wake()

    def _wake(self) -> None:
        for n, waiter in list(self._waiters):  # oldest first; a smaller one may pass a larger
            if waiter.done():
                self._waiters.remove((n, waiter))
            elif self._fits(n):
                self._waiters.remove((n, waiter))
                self._grant(n)
                waiter.set_result(None)


class _Floor:
    """The rate floor of one frame: every ``window`` seconds at least ``need`` bytes must move
    (``max(1, rate * window)``, or the rest of the frame when that is less)."""

    def __init__(self, window: float, rate: float, total: int) -> None:
        self.window = window
        self.rate = rate
        self.restart(total)

    def restart(self, total: int) -> None:
        self.total = total
        self._open_window(0)

    def _open_window(self, done: int) -> None:
        self.start = time.monotonic()
        self.done_at_start = done
        self.need = min(max(1, int(self.rate * self.window)), self.total - done)
        self.window_bytes = 0

    def left(self) -> float:
        return max(0.0, self.start + self.window - time.monotonic())

    def moved(self, done: int) -> bool:
        """``done`` bytes of the frame have moved: True (and a new window) once this window got
        its share."""
        self.window_bytes = done - self.done_at_start
        if self.window_bytes >= self.need:
            self._open_window(done)
            return True
        return False


def parse_address(address: str) -> tuple[str, str | tuple[str, int]]:
    """``unix:/path``, ``tcp:host:port`` or ``tcp+insecure:host:port`` -> (kind, target); kind
    is ``unix`` or ``tcp``. Raises ValueError on anything else."""
    kind, _, rest = address.partition(":")
    if kind == "unix" and rest:
        return "unix", rest
    if kind in ("tcp", "tcp+insecure"):
        host, _, port = rest.rpartition(":")
        if host and port.isdigit():
            return "tcp", (host, int(port))
    raise ValueError(f"bad address {address!r}: expected unix:/path/to/sock, tcp:HOST:PORT "
                     f"(TLS) or tcp+insecure:HOST:PORT")


def frame_header(mtype: int, request_id: int, length: int) -> bytes:
    """The 12-byte header of a socket frame (docs/PROTOCOL.md §6): magic, version, type, id,
    payload length. Benchmarks use it to send frames that lie about their length."""
    return _HEADER.pack(_MAGIC, PROTOCOL_VERSION, int(mtype), request_id, length)


async def connect_socket(address: str, timeout: float = 10.0, *, tls: Any = None,
                         pin: str | None = None, allow_insecure: bool = False) -> SocketLink:
    """Connect to a handheld daemon listening on ``address``. A ``tcp:`` address runs TLS
    (``tls``: None or True, the device's store; a
    :class:`~coinf.ble_protocol.tls_store.TlsStore`; False: plain) and checks the server's
    certificate (``pin``: that fingerprint, else any paired peer's) before anything is sent:
    a certificate not pinned is :class:`~coinf.errors.UntrustedPeer`. Plain TCP
    (``tcp+insecure:``, ``tls=False``) needs ``allow_insecure=True`` and logs a WARNING."""
    from coinf.ble_protocol.tls import is_plain_tcp, resolve_store, warn_insecure

    store = resolve_store(address, tls, allow_insecure)
    if is_plain_tcp(address, tls):
        warn_insecure(address, "connecting to")
    return await dial_socket(address, timeout, store, pin)


async def dial_socket(address: str, timeout: float, tls: Any, pin: str | None) -> SocketLink:
    """:func:`connect_socket` with the store already resolved (``tls``: a
    :class:`~coinf.ble_protocol.tls_store.TlsStore`, or None: plain, as the caller decided)."""
    kind, target = parse_address(address)
    try:
        if kind == "unix":
            assert isinstance(target, str)
            coro = asyncio.open_unix_connection(target)
        else:
            assert isinstance(target, tuple)
            if tls is not None:
                from coinf.ble_protocol.tls import client_context

                coro = asyncio.open_connection(*target, ssl=client_context(tls),
                                               ssl_handshake_timeout=timeout)
            else:
                coro = asyncio.open_connection(*target)
        reader, writer = await asyncio.wait_for(coro, timeout)
    except ssl.SSLError as exc:
        raise LinkClosed(f"TLS handshake with {address} failed ({exc.reason or exc}): is it a "
                         f"coinf helper with TLS?") from None
    except ConnectionError as exc:
        if tls is None:
            raise LinkClosed(f"cannot reach handheld at {address}: {exc}") from None
        raise LinkClosed(f"TLS handshake with {address} failed ({type(exc).__name__}: the "
                         f"server closed the connection; a plain server, or no free slot?)"
                         ) from None
    except TimeoutError:
        what = "no TLS handshake" if tls is not None else "no connection"
        raise LinkClosed(f"cannot reach handheld at {address}: {what} within {timeout:g} s"
                         ) from None
    except OSError as exc:
        raise LinkClosed(f"cannot reach handheld at {address}: {exc}") from None
    link = SocketLink(reader, writer, name=address)
    if tls is not None:
        from coinf.ble_protocol.tls import check_server, peer_fingerprint

        try:
            link.fingerprint = check_server(peer_fingerprint(writer), tls, pin, address)
        except BaseException:
            writer.transport.abort()  # not a byte of ours reaches a device we do not trust
            raise
    return link


class _HeldBackProtocol(asyncio.StreamReaderProtocol):
    """A server connection that reads nothing until its handler says so: the TLS handshake
    (``start_tls``) must see the client's first bytes, which a stream reader would swallow."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert isinstance(transport, asyncio.ReadTransport)
        transport.pause_reading()


async def serve_socket(
    address: str, on_link: Callable[[SocketLink], Awaitable[None]], *, tls: bool = False,
    **link_options: Any
) -> asyncio.AbstractServer:
    """Listen on ``address``; call ``on_link`` for each connection (one task per connection).
    ``link_options`` go to each :class:`SocketLink` (``max_message_bytes``, ``frame_timeout``,
    ``min_rate_bps``). ``tls``: TCP connections read nothing until ``on_link`` runs
    :meth:`SocketLink.start_tls` on them."""
    kind, target = parse_address(address)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = SocketLink(reader, writer, name=address, **link_options)
        try:
            await on_link(link)
        finally:
            await link.close()

    if kind == "unix":
        assert isinstance(target, str)
        return await asyncio.start_unix_server(handle, target)
    assert isinstance(target, tuple)
    if not tls:
        return await asyncio.start_server(handle, *target)
    loop = asyncio.get_running_loop()

    def factory() -> asyncio.StreamReaderProtocol:
        return _HeldBackProtocol(asyncio.StreamReader(loop=loop), handle, loop=loop)

    return await loop.create_server(factory, *target)
