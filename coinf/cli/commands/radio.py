"""``coinf radio``: host the emulated BLE radio; wearable and handheld processes attach to it.

Prints one ``SIDE=SPEC`` line per side on stdout (``wearable=tcp-client:127.0.0.1:PORT``,
``handheld=...``), then serves until interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

from coinf.cli import argtypes


def register(parser: argparse.ArgumentParser) -> None:
    from coinf.ble_protocol.radio import PRESETS

    parser.add_argument("--preset", default="pi-zero-2w", choices=sorted(PRESETS))
    parser.add_argument(
        "--listen",
        default="127.0.0.1:0",
        type=argtypes.host_port_pair,
        help="HOST:PORT for the wearable's controller; the handheld's is PORT+1 "
        "(PORT 0 = pick free ports). Default 127.0.0.1:0",
    )
    parser.add_argument(
        "--set",
        action="append",
        metavar="FIELD=VALUE",
        help="override a radio parameter, e.g. --set interval_ms=15",
    )
    parser.add_argument(
        "--describe", action="store_true", help="print the parameters and capacity as JSON and exit"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from coinf.ble_protocol.radio import EmulatedRadio, RadioError, parse_overrides, preset

    params = preset(args.preset, **parse_overrides(args.set))
    if args.describe:
        print(json.dumps(params.describe(), indent=1))
        return 0
    host, _, port_text = args.listen.rpartition(":")
    if not host or not port_text.isdigit():
        raise RadioError(f"bad --listen {args.listen!r}: expected HOST:PORT")
    port = int(port_text)
    ports = (port, port + 1) if port else (0, 0)

    async def main() -> None:
        radio = EmulatedRadio(params, host=host, ports=ports)
        await radio.start()
        wearable, handheld = radio.specs
        print(f"wearable={wearable}\nhandheld={handheld}", flush=True)
        print(f"radio {params.name}: capacity {params.capacity_bps():.0f} B/s", file=sys.stderr)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await radio.stop()

    asyncio.run(main())
    return 0
