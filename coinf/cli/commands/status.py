"""``coinf status``: what the running wearable service serves (its control socket), as JSON.

The same request as ``coinf wearable status``; on the Pi the socket is
``/run/coinf/control.sock`` (``$COINF_CONTROL``). The service's log is its journal
(``journalctl -u coinf-wearable -f``).
"""

from __future__ import annotations

import argparse


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--control", default=None,
                        help="the service's control socket (default $COINF_CONTROL or "
                             "/run/coinf/control.sock)")
    parser.add_argument("--expect", metavar="IDENTITY",
                        help="fail unless the service serves this bundle identity")
    parser.set_defaults(func=run, op="status")


def run(args: argparse.Namespace) -> int:
    from coinf.cli.commands.wearable import control

    return control(args)
