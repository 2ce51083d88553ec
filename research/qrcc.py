"""Read the files of a Qt binary resource (``.rcc``), e.g. the photographs that Debian's
``gcompris-qt-data`` keeps in ``usr/share/gcompris-qt/rcc/*.rcc``.

Format (Qt's ``rcc`` tool, versions 1-3, all big-endian): a 20-byte header ``qres``, version,
then the offsets of the tree, the data and the names (version 3 adds 4 bytes of flags). The tree
is an array of nodes (14 bytes, 22 from version 2 on: a trailing 8-byte mtime): name offset u32,
flags u16 (2 = directory, 1 = zlib, 4 = zstd), then for a directory the child count u32 and the
first child's index u32, for a file country u16, language u16 and the data offset u32. A name is
length u16 (UTF-16 units), hash u32 and the UTF-16BE text; a file's data is length u32 then the
bytes (zlib: a u32 of the unpacked size, then the stream). Node 0 is the root directory.

The file is read from a package, not from the wire, but it is still bounds-checked: every offset
and length is checked against the blob, the walk is bounded in nodes and depth, and a file's
unpacked size in bytes, so a malformed file is one :class:`RccError`, never a hang.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

#: refuse to unpack one file larger than this (GCompris's largest picture is ~1 MB)
MAX_FILE = 64 << 20
MAX_DEPTH = 32
MAX_NODES = 1 << 20

DIRECTORY, ZLIB, ZSTD = 2, 1, 4


class RccError(ValueError):
    """A malformed or unsupported ``.rcc`` blob."""


def _get(blob: bytes, fmt: str, at: int, what: str) -> tuple[int, ...]:
    size = struct.calcsize(fmt)
    if at < 0 or at + size > len(blob):
        raise RccError(f"{what} at {at} (+{size}) is past the end ({len(blob)} bytes)")
    return struct.unpack_from(fmt, blob, at)


def files(blob: bytes) -> Iterator[tuple[str, bytes]]:
    """``(path, bytes)`` of every file in the resource, paths ``a/b/c.png`` (no leading slash),
    unpacked. Raises :class:`RccError` on anything malformed."""
    magic, version, tree, data, names = _get(blob, ">4sIIII", 0, "header")
    if magic != b"qres":
        raise RccError(f"not a Qt resource: magic {magic!r}")
    if not 1 <= version <= 3:
        raise RccError(f"unsupported rcc version {version} (1-3 are known)")
    node = 14 if version == 1 else 22
    seen = 0

    def name(off: int) -> str:
        (n,) = _get(blob, ">H", names + off, "name length")
        at = names + off + 6
        if at + 2 * n > len(blob):
            raise RccError(f"name at {names + off} ({n} units) is past the end")
        return blob[at:at + 2 * n].decode("utf-16-be", errors="replace")

    def walk(i: int, prefix: str, depth: int) -> Iterator[tuple[str, bytes]]:
        nonlocal seen
        seen += 1
        if seen > MAX_NODES or depth > MAX_DEPTH:
            raise RccError("resource tree too large or too deep (a loop?)")
        base = tree + i * node
        noff, flags = _get(blob, ">IH", base, f"node {i}")
        label = name(noff) if i else ""
        if "/" in label or label in (".", ".."):
            raise RccError(f"node {i}: bad name {label!r}")
        if flags & DIRECTORY:
            count, first = _get(blob, ">II", base + 6, f"node {i}")
            if first <= i or count > MAX_NODES:
                raise RccError(f"node {i}: children {first}+{count} do not follow it")
            for child in range(first, first + count):
                yield from walk(child, f"{prefix}{label}/" if label else prefix, depth + 1)
            return
        (doff,) = _get(blob, ">I", base + 10, f"node {i}")
        (size,) = _get(blob, ">I", data + doff, f"data of {prefix}{label}")
        start = data + doff + 4
        if start + size > len(blob):
            raise RccError(f"data of {prefix}{label} ({size} bytes) is past the end")
        raw = blob[start:start + size]
        if flags & ZLIB:
            (unpacked,) = _get(raw, ">I", 0, f"zlib size of {prefix}{label}")
            if unpacked > MAX_FILE:
                raise RccError(f"{prefix}{label}: {unpacked} bytes unpacked (limit {MAX_FILE})")
            inflater = zlib.decompressobj()
            try:
                raw = inflater.decompress(raw[4:], MAX_FILE + 1)
            except zlib.error as e:
                raise RccError(f"{prefix}{label}: bad zlib data ({e})") from None
            if len(raw) != unpacked:
                raise RccError(f"{prefix}{label}: {len(raw)} bytes unpacked, header says "
                               f"{unpacked}")
        elif flags & ZSTD:
            raise RccError(f"{prefix}{label}: zstd-compressed entries are not supported")
        yield prefix + label, bytes(raw)

    yield from walk(0, "", 0)
