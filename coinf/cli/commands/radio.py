"""``coinf radio``: host the emulated BLE radio; wearable and handheld processes attach to it.

Prints one ``SIDE=SPEC`` line per side on stdout (``wearable=tcp-client:127.0.0.1:PORT``,
``handheld=...``), then serves until interrupted. ``--wifi PRESET --to tcp:HOST:PORT`` emulates
a Wi-Fi link instead (:mod:`coinf.ble_protocol.wifi_air`): it prints ``wearable=tcp:...``, the
address the wearable dials.
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
    parser.add_argument("--wifi", metavar="PRESET",
                        help="emulate a Wi-Fi link instead (pi-zero-2w-wifi): a relay to --to "
                             "whose bytes cross the preset's air; prints wearable=SPEC")
    parser.add_argument("--to", type=argtypes.connect_address, metavar="tcp:HOST:PORT",
                        help="with --wifi: the handheld daemon's address (tcp: or tcp+insecure:)")
    parser.set_defaults(func=run)


async def _until_signal() -> None:
    """Return on SIGINT or SIGTERM (the emulated air serves until then)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def run_wifi(args: argparse.Namespace) -> int:
    """``coinf radio --wifi PRESET --to tcp:HOST:PORT``: the emulated Wi-Fi air."""
    from coinf.ble_protocol.wifi_air import WifiAir
    from coinf.ble_protocol.wifi_preset import WifiError, wifi_preset

    params = wifi_preset(args.wifi)
    if args.describe:
        print(json.dumps(params.describe(), indent=1))
        return 0
    scheme, _, rest = (args.to or "").partition(":")
    host, _, port = rest.rpartition(":")
    if scheme not in ("tcp", "tcp+insecure") or not host or not port.isdigit():
        raise WifiError(f"--wifi needs --to tcp:HOST:PORT (or tcp+insecure:HOST:PORT), the "
                        f"handheld daemon's address; got {args.to!r}")
    listen_host, _, listen_port = args.listen.rpartition(":")

    async def main() -> None:
        air = WifiAir(params.channel(), (host, int(port)), host=listen_host or "127.0.0.1",
                      port=int(listen_port) if listen_port.isdigit() else 0)
        await air.start()
        print(f"wearable={scheme}:{air.spec}", flush=True)
        print(f"wifi {params.name}: {params.throughput_bps / 1e6:g} MB/s, RTT "
              f"{params.rtt_ms:g} ms, jitter {params.jitter_ms:g} ms, loss {params.loss:g}",
              file=sys.stderr)
        await _until_signal()
        await air.stop()

    asyncio.run(main())
    return 0


def run(args: argparse.Namespace) -> int:
    from coinf.ble_protocol.radio import EmulatedRadio, RadioError, parse_overrides, preset

    if args.wifi:
        return run_wifi(args)
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
        await _until_signal()
        await radio.stop()

    asyncio.run(main())
    return 0
