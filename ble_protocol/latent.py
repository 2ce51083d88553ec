"""Learned bottleneck codes on the wire: the ``latent`` packing (wire codec 12, docs/PACKING.md).

A learned compressor (``coinf compress``, docs/BOTTLENECK.md) ends its encoder in an integer
latent, float32 ``(1, C, ...)`` holding integers clipped per channel to its entropy model's
range, and ships that model as a ``coinf-pmf`` table in the bundle. ``latent`` codes those
integers exactly with :mod:`ble_protocol.entropy` under that table: ``C`` channels along axis 1,
one pmf per channel (no contexts), symbols ``offsets[c] .. offsets[c] + K - 1``. Nothing is
quantised here; the stream names its table by key (the first 4 bytes), and a receiver decodes
only under a table it registered from its own bundle (the compressor's files are part of the
bundle identity, so both sides hold the same table).

Both sides register their bundle's learned tables when they open its compressors
(``convert.compressors.CodecRunner``); :func:`lookup` finds them by key. A stream naming a key
this side lacks, a table of another channel count, or a stream that does not decode is a
:class:`ProtocolError`, allocating at most the declared shape (bounded by the receiver's budget
before this runs).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence

import numpy as np
from coinf.ble_protocol import entropy

from coinf.errors import ErrorCode, ProtocolError

#: the wire codec number of the ``latent`` packing
LATENT = 12
#: the entropy coder's largest precision
PRECISION = entropy.MAX_PRECISION

_BOOK: dict[str, entropy.ChannelPriors] = {}
_LOCK = threading.Lock()

Book = Mapping[str, entropy.ChannelPriors]


def table(offsets: Sequence[int], freqs: Sequence[Sequence[int]], precision: int,
          name: str) -> entropy.ChannelPriors:
    """The coder's priors from a ``coinf-pmf`` table (per channel an offset and its symbols'
    frequencies, each row summing to ``2**precision``): one column per symbol of the widest
    channel plus the escape; a narrower channel's extra columns and the escape get the floor
    of 1, taken from its most likely symbols (precision above 16 is scaled down)."""
    if not freqs or len(offsets) != len(freqs):
        raise ValueError("a latent table needs one offset and one frequency row per channel")
    width = max(len(f) for f in freqs)
    counts = np.zeros((len(freqs), width), np.float64)
    for c, row in enumerate(freqs):
        counts[c, :len(row)] = np.asarray(row, np.float64)
    prec = max(min(int(precision), PRECISION), math.ceil(math.log2(width + 2)) + 1)
    return entropy.ChannelPriors.from_counts(counts, prec, np.asarray(offsets, np.int64),
                                             name=f"latent/{name}", pooled_weight=0.0)


def register(priors: entropy.ChannelPriors) -> str:
    """Make a table decodable by key (idempotent); returns the key."""
    with _LOCK:
        _BOOK[priors.key] = priors
    return priors.key


def lookup(key: str, book: Book | None = None) -> entropy.ChannelPriors | None:
    if book is not None:
        return book.get(key)
    with _LOCK:
        return _BOOK.get(key)


def channels_of(shape: tuple[int, ...]) -> int:
    """Latent channels: axis 1 of a ``(B, C, ...)`` code (1 for fewer dims)."""
    return int(shape[1]) if len(shape) >= 2 else 1


def encode(code: np.ndarray, priors: entropy.ChannelPriors) -> bytes:
    """The entropy stream of an integer-valued code under ``priors`` (exact: a value outside
    a channel's range is escaped, a fractional one is refused)."""
    arr = np.asarray(code)
    sym = np.rint(arr).astype(np.int64)
    if not np.array_equal(sym, arr):
        raise ValueError("a latent code must hold integers (the encoder rounds them)")
    c = channels_of(arr.shape)
    if c != priors.channels:
        raise ValueError(f"the code has {c} channels, its table {priors.channels}")
    return entropy.encode(np.moveaxis(sym, 1, 0).reshape(c, -1) if arr.ndim >= 2
                          else sym.reshape(1, -1), priors)


def decode(payload: bytes | memoryview, shape: tuple[int, ...], book: Book | None = None
           ) -> np.ndarray:
    """float32 ``shape`` from a stream; ProtocolError on an unknown table, another channel
    count or a stream that does not decode."""
    key = entropy.stream_key(payload)
    priors = lookup(key, book)
    if priors is None:
        raise ProtocolError(ErrorCode.MALFORMED, f"latent code under table {key}, which this "
                            f"side does not have (another bundle's compressor?)")
    c = channels_of(shape)
    count = math.prod(shape)
    if c != priors.channels or count % c:
        raise ProtocolError(ErrorCode.MALFORMED, f"latent code of shape {list(shape)} under a "
                            f"table of {priors.channels} channels")
    sym = entropy.decode(payload, priors, c, count // c)
    if len(shape) < 2:
        return sym.astype(np.float32).reshape(shape)
    moved = (shape[1], shape[0], *shape[2:])
    return np.moveaxis(sym.astype(np.float32).reshape(moved), 0, 1).copy()


__all__ = ["LATENT", "Book", "channels_of", "decode", "encode", "lookup", "register", "table"]
