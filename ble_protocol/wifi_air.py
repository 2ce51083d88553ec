"""The emulated Wi-Fi air: a TCP relay that shapes the bytes between a wearable and its handheld.

``coinf radio --wifi PRESET --to tcp:HOST:PORT`` runs one, as ``coinf radio`` runs the emulated
BLE radio: the wearable dials the relay's address instead of the handheld's, and every byte in
either direction crosses one shared medium (Wi-Fi is half duplex: both directions take turns on
the air) at the preset's throughput, arrives one-way latency plus jitter later, in order, and a
segment lost on air costs one more round trip (:class:`~coinf.ble_protocol.shaped.Channel`).
TLS and coinf's framing pass through untouched: the relay sees only bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import subprocess
import sys
import threading
from collections.abc import Callable

from coinf.ble_protocol.shaped import Channel

from coinf.errors import UserError

READ_BYTES = 64 * 1024  # at most this much crosses the air in one burst


class WifiAir:
    """A listening relay to ``target`` (host, port) with ``channel``'s shape both ways."""

    def __init__(self, channel: Channel, target: tuple[str, int], host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.channel, self.target = channel, target
        self.host, self.port = host, port
        self._air = asyncio.Lock()
        self._rng = random.Random(channel.seed)
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def spec(self) -> str:
        """What the wearable dials (``tcp:`` or ``tcp+insecure:`` is the caller's choice)."""
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            self._tasks.discard(task)
            return
        try:
            await asyncio.gather(self._pump(reader, up_w), self._pump(up_r, writer))
        finally:
            for w in (writer, up_w):
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()
            self._tasks.discard(task)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One direction: each burst holds the shared air for its airtime (plus repairs), then
        is written ``latency + jitter`` later, never before the burst before it."""
        c, loop = self.channel, asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                at, data = await queue.get()
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    else:
                        writer.close()
                    return
                await asyncio.sleep(max(at - loop.time(), 0.0))
                writer.write(data)
                await writer.drain()

        out = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await reader.read(READ_BYTES)
                if data:
                    async with self._air:
                        await asyncio.sleep(c.airtime(len(data)) + c.repair_s(len(data),
                                                                              self._rng))
                queue.put_nowait((loop.time() + c.latency_s + c.jitter(self._rng), data))
                if not data:
                    break
            await out
        except (ConnectionError, OSError):
            pass
        finally:
            out.cancel()
            await asyncio.gather(out, return_exceptions=True)


def spawn(preset_name: str, target: str, timeout: float = 20.0
          ) -> tuple[str, Callable[[], None]]:
    """Run ``coinf radio --wifi PRESET --to TARGET`` in a subprocess; returns (the spec the
    wearable dials, stop)."""
    cmd = [sys.executable, "-m", "coinf", "radio", "--wifi", preset_name, "--to", target]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    timer = threading.Timer(timeout, proc.kill)  # a hung start-up cannot block the caller
    timer.start()
    try:
        line = proc.stdout.readline()
    finally:
        timer.cancel()
    key, _, spec = line.strip().partition("=")
    if key != "wearable" or not spec:
        proc.kill()
        proc.wait()
        raise UserError(f"the Wi-Fi air process did not start within {timeout:.0f} s "
                        f"(exit code {proc.returncode})")

    from coinf.ble_protocol.radio import stop_process

    return spec, lambda: stop_process(proc)
