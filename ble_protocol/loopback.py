"""Loopback links: in-process (asyncio queues) and cross-process (unix or TCP socket).

Socket frame (all little-endian)::

    b"CF" | u8 version | u8 type | u32 request_id | u32 payload_len | payload | u32 crc32

``crc32`` covers everything before it. ``payload_len`` is checked against the receiver's
``max_message_bytes`` before the payload is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import zlib
from collections.abc import Awaitable, Callable

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
    """A link over an asyncio stream (unix socket or TCP)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        name: str = "socket",
        max_message_bytes: int | None = None,
    ) -> None:
        super().__init__()
        self._reader, self._writer = reader, writer
        self._name = name
        self._open = True
        self._send_lock = asyncio.Lock()
        if max_message_bytes is not None:
            self.max_message_bytes = max_message_bytes

    @property
    def description(self) -> str:
        return self._name

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
                await self._writer.drain()
            except (ConnectionError, OSError) as exc:
                self._open = False
                raise LinkClosed(f"{self._name}: {exc}") from None
        self.stats.count_sent(len(message.payload))

    async def receive(self) -> Message:
        if not self._open:
            raise LinkClosed(f"{self._name} closed")
        try:
            header = await self._reader.readexactly(_HEADER.size)
            magic, version, mtype, rid, length = _HEADER.unpack(header)
            if magic != _MAGIC:
                raise ProtocolError(ErrorCode.MALFORMED, f"bad frame magic {magic!r}")
            if version != PROTOCOL_VERSION:
                raise ProtocolError(
                    ErrorCode.BAD_VERSION,
                    f"peer speaks protocol {version}, this side speaks {PROTOCOL_VERSION}",
                )
            if length > self.max_message_bytes:
                raise ProtocolError(
                    ErrorCode.TOO_LARGE,
                    f"frame declares {length} B, limit is {self.max_message_bytes} B",
                )
            payload = await self._reader.readexactly(length)
            (crc,) = struct.unpack("<I", await self._reader.readexactly(4))
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            self._open = False
            raise LinkClosed(f"{self._name}: peer disconnected ({type(exc).__name__})") from None
        except ProtocolError:
            await self.close()
            raise
        if zlib.crc32(payload, zlib.crc32(header)) != crc:
            await self.close()
            raise ProtocolError(ErrorCode.BAD_CRC, "frame CRC32 mismatch")
        self.stats.count_received(length)
        return Message(parse_type(mtype), rid, payload)

    async def close(self) -> None:
        if not self._open and self._writer.is_closing():
            return
        self._open = False
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    @property
    def is_open(self) -> bool:
        return self._open and not self._writer.is_closing()


def parse_address(address: str) -> tuple[str, str | tuple[str, int]]:
    """``unix:/path`` or ``tcp:host:port`` -> (kind, target). Raises ValueError on anything else."""
    kind, _, rest = address.partition(":")
    if kind == "unix" and rest:
        return "unix", rest
    if kind == "tcp":
        host, _, port = rest.rpartition(":")
        if host and port.isdigit():
            return "tcp", (host, int(port))
    raise ValueError(f"bad address {address!r}: expected unix:/path/to/sock or tcp:HOST:PORT")


async def connect_socket(address: str, timeout: float = 10.0) -> SocketLink:
    """Connect to a handheld daemon listening on ``address``."""
    kind, target = parse_address(address)
    try:
        if kind == "unix":
            assert isinstance(target, str)
            coro = asyncio.open_unix_connection(target)
        else:
            assert isinstance(target, tuple)
            coro = asyncio.open_connection(*target)
        reader, writer = await asyncio.wait_for(coro, timeout)
    except (OSError, TimeoutError) as exc:
        raise LinkClosed(f"cannot reach handheld at {address}: {exc}") from None
    return SocketLink(reader, writer, name=address)


async def serve_socket(
    address: str, on_link: Callable[[SocketLink], Awaitable[None]]
) -> asyncio.AbstractServer:
    """Listen on ``address``; call ``on_link`` for each connection (one task per connection)."""
    kind, target = parse_address(address)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = SocketLink(reader, writer, name=address)
        try:
            await on_link(link)
        finally:
            await link.close()

    if kind == "unix":
        assert isinstance(target, str)
        return await asyncio.start_unix_server(handle, target)
    assert isinstance(target, tuple)
    return await asyncio.start_server(handle, *target)
