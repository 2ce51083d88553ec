"""Entropy coding with calibrated per-channel priors: interleaved rANS, vectorised in numpy.

The API other code uses (the ``ansN`` packing, :mod:`ble_protocol.priors`; a learned bottleneck
calls it the same way)::

    priors = ChannelPriors.from_counts(counts, precision=12, name="c003/x/ans4")  # (C, K)
    data = encode(symbols, priors)               # symbols: (C, N) integers -> bytes
    symbols = decode(data, priors, C, N)         # -> (C, N) int64; ProtocolError otherwise

**Priors.** :class:`ChannelPriors` holds, per channel ``c`` (and per context, below), an
integer pmf over ``K`` symbols ``offsets[c] .. offsets[c] + K - 1`` plus one *escape*:
``freqs`` is ``(C, K + 1)`` or ``(C, X, K + 1)``, every entry >= 1 (no symbol is ever
uncodable), each row summing to ``2**precision`` (``precision`` <= 16). ``key`` is a 4-byte
content hash (name, precision, contexts, offsets, freqs): every stream starts with it, and
decoding with other priors is a ProtocolError.

**Out-of-range symbols are escaped, never clipped**: a symbol outside its channel's window is
coded as the escape (``freqs[c, K]``, cost ``precision - log2 freqs[c, K]`` bits) and its value
travels after the lane states as a zigzag LEB128 varint, in C order of the symbols. Encoding
is exact for every int64 symbol.

**Contexts** (``X = 16``; ``X = 1``: none). Symbol ``n`` of a channel is coded with the pmf of
context ``4 * b(left) + b(above)``: ``left`` is symbol ``n - 1`` of the channel, ``above``
symbol ``n - width`` (``width``: the row length, e.g. ``W`` of an ``H x W`` map; 0 = none),
each only when it lies in the same lane at an earlier step (else bucket 0), and ``b`` buckets
the in-range index ``k = symbol - offset`` (the escape is ``K``): 0 for 0, 1 for 1, 2 for
2..3, 3 for 4 and more (:func:`contexts`). A ReLU map's zeros come in patches: on real
activations this halves the bits of 2- to 4-bit levels against one pmf per channel.

**Coder.** rANS with 32-bit states in ``[2**16, 2**32)`` and 16-bit renormalisation (at most one
word per symbol; ryg's ``rans_word``). The ``S = C * N`` symbols, in C order, are cut into ``L``
lanes of ``T = ceil(S / L)`` consecutive symbols (the last lane shorter); each numpy step codes
one symbol of every lane, so Python runs ``T`` steps, not ``S``. A lane costs its final state
(4 B, of which ~2 B are data): :func:`lanes_for` picks ``L ~ sqrt(S) / 2``, at least
``S / MAX_STEPS``. Positions past ``S`` code with frequency ``2**precision`` (the identity).
The encoder starts every lane at ``2**16``; the decoder must end every lane there having read
every word, which rejects a corrupt stream or other priors (on top of the key).

**Stream** (all little-endian)::

    key      4 B     ChannelPriors.key
    lanes    varint  L: 0 iff S == 0, else 1..S with ceil(S / ceil(S / L)) == L
    escapes  varint  E: bytes of escape values
    states   4 L B   each lane's initial decoder state, u32 in [2**16, 2**32)
    values   E B     one zigzag LEB128 varint (<= 10 B, minimal) per escaped symbol
    words    rest    u16 renormalisation words, in the order the decoder reads them

**Hostile bytes.** :func:`decode` raises only :class:`ProtocolError` (TRUNCATED or MALFORMED).
It checks every length before allocating; it allocates O(C * N) (a few arrays of
``T * L < S + L`` entries, at most 8 B each, and the output) and never more, whatever the stream
declares; it loops ``T <= MAX_STEPS`` times over arrays of ``L <= S`` lanes: it cannot hang.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from coinf.errors import ErrorCode, ProtocolError

MAX_PRECISION = 16
STATE_BITS = 16  # lane states live in [2**16, 2**32)
STATE_LOW = 1 << STATE_BITS
WORD_BITS = 16
#: most numpy steps a stream may take (``ceil(S / L)``); the decoder refuses more
MAX_STEPS = 1024
#: lanes per sqrt(symbol): a lane costs ~4 B on the radio (~0.2 ms at 20 kB/s) and its first
#: symbols lose their context; it saves ``S / L**2`` steps of ~0.1 ms on a Pi Zero 2 W
LANE_FACTOR = 0.5
KEY_SIZE = 4
#: contexts of a context-modelled table (4 buckets of the left x 4 of the above symbol)
CONTEXTS = 16
_U64 = np.uint64


def lanes_for(count: int) -> int:
    """Lanes the encoder uses for ``count`` symbols: ``ceil(LANE_FACTOR * sqrt(count))``, at
    least ``ceil(count / MAX_STEPS)``, at most ``count``, then trimmed so no lane is empty."""
    if count <= 0:
        return 0
    lanes = max(math.ceil(LANE_FACTOR * math.sqrt(count)), -(-count // MAX_STEPS))
    steps = -(-count // min(lanes, count))
    return -(-count // steps)


@dataclass(frozen=True, eq=False)
class ChannelPriors:
    """Per-channel integer pmfs (module docstring): ``freqs`` ``(C, K + 1)``, or ``(C, 16,
    K + 1)`` per context, last column the escape, rows summing to ``2**precision``; ``offsets``
    ``(C,)``, the symbol of column 0; ``name`` labels the table (hashed into :attr:`key`)."""

    freqs: np.ndarray
    offsets: np.ndarray
    precision: int
    name: str = ""
    _cache: dict[str, object] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        f = np.asarray(self.freqs)
        if f.ndim == 2:
            f = f[:, None, :]
        if f.ndim != 3 or f.shape[1] not in (1, CONTEXTS) or min(f.shape) < 1 \
                or f.dtype.kind not in "iu":
            raise ValueError(f"freqs must be a (C, K + 1) or (C, {CONTEXTS}, K + 1) integer "
                             f"array, got {f.shape} {f.dtype}")
        if not isinstance(self.precision, int) or not 1 <= self.precision <= MAX_PRECISION:
            raise ValueError(f"precision must be 1..{MAX_PRECISION}, got {self.precision}")
        if f.min() < 1 or np.any(f.sum(axis=2, dtype=np.int64) != 1 << self.precision):
            raise ValueError(f"every frequency must be >= 1 and every row sum to "
                             f"2**{self.precision}")
        off = np.zeros(f.shape[0], np.int64) if self.offsets is None else np.asarray(
            self.offsets)
        if off.shape != (f.shape[0],) or off.dtype.kind not in "iu":
            raise ValueError(f"offsets must be ({f.shape[0]},) integers, got {off.shape}")
        if np.any(np.abs(off.astype(np.float64)) > 2.0 ** 62):
            raise ValueError("offsets must lie within +-2**62")
        small = np.uint16 if int(f.max()) <= 0xFFFF else np.uint32  # half the memory
        object.__setattr__(self, "freqs", np.ascontiguousarray(f, dtype=small))
        object.__setattr__(self, "offsets", np.ascontiguousarray(off, dtype=np.int64))
        self.freqs.setflags(write=False)
        self.offsets.setflags(write=False)

    @property
    def channels(self) -> int:
        return int(self.freqs.shape[0])

    @property
    def contexts(self) -> int:
        """X: 1, or :data:`CONTEXTS` for a context-modelled table."""
        return int(self.freqs.shape[1])

    @property
    def symbols(self) -> int:
        """K: in-range symbols per channel (the escape not counted)."""
        return int(self.freqs.shape[2]) - 1

    @cached_property
    def key_bytes(self) -> bytes:
        h = hashlib.blake2b(digest_size=KEY_SIZE, person=b"coinf-priors")
        h.update(self.name.encode("utf-8") + b"\0")
        h.update(np.array([self.precision, self.channels, self.contexts, self.symbols],
                          "<u4").tobytes())
        h.update(self.offsets.astype("<i8").tobytes())
        h.update(self.freqs.astype("<u4").tobytes())
        return h.digest()

    @property
    def key(self) -> str:
        """The content hash, 8 hex digits (what a stream names)."""
        return self.key_bytes.hex()

    @classmethod
    def from_counts(cls, counts: np.ndarray, precision: int, offsets: np.ndarray | None = None,
                    name: str = "", pooled_weight: float = 1.0) -> ChannelPriors:
        """Priors from observed counts ``(C, K)`` or ``(C, 16, K)`` per context (symbol
        ``offsets[c] + k``): each row's counts plus ``pooled_weight * K`` pseudo-counts spread
        as all channels together in that context (a row seen rarely leans on the tensor's pmf),
        normalised to ``2**precision - K - 1`` and floored at 1 per symbol, the escape 1;
        rounding goes to the largest remainders."""
        counts = np.asarray(counts, dtype=np.float64)
        shape = counts.shape
        if counts.ndim == 2:
            counts = counts[:, None, :]
        if counts.ndim != 3 or min(counts.shape) < 1 or counts.min() < 0:
            raise ValueError(f"counts must be a non-negative (C, K) or (C, X, K) array, got "
                             f"{shape}")
        c, x, k = counts.shape
        free = (1 << precision) - (k + 1)  # after the floor of 1 per symbol and the escape
        if free < 0:
            need = math.ceil(math.log2(k + 1))
            raise ValueError(f"{k} symbols + escape need precision >= {need}")
        pooled = counts.sum(axis=0, keepdims=True) + 0.5
        pooled /= pooled.sum(axis=2, keepdims=True)
        p = (counts + pooled_weight * k * pooled).reshape(c * x, k)
        p /= p.sum(axis=1, keepdims=True)
        share = p * free
        base = np.floor(share).astype(np.int64)
        short = free - base.sum(axis=1)  # 0 <= short < k
        order = np.argsort(-(share - base), axis=1, kind="stable")
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(k)[None, :].repeat(c * x, 0), axis=1)
        base += rank < short[:, None]
        freqs = np.concatenate([base + 1, np.ones((c * x, 1), np.int64)], axis=1)
        return cls(freqs.reshape(c, x, k + 1) if len(shape) == 3 else freqs,
                   np.zeros(c, np.int64) if offsets is None else offsets, precision, name)

    # -- tables, built once per priors ------------------------------------------------------
    def _table(self, name: str) -> np.ndarray:
        got = self._cache.get(name)
        if got is None:
            got = self._cache[name] = self._build(name)
        assert isinstance(got, np.ndarray)
        return got

    def _build(self, name: str) -> np.ndarray:
        """Flat tables over entries ``(row * (K + 1) + k)``, row ``c * X + context``, plus one
        sentinel entry for padding positions (frequency ``2**P``, start 0: the identity)."""
        m, k1 = 1 << self.precision, self.symbols + 1
        f = self.freqs.reshape(-1, k1).astype(np.int64)
        start = np.cumsum(f, axis=1) - f  # exclusive cumulative frequency
        if name == "freq":
            return np.append(f.reshape(-1), m).astype(_U64)
        if name == "start":
            return np.append(start.reshape(-1), 0).astype(_U64)
        if name == "symbol":  # entry -> in-range index k (the escape: K)
            return np.append(np.tile(np.arange(k1, dtype=np.int32), len(f)), 0)
        if name == "bucket":
            return _bucket(self._table("symbol")).astype(np.uint8)
        if name.endswith("+1"):  # indexed by searchsorted's answer, entry + 1
            first = self._table(name[:-2])
            return np.concatenate([np.zeros(1, first.dtype), first])
        # "global": the decoder's sorted starts, row * 2**precision + start
        base = (np.arange(len(f), dtype=np.int64) << self.precision)[:, None]
        return np.append((start + base).reshape(-1), len(f) << self.precision).astype(_U64)

    def cost_bits(self, symbols: np.ndarray, width: int = 0) -> float:
        """Ideal code length of ``symbols`` (C, N) under these priors, in bits (one lane, no
        states, no escape values): what :func:`encode` approaches."""
        idx, _, _ = _indices(np.asarray(symbols), self)
        entries = self._entries(idx, width, max(idx.size, 1))
        f = self._table("freq")[entries].astype(np.float64)
        return float(np.sum(self.precision - np.log2(f)))

    def _entries(self, idx: np.ndarray, width: int, steps: int) -> np.ndarray:
        """Flat table entries of in-range indices ``idx`` (C, N), lanes of ``steps``."""
        k1, x = self.symbols + 1, self.contexts
        rows = (np.arange(self.channels, dtype=np.int64) * x)[:, None]
        if x > 1:
            rows = rows + contexts(idx, width, steps)
        return (rows * k1 + idx).reshape(-1)


def _bucket(k: np.ndarray) -> np.ndarray:
    return (k >= 1).astype(np.int64) + (k >= 2) + (k >= 4)


def contexts(idx: np.ndarray, width: int = 0, steps: int | None = None) -> np.ndarray:
    """Context ``4 * b(left) + b(above)`` of every in-range index ``idx`` (C, N) (module
    docstring), for lanes of ``steps`` consecutive symbols (None: one lane)."""
    c, n = idx.shape
    b = _bucket(idx)
    at = np.arange(c * n, dtype=np.int64).reshape(c, n)
    step = at if steps is None else at % steps  # a neighbour counts only in the same lane
    col = np.arange(n)[None, :]
    out = np.zeros((c, n), np.int64)
    out[:, 1:] = 4 * b[:, :-1]
    out *= (col >= 1) & (step >= 1)
    if 0 < width < n:
        above = np.zeros((c, n), np.int64)
        above[:, width:] = b[:, :-width]
        out += above * ((col >= width) & (step >= width))
    return out


def _indices(symbols: np.ndarray, priors: ChannelPriors) -> tuple[np.ndarray, np.ndarray,
                                                                   np.ndarray]:
    """(flat table index per symbol, escape mask, symbols as int64), C order."""
    if symbols.ndim != 2 or symbols.shape[0] != priors.channels or symbols.dtype.kind not in "iub":
        raise ValueError(f"symbols must be ({priors.channels}, N) integers, got "
                         f"{symbols.shape} {symbols.dtype}")
    if symbols.dtype.kind == "u" and symbols.size and int(symbols.max()) > np.iinfo(np.int64).max:
        raise ValueError("symbols must fit int64")
    s = symbols.astype(np.int64)
    k = priors.symbols
    rel = s - priors.offsets[:, None]
    esc = (rel < 0) | (rel >= k)
    return np.where(esc, k, rel), esc.reshape(-1), s.reshape(-1)


# --- encoding ---------------------------------------------------------------------------------


def encode(symbols: np.ndarray, priors: ChannelPriors, lanes: int | None = None,
           width: int = 0) -> bytes:
    """The stream of ``symbols`` (C, N) under ``priors`` (module docstring); ``width``: the
    row length of the above-context (the decoder must be given the same). ``lanes``
    overrides :func:`lanes_for` (trimmed the same way, at least ``S / MAX_STEPS``)."""
    idx, esc, flat = _indices(np.asarray(symbols), priors)
    count = idx.size
    if lanes is None:
        lanes = lanes_for(count)
    elif count:
        lanes = max(1, min(int(lanes), count), -(-count // MAX_STEPS))
        lanes = -(-count // -(-count // lanes))
    else:
        lanes = 0
    values = _varints(_zigzag(flat[esc])) if esc.any() else b""
    head = priors.key_bytes + _varint(lanes) + _varint(len(values))
    if count == 0:
        return head + values
    steps = -(-count // lanes)
    pad = steps * lanes - count
    entries = priors._entries(idx, width, steps)
    padded = np.concatenate([entries, np.full(pad, len(priors._table("freq")) - 1)])
    order = padded.reshape(lanes, steps).T  # row t: symbol t of every lane
    freq = np.ascontiguousarray(priors._table("freq")[order])
    start = np.ascontiguousarray(priors._table("start")[order])
    gain = _U64(1 << priors.precision) - freq  # x' = x + (x // f) * (2**P - f) + start
    limit = freq << _U64(2 * STATE_BITS - priors.precision)  # renormalise when x >= limit
    x = np.full(lanes, STATE_LOW, _U64)
    before = np.empty((steps, lanes), _U64)  # each step's state and whether it emitted a word
    emits = np.empty((steps, lanes), bool)
    q = np.empty(lanes, _U64)
    shift = _U64(WORD_BITS)
    for t in range(steps - 1, -1, -1):
        np.greater_equal(x, limit[t], out=emits[t])
        before[t] = x
        x = np.where(emits[t], x >> shift, x)
        np.floor_divide(x, freq[t], out=q)
        q *= gain[t]
        x += q
        x += start[t]
    words = before[emits] & _U64((1 << WORD_BITS) - 1)  # step 0 first: the decoder's order
    return b"".join((head, x.astype("<u4").tobytes(), values, words.astype("<u2").tobytes()))


def _zigzag(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.int64)
    return (v.view(_U64) << _U64(1)) ^ (v >> 63).view(_U64)


def _varint(value: int) -> bytes:
    return _varints(np.array([value], _U64))


def _varints(v: np.ndarray) -> bytes:
    """Minimal LEB128 of each uint64, concatenated (vectorised)."""
    v = v.astype(_U64)
    groups = np.ones(v.size, np.int64)
    for k in range(1, 10):
        groups += (v >> _U64(7 * k)) != 0
    out = np.empty(int(groups.sum()), np.uint8)
    first = np.cumsum(groups) - groups
    for k in range(10):
        sel = groups > k
        if not sel.any():
            break
        byte = (v[sel] >> _U64(7 * k)) & _U64(0x7F)
        more = (groups[sel] > k + 1).astype(_U64) << _U64(7)
        out[first[sel] + k] = (byte | more).astype(np.uint8)
    return out.tobytes()


# --- decoding (hostile bytes) -----------------------------------------------------------------


def _bad(text: str) -> ProtocolError:
    return ProtocolError(ErrorCode.MALFORMED, f"entropy-coded tensor: {text}")


def _short(text: str) -> ProtocolError:
    return ProtocolError(ErrorCode.TRUNCATED, f"entropy-coded tensor: {text}")


def stream_key(data: bytes | memoryview) -> str:
    """The priors key a stream names (8 hex digits); TRUNCATED if it is shorter than one."""
    mv = memoryview(data)
    if len(mv) < KEY_SIZE:
        raise _short(f"{len(mv)} B, shorter than its {KEY_SIZE}-B priors key")
    return bytes(mv[:KEY_SIZE]).hex()


def _read_varint(mv: memoryview, pos: int, what: str) -> tuple[int, int]:
    value = 0
    for k in range(5):  # lanes and escape bytes fit 32 bits
        if pos >= len(mv):
            raise _short(f"cut short in its {what}")
        byte = mv[pos]
        pos += 1
        value |= (byte & 0x7F) << (7 * k)
        if not byte & 0x80:
            if byte == 0 and k:
                raise _bad(f"{what} varint is not minimal")
            return value, pos
    raise _bad(f"{what} varint longer than 5 bytes")


def decode(data: bytes | memoryview, priors: ChannelPriors, channels: int, count: int,
           width: int = 0) -> np.ndarray:
    """The ``(channels, count)`` int64 symbols of a stream coded with ``priors`` (and
    ``width``, as encoded); :class:`ProtocolError` for anything else (other priors, corrupt
    or cut bytes)."""
    mv = memoryview(data).cast("B")
    if stream_key(mv) != priors.key:
        raise _bad(f"coded with priors {stream_key(mv)}, not {priors.key} ({priors.name})")
    if channels != priors.channels or count < 0:
        raise _bad(f"{channels} channels x {count}; the priors have {priors.channels} channels")
    total = channels * count
    lanes, pos = _read_varint(mv, KEY_SIZE, "lane count")
    nvalues, pos = _read_varint(mv, pos, "escape length")
    if total == 0:
        if lanes or nvalues or pos != len(mv):
            raise _bad("an empty tensor carries no lanes, escapes or words")
        return np.zeros((channels, count), np.int64)
    if not 1 <= lanes <= total:
        raise _bad(f"{lanes} lanes for {total} symbols")
    steps = -(-total // lanes)
    if steps > MAX_STEPS or -(-total // steps) != lanes:
        raise _bad(f"{lanes} lanes for {total} symbols: {steps} steps (at most {MAX_STEPS}, "
                   f"no empty lane)")
    if len(mv) - pos < 4 * lanes + nvalues:
        raise _short(f"{len(mv) - pos} B left for {lanes} lane states and {nvalues} B of escapes")
    x = np.frombuffer(mv, "<u4", lanes, pos).astype(_U64)
    pos += 4 * lanes
    if int(x.min()) < STATE_LOW:
        raise _bad("a lane state is below 2**16")
    values = np.frombuffer(mv, np.uint8, nvalues, pos)
    pos += nvalues
    if (len(mv) - pos) % 2:
        raise _bad("odd number of word bytes")
    words = np.frombuffer(mv, "<u2", (len(mv) - pos) // 2, pos).astype(_U64)
    table = _run(x, words, priors, count, lanes, steps, width)
    k = priors.symbols
    sym = table.T.reshape(-1)[:total].reshape(channels, count)  # 0..K-1, K the escape
    del table
    out = sym + priors.offsets[:, None]  # int64
    esc = sym == k
    n_esc = int(np.count_nonzero(esc))
    if n_esc or nvalues:
        got = _unzigzag(_parse_varints(values, n_esc))
        rel = got - np.broadcast_to(priors.offsets[:, None], esc.shape)[esc]
        if np.any((rel >= 0) & (rel < k)):
            raise _bad("an escaped value lies in its channel's range")
        out[esc] = got
    return out


def _run(x: np.ndarray, words: np.ndarray, priors: ChannelPriors, count: int, lanes: int,
         steps: int, width: int) -> np.ndarray:
    """The decoding loop: (steps, lanes) in-range indices; the lane states must end at 2**16
    with every word read."""
    prec, ctx_on = priors.precision, priors.contexts > 1
    starts = priors._table("global")
    # indexed by searchsorted's answer j = entry + 1: no subtraction per step (cached)
    freqs, firsts = priors._table("freq+1"), priors._table("global+1")
    symbol, bucket = priors._table("symbol+1"), priors._table("bucket+1")
    at = np.arange(steps * lanes, dtype=np.int32 if steps * lanes < 2**31 else np.int64)
    chan, col = np.divmod(at.reshape(lanes, steps).T, count)
    del at
    chan = np.minimum(chan, priors.channels, out=chan)  # padding: the sentinel row
    col[chan == priors.channels] = 0  # padding: no context
    base = (chan * priors.contexts).astype(_U64) << _U64(prec)
    del chan
    above = ctx_on and 0 < width < count
    # a decoded bucket b moves the key by b * left (4 rows) or b * up (1 row) when that
    # neighbour counts: 0 at a channel's first column (row), and for padding
    left = np.where(col >= 1, np.uint32(4 << prec), np.uint32(0)) if ctx_on else None
    up = np.where(col >= width, np.uint32(1 << prec), np.uint32(0)) if above else None
    del col
    table = np.empty((steps, lanes), np.int32)
    seen = np.zeros((steps, lanes), np.uint8)  # decoded buckets (contexts of later steps)
    shift, scale, low = _U64(WORD_BITS), _U64(1 << prec), _U64(STATE_LOW)
    used, nwords = 0, words.size
    for t in range(steps):
        high, slot = np.divmod(x, scale)
        key = base[t] + slot
        if left is not None and t:
            key += seen[t - 1] * left[t]
            if up is not None and t >= width:
                key += seen[t - width] * up[t]
        j = np.searchsorted(starts, key, side="right")
        table[t] = symbol[j]
        if ctx_on:
            seen[t] = bucket[j]
        x = freqs[j] * high + (key - firsts[j])
        need = x < low
        n = int(np.count_nonzero(need))
        if n:
            if used + n > nwords:
                raise _short(f"words run out at step {t} of {steps}")
            x[need] = (x[need] << shift) | words[used:used + n]
            used += n
    if used != nwords:
        raise _bad(f"{nwords - used} words left over (corrupt, or coded with other priors)")
    if np.any(x != low):
        raise _bad("lanes do not end in their initial state (corrupt, or other priors)")
    return table


def _parse_varints(b: np.ndarray, n: int) -> np.ndarray:
    """Exactly ``n`` minimal LEB128 uint64 filling ``b``; MALFORMED otherwise."""
    if n == 0:
        if b.size:
            raise _bad(f"{b.size} B of escape values but no escaped symbol")
        return np.zeros(0, _U64)
    ends = np.flatnonzero(b < 0x80)
    if ends.size != n or (n and ends[-1] != b.size - 1):
        raise _bad(f"{b.size} B of escape values do not hold exactly {n} varints")
    first = np.concatenate([[0], ends[:-1] + 1])
    size = ends - first + 1
    if np.any(size > 10) or np.any((size > 1) & (b[ends] == 0)) or np.any(
            (size == 10) & (b[ends] > 1)):
        raise _bad("an escape value is not a minimal 64-bit varint")
    group = np.repeat(np.arange(n), size)
    shift = (np.arange(b.size) - first[group]) * 7
    parts = (b.astype(_U64) & _U64(0x7F)) << shift.astype(_U64)
    return np.bitwise_or.reduceat(parts, first)


def _unzigzag(v: np.ndarray) -> np.ndarray:
    v = v.astype(_U64)
    return ((v >> _U64(1)) ^ (_U64(0) - (v & _U64(1)))).view(np.int64)
