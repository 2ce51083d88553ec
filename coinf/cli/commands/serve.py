"""``coinf serve BUNDLE...``: the tail service for many wearables (docs/DEPLOY.md, "A tail
service for many wearables"). Same protocol and TLS pairing as ``coinf handheld``; frames of
all wearables are batched and run on an engine (Ray Serve, or this process)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from pathlib import Path
from typing import Any

from coinf.cli import argtypes

DEFAULT_LISTEN = "tcp:127.0.0.1:7979"


def replicas(text: str) -> tuple[int, int]:
    """``N`` or ``MIN:MAX`` replicas (1..64)."""
    lo, _, hi = text.partition(":")
    try:
        a, b = int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or MIN:MAX, got {text!r}") from None
    if not 1 <= a <= b <= 64:
        raise argparse.ArgumentTypeError(f"must satisfy 1 <= MIN <= MAX <= 64, got {text!r}")
    return a, b


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundles", nargs="+", metavar="BUNDLE",
                        help="bundle directories (from `coinf split`); a wearable's HELLO "
                        "picks one by its identity")
    parser.add_argument("--listen", type=argtypes.listen_address, default=DEFAULT_LISTEN,
                        help="tcp:HOST:PORT (TLS, paired devices only) or unix:/path; default "
                        "%(default)s. tcp+insecure:HOST:PORT (plain) needs --insecure-plaintext")
    argtypes.add_insecure_flag(parser)
    parser.add_argument("--engine", default="ray", metavar="SPEC",
                        help="where batches run: ray (Ray Serve started here; the serve extra), "
                        "ray:ADDRESS (a running Ray cluster, e.g. ray:auto), local or local:N "
                        "(N threads in this process); default %(default)s")
    parser.add_argument("--replicas", type=replicas, default=(1, 2), metavar="MIN:MAX",
                        help="replicas per bundle, autoscaled between MIN and MAX with load "
                        "(Ray; default 1:2)")
    parser.add_argument("--threads", type=argtypes.integer(1, 64), default=1,
                        help="onnxruntime threads per replica (default %(default)s)")
    parser.add_argument("--max-batch", type=argtypes.integer(1, 1024), default=32,
                        help="frames per batch at most (default %(default)s)")
    parser.add_argument("--max-wait-ms", type=argtypes.number(0, 1000), default=20.0,
                        help="how long the oldest frame waits for a batch to fill (default "
                        "%(default)s ms)")
    parser.add_argument("--max-pending", type=argtypes.integer(1, 1024), default=4,
                        help="frames in flight per wearable; more get BUSY (default %(default)s)")
    limits = parser.add_argument_group("socket listener limits (docs/PROTOCOL.md §6.14)")
    limits.add_argument("--max-links", type=argtypes.integer(1, 65536), default=1024,
                        metavar="N", help="connections at once (default %(default)s)")
    limits.add_argument("--max-links-per-peer", type=argtypes.integer(1, 65536), default=4,
                        metavar="N", help="connections at once from one address (default "
                        "%(default)s)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log each connection and request")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from coinf.ble_protocol.listen import open_listener
    from coinf.bundle import Bundle
    from coinf.cli.commands.handheld import (
        configure_logging,
        serve_until_stopped,
        stop_on_signals,
    )
    from coinf.handheld.daemon import request_bound
    from coinf.handheld.engines import EngineOptions, open_engine
    from coinf.handheld.fleet import FleetService

    configure_logging(args.verbose)
    insecure = argtypes.insecure_options(args, args.listen)
    bundles = [Bundle.load(path) for path in args.bundles]
    options = EngineOptions(threads=args.threads, min_replicas=args.replicas[0],
                            max_replicas=args.replicas[1], max_batch=args.max_batch)
    engine = open_engine(args.engine, options)  # a bad spec or a missing extra: before Ray
    limits: dict[str, Any] = {"max_message_bytes": max(request_bound(b) for b in bundles),
                              "max_links": args.max_links,
                              "max_links_per_peer": args.max_links_per_peer}
    if args.listen.startswith("tcp+insecure:"):
        limits.update(insecure)
    if args.listen.partition(":")[0] not in ("tcp", "tcp+insecure", "unix"):
        from coinf.errors import UserError

        raise UserError(f"coinf serve listens on tcp:HOST:PORT or unix:/path, not {args.listen}")
    listener = open_listener(args.listen, **limits)
    service = FleetService(bundles, engine, max_batch=args.max_batch,
                           max_wait_ms=args.max_wait_ms, max_pending=args.max_pending)

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(service)  # the engine starts (Ray: seconds)
            await stack.enter_async_context(listener)
            names = ", ".join(f"{Path(b.root).name} ({b.identity})" for b in bundles)
            stop = stop_on_signals()
            print(f"coinf serve: serving {names} on {listener.description} with "
                  f"{engine.description}; batches of up to {args.max_batch}, "
                  f"{args.max_wait_ms:g} ms wait", flush=True)
            await serve_until_stopped(service, [listener], stop)

    asyncio.run(main())
    return 0
