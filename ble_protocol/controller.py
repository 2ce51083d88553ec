"""What this machine's Bluetooth controller can do, read from the controller itself.

Four HCI commands answer it (Core spec Vol 4 Part E): Read Local Version Information (7.4.1),
LE Read Local Supported Features (7.8.3: Data Length Extension = bit 5, 2M PHY = bit 8, Coded
PHY = bit 11), LE Read Buffer Size (7.8.2: the controller's max LE ACL data length and buffer
count) and LE Read Maximum Data Length (7.8.46: the longest LL payload with DLE). Their Command
Complete events are decoded with bumble's HCI classes, whether they come live from a controller
(:func:`read_controller`) or recorded (:func:`parse_responses`; ``coinf doctor --hci-dump``), and
:func:`matching_preset` picks the radio preset (:mod:`ble_protocol.radio.params`) these facts
describe, so the planner's link model is the controller's, not a guess.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from coinf.errors import AdapterError

#: commands whose answers describe the controller, in the order they are sent
COMMANDS = ("HCI_READ_LOCAL_VERSION_INFORMATION_COMMAND",
            "HCI_LE_READ_LOCAL_SUPPORTED_FEATURES_COMMAND",
            "HCI_LE_READ_BUFFER_SIZE_COMMAND",
            "HCI_LE_READ_MAXIMUM_DATA_LENGTH_COMMAND")
MAX_PACKET = 260  # an HCI event is at most 2 + 255 bytes (+ the H4 indicator)


@dataclass
class ControllerInfo:
    """The controller's facts (None: the controller did not answer that command)."""

    hci_version: str | None = None
    lmp_version: str | None = None
    company: str | None = None
    le_features: list[str] | None = None
    data_length_extension: bool | None = None
    le_2m_phy: bool | None = None
    le_coded_phy: bool | None = None
    max_acl_data_length: int | None = None  # LE ACL data packet length (host -> controller)
    acl_buffers: int | None = None
    max_tx_octets: int | None = None  # LL payload with DLE
    max_rx_octets: int | None = None
    failed: dict[str, str] | None = None  # command -> error status

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _event(raw: bytes) -> Any:
    """One HCI event packet (with or without the H4 ``0x04`` indicator) decoded by bumble."""
    from bumble import hci

    if not raw or len(raw) > MAX_PACKET:
        raise ValueError(f"an HCI event is 3..{MAX_PACKET} bytes, got {len(raw)}")
    data = raw if raw[0] == hci.HCI_EVENT_PACKET else bytes([hci.HCI_EVENT_PACKET]) + raw
    if len(data) < 3 or data[2] != len(data) - 3:
        raise ValueError(f"HCI event length field says {data[2] if len(data) > 2 else '?'} "
                         f"bytes, the packet has {len(data) - 3}")
    return hci.HCI_Packet.from_bytes(data)


def parse_responses(packets: Iterable[bytes]) -> ControllerInfo:
    """Decode Command Complete events of the :data:`COMMANDS`; other events are ignored. A
    malformed packet raises ``ValueError`` naming what is wrong."""
    from bumble import hci

    info = ControllerInfo(failed={})
    for raw in packets:
        try:
            ev = _event(bytes(raw))
        except ValueError:
            raise
        except Exception as exc:  # bumble's parser on truncated parameters
            raise ValueError(f"not a decodable HCI event: {exc}") from None
        if not isinstance(ev, hci.HCI_Command_Complete_Event):
            continue
        name = hci.HCI_Command.command_name(ev.command_opcode)
        rp = ev.return_parameters
        status = getattr(rp, "status", None)
        if status is None and isinstance(rp, hci.HCI_GenericReturnParameters):
            status = rp.data[0] if rp.data else None
        if status not in (0, None):
            assert info.failed is not None
            info.failed[name] = hci.HCI_Constant.error_name(status)
            continue
        if name == "HCI_READ_LOCAL_VERSION_INFORMATION_COMMAND":
            info.hci_version = _version_name(rp.hci_version)
            info.lmp_version = _version_name(rp.lmp_version)
            info.company = _company(rp.company_identifier)
        elif name == "HCI_LE_READ_LOCAL_SUPPORTED_FEATURES_COMMAND":
            mask = hci.LeFeatureMask(int.from_bytes(rp.le_features, "little"))
            info.le_features = sorted(f.name for f in hci.LeFeatureMask
                                      if f.name and f in mask and f.value)
            info.data_length_extension = hci.LeFeatureMask.LE_DATA_PACKET_LENGTH_EXTENSION in mask
            info.le_2m_phy = hci.LeFeatureMask.LE_2M_PHY in mask
            info.le_coded_phy = hci.LeFeatureMask.LE_CODED_PHY in mask
        elif name == "HCI_LE_READ_BUFFER_SIZE_COMMAND":
            info.max_acl_data_length = int(rp.le_acl_data_packet_length)
            info.acl_buffers = int(rp.total_num_le_acl_data_packets)
        elif name == "HCI_LE_READ_MAXIMUM_DATA_LENGTH_COMMAND":
            info.max_tx_octets = int(rp.supported_max_tx_octets)
            info.max_rx_octets = int(rp.supported_max_rx_octets)
    return info


