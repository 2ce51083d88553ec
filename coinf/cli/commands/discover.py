"""``coinf discover [BUNDLE]``: the helpers announced on the network (DNS-SD ``_coinf._tcp``,
docs/PIPELINE.md "Discovery"), as a table or ``--json`` (a pipeline config: ``{"helpers":
[...]}``, plus what was dropped and why). Also the discovery flags of ``coinf run`` and
``coinf plan`` (``--discover [SECONDS]``, ``--allow``, ``--mdns-interface``)."""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
from typing import Any

from coinf.cli import argtypes

timeout_s = argtypes.number(0, 60, lo_open=True, what="a number of seconds")
DEFAULT_TIMEOUT_S = 2.0


def _allow(text: str) -> list[str]:
    """``--allow h1,192.168.1.30,tcp:192.168.1.31:7878`` -> the entries, each checked."""
    from coinf.ble_protocol.mdns import check_allow
    from coinf.errors import InputError

    entries = [e.strip() for e in text.split(",") if e.strip()]
    if not entries:
        raise argparse.ArgumentTypeError(f"must name helpers or addresses, got {text!r}")
    try:
        return list(check_allow(entries))
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _interface(text: str) -> str:
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an IPv4 address of this machine, got "
                                         f"{text!r}") from None


def add_filters(parser: argparse.ArgumentParser) -> None:
    """``--allow`` and ``--mdns-interface``, shared by the commands that discover."""
    parser.add_argument("--allow", type=_allow, action="extend", default=[],
                        metavar="NAME|IP|tcp:IP:PORT",
                        help="discovery: use only these helpers (names or addresses, "
                        "comma-separated or repeated); default: any serving the bundle")
    parser.add_argument("--mdns-interface", type=_interface, action="append", default=[],
                        metavar="IP", help="discovery: browse on the interface with this IPv4 "
                        "address (repeatable; default: every interface)")


def add_discover(parser: argparse.ArgumentParser, group: Any = None) -> None:
    """``--discover [SECONDS]`` (in ``group`` when given) and :func:`add_filters`."""
    (group or parser).add_argument(
        "--discover", type=timeout_s, nargs="?", const=DEFAULT_TIMEOUT_S, metavar="SECONDS",
        help="find the helpers on the network instead of a config file: those announced "
        "(coinf handheld --announce) that serve this bundle, browsed for SECONDS "
        f"(default {DEFAULT_TIMEOUT_S:g})")
    add_filters(parser)


def _line(found: Any, seconds: float) -> str:
    from coinf.ble_protocol.mdns import printable

    seen = ", ".join(f"{a.name} at {a.address}" for a in found.announcements) or "no helper"
    line = f"discovery ({seconds:g} s): {seen}"
    if found.dropped:
        why = "; ".join(f"{printable(i, 40) or '-'}: {r}" for i, r in found.dropped[:3])
        more = f"; {len(found.dropped) - 3} more" if len(found.dropped) > 3 else ""
        line += f" ({len(found.dropped)} dropped: {why}{more})"
    if found.unpaired:
        line += (f"; not used, unpaired: "
                 f"{', '.join(f'{a.name} at {a.address}' for a in found.unpaired)} "
                 f"(coinf wifi pair)")
    return line


def discovered_helpers(args: argparse.Namespace, bundle: Any) -> list[Any]:
    """``--discover``'s helpers serving ``bundle``, with one line on stderr saying what was
    found and dropped."""
    from coinf.wearable.discovery import discover, to_helper

    found = discover(args.discover, bundle.identity, args.allow, args.mdns_interface)
    print(_line(found, args.discover), file=sys.stderr, flush=True)
    return [to_helper(a) for a in found.announcements]


def check_filters(args: argparse.Namespace) -> None:
    """``--allow`` / ``--mdns-interface`` mean nothing without ``--discover``."""
    from coinf.errors import UserError

    if args.discover is None and (args.allow or args.mdns_interface):
        raise UserError("--allow and --mdns-interface filter --discover: give --discover too")


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", nargs="?", type=argtypes.existing_dir,
                        help="list only the helpers serving this bundle (default: every helper, "
                        "with the bundle it serves)")
    parser.add_argument("--timeout", type=timeout_s, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help="seconds to browse (default %(default)s)")
    add_filters(parser)
    parser.add_argument("--json", action="store_true",
                        help="print a pipeline config ({\"helpers\": [...]}, usable as "
                        "--helpers CONFIG) with what was dropped and why")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from coinf.ble_protocol.mdns import printable
    from coinf.bundle import Bundle
    from coinf.wearable.discovery import discover

    identity = Bundle.load(args.bundle).identity if args.bundle else None
    found = discover(args.timeout, identity, args.allow, args.mdns_interface)
    if args.json:
        json.dump({"helpers": [{**a.to_json(), "bundle": a.bundle}
                               for a in found.announcements],
                   "unpaired": [{**a.to_json(), "bundle": a.bundle} for a in found.unpaired],
                   "dropped": [{"instance": i, "why": r} for i, r in found.dropped]},
                  sys.stdout, indent=1)
        print()
        return 0
    if not found.announcements and not found.unpaired:
        print(f"no helper found in {args.timeout:g} s"
              + (f" serving {identity}" if identity else ""))
    else:
        rows = [(a.name, a.address, "-" if a.speed_gflops is None else f"{a.speed_gflops:g}",
                 a.bundle, status) for status, group in (("paired", found.announcements),
                                                         ("unpaired", found.unpaired))
                for a in group]
        head = ("name", "address", "GFLOP/s", "bundle", "trust")
        widths = [max(len(r[k]) for r in [head, *rows]) for k in range(5)]
        for r in [head, *rows]:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    if found.unpaired:
        print("unpaired helpers are not used: pair with them first (coinf wifi pair)")
    for instance, why in found.dropped:
        print(f"dropped {printable(instance) or '-'}: {why}")
    return 0
