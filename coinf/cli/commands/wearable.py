"""``coinf wearable``: run the wearable's GATT server on a real (or emulated) controller.

On a Pi Zero 2 W: ``sudo systemctl stop bluetooth`` then
``coinf wearable --bundle BUNDLE --hci hci-socket:0`` (see docs/PROTOCOL.md, "Pi setup").
Each handheld that connects, pairs and completes the handshake gets a link; the wearable then
sends PROBE messages (``--probe-bytes``) and prints the measured round trips as JSON lines.
The full offloading session (planner + head) is ``coinf run``/``Session``; this command is the
transport check for real hardware.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bundle",
        required=True,
        help="split bundle directory (its identity is checked in the handshake)",
    )
    parser.add_argument(
        "--hci",
        required=True,
        help="bumble HCI transport: hci-socket:0 (Pi, bluetoothd stopped), "
        "usb:0 (dongle), tcp-client:HOST:PORT (coinf radio)",
    )
    parser.add_argument("--name", default="coinf-wearable", help="advertised name")
    parser.add_argument("--keystore", default=None, help="JSON file keeping bonds across runs")
    parser.add_argument("--probe-bytes", type=int, default=10_000)
    parser.add_argument("--probes", type=int, default=5)
    parser.add_argument("--once", action="store_true", help="exit after the first handheld")
    parser.set_defaults(func=run)


def bundle_identity(path: str) -> str:
    from coinf.convert.bundle import Bundle

    return Bundle.load(path).identity


def run(args: argparse.Namespace) -> int:
    from coinf.ble_protocol.link import LinkClosed
    from coinf.ble_protocol.messages import MsgType, ProtocolError
    from coinf.ble_protocol.peripheral import WearableServer
    from coinf.ble_protocol.rpc import RpcClient

    identity = bundle_identity(args.bundle)

    async def main() -> None:
        async with WearableServer(args.hci, bundle_identity=identity, name=args.name,
                                  keystore=args.keystore) as server:
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
