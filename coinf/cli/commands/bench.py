"""``coinf bench NAME ...``: benchmarks that print JSON on stdout."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

from coinf.cli.bench import BENCHES, options
from coinf.errors import UserError


def _missing(name: str, module: str) -> Callable[[argparse.Namespace], int]:
    def func(args: argparse.Namespace) -> int:
        raise UserError(f"bench {name!r} is not part of this build ({module} is missing)")

    return func


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", metavar="BENCH")
    for name, module, help_text in BENCHES:
        bench_parser = sub.add_parser(name, help=help_text, description=help_text)
        try:
            mod = importlib.import_module(f"coinf.cli.bench.{module}")
        except ModuleNotFoundError as exc:
            if exc.name != module:  # a dependency of an existing bench is missing: a real bug
                raise
            bench_parser.set_defaults(func=_missing(name, module))
            continue
        mod.register(bench_parser)
        if not any("--json" in a.option_strings for a in bench_parser._actions):
            options.add_json(bench_parser)

    def show_help(args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(func=show_help)
