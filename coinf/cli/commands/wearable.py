"""``coinf wearable``: run the wearable's GATT server on a real (or emulated) controller.

On a Pi Zero 2 W: ``sudo systemctl stop bluetooth`` then
``coinf wearable --bundle BUNDLE --hci hci-socket:0`` (see docs/PROTOCOL.md, "Pi setup").
Each handheld that connects, pairs and completes the handshake gets a link; the wearable then
sends PROBE messages (``--probe-bytes``) and prints the measured round trips as JSON lines.
The full offloading session (planner + head) is ``coinf run``/``Session``; this command is the
transport check for real hardware.

Only handhelds bonded by ``coinf wearable pair`` (LE Secure Connections, passkey) are served;
the bond store defaults to ``<config dir>/coinf/bonds/wearable.json`` (see
:mod:`coinf.cli.commands.pair`). A central that has not sent its HELLO within
``--handshake-timeout`` seconds is dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from coinf.cli import argtypes


def register(parser: argparse.ArgumentParser) -> None:
    from coinf.cli.commands import pair

    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    pair.register_wearable(actions.add_parser(
        "pair", help="open the pairing window and bond a handheld (passkey)",
        description="Open the pairing window; print the passkey a handheld must type."))
    for action, text in (("reload", "tell the running service to reload its bundle"),
                         ("status", "ask the running service what it serves")):
        sub = actions.add_parser(action, help=text, description=text)
        sub.add_argument("--control", default=None,
                         help="the service's control socket (default $COINF_CONTROL or "
                              "/run/coinf/control.sock)")
        sub.add_argument("--expect", metavar="IDENTITY",
                         help="fail unless the service then serves this bundle identity")
        sub.set_defaults(func=control, op=action)
    parser.add_argument(
        "--bundle",
        help="split bundle directory (its identity is checked in the handshake); required",
    )
    parser.add_argument(
        "--hci", type=argtypes.connect_address,
        help="bumble HCI transport: hci-socket:0 (Pi, bluetoothd stopped), "
        "usb:0 (dongle), tcp-client:HOST:PORT (coinf radio)",
    )
    parser.add_argument("--name", default="coinf-wearable", help="advertised name")
    parser.add_argument("--advertise-identity", action="store_true",
                        help="always advertise the static address, name and service UUID "
                        "(found by name after bonding, but trackable; default: once bonded, "
                        "a new resolvable private address each time, nothing else)")
    parser.add_argument("--keystore", default=None, help="bond store from `coinf wearable pair` "
                        "(default <config dir>/coinf/bonds/wearable.json)")
    parser.add_argument("--handshake-timeout", type=argtypes.seconds, default=5.0,
                        help="drop a central that has not sent its HELLO within this many "
                        "seconds (default %(default)g)")
    parser.add_argument("--probe-bytes", type=argtypes.integer(1, 1 << 24), default=10_000)
    parser.add_argument("--probes", type=argtypes.positive_int, default=5)
    parser.add_argument("--once", action="store_true", help="exit after the first handheld")
    parser.add_argument("--control", default=None, metavar="SOCKET",
                        help="listen for reload/status requests on this unix socket (the "
                             "systemd unit uses /run/coinf/control.sock; `coinf push` reloads)")
    parser.set_defaults(func=run)


def control(args: argparse.Namespace) -> int:
    """``coinf wearable reload|status``: one request to the running service; prints its reply."""
    from coinf.errors import UserError
    from coinf.wearable.control import ControlError, control_request, default_control_path

    reply = control_request(args.control or default_control_path(), {"op": args.op})
    print(json.dumps(reply), flush=True)
    if not reply.get("ok"):
        raise ControlError(f"the service refused {args.op}: {reply.get('error')}")
    if args.expect and reply.get("identity") != args.expect:
        raise UserError(f"the service serves bundle {reply.get('identity')}, expected "
                        f"{args.expect}")
    return 0


def bundle_identity(path: str) -> str:
    from coinf.bundle import Bundle

    return Bundle.load(path).identity


def run(args: argparse.Namespace) -> int:
    from coinf.ble_protocol.link import LinkClosed
    from coinf.ble_protocol.messages import MsgType, ProtocolError
    from coinf.ble_protocol.peripheral import WearableServer
    from coinf.ble_protocol.rpc import RpcClient
    from coinf.cli.commands.pair import default_bond_store
    from coinf.errors import UserError

    if not args.bundle or not args.hci:
        raise UserError("coinf wearable needs --bundle and --hci (or: coinf wearable pair --hci)")
    if not args.handshake_timeout > 0:
        raise UserError("--handshake-timeout must be > 0")
    if args.control:  # refused now, not after the radio is up
        from coinf.cli.paths import writable_file

        writable_file(args.control, "--control")
    from coinf.wearable.control import BundleHolder, start_control

    holder = BundleHolder(args.bundle)
    keystore = args.keystore or default_bond_store("wearable")

    async def main() -> None:
        async with WearableServer(args.hci, bundle_identity=holder.identity, name=args.name,
                                  keystore=keystore, private=not args.advertise_identity,
                                  handshake_timeout=args.handshake_timeout) as server:
            holder.on_change = lambda identity: setattr(server, "bundle_identity", identity)
            if args.control:
                await start_control(holder, args.control)
            while True:
                link = await server.accept()
                client = RpcClient(link)
                try:
                    for _ in range(args.probes):
                        t0 = time.monotonic()
                        await client.request(MsgType.PROBE, bytes(args.probe_bytes), timeout=60)
                        dt = time.monotonic() - t0
                        print(
                            json.dumps(
                                {
                                    "link": link.description,
                                    "probe_bytes": args.probe_bytes,
                                    "round_trip_s": round(dt, 4),
                                    "bps": round(2 * args.probe_bytes / dt, 1),
                                }
                            ),
                            flush=True,
                        )
                except (LinkClosed, ProtocolError) as exc:
                    print(json.dumps({"error": str(exc)}), flush=True)
                finally:
                    await client.close()
                if args.once:
                    return

    asyncio.run(main())
    return 0
