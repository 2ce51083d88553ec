"""Issue 40, parts 1-2 (BLE): mutual authentication and pairing that ends.

Over the emulated radio with bumble's real SMP, ATT and GATT: the handheld refuses a wearable
whose pairing gives no MITM protection (before any HELLO), reconnects by its bonded identity (an
impostor advertising the same name gets nothing), and every pairing failure ends in a typed
:class:`PairingError` after a bounded number of attempts, on both sides."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from bumble.pairing import PairingDelegate
from coinf.ble_protocol.bleak_bumble import BumbleHost
from coinf.ble_protocol.bleak_errors import pairing_failure, smp_failure
from coinf.ble_protocol.central import Central
from coinf.ble_protocol.central_listener import CentralListener
from coinf.ble_protocol.peripheral import WearableServer
from coinf.ble_protocol.radio import EmulatedRadio

from coinf.cli.bench.attack_ble import ImpostorWearable
from coinf.errors import ErrorCode, PairingError, PairingFailure, ProtocolError
from tests.ble_servers import HANDHELD_PAIRING, TEST_PASSKEY, WEARABLE_PAIRING
from tests.test_ble_security import with_pairing

WEARABLE_ADDR = "C0:F1:00:00:00:01"
IMPOSTOR_ADDR = "C0:F1:00:00:00:66"


def run(main: Any) -> None:
    async def guarded() -> None:
        await asyncio.wait_for(main(), 120)

    asyncio.run(guarded())


@contextlib.asynccontextmanager
async def wearable(spec: str, **options: Any) -> AsyncIterator[WearableServer]:
    server = WearableServer(spec, bundle_identity="b", **options)
    await server.start()
    try:
        yield server
    finally:
        await server.close()


async def bond(server: WearableServer, host: BumbleHost) -> None:
    async with Central(WEARABLE_ADDR, bundle_identity="b", host=host, timeout=10) as central:
        accept = asyncio.ensure_future(server.accept(30))
        await (await central.connect()).close()
        await (await accept).close()


# --- 1. mutual authentication ----------------------------------------------------------------


def test_just_works_impostor_gets_no_hello_and_the_handheld_a_typed_error() -> None:
    """An impostor advertising the wearable's name with Just Works pairing (no bond yet): the
    handheld pairs, sees an unauthenticated key, disconnects before any GATT write, and stops
    with PairingError(UNAUTHENTICATED_PEER) at the first attempt (it is not retried)."""

    async def main() -> None:
        async with EmulatedRadio("ble5-2m", time_scale=0.2, extra_hosts=1) as radio, \
                ImpostorWearable(radio.spec("extra1")) as impostor, \
                BumbleHost(radio.specs[1], **HANDHELD_PAIRING) as host, \
                Central("coinf-wearable", bundle_identity="b", host=host, timeout=5) as central:
            with pytest.raises(PairingError) as err:
                await central.connect()
            assert err.value.reason == PairingFailure.UNAUTHENTICATED_PEER
            assert err.value.peer == IMPOSTOR_ADDR and err.value.attempts == 1
            assert not err.value.transient and err.value.code == ErrorCode.INSUFFICIENT_ENCRYPTION
            assert impostor.connections == 1 and impostor.hellos == 0
            assert impostor.data_writes == 0
            assert await host.bonded_peers() == []  # its keys were not kept

    run(main)


def test_bonded_handheld_reconnects_by_identity_and_ignores_a_same_name_impostor(
        tmp_path) -> None:
    """Once bonded, a name target is looked for among the bonded identities only: with only an
    impostor of that name on the air the scan finds nothing (the impostor sees no connection);
    with the real wearable back, the handheld is served by it, never by the impostor."""
    wstore = str(tmp_path / "w" / "bonds.json")
    hstore = str(tmp_path / "h" / "bonds.json")

    async def main() -> None:
        async with EmulatedRadio("ble5-2m", time_scale=0.2) as radio, \
                BumbleHost(radio.specs[1], keystore=hstore, **HANDHELD_PAIRING) as host, \
                wearable(radio.specs[0], keystore=wstore, **WEARABLE_PAIRING) as server:
            await bond(server, host)
        # both restart (bonds persist in their stores) on a fresh radio, the impostor first
        async with EmulatedRadio("ble5-2m", time_scale=0.2, extra_hosts=1) as radio, \
                BumbleHost(radio.specs[1], keystore=hstore, **HANDHELD_PAIRING) as host:
            assert [a for a, _ in await host.bonded_peers()] == [WEARABLE_ADDR]
            async with ImpostorWearable(radio.spec("extra1")) as impostor:
                async with Central("coinf-wearable", bundle_identity="b", host=host, timeout=2,
                                   attempts=2) as central:
                    with pytest.raises(ProtocolError) as err:
                        await central.connect()
                    assert "no bonded device" in str(err.value)
                assert impostor.connections == 0
                # the real wearable (window closed now: it serves its bond) comes back
                async with wearable(radio.specs[0], keystore=wstore) as server:
                    for _ in range(3):
                        async with Central("coinf-wearable", bundle_identity="b", host=host,
                                           timeout=10) as central:
                            accept = asyncio.ensure_future(server.accept(30))
                            link = await central.connect()
                            assert WEARABLE_ADDR in link.description
                            await link.close()
                            await (await accept).close()
                assert impostor.connections == 0 and impostor.hellos == 0

    run(main)


# --- 2. pairing that ends ----------------------------------------------------------------------


@pytest.mark.parametrize("case", ["wrong_passkey", "window_closed", "no_passkey", "weak"])
def test_pairing_failures_are_classified_and_bounded(case: str) -> None:
    async def main() -> None:
        window: dict[str, Any] = {} if case == "window_closed" else WEARABLE_PAIRING
        async with EmulatedRadio("ble5-2m", time_scale=0.2) as radio, \
                wearable(radio.specs[0], **{**window, "passkey": TEST_PASSKEY}) as server:
            passkey = {"wrong_passkey": TEST_PASSKEY + 1, "no_passkey": None}.get(
                case, TEST_PASSKEY)
            async with BumbleHost(radio.specs[1], passkey=passkey) as host:
                if case == "weak":
                    with_pairing(host, sc=False)  # LE legacy pairing: refused by the wearable
                async with Central(WEARABLE_ADDR, bundle_identity="b", host=host, timeout=10,
                                   attempts=5, pairing_attempts=2) as central:
                    with pytest.raises(PairingError) as err:
                        await central.connect()
            expected = {"wrong_passkey": (PairingFailure.WRONG_PASSKEY, 2, 0x04),
                        "window_closed": (PairingFailure.WINDOW_CLOSED, 1, 0x05),
                        "no_passkey": (PairingFailure.NO_PASSKEY, 1, 0x01),
                        "weak": (PairingFailure.WEAK, 1, 0x03)}[case]
            assert (err.value.reason, err.value.attempts, err.value.smp_code) == expected
            assert err.value.peer == WEARABLE_ADDR
            assert str(err.value).startswith(f"pairing failed ({expected[0].value})")
            assert server.device is not None
            assert await server.device.keystore.get_all() == []

    run(main)


def test_a_pairing_that_stalls_times_out_as_such() -> None:
    async def main() -> None:
        never = asyncio.Event()

        async def slow_typist() -> int | None:
            await never.wait()
            return None

        async with EmulatedRadio("ble5-2m", time_scale=0.2) as radio, \
                wearable(radio.specs[0], **WEARABLE_PAIRING), \
                BumbleHost(radio.specs[1], passkey=slow_typist) as host, \
                Central(WEARABLE_ADDR, bundle_identity="b", host=host, timeout=2,
                        pairing_attempts=1) as central:
            with pytest.raises(PairingError) as err:
                await central.connect()
            assert err.value.reason == PairingFailure.TIMEOUT

    run(main)


def test_smp_reasons_map_to_failures() -> None:
    assert smp_failure(0x04) == PairingFailure.WRONG_PASSKEY
    assert smp_failure(0x05) == PairingFailure.WINDOW_CLOSED
    assert smp_failure(0x03) == PairingFailure.WEAK
    assert smp_failure(0x09) == PairingFailure.REPEATED_ATTEMPTS
    assert smp_failure(0x08) == PairingFailure.OTHER and smp_failure(None) == PairingFailure.OTHER
    assert pairing_failure(ValueError("pairing failed")) is None  # never from text


def test_the_listener_stops_on_a_failed_pairing_instead_of_retrying_forever() -> None:
    """`coinf handheld --transport ble`'s listener: a wearable that refuses to pair (window
    closed, no bond) ends accept() with the PairingError, after one attempt."""

    async def main() -> None:
        async with EmulatedRadio("ble5-2m", time_scale=0.2) as radio, \
                wearable(radio.specs[0], passkey=TEST_PASSKEY) as server:
            listener = CentralListener(radio.specs[1], bundle_identity="b",
                                       name="coinf-wearable", timeout=5, **HANDHELD_PAIRING)
            async with listener:
                with pytest.raises(PairingError) as err:
                    await listener.accept()
            assert err.value.reason == PairingFailure.WINDOW_CLOSED
            assert server.admission.refused == 0  # it stopped before being throttled

    run(main)


def test_wearable_accept_ends_after_the_bounded_failed_pairings() -> None:
    """The wearable side of `coinf run --transport ble`: a handheld that cannot pair ends the
    wait with PairingError instead of waiting out the timeout; without a bound it waits on."""

    async def main() -> None:
        async with EmulatedRadio("ble5-2m", time_scale=0.2) as radio, \
                wearable(radio.specs[0], **WEARABLE_PAIRING) as server, \
                BumbleHost(radio.specs[1], passkey=TEST_PASSKEY + 1) as host, \
                Central(WEARABLE_ADDR, bundle_identity="b", host=host, timeout=10,
                        pairing_attempts=2) as central:
            accept = asyncio.ensure_future(server.accept(600, pairing_failures=2))
            with pytest.raises(PairingError):
                await central.connect()
            with pytest.raises(PairingError) as err:
                await accept
            assert err.value.reason == PairingFailure.WRONG_PASSKEY
            assert err.value.attempts == 2 and err.value.peer == "C0:F1:00:00:00:02"

    run(main)


def test_pairing_only_server_answers_hello_with_busy_not_bundle_mismatch(tmp_path) -> None:
    """`coinf wearable pair`'s server: a bonded handheld's HELLO gets ERROR BUSY (transient:
    the handheld retries once `coinf wearable` serves), never BUNDLE_MISMATCH (fatal)."""
    wstore = str(tmp_path / "w" / "bonds.json")
    hstore = str(tmp_path / "h" / "bonds.json")

    async def main() -> None:
        async with EmulatedRadio("ble5-2m", time_scale=0.2) as radio, \
                BumbleHost(radio.specs[1], keystore=hstore, **HANDHELD_PAIRING) as host, \
                wearable(radio.specs[0], keystore=wstore, **WEARABLE_PAIRING) as server:
            await bond(server, host)
        async with EmulatedRadio("ble5-2m", time_scale=0.2) as radio, \
                BumbleHost(radio.specs[1], keystore=hstore) as host, \
                WearableServer(radio.specs[0], bundle_identity="", keystore=wstore,
                               pairing_only=True, pairing_window_s=30), \
                Central(WEARABLE_ADDR, bundle_identity="b", host=host, timeout=10,
                        attempts=1) as central:
            with pytest.raises(ProtocolError) as err:
                await central.connect()
            assert err.value.code == ErrorCode.BUSY and err.value.transient
            assert "pairing only" in str(err.value)

    run(main)


def test_passkey_impostor_that_does_not_know_the_passkey_gets_no_hello() -> None:
    """An impostor that offers passkey entry (it displays one of its own) cannot make a key
    with the passkey the handheld types: WRONG_PASSKEY after the bound, no HELLO."""

    async def main() -> None:
        async with EmulatedRadio("ble5-2m", time_scale=0.2, extra_hosts=1) as radio, \
                ImpostorWearable(radio.spec("extra1"),
                                 io=PairingDelegate.IoCapability.DISPLAY_OUTPUT_ONLY
                                 ) as impostor, \
                BumbleHost(radio.specs[1], **HANDHELD_PAIRING) as host, \
                Central(IMPOSTOR_ADDR, bundle_identity="b", host=host, timeout=5,
                        pairing_attempts=2) as central:
            with pytest.raises(PairingError) as err:
                await central.connect()
            assert err.value.reason == PairingFailure.WRONG_PASSKEY and err.value.attempts == 2
            assert impostor.hellos == 0 and impostor.connections == 2

    run(main)


def test_the_pairing_window_closes_by_itself_after_its_deadline() -> None:
    async def main() -> None:
        async with EmulatedRadio("ble5-2m", time_scale=0.2) as radio, \
                wearable(radio.specs[0], passkey=TEST_PASSKEY) as server, \
                BumbleHost(radio.specs[1], **HANDHELD_PAIRING) as host:
            server.open_pairing_window(0.5)
            assert server.pairing_open
            while server.pairing_open:  # nobody closes it: its deadline does
                await asyncio.sleep(0.05)
            async with Central(WEARABLE_ADDR, bundle_identity="b", host=host, timeout=5) as c:
                with pytest.raises(PairingError) as err:
                    await c.connect()
            assert err.value.reason == PairingFailure.WINDOW_CLOSED

    run(main)
