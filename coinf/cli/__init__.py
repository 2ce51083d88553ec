"""The ``coinf`` command line. Nothing in the library imports this package.

Errors print one line, never a traceback: a user's mistake (:class:`~coinf.errors.UserError`)
exits 2, a failed link or peer (:class:`~coinf.errors.LinkError`) exits 3, a BLE pairing that
failed for good (:class:`~coinf.errors.PairingError`: wrong passkey, window closed, impostor...)
exits 4, any other :class:`~coinf.errors.CoinfError` exits 1; an interrupt exits 130, SIGTERM
143 (both after every ``finally`` ran). Bugs keep their traceback. Exit codes live here only.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from coinf import __version__
from coinf.cli.commands import COMMANDS
from coinf.deps import EXTRA_OF, left_out, missing_message
from coinf.errors import CoinfError, LinkError, MissingDependency, PairingError, UserError


class Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors: ``coinf CMD: error: ...`` and exit 2, not the usage
    block followed by the error (``coinf CMD --help`` prints the usage). Subparsers inherit it.

    A value refused by its ``type=`` check (:mod:`coinf.cli.argtypes`) or its ``choices`` is
    raised as :class:`argparse.ArgumentError` (``exit_on_error=False``), which :func:`main`
    prints and returns as 2 like any other user error; a malformed command line (an unknown
    option, a missing argument) exits here through argparse's ``SystemExit(2)``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("exit_on_error", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER, f"{self.prog}: error: {' '.join(message.split())}\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Build the parser; with ``only``, import just that subcommand's module."""
    parser = Parser(
        prog="coinf",
        description="Cooperative inference between a wearable and its handheld over BLE.",
    )
    parser.add_argument("--version", action="version", version=f"coinf {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module, help_text in COMMANDS:
        if only is not None and name != only:
            sub.add_parser(name, help=help_text, add_help=False)
            continue
        try:
            mod = importlib.import_module(f"coinf.cli.commands.{module}")
        except ModuleNotFoundError as exc:
            lean = left_out(exc.name)  # the Pi wheel has no benchmarks (coinf.deps.PI_LEFT_OUT)
            top = "a full install" if lean else _optional(exc)
            stub = sub.add_parser(name, help=f"{help_text} (needs {top})", add_help=False)
            stub.add_argument("rest", nargs=argparse.REMAINDER)
            stub.set_defaults(func=_missing(lean or missing_message(top, f"coinf {name}")))
            continue
        mod.register(sub.add_parser(name, help=help_text, description=help_text))
    return parser


_ARGPARSE_OWN = ("invalid ", "expected ", "ignored ", "not allowed")


def _usage(exc: argparse.ArgumentError) -> str:
    """``--lru must be >= 1 (an integer), got 0`` or ``--profile p.json: no such file`` (the
    checkers of :mod:`coinf.cli.argtypes`); argparse's own ``argument --x: invalid choice...``."""
    message = " ".join(str(exc.message).split())
    if exc.argument_name and not message.startswith(_ARGPARSE_OWN):
        return f"{exc.argument_name.split('/')[-1]} {message}"
    return " ".join(str(exc).split())


def _optional(exc: ModuleNotFoundError) -> str:
    """The missing optional package behind ``exc``; re-raises when it is not one (a bug)."""
    top = (exc.name or "").split(".")[0]
    if top not in EXTRA_OF:
        raise exc
    return top


def _missing(message: str) -> Callable[[argparse.Namespace], int]:
    def fail(args: argparse.Namespace) -> int:
        raise MissingDependency(message)

    return fail


EXIT_USER = 2  # the user's input is wrong
EXIT_LINK = 3  # the link or the peer failed
EXIT_PAIRING = 4  # BLE pairing failed for good (PairingError): the user must act
EXIT_OTHER = 1


def exit_code(exc: CoinfError) -> int:
    """The process exit code for an error that reached the command line."""
    if isinstance(exc, UserError):
        return EXIT_USER
    if isinstance(exc, PairingError):
        return EXIT_PAIRING
    if isinstance(exc, LinkError):
        return EXIT_LINK
    return EXIT_OTHER


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    names = {name for name, _, _ in COMMANDS}
    first = next((a for a in args_list if not a.startswith("-")), None)
    parser = build_parser(first if first in names else None)
    try:
        args, extra = parser.parse_known_args(args_list)
    except argparse.ArgumentError as exc:  # a value its type= check or choices refused
        print(f"{'coinf ' + first if first in names else 'coinf'}: error: {_usage(exc)}",
              file=sys.stderr)
        return EXIT_USER
    if extra:  # argparse leaves KEY=VALUE words that follow an option (`policy set --file F k=v`)
        if isinstance(getattr(args, "settings", None), list) and all(
                "=" in e and not e.startswith("-") for e in extra):
            args.settings.extend(extra)
        else:
            parser.exit(EXIT_USER, f"coinf {args.command}: error: unrecognized arguments: "
                                   f"{' '.join(extra)}\n")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2 if args.command is None else 0
    restore = _terminate_like_ctrl_c()
    try:
        rc = args.func(args)
    except Terminated:
        print(f"coinf {args.command}: terminated", file=sys.stderr)
        return 143
    except CoinfError as exc:
        print(f"coinf {args.command}: error: {exc}", file=sys.stderr)
        return exit_code(exc)
    except ModuleNotFoundError as exc:  # an optional dependency this install does not have
        lean = left_out(exc.name)  # or a module the Pi wheel leaves out
        message = lean or missing_message(_optional(exc), "this command")
        print(f"coinf {args.command}: error: {message}", file=sys.stderr)
        return EXIT_USER
    except BrokenPipeError:  # `coinf plan B | head`: the reader left, nothing is wrong
        _quiet_stdout()
        return 141
    except OSError as exc:
        if exc.filename is None:  # not about a path: a bug or the system, keep its traceback
            raise
        # a path given (or implied) cannot be read or written: the user's to mend, no traceback
        print(f"coinf {args.command}: error: {exc.filename}: {exc.strerror or exc}",
              file=sys.stderr)
        return EXIT_OTHER
    except KeyboardInterrupt:
        print(f"coinf {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        restore()
    try:
        sys.stdout.flush()  # here, not at exit: a reader that left is no traceback either
    except BrokenPipeError:
        _quiet_stdout()
        return 141
    return int(rc or 0)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush does not fail again."""
    import os

    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every ``finally`` runs (helper processes a command
    started are stopped, temporary files removed) before the process exits with 143."""


def _terminate_like_ctrl_c() -> Callable[[], None]:
    """While a command runs in the main thread, SIGTERM raises :class:`Terminated` (a command
    with its own handlers, such as ``coinf handheld``, installs them over this one). Returns
    what puts the previous handler back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def terminated(signum: int, frame: object) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminated)

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore
