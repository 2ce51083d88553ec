"""``bench attack``'s pairing attackers on BLE (issue 52): strangers during the pairing window,
and a tracker.

Each runs on its own emulated radio (bumble's real SMP, ATT and GATT) against the wearable side
of a Session's ``ble:HCI`` transport (:class:`~coinf.ble_protocol.ble_transport.
PeripheralConnector`, waiting for its first handheld with the pairing window open). A new
handheld (no bond yet) pairs during the attack, its person typing the passkey
:data:`TYPING_S` after it is asked. Time-outs are the library's defaults but two, shortened so
that a run takes seconds: the window lasts :data:`WINDOW_S` and a pairing :data:`PAIRING_S`.

* ``ble_rotating_flood``: attacker radios (``--radios``, default 1; each holds one connection
  to the wearable at a time) connecting again and again, each time from a new random address,
  alternately idling (never pairing) and starting a pairing they never finish;
* ``ble_failed_pairing_injection``: the same, each connection pairing with a guessed passkey
  (a failed pairing, as many as they can during the window);
* ``ble_tracking``: a passive scanner while a bonded handheld reconnects :data:`PERIODS` times
  (the wearable advertises again after each): how many advertisements carry an identifier seen
  in another advertising period (address, name, service UUID).

Per attacker: ``served`` (links the wearable made with the attacker), ``tensors_read``
(notifications it received), ``results_accepted`` (its links a wearable took),
``lockout_s`` (time the user's failed attempts took before it got through), and
``pair_s`` (from the user's first attempt to its served link: the goal is within one window).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from coinf.cli.bench.attack_arena import Arena, Outcome, attacker
from coinf.cli.bench.attack_ble import IDENTITY, WEARABLE, advertised

USER = "C0:F1:00:00:00:07"  # the new handheld that pairs during the attack
WINDOW_S = 30.0  # the pairing window of these runs (coinf run's default is 120 s)
PAIRING_S = 6.0  # pairing_timeout of these runs (default 30 s: a person types)
TYPING_S = 1.0  # the person reads and types the passkey
PERIODS = 4  # advertising periods the tracker watches
HEAD_START_S = 8.0  # the stranger attacks that long before the user starts to pair


@dataclass
class Stranger:
    """What an attacking central did and got."""

    connections: int = 0
    addresses: set[str] = field(default_factory=set)
    notifications: int = 0
    pairings: int = 0


async def _new_address(device: Any) -> str:
    """Give ``device`` a fresh random static address (what a stranger can do at will)."""
    from bumble import hci

    address = hci.Address.generate_static_address()
    await device.send_sync_command(hci.HCI_LE_Set_Random_Address_Command(random_address=address))
    device.random_address = device.static_address = address
    return str(address)


async def _stranger(spec: str, where: Callable[[], str], mode: str, stop: asyncio.Event,
                    got: Stranger) -> None:
    """Connect from a new address each time until ``stop``; ``mode``: ``"flood"`` (idle, then
    a stalled pairing, alternately) or ``"wrong"`` (a pairing with a guessed passkey)."""
    from bumble.pairing import PairingConfig, PairingDelegate

    from coinf.ble_protocol.bleak_bumble import BumbleHost

    class Typist(PairingDelegate):
        stall = False

        async def get_number(self) -> int | None:
            if Typist.stall:
                await asyncio.Event().wait()  # never types
            return secrets.randbelow(1_000_000)  # a guess

    def on_notify(_char: Any, value: bytearray) -> None:
        got.notifications += bool(value)

    async with BumbleHost(spec, address="C0:F1:00:00:00:66") as host:
        host.device.pairing_config_factory = lambda _c: PairingConfig(
            sc=True, mitm=True, bonding=True,
            delegate=Typist(PairingDelegate.IoCapability.KEYBOARD_INPUT_ONLY))
        while not stop.is_set():
            got.addresses.add(await _new_address(host.device))
            pair = mode == "wrong" or got.connections % 2 == 1
            Typist.stall = mode == "flood"
            # bumble aborts a pairing on disconnection by cancelling it: in a task of its own,
            # that ends the attempt, not this loop
            attempt = asyncio.ensure_future(_one_connection(host, where(), pair, got, on_notify))
            await asyncio.wait({attempt})
            if attempt.cancelled() or attempt.exception() is not None:
                await asyncio.sleep(0.05)  # refused, dropped, not reachable: again


async def _one_connection(host: Any, address: str, pair: bool, got: Stranger,
                          on_notify: Callable[[Any, bytearray], None]) -> None:
    """Connect to ``address``, pair (``pair``) and subscribe; return once dropped."""
    from bleak import BleakClient

    from coinf.ble_protocol import gatt
    from coinf.ble_protocol.bleak_bumble import BumbleBleakClient

    gone = asyncio.Event()
    client = BleakClient(address, backend=BumbleBleakClient, host=host, pair=False,
                         timeout=3, disconnected_callback=lambda _c: gone.set())
    try:
        await client.connect()
        got.connections += 1
        if pair:
            got.pairings += 1
            pairing = asyncio.ensure_future(client._backend._connection.pair())  # type: ignore[attr-defined]
            await asyncio.wait({pairing})
            if not pairing.cancelled():
                pairing.exception()  # retrieved: a failed pairing is the expected outcome
        for uuid in (gatt.CONTROL_UUID, gatt.DATA_UP_UUID):
            with contextlib.suppress(Exception):
                await client.start_notify(uuid, on_notify)
        with contextlib.suppress(TimeoutError):  # until the wearable drops it
            await asyncio.wait_for(gone.wait(), 4 * PAIRING_S)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.disconnect(), 3.0)


async def _user_pairs(spec: str, passkey: int) -> tuple[Any, float, float]:
    """The new handheld pairs (by name, as `coinf handheld pair` does) until served, for at
    most a window: (link or None, seconds to it, seconds its failed attempts took)."""
    from coinf.ble_protocol.bleak_bumble import BumbleHost
    from coinf.ble_protocol.central import Central
    from coinf.errors import LinkError

    async def typed() -> int:
        await asyncio.sleep(TYPING_S)
        return passkey

    t0, failing = time.monotonic(), 0.0
    host = BumbleHost(spec, address=USER, passkey=typed)
    await host.open()
    try:
        while time.monotonic() - t0 < WINDOW_S:
            t1 = time.monotonic()
            try:
                async with Central("coinf-wearable", bundle_identity=IDENTITY, host=host,
                                   timeout=5, attempts=1) as central:
                    link = await central.connect()
                    return link, time.monotonic() - t0, failing
            except LinkError:
                failing += time.monotonic() - t1
        return None, time.monotonic() - t0, failing
    finally:
        await host.close()


async def window_attack(name: str, mode: str, head_start: float = HEAD_START_S,
                        time_scale: float = 0.2, radios: int = 1) -> Outcome:
    """The wearable waits for its first handheld, window open; a stranger with ``radios``
    radios attacks (``mode``: ``"flood"`` or ``"wrong"``), from ``head_start`` s before the
    user starts to pair. ``pair_s`` is None if the user did not pair within the window."""
    from coinf.ble_protocol.ble_transport import PeripheralConnector
    from coinf.ble_protocol.radio import EmulatedRadio

    passkey = secrets.randbelow(1_000_000)
    got, stop = Stranger(), asyncio.Event()
    async with EmulatedRadio("ble5-2m", time_scale=time_scale, extra_hosts=radios) as radio:
        connector = PeripheralConnector(radio.specs[0], bundle_identity=IDENTITY,
                                        address=WEARABLE, passkey=passkey,
                                        pairing_window_s=WINDOW_S, pairing_timeout=PAIRING_S)
        wait = asyncio.ensure_future(connector.connect(WINDOW_S + 10))
        try:
            while connector.server.device is None:
                await asyncio.sleep(0.02)
            attack = asyncio.gather(*(
                _stranger(radio.spec(f"extra{i + 1}"), advertised(connector.server), mode, stop,
                          got) for i in range(radios)))
            await asyncio.sleep(head_start)  # the stranger is at it first
            link, pair_s, failing = await _user_pairs(radio.specs[1], passkey)
            theirs = 0
            if link is not None:
                served = await wait  # a PairingError here would be the attack ending the run
                peer = served.description.removeprefix("ble:").split("/")[0]
                theirs = int(peer in got.addresses)
                await link.close()
                await served.close()
            stop.set()
            await asyncio.wait_for(attack, 4 * PAIRING_S + 10)
            stats = connector.server.window_stats.as_dict()
        finally:
            stop.set()
            wait.cancel()
            await asyncio.gather(wait, return_exceptions=True)
            await connector.aclose()
    return Outcome(served=theirs, tensors_read=got.notifications, results_accepted=theirs,
                   lockout_s=round(failing, 3),
                   detail={"pair_s": round(pair_s, 3) if link is not None else None,
                           "radios": radios, "window_s": WINDOW_S,
                           "pairing_timeout_s": PAIRING_S, "connections": got.connections,
                           "addresses": len(got.addresses), "pairings": got.pairings,
                           "wearable_saw": stats, "name": name})


@attacker("ble_rotating_flood", "ble", "during the pairing window, a stranger (--radios) "
          "connecting from a new random address each time, idling or stalling its pairings; a "
          "new handheld pairs")
async def ble_rotating_flood(arena: Arena) -> Outcome:
    return await window_attack("rotating flood", "flood", radios=arena.radios)


@attacker("ble_failed_pairing_injection", "ble", "during the pairing window, a stranger "
          "(--radios) failing pairings (guessed passkeys, a new address each); a new handheld "
          "pairs")
async def ble_failed_pairing_injection(arena: Arena) -> Outcome:
    return await window_attack("failed pairing injection", "wrong", radios=arena.radios)


class Tracker:
    """A passive scanner: the identifiers each advertising period showed."""

    def __init__(self) -> None:
        self.periods: list[list[tuple[str, str | None, bool]]] = [[]]

    def on_advertisement(self, adv: Any) -> None:
        from bumble.core import UUID, AdvertisingData

        from coinf.ble_protocol import gatt

        name = adv.data.get(AdvertisingData.COMPLETE_LOCAL_NAME)
        uuids = adv.data.get(AdvertisingData.COMPLETE_LIST_OF_128_BIT_SERVICE_CLASS_UUIDS) or []
        has_uuid = any(u == UUID(gatt.SERVICE_UUID) for u in uuids)
        self.periods[-1].append((str(adv.address), name if isinstance(name, str) else None,
                                 has_uuid))

    def next_period(self) -> None:
        self.periods.append([])

    def figures(self) -> dict[str, int]:
        """Advertisements, and those carrying an identifier another period showed too."""
        periods = [p for p in self.periods if p]
        seen: dict[str, set[int]] = {}
        for i, period in enumerate(periods):
            for address, name, uuid in period:
                for key in (f"a:{address}", f"n:{name}" if name else "", "u" if uuid else ""):
                    if key:
                        seen.setdefault(key, set()).add(i)
        stable = {k for k, where in seen.items() if len(where) > 1}
        counts = {"address": 0, "name": 0, "uuid": 0, "any": 0}
        for period in periods:
            for address, name, uuid in period:
                hits = {"address": f"a:{address}" in stable,
                        "name": bool(name) and f"n:{name}" in stable, "uuid": uuid}
                for k, hit in hits.items():
                    counts[k] += hit
                counts["any"] += any(hits.values())
        return {"periods": len(periods), "advertisements": sum(len(p) for p in periods),
                "addresses": len({a for p in periods for a, _, _ in p}),
                **{f"stable_{k}": v for k, v in counts.items()}}


@attacker("ble_tracking", "ble", "a passive scanner while a bonded handheld reconnects "
          f"{PERIODS} times: advertisements carrying an identifier another period showed")
async def ble_tracking(arena: Arena | None = None, private: bool = True) -> Outcome:
    """``private=False``: the wearable as it was (static address, name and UUID always)."""
    from coinf.cli.bench.attack_ble import _handheld_gets_through, _scene

    tracker = Tracker()
    async with _scene("ble5-2m", 0.2, private=private) as (radio, _server, host, tally):
        from coinf.ble_protocol.bleak_bumble import BumbleHost

        async with BumbleHost(radio.spec("extra1"), address="C0:F1:00:00:00:77") as scanner:
            scanner.device.on("advertisement", tracker.on_advertisement)
            await scanner.device.start_scanning(active=True, filter_duplicates=False)
            for _ in range(PERIODS):
                await asyncio.sleep(0.5)  # the tracker hears this period's advertisements
                await _handheld_gets_through(host, tally)
                tracker.next_period()
    return Outcome(lockout_s=round(tally.lockout_s, 3),
                   detail={**tracker.figures(), "private": private})


__all__ = ["Tracker", "ble_failed_pairing_injection", "ble_rotating_flood", "ble_tracking",
           "window_attack"]
