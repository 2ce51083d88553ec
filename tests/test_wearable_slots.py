"""Issue 41, part 3 (the wearable): a stranger setting up a connection cannot take the slot of a
handheld that holds a bond, a stalled pairing is dropped at its deadline, and centrals whose
connections keep failing are throttled. Over the emulated radio with bumble's real SMP."""

from __future__ import annotations

import asyncio
import logging

import pytest
from bleak import BleakClient
from coinf.ble_protocol.admission import FREE_FAILURES, THROTTLE_BASE_S, Admission
from coinf.ble_protocol.bleak_bumble import BumbleBleakClient, BumbleHost
from coinf.ble_protocol.central import Central
from coinf.ble_protocol.peripheral import WearableServer
from coinf.ble_protocol.radio import EmulatedRadio

from coinf.errors import InputError
from tests.ble_servers import HANDHELD_PAIRING, WEARABLE_PAIRING

WEARABLE_ADDR = "C0:F1:00:00:00:01"
HANDHELD, STRANGER = "C0:F1:00:00:00:02", "C0:F1:00:00:00:03"


def test_slots_keep_room_for_a_bonded_handheld() -> None:
    a = Admission()
    assert a.admit(STRANGER, False, []) is None  # a free wearable takes anybody
    pairing = [(STRANGER, False, False)]
    assert a.admit("C0:F1:00:00:00:04", False, pairing) is not None  # one stranger at a time
    assert a.admit(HANDHELD, True, pairing) is None  # the spare slot: for a bonded handheld
    assert a.admit("C0:F1:00:00:00:05", True, [*pairing, (HANDHELD, True, False)]) is not None
    assert a.admit(HANDHELD, True, [(STRANGER, False, True)]) is not None  # one is served
    assert a.admit(STRANGER, False, [(HANDHELD, True, False)]) is not None
    assert a.refused == 4 and a.throttled == 0


def test_failing_centrals_are_throttled_and_a_served_one_is_forgiven() -> None:
    now = [100.0]
    a = Admission(clock=lambda: now[0])
    for _ in range(FREE_FAILURES):
        assert a.admit(STRANGER, False, []) is None
        a.failed(STRANGER)
    assert a.admit(STRANGER, False, []) is not None  # throttled ...
    assert a.admit(HANDHELD, False, []) is None  # ... only that address
    now[0] += THROTTLE_BASE_S
    assert a.admit(STRANGER, False, []) is None  # the penalty is over
    a.failed(STRANGER)
    now[0] += THROTTLE_BASE_S
    assert a.admit(STRANGER, False, []) is not None  # it doubles with each failure
    now[0] += THROTTLE_BASE_S
    assert a.admit(STRANGER, False, []) is None
    a.served(STRANGER)
    for _ in range(FREE_FAILURES - 1):
        a.failed(STRANGER)
    assert a.admit(STRANGER, False, []) is None  # served once: counting starts again
    assert a.throttled == 2


def run(main: object) -> None:
    async def guarded() -> None:
        await asyncio.wait_for(main(), 120)  # type: ignore[operator]  # hang guard only

    asyncio.run(guarded())


def test_a_stranger_in_set_up_cannot_lock_out_the_bonded_handheld() -> None:
    async def main() -> None:
        async with EmulatedRadio("ble5-2m", time_scale=0.2, extra_hosts=1) as radio:
            server = WearableServer(radio.specs[0], bundle_identity="b", handshake_timeout=60,
                                    **WEARABLE_PAIRING)
            await server.start()
            try:
                async with Central(WEARABLE_ADDR, bundle_identity="b", hci=radio.specs[1],
                                   timeout=10, **HANDHELD_PAIRING) as central:
                    accept = asyncio.ensure_future(server.accept(30))
                    link = await central.connect()  # pairs: a bond on both sides
                    await accept
                    await link.close()
                    async with BumbleHost(radio.spec("extra1"), address=STRANGER) as host:
                        gone = asyncio.Event()
                        stranger = BleakClient(WEARABLE_ADDR, backend=BumbleBleakClient,
                                               host=host, pair=False, timeout=10,
                                               disconnected_callback=lambda _c: gone.set())
                        await stranger.connect()  # connected, never pairs nor says HELLO
                        assert len(server._conns) == 1
                        accept = asyncio.ensure_future(server.accept(30))
                        link = await central.connect()  # the bonded handheld: the spare slot
                        served = await accept
                        assert served.is_open and link.is_open
                        await gone.wait()  # the stranger made way
                        assert server.admission._records[STRANGER].failures == 1
                        await link.close()
            finally:
                await server.close()

    run(main)


def test_a_stalled_pairing_is_dropped_at_its_deadline(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="coinf.ble_protocol.peripheral")

    async def never() -> int:
        await asyncio.Event().wait()  # the person never types the passkey
        return 0

    async def main() -> None:
        async with EmulatedRadio("ble5-2m", time_scale=0.2) as radio:
            server = WearableServer(radio.specs[0], bundle_identity="b", pairing_timeout=1.0,
                                    **WEARABLE_PAIRING)
            await server.start()
            try:
                async with BumbleHost(radio.specs[1], address=STRANGER, passkey=never) as host:
                    client = BleakClient(WEARABLE_ADDR, backend=BumbleBleakClient, host=host,
                                         pair=True, timeout=30)
                    attempt = asyncio.ensure_future(client.connect())
                    await asyncio.wait({attempt})  # fails, however bleak and bumble say it
                    assert attempt.cancelled() or attempt.exception() is not None
                async with asyncio.timeout(10):
                    while server._conns:
                        await asyncio.sleep(0.02)
                assert any(r.getMessage().endswith("pairing took over 1 s")
                           for r in caplog.records)
                assert server.admission._records[STRANGER].failures == 1
            finally:
                await server.close()

    run(main)


def test_pairing_timeout_is_checked() -> None:
    with pytest.raises(InputError, match="pairing_timeout"):
        WearableServer("tcp-client:127.0.0.1:9", bundle_identity="b", pairing_timeout=0)
