"""``coinf wifi``: this device's TLS identity and its paired peers (docs/PROTOCOL.md §15).

* ``coinf wifi pair --listen [tcp:HOST:PORT]`` (on the helper): opens a pairing window, shows a
  one-time 6-digit code, exits 0 once a device paired (4, a pairing failure, when the window
  closes or the wrong attempts run out);
* ``coinf wifi pair --connect tcp:HOST:PORT`` (on the other device): asks for the code (a prompt,
  or one line on stdin; never an argument) and pairs;
* ``coinf wifi id``: this device's fingerprint (to put in a pipeline config's ``fingerprint``);
* ``coinf wifi peers`` / ``coinf wifi revoke NAME|FINGERPRINT``;
* ``coinf wifi trust-self``: a pairing record of this device's own certificate, for two roles on
  one machine that share the store (a device trusts only its records, never its own key by
  itself; with this record any process that copies identity.pem is trusted too:
  docs/SECURITY.md). ``coinf wifi revoke self`` removes it.

The store is ``--store`` or ``$COINF_TLS_DIR`` or ``<config dir>/coinf/tls`` (0700; its files
0600).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import time
from typing import TYPE_CHECKING

from coinf.cli import argtypes

if TYPE_CHECKING:
    from coinf.ble_protocol.tls_store import TlsStore


def register(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    pair = actions.add_parser("pair", help="pair with another device by a one-time code",
                              description="Pair two devices for TLS on Wi-Fi links: one opens a "
                              "window (--listen) and shows a code, the other connects "
                              "(--connect) and is asked for it.")
    side = pair.add_mutually_exclusive_group(required=True)
    side.add_argument("--listen", nargs="?", const="tcp:0.0.0.0:7879", type=argtypes.listen_address,
                      metavar="tcp:HOST:PORT", help="open a pairing window here "
                      "(default tcp:0.0.0.0:7879) and show its code")
    side.add_argument("--connect", type=argtypes.connect_address, metavar="tcp:HOST:PORT",
                      help="pair with the device whose window is there (asks for its code)")
    pair.add_argument("--window-s", type=argtypes.seconds, default=120.0,
                      help="with --listen: how long the window stays open (default %(default)g)")
    pair.add_argument("--attempts", type=argtypes.integer(1, 10), default=3,
                      help="with --listen: wrong codes tolerated before it closes "
                      "(default %(default)s)")
    pair.add_argument("--name", default=socket.gethostname()[:64] or "coinf",
                      help="this device's name in the other's trust store (default: hostname)")
    for sub in (pair, actions.add_parser("id", help="this device's TLS fingerprint"),
                actions.add_parser("peers", help="the paired devices"),
                actions.add_parser("trust-self", help="trust this device's own certificate "
                                   "(two roles on one machine; docs/SECURITY.md)")):
        sub.add_argument("--store", help="TLS store directory (default $COINF_TLS_DIR or "
                         "<config dir>/coinf/tls)")
    revoke = actions.add_parser("revoke", help="forget a paired device")
    revoke.add_argument("peer", help="its name or fingerprint")
    revoke.add_argument("--store", help="TLS store directory")
    parser.set_defaults(func=run)


#: the name of the record ``trust-self`` makes
SELF = "self"


def _store(args: argparse.Namespace) -> TlsStore:
    from coinf.ble_protocol.tls_store import TlsStore

    return TlsStore(args.store) if getattr(args, "store", None) else TlsStore()


def run(args: argparse.Namespace) -> int:
    from coinf.errors import UserError

    if args.action is None:
        raise UserError("coinf wifi needs an action: pair, id, peers, revoke or trust-self")
    store = _store(args)
    if args.action == "id":
        print(store.fingerprint)
        return 0
    if args.action == "peers":
        peers = store.peers()
        if not peers:
            print(f"no paired device ({store.peers_file})")
        for p in peers:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(p.added)) if p.added else "-"
            print(f"{p.name}  {p.fingerprint}  {p.address or '-'}  {when}")
        return 0
    if args.action == "trust-self":
        entry = store.pin(SELF, store.certificate_der(), "this machine")
        print(f"coinf wifi: {store.peers_file} now trusts this device's own certificate "
              f"{entry.fingerprint}: roles on this machine that share the store reach each "
              f"other, and so does any process that copies {store.identity_file.name} "
              f"(`coinf wifi revoke {SELF}` undoes it)", flush=True)
        return 0
    if args.action == "revoke":
        gone = store.revoke(args.peer)
        if not gone:
            raise UserError(f"no paired device named or with fingerprint {args.peer!r}")
        for p in gone:
            print(f"revoked {p.name} ({p.fingerprint})")
        return 0
    return asyncio.run(_listen(args, store) if args.listen else _connect(args, store))


async def _listen(args: argparse.Namespace, store: TlsStore) -> int:
    from coinf.ble_protocol.wifi_pair import PairingWindow

    window = PairingWindow(store, args.listen, name=args.name, window_s=args.window_s,
                           attempts=args.attempts)
    async with window:
        print(f"coinf wifi: pairing window open on {window.address} for {args.window_s:g} s; "
              f"this device is {store.fingerprint}", flush=True)
        print(f"coinf wifi: pairing code {window.code[:3]} {window.code[3:]}", flush=True)
        entry = await window.wait()
    print(f"coinf wifi: paired with {entry.name} ({entry.fingerprint})", flush=True)
    return 0


async def _connect(args: argparse.Namespace, store: TlsStore) -> int:
    from coinf.ble_protocol.wifi_pair import check_code, pair_with

    prompt = "pairing code shown by the other device: "
    if sys.stdin.isatty():
        import getpass

        line = await asyncio.to_thread(getpass.getpass, prompt)
    else:
        line = await asyncio.to_thread(sys.stdin.readline)
    code = check_code(line)
    entry = await pair_with(args.connect, code, store, name=args.name)
    print(f"coinf wifi: paired with {entry.name} ({entry.fingerprint}); this device is "
          f"{store.fingerprint}", flush=True)
    return 0
