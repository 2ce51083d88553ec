"""Issue 11, security: over the emulated radio, with bumble's real SMP, ATT and GATT.

Only LE Secure Connections with passkey entry makes a bond, only inside the pairing window;
every coinf characteristic and CCCD needs encryption with such a key; an idle central is dropped
after the handshake deadline; bond stores are private."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from bleak import BleakClient
from bleak.exc import BleakError
from bumble import smp
from bumble.pairing import PairingConfig, PairingDelegate
from coinf.ble_protocol import gatt
from coinf.ble_protocol.bleak_bumble import BumbleATTError, BumbleBleakClient, BumbleHost
from coinf.ble_protocol.bonds import BondStoreError, PrivateJsonKeyStore, prepare_bond_store
from coinf.ble_protocol.central import Central
from coinf.ble_protocol.messages import ProtocolError
from coinf.ble_protocol.peripheral import WearableServer
from coinf.ble_protocol.radio import EmulatedRadio, spawn

from coinf.errors import InputError, PairingFailure
from tests.ble_servers import HANDHELD_PAIRING, TEST_PASSKEY, WEARABLE_PAIRING

# time beyond the suite's 30 s a test: pairs and bonds over the emulated BLE radio (up to 9 s alone)
pytestmark = pytest.mark.timeout(120)

WEARABLE_ADDR = "C0:F1:00:00:00:01"


@contextlib.asynccontextmanager
async def wearable(radio: EmulatedRadio, **options: Any) -> AsyncIterator[WearableServer]:
    server = WearableServer(radio.specs[0], bundle_identity="b", **options)
    await server.start()
    try:
        yield server
    finally:
        await server.close()


KEYBOARD = PairingDelegate.IoCapability.KEYBOARD_INPUT_ONLY


def with_pairing(host: BumbleHost, *, sc: bool = True, mitm: bool = True,
                 io: PairingDelegate.IoCapability = KEYBOARD,
                 passkey: int = TEST_PASSKEY) -> None:
    """Make ``host`` pair as a central of another kind (legacy, Just Works...) would."""

    class Delegate(PairingDelegate):
        async def get_number(self) -> int | None:
            return passkey

    host.device.pairing_config_factory = lambda _c: PairingConfig(
        sc=sc, mitm=mitm, bonding=True,
        identity_address_type=PairingConfig.AddressType.RANDOM, delegate=Delegate(io))


async def stored(server: WearableServer) -> list[str]:
    assert server.device is not None and server.device.keystore is not None
    return [address for address, _ in await server.device.keystore.get_all()]


async def bare_client(host: BumbleHost) -> BleakClient:
    """A connected bleak client that has not paired (it does what the test says)."""
    client = BleakClient(WEARABLE_ADDR, backend=BumbleBleakClient, host=host, pair=False,
                         timeout=10)
    await client.connect()
    return client


def raw_connection(client: BleakClient) -> Any:
    return client._backend._connection  # type: ignore[attr-defined]


def run(main: Any) -> None:
    """asyncio.run with a hang guard: a stalled exchange fails the test instead of CI."""

    async def guarded() -> None:
        await asyncio.wait_for(main(), 120)

    asyncio.run(guarded())


def test_passkey_paired_central_is_served_and_its_key_is_authenticated() -> None:
    async def main() -> None:
        async with EmulatedRadio("ble5-2m", time_scale=0.2) as radio:
            shown: list[int] = []
            async with wearable(radio, pairing_window_s=30,
                                display_passkey=lambda _a, p: shown.append(p)) as server:
                # the default path: a random passkey, shown by the wearable, typed by the user
                typed: list[int] = []

                async def type_it() -> int:
                    while len(shown) <= len(typed):  # a person reading the wearable's console
                        await asyncio.sleep(0.01)
                    typed.append(shown[-1])
                    return shown[-1]

                async with Central(WEARABLE_ADDR, bundle_identity="b", hci=radio.specs[1],
                                   passkey=type_it, timeout=10) as central:
                    accept = asyncio.ensure_future(server.accept(30))
                    hl = await central.connect()
                    await accept
                    await hl.close()
                assert len(shown) == 1 and typed == shown and 0 <= shown[0] <= 999_999
                assert server.device is not None
                keys = await server.device.keystore.get("C0:F1:00:00:00:02")
                assert keys is not None and keys.ltk is not None and keys.ltk.authenticated
                assert keys.ltk_central is None and keys.ltk_peripheral is None  # not legacy

    run(main)


def test_wrong_passkey_is_refused() -> None:
    async def main() -> None:
        async with EmulatedRadio("ble5-2m", time_scale=0.2) as radio, wearable(
            radio, **WEARABLE_PAIRING
        ) as server:
            async with BumbleHost(radio.specs[1], passkey=TEST_PASSKEY + 1) as host:
                client = await bare_client(host)
                with pytest.raises(BleakError) as err:
                    await client.pair()
                assert err.value.pairing_failure == PairingFailure.WRONG_PASSKEY  # type: ignore[attr-defined]
                await client.disconnect()
            assert await stored(server) == []

    run(main)


def test_legacy_pairing_central_is_refused() -> None:
    async def main() -> None:
        async with EmulatedRadio("ble5-2m", time_scale=0.2) as radio, wearable(
            radio, **WEARABLE_PAIRING
        ) as server:
            accept = asyncio.ensure_future(server.accept(30))
            async with BumbleHost(radio.specs[1]) as host:
                with_pairing(host, sc=False)  # LE legacy pairing, with a passkey even
                client = await bare_client(host)
                failed: list[int] = []
                conn = raw_connection(client)
                conn.on("pairing_failure", failed.append)
                with pytest.raises(Exception):  # noqa: B017 - bumble's SMP ProtocolError
                    await conn.pair()
                assert failed == [smp.ErrorCode.AUTHENTICATION_REQUIREMENTS]
                control = client.services.get_characteristic(gatt.CONTROL_UUID)
                with pytest.raises(BumbleATTError) as err:
                    await client.write_gatt_char(control, b"\x01{}", response=True)
                assert err.value.att_error_code == 0x0F
                await client.disconnect()
            assert await stored(server) == []
            assert not accept.done()  # it never reached the coinf handshake
            accept.cancel()

    run(main)


@pytest.mark.parametrize("io", ["NO_OUTPUT_NO_INPUT", "DISPLAY_OUTPUT_AND_YES_NO_INPUT"])
def test_just_works_central_is_refused(io: str) -> None:
    """Centrals whose IO capabilities give Just Works against a display-only wearable."""

    async def main() -> None:
        async with EmulatedRadio("ble5-2m", time_scale=0.2, extra_hosts=1) as radio, wearable(
            radio, **WEARABLE_PAIRING
        ) as server:
            async with BumbleHost(radio.specs[1]) as host:
                with_pairing(host, mitm=False, io=PairingDelegate.IoCapability[io])
                client = await bare_client(host)
                with pytest.raises(Exception):  # noqa: B017 - bumble's SMP ProtocolError
                    await raw_connection(client).pair()
                await client.disconnect()
            assert await stored(server) == []
            # and the real central reports it as a pairing failure, not a served link
            async with BumbleHost(radio.spec("extra1"), address="C0:F1:00:00:00:04") as host:
                with_pairing(host, mitm=False, io=PairingDelegate.IoCapability[io])
                async with Central(WEARABLE_ADDR, bundle_identity="b", host=host, timeout=5,
                                   attempts=1) as central:
                    with pytest.raises(ProtocolError):
                        await central.connect()
            assert await stored(server) == []

    run(main)


def test_unauthenticated_key_is_dropped_and_cannot_subscribe_or_handshake() -> None:
    """Defence in depth: even if Just Works keys were made (the SMP policy bypassed), the wearable
    forgets them and disconnects; and the GATT layer refuses them anyway: every CCCD and
    characteristic needs an authenticated LE SC key."""

    async def main() -> None:
        async with EmulatedRadio("ble5-2m", time_scale=0.2, extra_hosts=1) as radio, wearable(
            radio, **WEARABLE_PAIRING
        ) as server:
            assert server.device is not None
            server.device.smp_session_proxy = smp.Session  # bumble's permissive default
            server.device.pairing_config_factory = lambda _c: PairingConfig(
                sc=True, mitm=False, bonding=True,
                delegate=PairingDelegate(PairingDelegate.IoCapability.NO_OUTPUT_NO_INPUT))
            async with BumbleHost(radio.specs[1]) as host:
                with_pairing(host, mitm=False, io=PairingDelegate.IoCapability.NO_OUTPUT_NO_INPUT)
                dropped = asyncio.Event()
                client = BleakClient(WEARABLE_ADDR, backend=BumbleBleakClient, host=host,
                                     pair=False, timeout=10,
                                     disconnected_callback=lambda _c: dropped.set())
                await client.connect()
                with contextlib.suppress(Exception):
                    await raw_connection(client).pair()  # Just Works: done, then dropped
                await asyncio.wait_for(dropped.wait(), 10)
            assert await stored(server) == []

            async def keep(_connection: Any) -> None:
                return None

            server._forget_and_drop = keep  # type: ignore[method-assign]
            async with BumbleHost(radio.spec("extra1"), address="C0:F1:00:00:00:05") as host:
                with_pairing(host, mitm=False, io=PairingDelegate.IoCapability.NO_OUTPUT_NO_INPUT)
                client = await bare_client(host)
                conn = raw_connection(client)
                await conn.pair()  # encrypted, but not authenticated
                assert conn.encryption
                for uuid in (gatt.CONTROL_UUID, gatt.DATA_UP_UUID):
                    char = client.services.get_characteristic(uuid)
                    with pytest.raises(BumbleATTError) as err:
                        await client.start_notify(char, lambda _c, _v: None)
                    assert err.value.att_error_code == 0x05  # INSUFFICIENT_AUTHENTICATION
                    with pytest.raises(BumbleATTError):
                        await client.read_gatt_char(char)
                control = client.services.get_characteristic(gatt.CONTROL_UUID)
                with pytest.raises(BumbleATTError) as err:
                    await client.write_gatt_char(control, b"\x01{}", response=True)
                assert err.value.att_error_code == 0x05
                await client.disconnect()

    run(main)


def test_subscribing_without_encryption_fails() -> None:
    async def main() -> None:
        async with EmulatedRadio("ble5-2m", time_scale=0.2) as radio, wearable(
            radio, **WEARABLE_PAIRING
        ), BumbleHost(radio.specs[1]) as host:
            client = await bare_client(host)
            for uuid in (gatt.CONTROL_UUID, gatt.DATA_UP_UUID):
                char = client.services.get_characteristic(uuid)
                with pytest.raises(BumbleATTError) as err:
                    await client.start_notify(char, lambda _c, _v: None)
                assert err.value.att_error_code == 0x0F  # INSUFFICIENT_ENCRYPTION
            await client.disconnect()

    run(main)


def test_pairing_outside_the_window_is_refused_and_bonds_outlive_it() -> None:
    async def main() -> None:
        async with EmulatedRadio("ble5-2m", time_scale=0.2, extra_hosts=1) as radio, wearable(
            radio, passkey=TEST_PASSKEY  # fixed passkey, but no window: the real default
        ) as server:
            assert not server.pairing_open
            async with BumbleHost(radio.specs[1], **HANDHELD_PAIRING) as host:
                async with Central(WEARABLE_ADDR, bundle_identity="b", host=host, timeout=5,
                                   attempts=1) as central:
                    with pytest.raises(ProtocolError):
                        await central.connect()
                assert await stored(server) == []
                # the user opens the window: the same handheld pairs and is served
                server.open_pairing_window(30)
                async with Central(WEARABLE_ADDR, bundle_identity="b", host=host,
                                   timeout=10) as central:
                    accept = asyncio.ensure_future(server.accept(30))
                    await (await central.connect()).close()
                    await (await accept).close()
                assert await stored(server) == ["C0:F1:00:00:00:02"]
                # window closed again: the bonded handheld is still served (no new pairing)
                server.close_pairing_window()
                await asyncio.sleep(0.3)
                async with Central(WEARABLE_ADDR, bundle_identity="b", host=host,
                                   timeout=10) as central:
                    accept = asyncio.ensure_future(server.accept(30))
                    await (await central.connect()).close()
                    await (await accept).close()
            # ... but a new, unbonded handheld is not
            async with BumbleHost(radio.spec("extra1"), address="C0:F1:00:00:00:09",
                                  **HANDHELD_PAIRING) as stranger, Central(
                WEARABLE_ADDR, bundle_identity="b", host=stranger, timeout=5, attempts=1
            ) as central:
                with pytest.raises(ProtocolError):
                    await central.connect()
            assert await stored(server) == ["C0:F1:00:00:00:02"]

    run(main)


def test_idle_central_is_dropped_after_the_deadline_and_another_connects(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="coinf.ble_protocol.peripheral")

    async def main() -> None:
        async with EmulatedRadio("ble5-2m", time_scale=0.2, extra_hosts=1) as radio, wearable(
            radio, handshake_timeout=1.0, **WEARABLE_PAIRING
        ) as server:
            async with BumbleHost(radio.specs[1], **HANDHELD_PAIRING) as host:
                dropped = asyncio.Event()
                client = BleakClient(WEARABLE_ADDR, backend=BumbleBleakClient, host=host,
                                     pair=True, timeout=10,
                                     disconnected_callback=lambda _c: dropped.set())
                await client.connect()  # paired and encrypted, then sits there
                assert not dropped.is_set()
                await asyncio.wait_for(dropped.wait(), 10)  # hang guard only
                # dropped by the 1 s handshake deadline (not a stalled pairing, not the default
                # 5 s deadline): the wearable says which deadline it enforced
                drops = [r.getMessage() for r in caplog.records
                         if r.getMessage().startswith("dropping ")]
                assert len(drops) == 1 and drops[0].endswith(
                    ": no coinf handshake within 1.0 s"), drops
            # the wearable advertises again: another handheld connects and is served
            async with Central(WEARABLE_ADDR, bundle_identity="b", hci=radio.spec("extra1"),
                               own_address="C0:F1:00:00:00:03", timeout=10,
                               **HANDHELD_PAIRING) as central:
                accept = asyncio.ensure_future(server.accept(30))
                hl = await central.connect()
                wl = await accept
                await asyncio.sleep(1.5)  # past the deadline: a handshaken link stays
                assert hl.is_open and wl.is_open
                await hl.close()

    run(main)


def test_wearable_options_are_checked() -> None:
    for bad in ({"passkey": 1_000_000}, {"passkey": -1}, {"passkey": "123456"},
                {"handshake_timeout": 0}, {"pairing_window_s": -1}):
        with pytest.raises(InputError):
            WearableServer("tcp-client:127.0.0.1:1", bundle_identity="b", **bad)
    with pytest.raises(ValueError):
        BumbleHost("tcp-client:127.0.0.1:1", passkey=1_000_000)
    server = WearableServer("tcp-client:127.0.0.1:1", bundle_identity="b")
    assert not server.pairing_open and server.passkey is None  # the secure defaults
    server.open_pairing_window(math.inf)
    assert server.pairing_open
    server.close_pairing_window()
    assert not server.pairing_open


# --- bond stores --------------------------------------------------------------------------------


def mode(path: Any) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_bond_store_is_created_private(tmp_path) -> None:
    path = tmp_path / "new" / "bonds.json"

    async def main() -> None:
        store = PrivateJsonKeyStore(path)
        from bumble.keys import PairingKeys

        keys = PairingKeys()
        keys.ltk = PairingKeys.Key(value=bytes(16), authenticated=True)
        await store.update("C0:F1:00:00:00:02", keys)

    old = os.umask(0o022)
    try:
        run(main)
    finally:
        os.umask(old)
    assert mode(path.parent) == 0o700
    assert mode(path) == 0o600
    assert "C0:F1:00:00:00:02" in json.dumps(json.loads(path.read_text()))


def test_bond_store_tightens_a_loose_file_and_refuses_a_loose_directory(tmp_path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)
    loose_file = private / "bonds.json"
    loose_file.write_text("{}")
    os.chmod(loose_file, 0o644)
    prepare_bond_store(loose_file)
    assert mode(loose_file) == 0o600
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)
    with pytest.raises(BondStoreError, match="chmod 700"):
        prepare_bond_store(shared / "bonds.json")
    with pytest.raises(BondStoreError, match="chmod 700"):
        asyncio.run(WearableServer("tcp-client:127.0.0.1:1", bundle_identity="b",
                                   keystore=str(shared / "bonds.json")).start())
    assert mode(shared) == 0o755  # never chmod a directory we did not create


def test_paired_bonds_land_in_private_files(tmp_path) -> None:
    async def main() -> None:
        async with EmulatedRadio("ble5-2m", time_scale=0.2) as radio:
            wstore, hstore = tmp_path / "w" / "bonds.json", tmp_path / "h" / "bonds.json"
            async with wearable(radio, keystore=str(wstore), **WEARABLE_PAIRING) as server, \
                    Central(WEARABLE_ADDR, bundle_identity="b", hci=radio.specs[1],
                            keystore=str(hstore), timeout=10, **HANDHELD_PAIRING) as central:
                accept = asyncio.ensure_future(server.accept(30))
                await (await central.connect()).close()
                await (await accept).close()
            for store in (wstore, hstore):
                assert mode(store) == 0o600 and mode(store.parent) == 0o700
                assert '"authenticated": true' in store.read_text()

    run(main)


# --- the commands, as separate processes over the radio process ---------------------------------


def test_pair_commands_bond_and_only_the_bonded_handheld_is_served(tmp_path) -> None:
    from tests.bundles import make_tiny_bundle

    bundle = make_tiny_bundle(tmp_path / "tiny")
    wspec, hspec, stop_radio = spawn("ble5-2m", overrides=["time_scale=0.5"])
    coinf = [sys.executable, "-m", "coinf"]
    wstore, hstore = str(tmp_path / "w" / "bonds.json"), str(tmp_path / "h" / "bonds.json")
    procs: list[subprocess.Popen[str]] = []
    try:
        pair_w = subprocess.Popen(
            [*coinf, "wearable", "pair", "--hci", wspec, "--window-s", "60",
             "--keystore", wstore], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(pair_w)
        assert pair_w.stdout is not None
        assert "pairing window open" in pair_w.stdout.readline()
        pair_h = subprocess.Popen(
            [*coinf, "handheld", "pair", "--hci", hspec, "--keystore", hstore],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(pair_h)
        shown = pair_w.stdout.readline()
        passkey = re.search(r"passkey for \S+: (\d{6})$", shown.strip())
        assert passkey, shown
        out, err = pair_h.communicate(passkey.group(1) + "\n", timeout=60)
        assert pair_h.returncode == 0, err[-800:]
        assert "paired with coinf-wearable" in out
        assert pair_w.wait(30) == 0
        assert "bonded with C0:F1:00:00:00:02" in pair_w.stdout.read()
        # no window any more: the bonded handheld is served by `coinf wearable`
        handheld = subprocess.Popen(
            [*coinf, "handheld", "--bundle", str(bundle.root), "--transport", "ble", "--hci",
             hspec, "--keystore", hstore], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        procs.append(handheld)
        assert handheld.stdout is not None and "serving" in handheld.stdout.readline()
        served = subprocess.run(
            [*coinf, "wearable", "--bundle", str(bundle.root), "--hci", wspec, "--keystore",
             wstore, "--once", "--probes", "1", "--probe-bytes", "1000"],
            capture_output=True, text=True, timeout=120)
        assert served.returncode == 0, served.stderr[-800:]
        assert "round_trip_s" in served.stdout
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)
        stop_radio()
