"""Issue 41, part 1: a dead or frozen peer is dropped in about a second, the wearable advertises
again, and offloading resumes by itself as soon as the handheld is back. Assertions are on
states, counters and the order of events; waits have hang guards only."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from coinf.ble_protocol import gatt
from coinf.ble_protocol.gatt import GattLink
from coinf.ble_protocol.link import Link
from coinf.ble_protocol.loopback import InProcessLink
from coinf.ble_protocol.messages import Message, MsgType
from coinf.handheld.inprocess import InProcessConnector
from coinf.wearable.core import AsyncSession

from coinf import LinkOptions
from coinf.errors import LinkClosed
from tests.bundles import fixed, make_tiny_bundle, reference

# time beyond the suite's 30 s a test: a handheld process frozen and thawed (up to 14 s alone)
pytestmark = pytest.mark.timeout(120)

X = np.random.default_rng(4).standard_normal((1, 16)).astype(np.float32)


def lonely_link(disconnects: list[str], **options: float) -> GattLink:
    """A wearable-side link to a peer that announced a heartbeat and then never says a word."""

    async def nowhere(_frame: bytes) -> None:
        return None

    async def disconnect() -> None:
        disconnects.append("asked")

    return GattLink(role="wearable", mtu=100, peer_window=8, peer_max_message_bytes=1000,
                    write_data=nowhere, write_control=nowhere, disconnect=disconnect,
                    heartbeat=True, **options)


def test_a_silent_peer_fails_the_link_and_is_disconnected_even_if_closed_at_once() -> None:
    """The link PINGs, gives up, and asks the transport to disconnect, also when its owner
    closes it right away (the session does: it drops a failed link at once). That disconnect used
    to be cancelled by close(), leaving the wearable connected to a dead handheld and not
    advertising."""

    async def main() -> None:
        disconnects: list[str] = []
        link = lonely_link(disconnects, heartbeat_s=0.02, silence_limit_s=0.1)
        with pytest.raises(LinkClosed, match="silent"):
            await asyncio.wait_for(link.receive(), 10)  # hang guard only
        await link.close()
        assert link._pings >= 1 and disconnects == ["asked"]
        await link.close()
        assert disconnects == ["asked"]  # once

    asyncio.run(main())


def test_the_default_liveness_bound_fits_the_two_second_goal() -> None:
    # silence limit + one check period: the longest a frozen peer goes unnoticed
    assert gatt.SILENCE_LIMIT_S + gatt.HEARTBEAT_S / 2 <= 1.25
    assert gatt.HEARTBEAT_S < gatt.SILENCE_LIMIT_S / 2  # at least two PINGs before giving up


def test_a_late_check_does_not_condemn_a_live_peer() -> None:
    """This process was not scheduled for a while (here: a blocking sleep): the peer could not
    be heard, so the check gives it a fresh heartbeat and a PING instead of failing the link."""

    async def main() -> None:
        ends: dict[str, GattLink] = {}

        def make(role: str, peer: str) -> GattLink:
            async def write(frame: bytes) -> None:
                ends[peer].feed_control(frame)

            async def data(chunk: bytes) -> None:
                ends[peer].feed_data(chunk)

            async def disconnect() -> None:
                ends[peer].connection_lost("gone")

            return GattLink(role=role, mtu=100, peer_window=8, peer_max_message_bytes=1000,
                            write_data=data, write_control=write, disconnect=disconnect,
                            heartbeat=True, heartbeat_s=0.05, silence_limit_s=0.2)

        ends["w"], ends["h"] = make("wearable", "h"), make("handheld", "w")
        await asyncio.sleep(0.1)
        time.sleep(0.6)  # the whole process stalls for 3 silence limits
        await asyncio.sleep(0.3)
        assert ends["w"].is_open and ends["h"].is_open
        await ends["w"].send(Message(MsgType.PROBE, 1, b"still here"))
        assert (await asyncio.wait_for(ends["h"].receive(), 10)).payload == b"still here"
        for end in ends.values():
            await end.close()

    asyncio.run(main())


class PassiveConnector(InProcessConnector):
    """An in-process handheld that connects when it is ``back`` (like a handheld reconnecting
    to the wearable's GATT server: the wearable cannot call it)."""

    passive = True

    def __init__(self, bundle: object) -> None:
        super().__init__(bundle=bundle)  # type: ignore[arg-type]
        self.back = asyncio.Event()
        self.last: Link | None = None

    async def connect(self, timeout: float) -> Link:
        await self.back.wait()
        ours, theirs = InProcessLink.pair()
        self.daemon.start(theirs)
        self.last = theirs
        return ours


def test_offloading_resumes_as_soon_as_a_passive_peer_reconnects(tmp_path: Path) -> None:
    """A dropped link: the next inference finishes here at once (it does not wait for the
    peer), and when the peer reconnects the session is connected again before any inference
    asks, whatever the backoff."""
    bundle = make_tiny_bundle(tmp_path / "b")
    ref = reference(bundle, X)

    async def main() -> None:
        conn = PassiveConnector(bundle)
        link = LinkOptions(transport=conn, reconnect_timeout=60.0, max_backoff_s=30.0)
        async with AsyncSession(bundle, fixed("c001", link=link)) as sess:
            conn.back.set()
            await sess.connect()
            (y,) = await sess.run(None, {"x": X})
            assert sess.last_run is not None and not sess.last_run.local
            conn.back.clear()
            assert conn.last is not None
            await conn.last.close()  # the handheld goes away
            (y,) = await asyncio.wait_for(sess.run(None, {"x": X}), 10)  # no 60 s wait
            np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
            assert sess.last_run is not None and sess.last_run.local
            assert sess.offline is not None and "reconnects" in sess.offline
            conn.back.set()  # it is back: no inference needed to notice
            async with asyncio.timeout(10):  # hang guard only
                while sess.connection.rpc_client is None:
                    await asyncio.sleep(0.01)
            assert sess.offline is None and sess.connection.rejoined == 1
            (y,) = await sess.run(None, {"x": X})
            assert not sess.last_run.local and sess.connection.links_opened == 2

    asyncio.run(main())


def test_a_frozen_handheld_is_dropped_and_offloading_comes_back_by_itself(tmp_path: Path) -> None:
    """SIGSTOP the handheld process (its controller keeps the connection up): the wearable's
    inference falls back because the peer went silent (not at its 30 s timeout), the wearable
    drops the connection and advertises; after SIGCONT the handheld reconnects and the session
    is offloading again without being asked."""
    from coinf.ble_protocol.radio import spawn

    from tests.ble_servers import WEARABLE_PAIRING, cli_pairing
    from tests.procs import handheld_daemon

    bundle = make_tiny_bundle(tmp_path / "b")
    wspec, hspec, stop = spawn("ble5-2m", overrides=["time_scale=0.5"])
    try:
        with handheld_daemon(bundle.root, f"ble:{hspec}",
                             *cli_pairing(tmp_path, "handheld")) as proc:

            async def main() -> None:
                link = LinkOptions(transport=f"ble:{wspec}", transport_options=WEARABLE_PAIRING)
                async with AsyncSession(bundle, fixed("c001", link=link)) as sess:
                    await asyncio.wait_for(sess.connect(), 60)
                    await sess.run(None, {"x": X})
                    assert sess.last_run is not None and not sess.last_run.local
                    proc.send_signal(signal.SIGSTOP)
                    try:
                        async with asyncio.timeout(20):  # hang guard, well under 30 s
                            while not sess.last_run.local:
                                await sess.run(None, {"x": X})
                        assert "silent" in (sess.last_run.fallback or "")
                        server = sess.connection.connector.server  # type: ignore[attr-defined]
                        async with asyncio.timeout(10):  # the dead connection is dropped and
                            while server._conns or not server._advertising:  # it advertises
                                await asyncio.sleep(0.02)
                    finally:
                        proc.send_signal(signal.SIGCONT)
                    async with asyncio.timeout(30):
                        while sess.offline is not None:
                            await asyncio.sleep(0.02)
                    assert sess.connection.rejoined == 1
                    (y,) = await sess.run(None, {"x": X})
                    assert not sess.last_run.local
                    np.testing.assert_allclose(y, reference(bundle, X), rtol=1e-5, atol=1e-6)

            asyncio.run(main())
    finally:
        stop()
