"""A handheld without Bluetooth stops at once with one line; a wearable not there is retried."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path

import pytest
from bleak.exc import (
    BleakBluetoothNotAvailableError,
    BleakBluetoothNotAvailableReason,
    BleakDBusError,
)
from coinf.ble_protocol import central as central_mod
from coinf.ble_protocol.central import Central, adapter_fault

from coinf.errors import AdapterError, LinkClosed
from tests.bundles import make_tiny_bundle


def test_adapter_fault_is_decided_from_types() -> None:
    R = BleakBluetoothNotAvailableReason
    assert adapter_fault(BleakBluetoothNotAvailableError("No Bluetooth adapters found.",
                                                         R.NO_BLUETOOTH))
    assert adapter_fault(BleakBluetoothNotAvailableError("classic only", R.NO_BLE_CENTRAL_ROLE))
    assert adapter_fault(FileNotFoundError(errno.ENOENT, "No such file or directory"))
    assert adapter_fault(BleakDBusError("org.freedesktop.DBus.Error.ServiceUnknown", []))
    # retried: the radio is off (may be switched on), the wearable is not found / not answering
    assert adapter_fault(BleakBluetoothNotAvailableError("off", R.POWERED_OFF)) is None
    assert adapter_fault(BleakDBusError("org.bluez.Error.Failed", ["le-connection-abort"])) is None
    assert adapter_fault(TimeoutError()) is None
    assert adapter_fault(LinkClosed("scan found no device")) is None


def _fake_find(exc: BaseException, calls: list[int]):  # type: ignore[no-untyped-def]
    async def find(*_args, **_kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        raise exc

    return find


def test_no_bluetooth_stack_is_fatal_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(central_mod, "_find",
                        _fake_find(FileNotFoundError(errno.ENOENT, "No such file"), calls))

    async def main() -> None:
        async with Central("w", bundle_identity="x", backoff=0.01) as central:
            with pytest.raises(AdapterError, match="D-Bus system bus"):
                await central.serve_with_reconnect(lambda link: asyncio.sleep(0))

    asyncio.run(asyncio.wait_for(main(), 10))
    assert calls == [1]  # no second attempt


def test_a_wearable_not_there_yet_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(central_mod, "_find", _fake_find(LinkClosed("scan found none"), calls))

    async def main() -> None:
        stop = asyncio.Event()
        async with Central("w", bundle_identity="x", backoff=0.01, attempts=2) as central:
            task = asyncio.ensure_future(
                central.serve_with_reconnect(lambda link: asyncio.sleep(0), stop=stop))
            while len(calls) < 6:
                await asyncio.sleep(0.01)
            stop.set()
            await task

    asyncio.run(asyncio.wait_for(main(), 20))


def test_hci_transport_that_does_not_open_is_one_line(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from coinf.cli import main

    bundle = make_tiny_bundle(tmp_path / "b")
    rc = main(["handheld", "--bundle", str(bundle.root), "--transport", "ble", "--hci",
               "tcp-client:127.0.0.1:1"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.strip().splitlines()[-1].startswith("coinf handheld: error: cannot open HCI")
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["wearable", "pair"])
def test_wearable_hci_transport_that_does_not_open_is_the_users_to_mend(
        command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The wearable's GATT server on an HCI spec that never opens: exit 2 (an AdapterError,
    like the handheld's), not 3 as if a peer had gone away."""
    from coinf.cli import main

    bundle = make_tiny_bundle(tmp_path / "b")
    args = (["wearable", "--bundle", str(bundle.root)] if command == "wearable"
            else ["wearable", "pair", "--keystore", str(tmp_path / "bonds.json")])
    rc = main([*args, "--hci", "bogus:spec", "--once"] if command == "wearable"
              else [*args, "--hci", "bogus:spec"])
    err = capsys.readouterr().err
    assert rc == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("coinf wearable: error: cannot open HCI transport 'bogus:spec'"), err
    assert "Traceback" not in err


def test_handheld_without_bluetooth_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from coinf.cli import main

    calls: list[int] = []
    monkeypatch.setattr(central_mod, "_find",
                        _fake_find(FileNotFoundError(errno.ENOENT, "No such file"), calls))
    bundle = make_tiny_bundle(tmp_path / "b")
    rc = main(["handheld", "--bundle", str(bundle.root), "--transport", "ble"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "no Bluetooth" in err and calls == [1]
