"""``bench attack``'s Wi-Fi pairing attacker (issue 52): holding the responder of ``coinf wifi
pair --listen`` (docs/PROTOCOL.md §15.3) so that the user cannot pair.

``wifi_pair_hold``: from three addresses (127.0.0.2-4), connections opened as fast as the
responder takes them, rotating three ways of holding it: silence (no START), half a START
frame, and a malformed START. A device with the code pairs meanwhile (``coinf wifi pair
--connect``, :func:`~coinf.ble_protocol.wifi_pair.pair_with`).

``served``: REPLY frames the attacker got (each would be an attempt it could guess in);
``tensors_read``: 0 by construction (pairing carries none) -- what it could read is the
responder's certificate, public; ``results_accepted``: 1 if the responder pinned the attacker;
``lockout_s``: the time the user's failed attempts took; ``pair_s``: from the user's first
attempt to its pinned peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time

from coinf.cli.bench.attack_arena import Arena, Outcome, attacker

SOURCES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
WINDOW_S = 30.0
#: s the attacker holds the responder before the user tries (beyond one START deadline)
HEAD_START_S = 6.0


async def _hold(address: str, stop: asyncio.Event, counts: dict[str, int]) -> None:
    """Open connections to the pairing window at ``address`` until ``stop``."""
    from coinf.ble_protocol.wifi_pair import REPLY, START

    host, port = address.split(":")[1:]
    held: list[asyncio.StreamWriter] = []
    n = 0
    try:
        while not stop.is_set():
            src, how = SOURCES[n % len(SOURCES)], ("silent", "half", "malformed")[n % 3]
            n += 1
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(
                    host, int(port), local_addr=(src, 0)), 2.0)
            except (OSError, TimeoutError):
                await asyncio.sleep(0.01)
                continue
            counts["connections"] += 1
            if how == "half":
                writer.write(struct.pack("<BH", START, 600) + bytes(100))
            elif how == "malformed":
                writer.write(struct.pack("<BH", START, 4) + b"\x01\xff\x00\x00")
            held.append(writer)
            if len(held) > 64:
                old = held.pop(0)
                old.close()
            with contextlib.suppress(Exception):
                first = await asyncio.wait_for(reader.read(3), 0.01)
                counts["replies"] += first[:1] == bytes([REPLY])
            await asyncio.sleep(0)
    finally:
        for writer in held:
            writer.close()


@attacker("wifi_pair_hold", "tcp", "connections holding the Wi-Fi pairing responder (silent, "
          "half a START, malformed STARTs) from three addresses; a device with the code pairs")
async def wifi_pair_hold(arena: Arena, head_start: float = HEAD_START_S) -> Outcome:
    from coinf.ble_protocol.wifi_pair import PairingWindow, pair_with
    from coinf.errors import PairingError

    helper, user = arena.store("pair-helper"), arena.store("pair-user")
    counts = {"connections": 0, "replies": 0}
    stop = asyncio.Event()
    async with PairingWindow(helper, "tcp:127.0.0.1:0", window_s=WINDOW_S) as window:
        attack = asyncio.ensure_future(_hold(window.address, stop, counts))
        await asyncio.sleep(head_start)  # the attacker is at it first
        t0, failing, entry = time.monotonic(), 0.0, None
        while entry is None and time.monotonic() - t0 < WINDOW_S:
            t1 = time.monotonic()
            try:
                entry = await pair_with(window.address, window.code, user)
            except PairingError:
                failing += time.monotonic() - t1
        pair_s = time.monotonic() - t0
        pinned = await asyncio.wait_for(window.wait(), 5.0) if entry is not None else None
        stop.set()
        await attack
        seen = window.counts.as_dict()
    theirs = int(pinned is not None and pinned.fingerprint != user.fingerprint)
    return Outcome(served=counts["replies"], tensors_read=0, results_accepted=theirs,
                   lockout_s=round(failing, 3),
                   detail={"pair_s": round(pair_s, 3) if entry is not None else None,
                           "window_s": WINDOW_S, "connections": counts["connections"],
                           "responder_saw": seen})


__all__ = ["wifi_pair_hold"]
