"""How the handheld finds the wearable to connect to (docs/PROTOCOL.md §2 and §7): by name or
the coinf service with no bond; with bonds, only a bonded identity -- its identity address, or a
resolvable private address that a bonded IRK resolves (a bonded wearable advertises from such
addresses, without name or service UUID)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from coinf.ble_protocol import gatt
from coinf.ble_protocol.link import LinkClosed

#: a MAC address (or a CoreBluetooth UUID): a target given as an address, not a name
MAC = re.compile(r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$|^[0-9A-Fa-f-]{36}$")


def bonded_match(bonds: list[tuple[str, bytes | None]]) -> Callable[[Any], bool]:
    """Whether a scanned device is one of ``bonds`` (identity address, IRK): its address is
    the identity address, or a resolvable private address that the IRK resolves."""
    from bumble import hci, smp

    identities = {address.upper() for address, _ in bonds}
    resolver = smp.AddressResolver([(irk, hci.Address(address)) for address, irk in bonds
                                    if irk is not None])

    def match(device: Any) -> bool:
        if str(device.address).upper() in identities:
            return True
        adv = device.details
        address = getattr(adv, "address", None)
        if isinstance(address, hci.Address) and address.is_resolvable:
            return resolver.resolve(address) is not None
        return False

    return match


async def find(
    address_or_name: str | None, scanner_backend: Any, timeout: float, kwargs: dict[str, Any],
    bonds: list[tuple[str, bytes | None]] | None = None,
) -> Any:
    """The device to connect to: one advertising ``address_or_name`` (a name) or the coinf
    service (None); with ``bonds``, only a bonded identity (see :func:`bonded_match`)."""
    from bleak import BleakScanner

    if bonds:
        bonded = bonded_match(bonds)
        # a wearable with a bond hides its name and service UUID (its resolvable private
        # address, which only a bonded IRK resolves, says who it is); when shown they must match
        found = await BleakScanner.find_device_by_filter(
            lambda d, ad: bonded(d) and (
                ad.local_name in (None, address_or_name) if address_or_name is not None
                else not ad.service_uuids
                or gatt.SERVICE_UUID in [u.lower() for u in ad.service_uuids]),
            timeout=timeout,
            backend=scanner_backend,
            **kwargs,
        )
        if found is None:
            what = repr(address_or_name) if address_or_name else "the coinf service"
            raise LinkClosed(f"scan found no bonded device advertising {what} within "
                             f"{timeout:.0f} s ({len(bonds)} bond(s) in the store)")
        return found
    if address_or_name is None:
        found = await BleakScanner.find_device_by_filter(
            lambda _d, ad: gatt.SERVICE_UUID in [u.lower() for u in ad.service_uuids],
            timeout=timeout,
            backend=scanner_backend,
            **kwargs,
        )
        what = "a device advertising the coinf service"
    else:
        found = await BleakScanner.find_device_by_name(
            address_or_name, timeout=timeout, backend=scanner_backend, **kwargs
        )
        what = f"a device named {address_or_name!r}"
    if found is None:
        raise LinkClosed(f"scan found no {what} within {timeout:.0f} s")
    return found


__all__ = ["MAC", "bonded_match", "find"]
