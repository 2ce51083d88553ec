"""``coinf wearable pair`` and ``coinf handheld pair``: bond a handheld with a wearable.

LE Secure Connections with passkey entry (docs/PROTOCOL.md, "Pairing and security"):

* on the wearable (the Pi): ``coinf wearable pair --hci hci-socket:0 [--window-s 120]`` opens the
  pairing window, prints the 6-digit passkey when a handheld starts pairing, and exits 0 once a
  handheld is bonded (1 if none paired before the window closed);
* on the laptop: ``coinf handheld pair [--wearable NAME]`` connects and pairs; the passkey is
  typed at the prompt (on a terminal; otherwise one line of stdin when the wearable asks), or
  comes from ``--passkey-file F`` (0600) / ``--passkey-stdin`` (scripts). With ``--hci`` (a bumble
  host: a USB dongle or the emulated radio) coinf asks for it; on the OS stack the system's
  Bluetooth agent does. A passkey is never an argument (``--passkey N`` is refused, exit 2).

A failed pairing ends in one line and exit code 4 (:class:`~coinf.errors.PairingError`: wrong
passkey, window closed, an impostor...). The pairing-only server answers a bonded handheld's
HELLO with ERROR BUSY ("pairing only"): the handheld retries once ``coinf wearable`` serves.

Both sides keep the bond in a private bond store (``--keystore``; 0600 file, 0700 directory);
default ``<config dir>/coinf/bonds/{wearable,handheld}.json``, the default of ``coinf wearable``,
``coinf handheld --hci`` and ``coinf run --transport ble`` too. ``coinf bonds`` lists and revokes
them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from pathlib import Path
from typing import Any

from coinf.cli import argtypes
from coinf.cli.passkey import add_passkey_options, given_passkey, parse_passkey, prompt_passkey
from coinf.errors import LinkError, PairingError, UserError

DEFAULT_WINDOW_S = 120.0


def default_bond_store(role: str) -> str:
    """``<config dir>/coinf/bonds/<role>.json`` (the config dir of ``coinf policy``)."""
    from coinf.device.config import config_path

    return str(Path(config_path()).parent / "bonds" / f"{role}.json")


# --- the wearable --------------------------------------------------------------------------------


def register_wearable(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hci", required=True, type=argtypes.connect_address,
                        help="bumble HCI transport: hci-socket:0 (Pi, bluetoothd stopped), "
                        "usb:0 (dongle), tcp-client:HOST:PORT (coinf radio)")
    parser.add_argument("--name", default="coinf-wearable", help="advertised name")
    parser.add_argument("--keystore", default=None,
                        help="bond store (default <config dir>/coinf/bonds/wearable.json)")
    parser.add_argument("--window-s", type=argtypes.seconds, default=DEFAULT_WINDOW_S,
                        help="how long new bonds are accepted (default %(default)g s)")
    add_passkey_options(parser, "a fixed passkey instead of a fresh random one (scripts, "
                        "emulated radio only: a fixed passkey is weaker)")
    parser.set_defaults(func=run_wearable)


def run_wearable(args: argparse.Namespace) -> int:
    from coinf.ble_protocol.link import LinkClosed
    from coinf.ble_protocol.peripheral import WearableServer

    if not args.window_s > 0:
        raise UserError("--window-s must be > 0")
    passkey = given_passkey(args)
    keystore = args.keystore or default_bond_store("wearable")
    logging.getLogger("bumble").setLevel(logging.CRITICAL)

    def show(address: str, passkey: int) -> None:
        print(f"coinf wearable: passkey for {address}: {passkey:06d}", flush=True)

    async def main() -> int:
        server = WearableServer(args.hci, bundle_identity="", name=args.name, keystore=keystore,
                                passkey=passkey, pairing_window_s=args.window_s,
                                display_passkey=show, pairing_only=True)
        try:
            await server.start()
            print(f"coinf wearable: pairing window open for {args.window_s:g} s as "
                  f"{args.name!r} ({server.address}); on the handheld run `coinf handheld pair`",
                  flush=True)
            try:
                address = await asyncio.wait_for(server.bonded.get(), args.window_s)
            except TimeoutError:
                print(f"coinf wearable: no handheld paired within {args.window_s:g} s",
                      file=sys.stderr, flush=True)
                return 1
            print(f"coinf wearable: bonded with {address} (bond store {keystore})", flush=True)
            await asyncio.sleep(0.5)  # let the handheld finish and disconnect
            return 0
        except LinkClosed as exc:
            raise LinkError(str(exc)) from None
        finally:
            await server.close()

    return asyncio.run(main())


# --- the handheld --------------------------------------------------------------------------------


def register_handheld(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wearable", default="coinf-wearable",
                        help="name or address of the wearable (default %(default)s)")
    parser.add_argument("--hci", type=argtypes.connect_address,
                        help="pair through a bumble host on this HCI transport "
                        "(usb:0, tcp-client:HOST:PORT of coinf radio) instead of the OS stack")
    parser.add_argument("--keystore", default=None, help="with --hci: bond store (default "
                        "<config dir>/coinf/bonds/handheld.json)")
    add_passkey_options(parser, "with --hci, instead of the prompt")
    parser.add_argument("--timeout", type=argtypes.seconds, default=60.0,
                        help="seconds to find the wearable and pair (default %(default)g)")
    parser.set_defaults(func=run_handheld)


async def _ask_passkey() -> int | None:
    """The passkey typed when the wearable asks: the prompt on a terminal, else one line of
    stdin (a script answering the prompt)."""
    if sys.stdin.isatty():
        return await prompt_passkey()
    line = await asyncio.to_thread(sys.stdin.readline)
    try:
        return parse_passkey(line, "stdin")
    except UserError:
        return None


def run_handheld(args: argparse.Namespace) -> int:
    from bleak import BleakClient
    from bleak.exc import BleakError

    from coinf.ble_protocol.link import LinkClosed

    if args.hci is None and (args.passkey_file or args.passkey_stdin or args.keystore):
        raise UserError("--passkey-file, --passkey-stdin and --keystore need --hci (on the OS "
                        "stack its Bluetooth agent asks for the passkey and keeps the bond)")
    passkey = given_passkey(args)
    logging.getLogger("bumble").setLevel(logging.CRITICAL)

    async def main() -> int:
        from coinf.ble_protocol.central import _MAC, _find

        if args.hci is not None:
            from coinf.ble_protocol.bleak_bumble import (
                BumbleBleakClient,
                BumbleBleakScanner,
                BumbleHost,
            )

            keystore = args.keystore or default_bond_store("handheld")
            host = BumbleHost(args.hci, keystore=keystore,
                              passkey=passkey if passkey is not None else _ask_passkey)
            try:
                await host.open()
            except BleakError as exc:
                raise LinkError(str(exc)) from None
            backend, scanner = BumbleBleakClient, BumbleBleakScanner
            kwargs: dict[str, Any] = {"host": host}
            where = f"bond store {keystore}"
        else:
            host, backend, scanner, kwargs = None, None, None, {}
            where = "the OS Bluetooth stack"
            print("coinf handheld: the system's Bluetooth agent will ask for the passkey",
                  flush=True)
        try:
            target = args.wearable
            if not _MAC.match(target):
                target = await _find(target, scanner, args.timeout, kwargs)
            client = BleakClient(target, backend=backend, timeout=args.timeout, **kwargs)
            try:
                from coinf.ble_protocol import gatt

                await client.connect()
                control = client.services.get_characteristic(gatt.CONTROL_UUID)
                if control is None:
                    raise LinkError(f"{args.wearable} has no coinf service") from None
                with contextlib.suppress(NotImplementedError):  # CoreBluetooth pairs on the read
                    await client.pair()  # the bumble backend: encrypt with the bond, else pair
                # one encrypted round trip before hanging up: our last key distribution PDUs
                # go ahead of it on the link, so the wearable has them all (hanging up at once
                # lost them now and then, and the wearable never completed its bond)
                await client.read_gatt_char(control)
            except BleakError as exc:
                from coinf.ble_protocol.bleak_errors import pairing_failure

                reason = pairing_failure(exc)
                if reason is not None:
                    raise PairingError(reason, str(exc), peer=str(getattr(exc, "peer", "")) or
                                       None, smp_code=getattr(exc, "smp_code", None)) from None
                raise LinkError(f"pairing with {args.wearable} failed: {exc}") from None
            finally:
                await client.disconnect()
            print(f"coinf handheld: paired with {args.wearable} ({where})", flush=True)
            return 0
        except LinkClosed as exc:
            raise LinkError(str(exc)) from None
        finally:
            if host is not None:
                await host.close()

    return asyncio.run(main())
