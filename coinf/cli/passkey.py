"""Where a BLE passkey comes from on the command line -- never argv, which every local user can
read in the process list (docs/PROTOCOL.md §2, "Passkeys").

* ``--passkey-file F``: the 6 digits in a file only its owner can read or write (mode 0600 or
  stricter; anything else is refused: exit 2);
* ``--passkey-stdin``: one line read from standard input;
* the prompt (``coinf handheld pair``, and ``coinf handheld`` on a terminal): typed when the
  wearable asks, not echoed.

The old ``--passkey N`` is refused with one line naming these (exit 2). The library keeps its
``passkey=`` keyword (tests, in-process callers).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import stat
import sys
from collections.abc import Awaitable, Callable

from coinf.errors import UserError

Passkey = int | Callable[[], Awaitable[int | None]] | None

REPLACEMENT = ("--passkey-file F (a 0600 file holding the 6 digits), --passkey-stdin, or the "
               "prompt")


def _gone(_text: str) -> int:
    raise argparse.ArgumentTypeError(
        f"is no longer accepted (argv is visible to every local user): use {REPLACEMENT}")


def add_passkey_options(parser: argparse.ArgumentParser, what: str) -> None:
    """``--passkey-file``, ``--passkey-stdin`` and the refused ``--passkey``; ``what`` says
    what the passkey is for, in the help."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--passkey-file", metavar="FILE",
                       help=f"{what}: read the 6-digit passkey from FILE (mode 0600 or "
                       "stricter, else refused)")
    group.add_argument("--passkey-stdin", action="store_true",
                       help=f"{what}: read the 6-digit passkey from one line of stdin")
    group.add_argument("--passkey", type=_gone, nargs="?", metavar="N",
                       help=argparse.SUPPRESS)


def write_passkey_file(directory: str | os.PathLike[str], passkey: int) -> str:
    """Write ``passkey`` to a new 0600 file in ``directory`` (the demo's and benchmarks' child
    processes read it with ``--passkey-file``); returns its path."""
    path = os.path.join(os.fspath(directory), "passkey")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        os.fchmod(file.fileno(), 0o600)
        file.write(f"{passkey:06d}\n")
    return path


def parse_passkey(text: str, where: str) -> int:
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 6):
        raise UserError(f"{where}: a passkey is 6 digits (000000..999999)")
    return int(digits, 10)


def read_passkey_file(path: str) -> int:
    """The passkey in ``path``; refused unless it is a regular file of this user that group
    and others can neither read nor write."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise UserError(f"--passkey-file {path}: {exc.strerror}") from None
    with os.fdopen(fd, encoding="utf-8") as file:
        st = os.fstat(file.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"--passkey-file {path}: not a regular file")
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise UserError(f"--passkey-file {path}: mode {stat.S_IMODE(st.st_mode):04o} lets "
                            f"other users read it; refused (chmod 600 {path})")
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise UserError(f"--passkey-file {path}: belongs to another user; refused")
        return parse_passkey(file.read(64), f"--passkey-file {path}")


def given_passkey(args: argparse.Namespace) -> int | None:
    """The passkey of ``--passkey-file`` / ``--passkey-stdin``, or None if neither."""
    if getattr(args, "passkey_file", None):
        return read_passkey_file(args.passkey_file)
    if getattr(args, "passkey_stdin", False):
        return parse_passkey(sys.stdin.readline(), "--passkey-stdin")
    return None


async def prompt_passkey() -> int | None:
    """Ask on the terminal (not echoed) when the wearable asks; None if what is typed is not a
    passkey (the pairing then fails as NO_PASSKEY)."""
    text = await asyncio.to_thread(getpass.getpass, "passkey shown by the wearable: ")
    try:
        return parse_passkey(text, "passkey")
    except UserError:
        return None


def handheld_passkey(args: argparse.Namespace, *, prompt: bool) -> Passkey:
    """What the handheld types: a given passkey, else (``prompt`` and stdin a terminal) the
    prompt, else None (only bonds)."""
    fixed = given_passkey(args)
    if fixed is not None:
        return fixed
    if prompt and sys.stdin is not None and sys.stdin.isatty():
        return prompt_passkey
    return None


__all__ = ["REPLACEMENT", "add_passkey_options", "given_passkey", "handheld_passkey",
           "parse_passkey", "prompt_passkey", "read_passkey_file", "write_passkey_file"]
