"""coinf.research.qrcc: the files of a Qt binary resource, bounds-checked."""

from __future__ import annotations

import struct
import zlib

import pytest
from coinf.research import qrcc


def _rcc(version: int = 2, compress: bool = True) -> bytes:
    """A resource /pics/{a.jpg (zlib), b.png (stored)} laid out as Qt's rcc writes it."""
    names, offs = b"", {}
    for n in ("pics", "a.jpg", "b.png"):
        offs[n] = len(names)
        names += struct.pack(">HI", len(n), 0) + n.encode("utf-16-be")
    a, b = b"A" * 300, b"png bytes"
    data = b""
    body = struct.pack(">I", len(a)) + zlib.compress(a) if compress else a
    a_off, data = len(data), data + struct.pack(">I", len(body)) + body
    b_off, data = len(data), data + struct.pack(">I", len(b)) + b
    pad = b"\0" * 8 if version >= 2 else b""

    def d(name: int, count: int, first: int) -> bytes:
        return struct.pack(">IHII", name, 2, count, first) + pad

    def f(name: int, flags: int, off: int) -> bytes:
        return struct.pack(">IHHHI", name, flags, 0, 0, off) + pad

    tree = (d(0, 1, 1) + d(offs["pics"], 2, 2) + f(offs["a.jpg"], 1 if compress else 0, a_off)
            + f(offs["b.png"], 0, b_off))
    head = 20
    return (struct.pack(">4sIIII", b"qres", version, head, head + len(tree),
                        head + len(tree) + len(data)) + tree + data + names)


@pytest.mark.parametrize("version", [1, 2])
def test_reads_the_files(version: int) -> None:
    got = dict(qrcc.files(_rcc(version)))
    assert got == {"pics/a.jpg": b"A" * 300, "pics/b.png": b"png bytes"}


def _patch(blob: bytes, at: int, fmt: str, *values: int) -> bytes:
    out = bytearray(blob)
    struct.pack_into(fmt, out, at, *values)
    return bytes(out)


@pytest.mark.parametrize("mangle, message", [
    (lambda b: b"qrez" + b[4:], "not a Qt resource"),
    (lambda b: b[:10], "header"),
    (lambda b: _patch(b, 4, ">I", 9), "unsupported rcc version"),
    (lambda b: b[:-30], "past the end"),  # names cut short
    (lambda b: _patch(b, 20 + 22 + 10, ">I", 1), "do not follow it"),  # a loop to the root
    (lambda b: _patch(b, 20 + 22 + 6, ">I", 1 << 30), "do not follow it"),
    (lambda b: _patch(b, 20 + 4 * 22, ">I", 1 << 30), "past the end"),  # a file's length
    (lambda b: _patch(b, 20 + 3 * 22 + 10, ">I", 1 << 30), "past the end"),  # its offset
])
def test_a_malformed_resource_is_one_error(mangle: object, message: str) -> None:
    with pytest.raises(qrcc.RccError, match=message):
        dict(qrcc.files(mangle(_rcc())))  # type: ignore[operator]


def test_a_zlib_bomb_is_refused_before_inflating() -> None:
    blob = _rcc()
    at = 20 + 4 * 22 + 4  # first file's data: u32 length, then u32 unpacked size
    with pytest.raises(qrcc.RccError, match="limit"):
        dict(qrcc.files(_patch(blob, at, ">I", qrcc.MAX_FILE + 1)))
    with pytest.raises(qrcc.RccError, match="header says"):
        dict(qrcc.files(_patch(blob, at, ">I", 7)))
