"""``coinf handheld``: the handheld daemon. Serves tails for one bundle until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys

from ble_protocol.loopback import parse_address, serve_socket
from convert.bundle import Bundle


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bundle", required=True, help="bundle directory (from `coinf split`)")
    parser.add_argument(
        "--listen",
        default="tcp:127.0.0.1:7878",
        help="where wearables connect: unix:/path/to.sock or tcp:HOST:PORT (default %(default)s)",
    )
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime threads (0 = auto)")
    parser.add_argument("--slowdown", type=float, default=1.0, help="emulate a K x slower device")
    parser.add_argument("--lru", type=int, default=4, help="tail sessions kept loaded")
    parser.add_argument("-v", "--verbose", action="store_true", help="log each connection")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from coinf.errors import CoinfError
    from handheld.daemon import HandheldDaemon
    from wearable.emulation import DeviceEmulation

    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s handheld %(message)s",
        stream=sys.stderr,
    )
    try:
        kind, target = parse_address(args.listen)
        emulation = DeviceEmulation(args.slowdown, args.threads)
    except ValueError as exc:
        raise CoinfError(str(exc)) from None
    bundle = Bundle.load(args.bundle)
    daemon = HandheldDaemon(bundle, emulation, lru=args.lru)

    async def main() -> None:
        if kind == "unix":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(str(target))
        try:
            server = await serve_socket(args.listen, daemon.serve)
        except OSError as exc:
            raise CoinfError(f"cannot listen on {args.listen}: {exc.strerror or exc}") from None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        print(
            f"coinf handheld: serving {len(bundle.candidates)} candidates of "
            f"{bundle.model_file} ({bundle.identity}) on {args.listen}",
            flush=True,
        )
        async with server:
            await stop.wait()

    asyncio.run(main())
    return 0