def _version_name(v: int) -> str:
    from bumble import hci

    try:
        return str(hci.SpecificationVersion(v).name).replace("BLUETOOTH_CORE_", "").replace(
            "_", ".")
    except ValueError:
        return f"unknown ({v})"


def _company(cid: int) -> str:
    try:
        from bumble.company_ids import COMPANY_IDENTIFIERS

        return f"{COMPANY_IDENTIFIERS.get(cid, 'unknown')} (0x{cid:04X})"
    except ImportError:
        return f"0x{cid:04X}"


def matching_preset(info: ControllerInfo) -> tuple[str, dict[str, Any], str]:
    """(preset name, overrides, why) for the radio model this controller matches: 2M PHY + DLE
    -> ``ble5-2m``; DLE -> ``ble42-dle``; neither (or unknown) -> ``pi-zero-2w`` (27-byte LL
    payloads, 1M PHY). Overrides carry the controller's LL payload and ACL buffer count."""
    over: dict[str, Any] = {}
    if info.data_length_extension:
        if info.max_tx_octets:
            over["ll_payload"] = max(27, min(251, info.max_tx_octets))
        name = "ble5-2m" if info.le_2m_phy else "ble42-dle"
        why = "Data Length Extension" + (" and the 2M PHY" if info.le_2m_phy else
                                         ", 1M PHY only")
    else:
        name = "pi-zero-2w"
        why = ("no Data Length Extension: 27-byte LL payloads, 1M PHY"
               if info.data_length_extension is False else
               "LE features unknown: assuming the slowest (27-byte LL payloads, 1M PHY)")
    if info.acl_buffers:
        over["acl_buffers"] = max(1, min(1024, info.acl_buffers))
    return name, over, why


async def read_controller(spec: str, timeout: float = 5.0) -> tuple[ControllerInfo, list[bytes]]:
    """Open the HCI transport ``spec`` with bumble, reset the controller, send the
    :data:`COMMANDS`; returns the decoded facts and the raw events (to record). Raises
    :class:`AdapterError` when the transport cannot be opened or the controller does not
    answer within ``timeout`` seconds per step."""
    from bumble import hci
    from bumble.host import Host
    from bumble.transport import open_transport

    try:
        transport = await asyncio.wait_for(open_transport(spec), timeout)
    except Exception as exc:  # bumble raises OSError, ValueError, its own TransportError...
        raise AdapterError(f"cannot open the HCI transport {spec!r}: {exc}") from None
    raws: list[bytes] = []
    try:
        host = Host(transport.source, transport.sink)
        try:
            await asyncio.wait_for(host.reset(), timeout)  # bumble's reset + init sequence
        except Exception as exc:
            raise AdapterError(f"the controller at {spec!r} does not answer HCI Reset: "
                               f"{exc or type(exc).__name__}") from None
        for cls in (hci.HCI_Read_Local_Version_Information_Command,
                    hci.HCI_LE_Read_Local_Supported_Features_Command,
                    hci.HCI_LE_Read_Buffer_Size_Command,
                    hci.HCI_LE_Read_Maximum_Data_Length_Command):
            try:
                ev: Any = await asyncio.wait_for(host.send_command(cls()), timeout)
            except Exception:  # a controller without the command: recorded as missing
                continue
            raws.append(bytes(ev))
    finally:
        await transport.close()
    return parse_responses(raws), raws


def local_controllers() -> list[str]:
    """HCI devices the kernel knows (``hci0``...), empty without any (or not on Linux)."""
    root = Path("/sys/class/bluetooth")
    try:
        return sorted(p.name for p in root.iterdir() if p.name.startswith("hci")
                      and ":" not in p.name)
    except OSError:
        return []
