"""``coinf handheld``: the handheld daemon. Serves tails for one bundle until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from typing import TYPE_CHECKING, Any

from coinf.bundle import Bundle
from coinf.cli import argtypes

if TYPE_CHECKING:
    from coinf.handheld.daemon import HandheldDaemon
    from coinf.handheld.fleet import FleetService

DEFAULT_LISTEN = "tcp:127.0.0.1:7878"


def register(parser: argparse.ArgumentParser) -> None:
    from coinf.cli.commands import pair

    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    pair.register_handheld(actions.add_parser(
        "pair", help="pair with a wearable (type the passkey it shows)",
        description="Pair with a wearable: LE Secure Connections, passkey entry."))
    parser.add_argument("--bundle", help="bundle directory (from `coinf split`); required")
    parser.add_argument(
        "--listen", type=argtypes.listen_address,
        help="where links come from: tcp:HOST:PORT or unix:/path (wearables connect here), "
        "ble (connect to the wearable over this machine's Bluetooth) or ble:HCI (over a bumble "
        "host on that HCI transport, e.g. ble:tcp-client:HOST:PORT of coinf radio); "
        f"default {DEFAULT_LISTEN}. tcp+insecure:HOST:PORT (plain) needs --insecure-plaintext")
    argtypes.add_insecure_flag(parser)
    parser.add_argument("--transport", choices=["socket", "ble"],
                        help="older spelling: ble = --listen ble (or ble:HCI with --hci)")
    parser.add_argument("--wearable", default="coinf-wearable",
                        help="BLE: name or address of the wearable (default %(default)s)")
    parser.add_argument("--hci", type=argtypes.connect_address,
                        help="BLE: use a bumble host on this HCI transport "
                        "(tcp-client:HOST:PORT of coinf radio) instead of the OS Bluetooth stack")
    parser.add_argument("--keystore", help="BLE with --hci: the bond store (default "
                        "<config dir>/coinf/bonds/handheld.json, as `coinf handheld pair`)")
    from coinf.cli.passkey import add_passkey_options

    add_passkey_options(parser, "BLE with --hci: the wearable's passkey, typed when pairing "
                        "(emulated radio, scripts; default: the prompt on a terminal, else "
                        "bonds only)")
    parser.add_argument("--threads", type=argtypes.threads_or_auto, default=0,
                        help="onnxruntime threads (0 = auto)")
    parser.add_argument("--slowdown", type=argtypes.slowdown, default=1.0,
                        help="emulate a K x slower device")
    parser.add_argument("--lru", type=argtypes.positive_int, default=4,
                        help="tail sessions kept loaded")
    parser.add_argument("--runtime", choices=("onnxruntime", "litert", "auto"),
                        default="onnxruntime",
                        help="run tails with onnxruntime, LiteRT (the bundle's TFLite slices) or "
                             "auto (the faster per slice in --profile); default %(default)s")
    parser.add_argument("--max-pending", type=argtypes.positive_int, default=None,
                        help="requests admitted at once per link; more get BUSY (default 4; "
                        "16 with --pipeline, whose streams keep more frames in flight)")
    limits = parser.add_argument_group(
        "socket listener limits (tcp:/unix:; docs/PROTOCOL.md §6.14)")
    limits.add_argument("--max-links", type=argtypes.integer(1, 4096), metavar="N",
                        help="connections at once (default 16)")
    limits.add_argument("--max-links-per-peer", type=argtypes.integer(1, 4096), metavar="N",
                        help="connections at once from one address (default 4)")
    limits.add_argument("--hello-timeout", type=argtypes.seconds, metavar="S",
                        help="seconds a new connection has to complete its HELLO (default 5)")
    limits.add_argument("--idle-timeout", type=argtypes.seconds, metavar="S",
                        help="seconds of silence before a connection is closed (default 120)")
    limits.add_argument("--max-request-mib", type=argtypes.number(0.001, 1024, lo_open=False),
                        metavar="MIB", help="largest frame a peer may send (default: the "
                        "bundle's largest request, docs/PROTOCOL.md §6.14; bench spatial's "
                        "tile requests need more)")
    parser.add_argument("--profile", type=argtypes.existing_file,
                        help="device profile sent to wearables "
                        "(default: the saved handheld profile, else built-in laptop defaults)")
    parser.add_argument("--pipeline", metavar="CONFIG",
                        help="pipeline config (JSON, "
                        "docs/PIPELINE.md): serve as one helper of a pipeline over n devices, "
                        "forwarding to the next helper; needs --name")
    parser.add_argument("--name", help="with --pipeline: this helper's name in the config; "
                        "it listens on its address there (for its peers, and for the wearable "
                        "unless --listen adds another spec, e.g. ble:HCI)")
    parser.add_argument("--announce", action="store_true",
                        help="announce this helper on the network (DNS-SD _coinf._tcp: its TCP "
                        "listener, --name, the bundle's identity), so `coinf run --discover` "
                        "finds it; needs --name. Without --pipeline it forwards pipeline stages "
                        "to the other announced helpers of this bundle (docs/PIPELINE.md)")
    parser.add_argument("--speed-gflops", type=argtypes.number(0, 1e6, lo_open=True),
                        metavar="G", help="with --announce: this helper's speed, announced as "
                        "the planner's prior (a config's speed_gflops)")
    from coinf.cli.commands.discover import add_filters

    add_filters(parser)  # --allow (which announced peers to forward to), --mdns-interface
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log each connection and request")
    parser.set_defaults(func=run)


#: --flag -> the socket listener option it sets (ble_protocol.socket_listener.SocketListener)
LIMIT_FLAGS = {"max_links": "max_links", "max_links_per_peer": "max_links_per_peer",
               "hello_timeout": "handshake_timeout", "idle_timeout": "idle_timeout"}


def socket_limits(args: argparse.Namespace, *specs: str) -> dict[str, Any]:
    """The socket listener options given on the command line; at least one of ``specs`` (the
    listeners) must be a socket one (tcp: / unix:)."""
    from coinf.errors import UserError

    given = {opt: getattr(args, flag) for flag, opt in LIMIT_FLAGS.items()
             if getattr(args, flag, None) is not None}
    if given and not any(is_socket(s) for s in specs):
        flag = next(f for f, o in LIMIT_FLAGS.items() if o in given)
        raise UserError(f"--{flag.replace('_', '-')} limits a socket listener (--listen "
                        f"tcp:HOST:PORT or unix:/path), not {specs[0]}")
    return given


def ble_pairing_options(args: argparse.Namespace, spec: str) -> dict[str, Any]:
    """The bond store and passkey of ``--listen ble:HCI``: the bond store defaults to the
    private one (bonds persist across restarts); on the OS stack (``ble``) BlueZ keeps them
    and its agent asks for the passkey."""
    from coinf.cli.commands.pair import default_bond_store
    from coinf.cli.passkey import handheld_passkey
    from coinf.errors import UserError

    if spec == "ble":
        if args.keystore or args.passkey_file or args.passkey_stdin:
            raise UserError("--keystore, --passkey-file and --passkey-stdin need a bumble host "
                            "(--listen ble:HCI); on the OS stack its Bluetooth agent pairs")
        return {}
    options: dict[str, Any] = {"keystore": args.keystore or default_bond_store("handheld")}
    passkey = handheld_passkey(args, prompt=True)
    if passkey is not None:
        options["passkey"] = passkey
    return options


def is_socket(spec: str) -> bool:
    return spec.partition(":")[0] in ("tcp", "tcp+insecure", "unix")


def listen_spec(args: argparse.Namespace) -> str:
    """The listener spec from --listen, or the older --transport/--hci spelling."""
    from coinf.errors import UserError

    if args.listen is not None:
        if args.transport == "ble" or args.hci is not None:
            raise UserError("give --listen ble:HCI, or --transport ble --hci HCI, not both")
        return str(args.listen)
    if args.transport == "socket":
        if args.hci is not None:
            raise UserError("--hci is for BLE: --listen ble:HCI (or --transport ble --hci HCI)")
        return DEFAULT_LISTEN
    if args.transport == "ble" or args.hci is not None:
        return f"ble:{args.hci}" if args.hci else "ble"
    return DEFAULT_LISTEN


def run(args: argparse.Namespace) -> int:
    from coinf.ble_protocol.listen import open_listener
    from coinf.device.emulation import DeviceEmulation
    from coinf.errors import UserError
    from coinf.handheld.daemon import HandheldDaemon, request_bound

    configure_logging(args.verbose)
    if not args.bundle:
        raise UserError("coinf handheld needs --bundle (or: coinf handheld pair)")
    forward, own_address = pipeline_forwarder(args)
    if args.max_pending is None:
        args.max_pending = 16 if forward is not None else 4
    spec = listen_spec(args)
    if args.announce and not any(s.startswith("tcp:") for s in (spec, own_address)):
        raise UserError(f"--announce needs a TCP listener (--listen tcp:HOST:PORT), not {spec}")
    try:
        emulation = DeviceEmulation(args.slowdown, args.threads)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if args.max_pending < 1:
        raise UserError("--max-pending must be >= 1")
    limits = socket_limits(args, spec, *([own_address] if forward is not None else []))
    insecure = argtypes.insecure_options(args, spec, own_address or None)
    bundle = Bundle.load(args.bundle)
    # the largest frame a peer may send follows the model (issue 41: memory a peer can pin)
    limits.setdefault("max_message_bytes", request_bound(bundle) if args.max_request_mib is None
                      else int(args.max_request_mib * 2**20))
    options: dict[str, Any] = dict(limits) if is_socket(spec) else {}
    if spec.startswith("tcp+insecure:"):
        options.update(insecure)
    is_ble = spec.partition(":")[0] == "ble"
    if is_ble:
        options = {"bundle_identity": bundle.identity, "name": args.wearable}
        options.update(ble_pairing_options(args, spec))
    listener = open_listener(spec, **options)  # a bad spec fails before the bundle loads tails
    # a pipeline helper also listens on its config address, where its peers reach it
    peers = (open_listener(own_address, **(limits if is_socket(own_address) else {}),
                           **(insecure if own_address.startswith("tcp+insecure:") else {}))
             if own_address and spec != own_address else None)
    from coinf.cli.paths import naming
    from coinf.device.profile import load_or_default

    with naming("--profile", args.profile):
        profile = load_or_default("handheld", args.profile)
    if forward is not None:
        forward = forward(bundle, emulation)
    daemon = HandheldDaemon(bundle, emulation, lru=args.lru, profile=profile, runtime=args.runtime,
                            max_pending=args.max_pending, forward=forward)

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            for part in (daemon, listener, peers):
                if part is not None:
                    await stack.enter_async_context(part)
            where = (f"to BLE wearable {args.wearable!r} via {listener.spec}"
                     if is_ble else f"on {listener.description}")
            if peers is not None:
                where += f" and to pipeline peers on {peers.description}"
            if args.announce:  # unregistered when the stack unwinds (Ctrl-C, SIGTERM too)
                announcer = await stack.enter_async_context(
                    announcer_for(args, bundle, (listener, peers), forward))
                where += f", announced as {announcer.description}"
            stop = ready(bundle, where)
            await serve_until_stopped(daemon, [lst for lst in (listener, peers)
                                               if lst is not None], stop)

    asyncio.run(main())
    return 0


def configure_logging(verbose: bool) -> None:
    """Log to stderr: each connection and request with ``verbose``, else warnings only (and
    none of bumble's teardown tracebacks)."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s handheld %(message)s",
        stream=sys.stderr,
    )
    if not verbose:  # bumble logs tracebacks for expected teardown (peer gone, radio off)
        logging.getLogger("bumble").setLevel(logging.CRITICAL)


