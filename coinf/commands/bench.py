"""``coinf bench NAME ...``: benchmarks that print JSON on stdout."""

from __future__ import annotations

import argparse
import importlib

from coinf.bench import BENCHES


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", metavar="BENCH")
    for name, module, help_text in BENCHES:
        mod = importlib.import_module(module)
        mod.register(sub.add_parser(name, help=help_text, description=help_text))
    parser.set_defaults(func=lambda args: parser.print_help() or 2)
