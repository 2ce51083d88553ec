"""argparse ``type=`` checkers: every number the command line takes is range-checked, and every
file it reads is checked, while the arguments are parsed, before any work.

A value out of range is a usage error, one line with exit code 2 (``coinf handheld: error: --lru
must be >= 1, got 0``). Numbers are finite (no ``inf`` or
``nan``); counts that mean nothing at zero start at 1; ports are 1..65535 (0 only where it
means "pick a free port"). Path checkers return the text unchanged, so the namespace holds the
same strings as before.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable
from pathlib import Path

Check = Callable[[str], object]


def _bounds(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    def g(x: float) -> str:
        return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"

    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{g(lo)}, {g(hi)}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {g(lo)}"
    if hi is not None:
        return f"{'<' if hi_open else '<='} {g(hi)}"
    return ""


def _named(fn: Callable[[str], object], name: str) -> Callable[[str], object]:
    fn.__name__ = name  # argparse names the type in its messages
    return fn


def _fail(want: str, kind: str, shown: object, *, say_kind: bool) -> argparse.ArgumentTypeError:
    """``must be >= 1, got 0``; naming the kind when the value is not one (``must be an integer
    >= 1, got 'x'``, ``must be a finite number in [0, 1], got nan``)."""
    need = f"{kind} {want}".strip() if say_kind or not want else want
    return argparse.ArgumentTypeError(f"must be {need}, got {shown}")


def integer(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    """An integer in ``[lo, hi]`` (either bound optional)."""
    want = _bounds(lo, hi, False, False)

    def parse(text: str) -> int:
        try:
            value = int(text.strip(), 10)
        except ValueError:
            raise _fail(want, "an integer", repr(text), say_kind=True) from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise _fail(want, "an integer", value, say_kind=False)
        return value

    return _named(parse, "integer")  # type: ignore[return-value]


def number(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
           hi_open: bool = False, what: str = "a finite number") -> Callable[[str], float]:
    """A finite number in the interval (``lo_open``/``hi_open`` exclude the bound)."""
    want = _bounds(lo, hi, lo_open, hi_open)

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise _fail(want, what, repr(text), say_kind=True) from None
        if not math.isfinite(value):
            raise _fail(want, what, value, say_kind=True)
        if ((lo is not None and (value < lo or (lo_open and value == lo)))
                or (hi is not None and (value > hi or (hi_open and value == hi)))):
            raise _fail(want, what, value, say_kind=False)
        return value

    return _named(parse, "number")  # type: ignore[return-value]


# --- the common ones -------------------------------------------------------------------------

positive_int = integer(1)  # a count where zero means nothing (runs, repeats, frames, bytes)
count = integer(0)  # a count where zero is meaningful (warm-up runs, epochs, synthetic models)
seed = integer(0, 2**32 - 1)  # numpy's seeds
threads = integer(1, 256)
threads_or_auto = integer(0, 256)  # 0 = onnxruntime's default
passkey = integer(0, 999_999)
positive = number(0, lo_open=True)
non_negative = number(0)
fraction = number(0, 1)
percent = number(0, 100)
slowdown = number(1, 1e4)  # x slower than this machine (1 = as fast)
seconds = number(0, 1e6, lo_open=True, what="a number of seconds")
milliseconds = number(0, 1e9, what="a number of ms")
kbps = number(0, 1e7, lo_open=True, what="a rate in kB/s")
megabytes = number(0, 1e7, lo_open=True, what="a number of MB")


# --- files -----------------------------------------------------------------------------------


def existing_file(text: str) -> str:
    """A file that exists and can be read (not a folder)."""
    p = Path(text)
    if not text:
        raise argparse.ArgumentTypeError("must name a file, got ''")
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a folder, not a file")
    if not p.is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    if not os.access(p, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text}: cannot be read (permission denied)")
    return text


def existing_dir(text: str) -> str:
    """A folder that exists."""
    p = Path(text)
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a file, not a folder")
    if not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: no such folder")
    return text


def name_equals_file(text: str) -> str:
    """``NAME=FILE`` whose FILE exists and can be read."""
    name, sep, file = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"must be NAME=FILE, got {text!r}")
    existing_file(file)
    return text


# --- addresses -------------------------------------------------------------------------------

_TCP = re.compile(r"(?:^|:)(tcp(?:-client|-server|\+insecure)?):"
                  r"(?P<host>[^:]*(?::[^:]*)*?):(?P<port>[^:]*)$")


def _port_of(text: str, lowest: int) -> None:
    m = _TCP.search(text)
    if m is None:
        return  # not a TCP spec: the listener or transport names what it accepts
    port = m.group("port")
    least = 0 if m.group(1) == "tcp-server" else lowest
    if not m.group("host") or not port.isdigit() or not least <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected {m.group(1)}:HOST:PORT with a port in {least}..65535")


def connect_address(text: str) -> str:
    """Where to connect (``tcp:HOST:PORT``, ``tcp-client:HOST:PORT``, ``unix:/path``, an HCI
    spec...): a TCP port must be 1..65535."""
    _port_of(text, 1)
    return text


def listen_address(text: str) -> str:
    """Where to listen: as :func:`connect_address`, but port 0 (pick a free one) is allowed;
    ``ble:tcp-client:HOST:PORT`` connects, so its port is 1..65535. A ``unix:/path`` socket's
    folder must exist."""
    if text.startswith("unix:"):
        folder = Path(text[5:]).parent
        if not folder.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r}: {folder} is not an existing folder")
    if text.startswith("ble:"):
        _port_of(text[4:], 1)
    else:
        _port_of(text, 0)
    return text


def host_port_pair(text: str) -> str:
    """``HOST:PORT`` of a server that also takes ``PORT+1`` (0 = pick free ports)."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65534:
        raise argparse.ArgumentTypeError(
            f"must be HOST:PORT with PORT in 0..65534 (PORT+1 is used too), got {text!r}")
    return text


__all__ = [
    "connect_address", "count", "existing_dir", "existing_file", "fraction", "host_port_pair",
    "integer", "kbps", "listen_address", "megabytes", "milliseconds", "name_equals_file",
    "non_negative", "number", "passkey", "percent", "positive", "positive_int", "seconds", "seed",
    "slowdown", "threads", "threads_or_auto",
]


#: the flag that allows plain TCP (``tcp+insecure:``) on a command that opens one
INSECURE_FLAG = "--insecure-plaintext"


def add_insecure_flag(parser: argparse.ArgumentParser) -> None:
    """``--insecure-plaintext``: the second opt-in a ``tcp+insecure:`` spec needs."""
    parser.add_argument(INSECURE_FLAG, dest="insecure_plaintext", action="store_true",
                        help="allow tcp+insecure:HOST:PORT (plain TCP: no encryption, no "
                        "authentication; tests and loopback benchmarks only; docs/SECURITY.md)")


def insecure_options(args: argparse.Namespace, *specs: str | None) -> dict[str, bool]:
    """``{"allow_insecure": True}`` when one of ``specs`` is ``tcp+insecure:`` and the flag was
    given, ``{}`` when none is; one is, without the flag: :class:`~coinf.errors.UserError`
    naming the flag (exit 2)."""
    from coinf.errors import UserError

    plain = [s for s in specs if isinstance(s, str) and s.startswith("tcp+insecure:")]
    if not plain:
        return {}
    if not getattr(args, "insecure_plaintext", False):
        raise UserError(f"{plain[0]} is plain TCP (no encryption, no authentication): add "
                        f"{INSECURE_FLAG} to run it anyway, or use tcp:HOST:PORT (TLS, "
                        f"`coinf wifi pair`)")
    return {"allow_insecure": True}
