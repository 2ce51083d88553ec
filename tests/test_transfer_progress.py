"""Progress of a long transfer: the GATT link's counters and the CLI line built on them."""

from __future__ import annotations

import asyncio
import io
import time
from types import SimpleNamespace

from coinf.ble_protocol.link import LinkStats
from coinf.ble_protocol.messages import Message, MsgType

from coinf.cli.commands.run import TransferProgress
from tests.test_ble_gatt_link import wired


def test_gatt_link_counts_the_message_being_sent() -> None:
    async def main() -> None:
        w, h, _ = wired(window=4)
        h.inbox_cap = 1  # hold the second message back after one window of chunks
        await w.send(Message(MsgType.REQUEST, 1, b"a" * 30))
        assert w.stats.sending() is None
        big = asyncio.ensure_future(w.send(Message(MsgType.REQUEST, 2, b"b" * 1000)))
        await asyncio.sleep(0.05)
        done, total, seconds = w.stats.sending() or (0, 0, 0.0)
        assert total == 1000 and 0 < done < total and seconds > 0
        await h.receive()
        await asyncio.wait_for(big, 2)
        assert w.stats.sending() is None and w.stats.bytes_sent == 1030
        await w.close()

    asyncio.run(main())


def test_progress_line_after_a_second() -> None:
    stats = LinkStats()
    session = SimpleNamespace(link=SimpleNamespace(stats=stats))
    out = io.StringIO()
    with TransferProgress(session, after_s=0.1, every_s=10, poll_s=0.02, stream=out):
        stats.sending_total, stats.sending_done = 600_000, 0
        stats.sending_since = time.monotonic()
        time.sleep(0.05)  # shorter than after_s: nothing yet
        assert out.getvalue() == ""
        stats.sending_done = 150_000
        stats.sending_since = time.monotonic() - 7.5  # 20 kB/s for 7.5 s
        time.sleep(0.2)
        stats.sending_total = 0
        time.sleep(0.05)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1, lines  # not a tty: one line per every_s
    assert lines[0].startswith("sending 150.0 kB / 600.0 kB (25%), 2"), lines  # ~20 kB/s
    assert " kB/s, ETA 2" in lines[0], lines  # ~22 s left
