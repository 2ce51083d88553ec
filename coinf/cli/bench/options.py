"""Command-line options that several ``coinf bench`` commands share.

Each helper adds one option with its name, type check and help text; the command passes what
differs between commands: the default, or (``default_text``) what is used when the option is
left out and its default is worked out at run time.
"""

from __future__ import annotations

import argparse

from coinf.cli import argtypes


def _default(default_text: str | None) -> str:
    """The help's default: the value argparse shows, or what is used when it is left out."""
    return f"default: {default_text}" if default_text else "default %(default)s"


def add_json(parser: argparse.ArgumentParser) -> None:
    """``--json``: accepted by every bench, whose output is always JSON."""
    parser.add_argument("--json", action="store_true", help="JSON on stdout (always the case)")


def add_bundle(parser: argparse.ArgumentParser, *, required: bool = False,
               default_text: str | None = None) -> None:
    """``--bundle DIR``: the bundle to measure (``default_text``: what is measured without)."""
    more = f"; {_default(default_text)}" if default_text else ""
    parser.add_argument("--bundle", required=required, help=f"bundle directory (coinf split{more})")


def add_split(parser: argparse.ArgumentParser, default: str | None = None, *,
              default_text: str | None = None) -> None:
    """``--split ID``: the candidate to run."""
    parser.add_argument("--split", default=default,
                        help=f"candidate id ({_default(default_text)})")


def add_data(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    """``--data SRC``: the inputs of a ``--bundle``."""
    parser.add_argument("--data", default=default,
                        help="with --bundle: 'digits' or an .npz of feeds (see coinf calibrate)")


def add_limit(parser: argparse.ArgumentParser) -> None:
    """``--limit N``: only the first N inputs."""
    parser.add_argument("--limit", type=argtypes.positive_int, default=None,
                        help="first N inputs")


def add_tolerance(parser: argparse.ArgumentParser, default: float = 1.0) -> None:
    """``--tolerance PP``: the quality loss the summary allows."""
    parser.add_argument("--tolerance", type=argtypes.percent, default=default,
                        help="quality (accuracy) loss allowed in the summary, pp (default "
                        "%(default)s)")


def add_repeats(parser: argparse.ArgumentParser, default: int) -> None:
    """``--repeats N``: timed repeats whose median is reported."""
    parser.add_argument("--repeats", type=argtypes.positive_int, default=default,
                        help="timed repeats of each measurement (median; default %(default)s)")


def add_warmup(parser: argparse.ArgumentParser, default: int) -> None:
    """``--warmup N``: untimed runs before the timed ones."""
    parser.add_argument("--warmup", type=argtypes.count, default=default,
                        help="untimed warm-up runs (default %(default)s)")


def add_threads(parser: argparse.ArgumentParser, default: int = 1) -> None:
    """``--threads N``: intra-op threads of each inference session."""
    parser.add_argument("--threads", type=argtypes.threads, default=default,
                        help="intra-op threads of each inference session (default %(default)s)")


def add_seed(parser: argparse.ArgumentParser, default: int) -> None:
    """``--seed N``: the random seed."""
    parser.add_argument("--seed", type=argtypes.seed, default=default)


def add_preset(parser: argparse.ArgumentParser, default: str = "pi-zero-2w") -> None:
    """``--preset NAME``: the emulated radio's preset."""
    parser.add_argument("--preset", default=default,
                        help="radio preset whose capacity and interval shape the link (default "
                        "%(default)s)")


def add_bandwidth_kbps(parser: argparse.ArgumentParser, default: float | None = None, *,
                       default_text: str | None = None) -> None:
    """``--bandwidth-kbps R``: the link's bandwidth."""
    parser.add_argument("--bandwidth-kbps", type=argtypes.kbps, default=default,
                        help=f"link bandwidth, kB/s ({_default(default_text)})")


def add_png(parser: argparse.ArgumentParser, what: str) -> None:
    """``--png FILE``: draw ``what`` there (a PNG; matplotlib, the ``convert`` extra)."""
    parser.add_argument("--png", metavar="FILE", help=f"draw {what} here (a PNG)")


def check_png(path: str | None) -> None:
    """A ``--png`` that cannot be written: one line, before any work."""
    if path:
        from coinf.cli.paths import writable_file

        writable_file(path, "--png", make_folder=False)
