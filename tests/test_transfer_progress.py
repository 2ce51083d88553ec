"""Progress of a long transfer: the GATT link's counters and the CLI line built on them."""

from __future__ import annotations

import asyncio
import io
import threading
from types import SimpleNamespace

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
        for _ in range(500):  # until the window is out (hang guard)
            if (w.stats.sending() or (0,))[0] > 0:
                break
            await asyncio.sleep(0.01)
        done, total, seconds = w.stats.sending() or (0, 0, 0.0)
        assert total == 1000 and 0 < done < total and seconds >= 0
        assert not big.done()  # held back by the receiver, not finished
        await h.receive()
        await asyncio.wait_for(big, 2)
        assert w.stats.sending() is None and w.stats.bytes_sent == 1030
        await w.close()

    asyncio.run(main())


class _Polled:
    """Link stats whose :meth:`sending` says what the test sets, and counts the polls."""

    def __init__(self) -> None:
        self.now: tuple[int, int, float] | None = None
        self.polls = 0
        self.polled = threading.Condition()

    def sending(self) -> tuple[int, int, float] | None:
        with self.polled:
            self.polls += 1
            self.polled.notify_all()
            return self.now

    def wait_polls(self, n: int) -> None:
        """Until the progress thread has polled ``n`` more times (hang guard: 10 s)."""
        with self.polled:
            target = self.polls + n
            assert self.polled.wait_for(lambda: self.polls >= target, 10), self.polls


def test_progress_line_after_a_second() -> None:
    stats = _Polled()
    session = SimpleNamespace(link=SimpleNamespace(stats=stats))
    out = io.StringIO()
    with TransferProgress(session, after_s=1.0, every_s=3600, poll_s=0.01, stream=out):
        stats.wait_polls(2)  # nothing being sent: nothing shown
        stats.now = (0, 600_000, 0.5)  # under way for less than after_s: nothing yet
        stats.wait_polls(3)
        assert out.getvalue() == ""
        stats.now = (150_000, 600_000, 7.5)  # 20 kB/s for 7.5 s
        stats.wait_polls(3)
        stats.now = None  # sent
        stats.wait_polls(2)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1, lines  # not a tty: one line per every_s
    assert lines[0] == "sending 150.0 kB / 600.0 kB (25%), 20.0 kB/s, ETA 22 s", lines
