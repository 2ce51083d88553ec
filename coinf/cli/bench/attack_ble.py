"""BLE attackers (issue "Trust on every link"; the BLE half of ``coinf bench attack``).

Each attacker runs over an in-process emulated radio with bumble's real SMP, ATT and GATT,
against a real wearable (:class:`~coinf.ble_protocol.peripheral.WearableServer`, pairing window
closed) and a real handheld (:class:`~coinf.ble_protocol.central.Central`) bonded to it
beforehand, and returns::

    {"attacker": name, "served": int, "tensors_read": int, "results_accepted": int,
     "lockout_s": float}

* ``served``: links the wearable handshook with the attacker (each would be served requests);
  for the impostor wearable, HELLOs the handheld sent it;
* ``tensors_read``: tensor notifications the attacker received (the wearable sends a tensor
  on every link it serves); for the impostor, data writes the handheld sent it;
* ``results_accepted``: the attacker's replies the wearable took as results (the impostor:
  links the handheld completed with it, the only way its results could be taken);
* ``lockout_s``: seconds the bonded handheld's connection attempts kept failing, while the
  attacker was active, before the real wearable served it (0: its first attempt got through);
* ``connections`` (extra): connections the attacker made (central) or got (impostor).

Attackers: :func:`unpaired_central`, :func:`legacy_central`, :func:`just_works_central`,
:func:`impostor_wearable`; :data:`ATTACKERS` lists them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

WEARABLE = "C0:F1:00:00:00:01"
HANDHELD = "C0:F1:00:00:00:02"
ATTACKER = "C0:F1:00:00:00:66"
IDENTITY = "attack-bundle"


@dataclass
class Tally:
    """What the wearable did for whom, and what the handheld went through."""

    served: dict[str, int] = field(default_factory=dict)  # links handshaken, per address
    accepted: dict[str, int] = field(default_factory=dict)  # replies taken, per address
    lockout_s: float = 0.0


class ImpostorWearable:
    """A bumble device advertising the wearable's name and the coinf service with no security
    at all: Just Works pairing (NoInputNoOutput) and open characteristics that record what a
    handheld writes. ``connections``, ``hellos`` and ``data_writes`` count what it got."""

    def __init__(self, spec: str, *, name: str = "coinf-wearable", address: str = ATTACKER,
                 io: Any = None) -> None:
        self.spec, self.name, self.address, self.io = spec, name, address, io
        self.connections = 0
        self.pairings = 0
        self.hellos = 0
        self.data_writes = 0
        self._transport: Any = None
        self.device: Any = None

    async def start(self) -> ImpostorWearable:
        from bumble import hci
        from bumble.core import UUID, AdvertisingData
        from bumble.device import Device
        from bumble.gatt import Characteristic, CharacteristicValue, Service
        from bumble.pairing import PairingConfig, PairingDelegate
        from bumble.transport import open_transport

        from coinf.ble_protocol import gatt

        self._transport = await open_transport(self.spec)
        device = Device.with_hci(self.name, hci.Address(self.address),
                                 self._transport.source, self._transport.sink)
        io = self.io if self.io is not None else PairingDelegate.IoCapability.NO_OUTPUT_NO_INPUT
        device.pairing_config_factory = lambda _c: PairingConfig(
            sc=True, mitm=False, bonding=True, delegate=PairingDelegate(io))
        props, perms = Characteristic.Properties, Characteristic.Permissions
        open_rw = perms.READABLE | perms.WRITEABLE

        def on_control(_conn: Any, value: bytes) -> None:
            if value[:1] == bytes([gatt.Ctrl.HELLO]):
                self.hellos += 1

        def on_data(_conn: Any, _value: bytes) -> None:
            self.data_writes += 1

        device.add_service(Service(gatt.SERVICE_UUID, [
            Characteristic(gatt.DATA_UP_UUID, props.NOTIFY | props.READ, open_rw, b""),
            Characteristic(gatt.DATA_DOWN_UUID, props.WRITE_WITHOUT_RESPONSE | props.WRITE,
                           open_rw, CharacteristicValue(write=on_data)),
            Characteristic(gatt.CONTROL_UUID, props.WRITE | props.NOTIFY | props.READ, open_rw,
                           CharacteristicValue(read=lambda _c: b"", write=on_control)),
        ]))

        def on_connection(connection: Any) -> None:
            self.connections += 1
            connection.on("pairing", lambda _keys: setattr(self, "pairings", self.pairings + 1))

        device.on("connection", on_connection)
        await device.power_on()
        self.device = device
        await device.start_advertising(
            auto_restart=True,
            advertising_data=bytes(AdvertisingData([
                (AdvertisingData.FLAGS, bytes([0x06])),
                (AdvertisingData.COMPLETE_LOCAL_NAME, self.name.encode()[:20])])),
            scan_response_data=bytes(AdvertisingData([
                (AdvertisingData.COMPLETE_LIST_OF_128_BIT_SERVICE_CLASS_UUIDS,
                 bytes(UUID(gatt.SERVICE_UUID).to_bytes()))])),
            advertising_interval_min=20, advertising_interval_max=20)
        return self

    async def close(self) -> None:
        if self.device is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.device.power_off(), 2.0)
        if self._transport is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._transport.close(), 2.0)

    async def __aenter__(self) -> ImpostorWearable:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# --- the scene: a wearable, a bonded handheld, one attacker --------------------------------


@contextlib.asynccontextmanager
async def _scene(preset: str, time_scale: float,
                 **options: Any) -> AsyncIterator[tuple[Any, Any, Any, Tally]]:
    """The radio, a wearable (window closed; ``options`` for its server) serving every link it
    accepts with one tensor, and a handheld host bonded to it; yields (radio, server, handheld
    host, tally)."""
    import secrets

    from coinf.ble_protocol.bleak_bumble import BumbleHost
    from coinf.ble_protocol.central import Central
    from coinf.ble_protocol.messages import MsgType
    from coinf.ble_protocol.peripheral import WearableServer
    from coinf.ble_protocol.radio import EmulatedRadio
    from coinf.ble_protocol.rpc import RpcClient

    passkey = secrets.randbelow(1_000_000)
    tally = Tally()
    async with EmulatedRadio(preset, time_scale=time_scale, extra_hosts=1) as radio:
        server = WearableServer(radio.specs[0], bundle_identity=IDENTITY, address=WEARABLE,
                                passkey=passkey, handshake_timeout=2.0, **options)
        await server.start()
        host = BumbleHost(radio.specs[1], address=HANDHELD, passkey=passkey)
        await host.open()

        async def serve_links() -> None:
            while True:
                with contextlib.suppress(Exception):
                    link = await server.accept()
                    peer = link.description.removeprefix("ble:").split("/")[0]
                    tally.served[peer] = tally.served.get(peer, 0) + 1
                    client = RpcClient(link)
                    try:  # one tensor per link; a reply is a result this wearable would take
                        with contextlib.suppress(Exception):
                            await client.request(MsgType.PROBE, bytes(512), timeout=3.0)
                            tally.accepted[peer] = tally.accepted.get(peer, 0) + 1
                    finally:
                        await client.close()

        try:
            server.open_pairing_window(30)  # the bond made beforehand, on purpose
            async with Central(WEARABLE, bundle_identity=IDENTITY, host=host,
                               timeout=10) as central:
                accept = asyncio.ensure_future(server.accept(30))
                await (await central.connect()).close()
                await (await accept).close()
            server.close_pairing_window()
            serving = asyncio.ensure_future(serve_links())
            try:
                yield radio, server, host, tally
            finally:
                serving.cancel()
                await asyncio.gather(serving, return_exceptions=True)
        finally:
            await host.close()
            await server.close()


async def _handheld_gets_through(host: Any, tally: Tally, target: str = "coinf-wearable",
                                 tries: int = 20) -> None:
    """The bonded handheld connects (by name: it must find the bonded identity) until served;
    the time its failed attempts took is ``tally.lockout_s``."""
    from coinf.ble_protocol.central import Central
    from coinf.errors import LinkError

    for _ in range(tries):
        t0 = time.monotonic()
        try:
            async with Central(target, bundle_identity=IDENTITY, host=host, timeout=5,
                               attempts=1) as central:
                link = await central.connect()
                peer = link.description.removeprefix("ble:").split("/")[0]
                if peer == ATTACKER:  # a link to the impostor: its results would be taken
                    tally.accepted[peer] = tally.accepted.get(peer, 0) + 1
                await asyncio.sleep(0.2)
                await link.close()
                if peer != ATTACKER:
                    return
        except LinkError:
            tally.lockout_s += time.monotonic() - t0
    raise RuntimeError(f"the bonded handheld did not get through in {tries} attempts")


def advertised(server: Any) -> Callable[[], str]:
    """The address ``server`` advertises from now (a resolvable private address once it holds
    a bond): what an attacker in range connects to, whatever it is called."""
    return lambda: str(server.device.random_address)


async def _attacking_central(radio: Any, tally: Tally, pairing: dict[str, Any] | None,
                             rounds: int, where: Callable[[], str]) -> tuple[int, int]:
    """An attacker central on the spare host: connect (to ``where()``), pair its way
    (``pairing``: the PairingConfig options; None: no pairing), subscribe, send a HELLO, and
    read; ``rounds`` times. Returns (tensor notifications it received, connections it
    made)."""
    from bleak import BleakClient
    from bumble.pairing import PairingConfig, PairingDelegate

    from coinf.ble_protocol import gatt
    from coinf.ble_protocol.bleak_bumble import BumbleBleakClient, BumbleHost
    from coinf.ble_protocol.messages import PROTOCOL_VERSION

    received = connected = 0

    def on_notify(_char: Any, value: bytearray) -> None:
        nonlocal received
        if value:
            received += 1

    async with BumbleHost(radio.spec("extra1"), address=ATTACKER) as host:
        if pairing is not None:
            io = pairing.pop("io", PairingDelegate.IoCapability.KEYBOARD_INPUT_ONLY)

            class Guess(PairingDelegate):
                async def get_number(self) -> int | None:
                    return 0  # a guess: it cannot know the passkey

            host.device.pairing_config_factory = lambda _c: PairingConfig(
                bonding=True, delegate=Guess(io), **pairing)
        for _ in range(rounds):
            client = BleakClient(where(), backend=BumbleBleakClient, host=host, pair=False,
                                 timeout=5)
            try:
                await client.connect()
                connected += 1
                if pairing is not None:
                    with contextlib.suppress(Exception):
                        await client._backend._connection.pair()  # type: ignore[attr-defined]
                for uuid in (gatt.CONTROL_UUID, gatt.DATA_UP_UUID):
                    with contextlib.suppress(Exception):
                        await client.start_notify(uuid, on_notify)
                    with contextlib.suppress(Exception):
                        if await client.read_gatt_char(uuid):
                            received += 1
                hello = gatt.make_hello(IDENTITY, 247, 8, 1 << 20, PROTOCOL_VERSION,
                                        "handheld")
                with contextlib.suppress(Exception):
                    await client.write_gatt_char(gatt.CONTROL_UUID,
                                                 gatt.ctrl_json(gatt.Ctrl.HELLO, hello),
                                                 response=True)
                await asyncio.sleep(0.5)
            except Exception:  # refused, throttled, dropped: that is the point
                pass
            finally:
                with contextlib.suppress(Exception):
                    await client.disconnect()
    return received, connected


def _row(name: str, tally: Tally, tensors: int, connections: int,
         peer: str = ATTACKER) -> dict[str, Any]:
    return {"attacker": name, "served": tally.served.get(peer, 0), "tensors_read": tensors,
            "results_accepted": tally.accepted.get(peer, 0),
            "lockout_s": round(tally.lockout_s, 3), "connections": connections}


async def _central_attack(name: str, pairing: dict[str, Any] | None, preset: str,
                          time_scale: float, rounds: int) -> dict[str, Any]:
    async with _scene(preset, time_scale) as (radio, server, host, tally):
        attack = asyncio.ensure_future(_attacking_central(radio, tally, pairing, rounds,
                                                          advertised(server)))
        await asyncio.sleep(0.3)  # the attacker holds a slot first
        await _handheld_gets_through(host, tally)
        tensors, connections = await attack
        return _row(name, tally, tensors, connections)


async def unpaired_central(preset: str = "ble5-2m", time_scale: float = 0.2,
                           rounds: int = 3) -> dict[str, Any]:
    """A central that never pairs: subscribes, reads and writes a HELLO in clear."""
    return await _central_attack("unpaired central", None, preset, time_scale, rounds)


async def legacy_central(preset: str = "ble5-2m", time_scale: float = 0.2,
                         rounds: int = 3) -> dict[str, Any]:
    """A central pairing with LE legacy pairing (passkey entry, a guessed passkey)."""
    return await _central_attack("legacy central", {"sc": False, "mitm": True}, preset,
                                 time_scale, rounds)


async def just_works_central(preset: str = "ble5-2m", time_scale: float = 0.2,
                             rounds: int = 3) -> dict[str, Any]:
    """A central claiming NoInputNoOutput (LE Secure Connections, Just Works)."""
    from bumble.pairing import PairingDelegate

    return await _central_attack(
        "just works central",
        {"sc": True, "mitm": False, "io": PairingDelegate.IoCapability.NO_OUTPUT_NO_INPUT},
        preset, time_scale, rounds)


async def impostor_wearable(preset: str = "ble5-2m", time_scale: float = 0.2,
                            rounds: int = 3) -> dict[str, Any]:
    """A device advertising the wearable's name and service with Just Works pairing, up while
    the bonded handheld reconnects by name ``rounds`` times."""
    async with _scene(preset, time_scale) as (radio, _server, host, tally), \
            ImpostorWearable(radio.spec("extra1")) as impostor:
        for _ in range(rounds):
            await _handheld_gets_through(host, tally)
        return {"attacker": "impostor wearable", "served": impostor.hellos,
                "tensors_read": impostor.data_writes,
                "results_accepted": tally.accepted.get(ATTACKER, 0),
                "lockout_s": round(tally.lockout_s, 3), "connections": impostor.connections}


#: name -> attacker (each an async function of (preset, time_scale, rounds) -> row)
ATTACKERS: dict[str, Callable[..., Awaitable[dict[str, Any]]]] = {
    "ble-unpaired-central": unpaired_central,
    "ble-legacy-central": legacy_central,
    "ble-just-works-central": just_works_central,
    "ble-impostor-wearable": impostor_wearable,
}


__all__ = ["ATTACKERS", "ImpostorWearable", "impostor_wearable", "just_works_central",
           "legacy_central", "unpaired_central"]
