"""``coinf doctor``: controller LE features decoded from recorded HCI responses, the matching
radio preset, a live read from bumble's (emulated) controller, and a machine without Bluetooth
(issue 16)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from coinf.ble_protocol.controller import (
    ControllerInfo,
    matching_preset,
    parse_responses,
    read_controller,
)
from coinf.ble_protocol.radio import EmulatedRadio
from coinf.device.runtimes import known_bad

from coinf.cli import main

# Command Complete events as a controller sends them: 04 0E len, num_cmd, opcode (LE), status...
# A CYW43438-class controller (Pi Zero 2 W): Bluetooth 4.1, no DLE, and LE Read Maximum Data
# Length is an unknown command (status 0x01).
PI_ZERO = [
    "040e0c01011000" "07" "0e01" "07" "3101" "0061",  # version: HCI 4.1, Cypress (0x0131)
    "040e0c01032000" "0100000000000000",  # LE features: LE Encryption only
    "040e07010220001b000a",  # LE Read Buffer Size: 27 B, 10 buffers
    "040e04012f2001",  # LE Read Maximum Data Length: Unknown HCI Command
]
# A Bluetooth 5 controller: DLE (bit 5), 2M PHY (bit 8), Coded PHY (bit 11); 251-byte payloads
BLE5 = [
    "040e0c01011000" "09" "0000" "09" "0200" "0000",  # HCI 5.0, Intel (0x0002)
    "040e0c01032000" "ff09000000000000",
    "040e0701022000fb000f",  # 251 B, 15 buffers
    "040e0c012f2000" "fb004808" "fb004808",  # max tx/rx 251 octets, 2120 us
]
# Bluetooth 4.2 with DLE on the 1M PHY only
BLE42 = [
    "040e0c01032000" "2100000000000000",  # LE Encryption + DLE
    "040e0c012f2000" "fb004808" "fb004808",
]


def _raw(hexes: list[str]) -> list[bytes]:
    return [bytes.fromhex(h) for h in hexes]


def test_pi_zero_controller_gets_the_slow_preset() -> None:
    info = parse_responses(_raw(PI_ZERO))
    assert (info.hci_version, info.lmp_version) == ("4.1", "4.1")
    assert "0x0131" in (info.company or "")
    assert info.data_length_extension is False and info.le_2m_phy is False
    assert info.max_acl_data_length == 27 and info.acl_buffers == 10
    assert info.max_tx_octets is None
    assert info.failed == {"HCI_LE_READ_MAXIMUM_DATA_LENGTH_COMMAND":
                           "UNKNOWN_HCI_COMMAND_ERROR"}
    name, over, why = matching_preset(info)
    assert (name, over) == ("pi-zero-2w", {"acl_buffers": 10}) and "no Data Length" in why


def test_ble5_controller_gets_2m_and_its_payload() -> None:
    info = parse_responses(_raw(BLE5))
    assert info.hci_version == "5.0" and info.le_coded_phy is True
    assert info.data_length_extension and info.le_2m_phy
    assert {"LE_2M_PHY", "LE_DATA_PACKET_LENGTH_EXTENSION"} <= set(info.le_features or [])
    assert (info.max_acl_data_length, info.acl_buffers, info.max_tx_octets) == (251, 15, 251)
    assert matching_preset(info)[:2] == ("ble5-2m", {"ll_payload": 251, "acl_buffers": 15})


def test_dle_without_2m() -> None:
    info = parse_responses(_raw(BLE42))
    assert info.hci_version is None  # not asked: unknown, not guessed
    assert matching_preset(info)[:2] == ("ble42-dle", {"ll_payload": 251})


def test_no_features_is_the_slowest_preset_and_says_so() -> None:
    name, _, why = matching_preset(parse_responses([]))
    assert name == "pi-zero-2w" and "unknown" in why


@pytest.mark.parametrize("bad", ["040e0c0103", "040e05010320", "ff" * 300])
def test_malformed_packets_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_responses([bytes.fromhex(bad)])


@pytest.mark.parametrize(("preset", "dle", "two_m"),
                         [("pi-zero-2w", False, False), ("ble5-2m", True, True)])
def test_live_read_from_the_emulated_controller(preset: str, dle: bool, two_m: bool) -> None:
    async def read() -> tuple[ControllerInfo, list[bytes]]:
        async with EmulatedRadio(preset) as radio:
            return await read_controller(radio.spec("wearable"), timeout=10)

    info, raws = asyncio.run(read())
    assert info.data_length_extension is dle and info.le_2m_phy is two_m
    assert matching_preset(info)[0] == preset
    assert parse_responses(raws) == info  # what doctor records decodes to the same facts


def test_doctor_cli_from_a_recording(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = tmp_path / "hci.txt"
    dump.write_text("\n".join(BLE5) + "\n")
    rc = main(["doctor", "--json", "--hci-dump", str(dump), "--bundle", str(tmp_path / "none")])
    report = json.loads(capsys.readouterr().out)
    ctl = report["checks"]["controller"]
    assert ctl["preset"] == "ble5-2m" and ctl["raw"] == BLE5
    assert report["checks"]["bundle"]["status"] == "fail" and rc == 1


def test_doctor_without_bluetooth_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import coinf.ble_protocol.controller as controller

    if controller.local_controllers():
        pytest.skip("this machine has a Bluetooth controller")
    monkeypatch.setenv("COINF_CONFIG", str(tmp_path / "cfg" / "policy.json"))
    rc = main(["doctor"])
    out = capsys.readouterr().out
    assert "[warn] controller: no Bluetooth controller found" in out
    assert "[  ok] runtime: onnxruntime" in out and rc == 0


def test_doctor_rejects_a_bad_dump(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "d.txt").write_text("zz\n")
    assert main(["doctor", "--hci-dump", str(tmp_path / "d.txt")]) == 2
    assert "one HCI event in hex per line" in capsys.readouterr().err


def test_known_bad_runtime() -> None:
    assert "SIGILL" in (known_bad("onnxruntime", "1.21.0") or "")
    assert known_bad("onnxruntime", "1.21.1") is None