def pipeline_forwarder(args: argparse.Namespace) -> tuple[Any, str]:
    """The forwarder factory of ``--announce`` (to the helpers announced on the network) or of
    ``--pipeline``/``--name`` (to the config's peers), or None; and this helper's address in
    the config ("" if none), which becomes ``--listen`` when no listener is given. Checks the
    ``--announce`` flags and that zeroconf is installed first."""
    from coinf.cli.commands.pipeline_role import check_announce, discovered_forwarder

    check_announce(args)
    if args.announce:  # before the bundle's tails load, not once the listeners are up
        from coinf.deps import require

        require("zeroconf", "discovery", "coinf handheld --announce")
    if args.announce and not args.pipeline:  # peers: the helpers announced on the network
        return discovered_forwarder(args), ""
    if args.pipeline or args.name:
        from coinf.cli.commands.pipeline_role import forwarder_for

        forward, own_address = forwarder_for(args)
        if args.listen is None and args.transport is None and args.hci is None:
            args.listen = own_address
        return forward, own_address
    return None, ""


async def serve_until_stopped(daemon: HandheldDaemon | FleetService, listeners: list[Any],
                              stop: asyncio.Event) -> None:
    """Serve every listener until ``stop`` is set or one of them ends; a listener's error is
    raised."""
    serving = [asyncio.ensure_future(daemon.serve_listener(lst)) for lst in listeners]
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({*serving, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (*serving, waiter):
            task.cancel()
        await asyncio.gather(*serving, waiter, return_exceptions=True)
    for task in serving:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


def announcer_for(args: argparse.Namespace, bundle: Bundle, listeners: tuple[Any, ...],
                  forward: Any) -> Any:
    """The :class:`~coinf.handheld.announce.Announcer` of ``--announce``: the first TCP
    listener's actual address; with a forwarder of no config, it keeps its peers too."""
    from coinf.handheld.announce import Announcer

    address = next(lst.address for lst in listeners
                   if lst is not None and getattr(lst, "address", "").startswith("tcp:"))
    if address.partition(":")[2].startswith("127."):
        print("coinf handheld: announcing a loopback address: only this machine can reach "
              "it (--listen tcp:0.0.0.0:PORT for the others)", file=sys.stderr, flush=True)
    store = next(lst.store for lst in listeners
                 if lst is not None and getattr(lst, "address", "").startswith("tcp:"))
    return Announcer(args.name, bundle.identity, address, interfaces=args.mdns_interface,
                     speed_gflops=args.speed_gflops,
                     forwarder=forward if not args.pipeline else None, allow=args.allow,
                     fingerprint=store.fingerprint if store is not None else None)


def stop_on_signals() -> asyncio.Event:
    """An event set on SIGINT/SIGTERM (the loop's handlers)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop


def ready(bundle: Bundle, where: str) -> asyncio.Event:
    """Stop on SIGINT/SIGTERM; print the ready line (the demo and tests wait for it)."""
    stop = stop_on_signals()
    print(f"coinf handheld: serving {len(bundle.candidates)} candidates of {bundle.model_file} "
          f"({bundle.identity}) {where}", flush=True)
    return stop
