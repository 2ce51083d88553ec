"""The wearable's LE privacy (docs/PROTOCOL.md §2, "Advertising and tracking").

Once the wearable holds a bond and its pairing window is closed, it advertises from a fresh
*resolvable private address* (RPA) each time it starts advertising (and every
:data:`RPA_ROTATE_S` while it advertises), generated from its identity resolving key (IRK), with
neither its name nor the coinf service UUID: a bonded handheld finds it
by resolving the address with the IRK it received when it paired; to anybody else each
advertising period looks like a different, anonymous device. While the window is open (or no
bond exists) it also shows its name and the service UUID, so that a handheld without a bond can
find it: discovery costs trackability for that long.

The IRK must be secret and must not change (bonded handhelds hold it): :func:`local_irk` keeps it
in a 0600 file next to the bond store (``wearable.json`` -> ``wearable.irk``), or makes a random
one for a bond store in memory. (bumble derives a default IRK from the static address, which
anybody who saw that address could compute.)
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from bumble import hci
from bumble.core import UUID, AdvertisingData
from bumble.device import Device

from coinf.errors import InputError

IRK_BYTES = 16
#: s one resolvable private address is advertised at most (the Core specification's 15 min)
RPA_ROTATE_S = 900.0


def irk_path(keystore: str) -> Path:
    return Path(keystore).with_suffix(".irk")


def local_irk(keystore: str | None) -> bytes:
    """This wearable's IRK: read from (or first written to) the file beside ``keystore``, 0600;
    random for a bond store in memory (None)."""
    if keystore is None:
        return secrets.token_bytes(IRK_BYTES)
    path = irk_path(keystore)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        text = path.read_text().strip()
        try:
            irk = bytes.fromhex(text)
        except ValueError:
            irk = b""
        if len(irk) != IRK_BYTES:
            raise InputError(f"{path} is not an IRK (32 hex digits); remove it and pair the "
                             "handhelds again") from None
        if path.stat().st_mode & 0o077:
            os.chmod(path, 0o600)
        return irk
    irk = secrets.token_bytes(IRK_BYTES)
    with os.fdopen(fd, "w") as out:
        out.write(irk.hex() + "\n")
    return irk


def advertising_payload(name: str, show_identity: bool) -> tuple[bytes, bytes]:
    """(advertising data, scan response): flags, plus name and service UUID when shown."""
    from coinf.ble_protocol import gatt

    fields: list[tuple[int, bytes]] = [(AdvertisingData.FLAGS, bytes([0x06]))]
    scan: list[tuple[int, bytes]] = []
    if show_identity:
        fields.append((AdvertisingData.COMPLETE_LOCAL_NAME, name.encode()[:20]))
        scan.append((AdvertisingData.COMPLETE_LIST_OF_128_BIT_SERVICE_CLASS_UUIDS,
                     bytes(UUID(gatt.SERVICE_UUID).to_bytes())))
    return bytes(AdvertisingData(fields)), bytes(AdvertisingData(scan))


async def use_address(device: Device, private: bool) -> hci.Address:
    """Set the address the next advertising uses: a fresh RPA from the device's IRK
    (``private``), else its static identity address."""
    address = (hci.Address.generate_private_address(device.irk) if private
               else device.static_address)
    if address != device.random_address:
        await device.send_sync_command(
            hci.HCI_LE_Set_Random_Address_Command(random_address=address))
        device.random_address = address
    return address


__all__ = ["RPA_ROTATE_S", "advertising_payload", "irk_path", "local_irk", "use_address"]
