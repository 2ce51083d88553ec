"""Recovery after the HCI transport is lost and restored (issue 11): the wearable's ``ble:``
connector notices its transport died, and once a radio is back on the same address a new
GATT server serves the handheld again."""

from __future__ import annotations

import asyncio

import pytest
from coinf.ble_protocol.ble_transport import PeripheralConnector
from coinf.ble_protocol.central import Central
from coinf.ble_protocol.radio import EmulatedRadio

from coinf.errors import LinkClosed
from tests.ble_servers import HANDHELD_PAIRING, WEARABLE_PAIRING


async def served(radio: EmulatedRadio, connector: PeripheralConnector) -> None:
    """One handheld connects through ``radio``; the connector hands the wearable a link."""
    hspec = radio.specs[1]
    async with Central("coinf-wearable", bundle_identity="b", hci=hspec, timeout=10,
                       **HANDHELD_PAIRING) as central:
        accept = asyncio.ensure_future(connector.connect(30))
        handheld = await central.connect()
        wearable = await asyncio.wait_for(accept, 30)  # hang guard
        assert wearable.is_open and handheld.is_open
        await handheld.close()
        await wearable.close()


def test_the_wearable_serves_again_after_the_radio_comes_back() -> None:
    async def main() -> None:
        radio = await EmulatedRadio("ble5-2m", time_scale=0.2).start()
        ports = tuple(radio.ports)
        connector = PeripheralConnector(radio.specs[0], bundle_identity="b", **WEARABLE_PAIRING)
        try:
            await served(radio, connector)
            await radio.stop()  # the radio process dies: the HCI socket closes
            for _ in range(100):  # hang guard: bumble notices the closed socket
                if connector.server.transport_lost:
                    break
                await asyncio.sleep(0.05)
            assert connector.server.transport_lost
            with pytest.raises(LinkClosed):  # nothing to connect to while it is down
                await connector.connect(5)
            radio = await EmulatedRadio("ble5-2m", time_scale=0.2, ports=ports).start()
            await served(radio, connector)  # a fresh server on the restored transport
        finally:
            await connector.aclose()
            await radio.stop()

    asyncio.run(main())


def test_a_wearable_with_no_controller_is_a_user_error() -> None:
    from coinf.errors import AdapterError

    async def main() -> None:
        connector = PeripheralConnector("tcp-client:127.0.0.1:9", bundle_identity="b")
        try:
            with pytest.raises(AdapterError, match="check the HCI spec"):
                await connector.connect(5)
        finally:
            await connector.aclose()

    asyncio.run(main())
