"""``coinf handheld``: the handheld daemon. Serves tails for one bundle until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from typing import Any

from coinf.ble_protocol.loopback import parse_address, serve_socket
from coinf.convert.bundle import Bundle


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bundle", required=True, help="bundle directory (from `coinf split`)")
    parser.add_argument("--transport", default="socket", choices=["socket", "ble"],
                        help="socket: listen for wearables; ble: connect to the wearable over BLE")
    parser.add_argument("--wearable", default="coinf-wearable",
                        help="--transport ble: name or address of the wearable")
    parser.add_argument("--hci", help="--transport ble: use a bumble host on this HCI transport "
                        "(tcp-client:HOST:PORT of coinf radio) instead of the OS Bluetooth stack")
    parser.add_argument(
        "--listen",
        default="tcp:127.0.0.1:7878",
        help="where wearables connect: unix:/path/to.sock or tcp:HOST:PORT (default %(default)s)",
    )
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime threads (0 = auto)")
    parser.add_argument("--slowdown", type=float, default=1.0, help="emulate a K x slower device")
    parser.add_argument("--lru", type=int, default=4, help="tail sessions kept loaded")
    parser.add_argument("--profile", help="device profile sent to wearables "
                        "(default: the saved handheld profile, else built-in laptop defaults)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log each connection")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from coinf.device.emulation import DeviceEmulation
    from coinf.errors import UserError
    from coinf.handheld.daemon import HandheldDaemon

    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s handheld %(message)s",
        stream=sys.stderr,
    )
    if not args.verbose:  # bumble logs tracebacks for expected teardown (peer gone, radio off)
        logging.getLogger("bumble").setLevel(logging.CRITICAL)
    try:
        kind, target = parse_address(args.listen)
        emulation = DeviceEmulation(args.slowdown, args.threads)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    bundle = Bundle.load(args.bundle)
    from coinf.device.profile import load_or_default

    profile = load_or_default("handheld", args.profile)
    daemon = HandheldDaemon(bundle, emulation, lru=args.lru, profile=profile)

    if args.transport == "ble":
        return run_ble(args, bundle, daemon)

    async def main() -> None:
        if kind == "unix":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(str(target))
        try:
            server = await serve_socket(args.listen, daemon.serve)
        except OSError as exc:
            raise UserError(f"cannot listen on {args.listen}: {exc.strerror or exc}") from None
        stop = ready(bundle, f"on {args.listen}")
        async with server:
            await stop.wait()

    asyncio.run(main())
    return 0


def ready(bundle: Bundle, where: str) -> asyncio.Event:
    """Stop on SIGINT/SIGTERM; print the ready line (the demo and tests wait for it)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    print(f"coinf handheld: serving {len(bundle.candidates)} candidates of {bundle.model_file} "
          f"({bundle.identity}) {where}", flush=True)
    return stop


def run_ble(args: argparse.Namespace, bundle: Bundle, daemon: Any) -> int:
    """Connect to the wearable (GATT central via bleak), serve, reconnect with backoff."""
    from coinf.handheld.ble_central import serve_with_reconnect

    opts: dict[str, Any] = {}
    if args.hci:
        from coinf.ble_protocol.bleak_bumble import BumbleBleakClient

        opts.update(backend=BumbleBleakClient, hci=args.hci)

    async def main() -> None:
        stop = ready(bundle, f"to BLE wearable {args.wearable!r}")
        task = asyncio.ensure_future(serve_with_reconnect(
            args.wearable, daemon.handle, bundle_identity=bundle.identity, stop=stop, **opts))
        waiter = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        for t in (task, waiter):
            t.cancel()
        if task in done and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
        if args.hci:
            from coinf.ble_protocol.bleak_bumble import close_devices

            await close_devices()

    asyncio.run(main())
    return 0
