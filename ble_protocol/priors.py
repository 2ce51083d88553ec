"""Calibrated entropy priors of the ``ansN`` packing: per tensor, layout, bundle files, lookup.

``ansN`` (docs/PACKING.md) quantizes a float tensor exactly as ``qN``/``qzN`` do (same levels,
same decoded values) and codes the levels with :mod:`ble_protocol.entropy` under per-channel
priors calibrated offline for that cut, tensor and bit width (:mod:`convert.entropy_cal`).

**Channels.** A tensor's levels become ``(C, N)`` along :func:`channel_axis`: axis 1 of a 2-D
``[B, F]`` or 4-D+ ``[B, C, ...]`` tensor (ONNX is channels-first), the last axis of a 3-D
``[B, T, D]`` one, one channel for 0-D/1-D tensors or when the axis has more than
:data:`MAX_CHANNELS` entries. The symbols of a channel are its levels ``0 .. 2**N - 1``
(offset 0), so an ``ansN`` table never escapes; the escape still costs one
``2**-precision`` of probability (:func:`precision_for`). Where a channel holds a sequence
(``N >= 2``) and the table stays under :data:`MAX_ENTRIES`, each channel has 16 context pmfs
(left and above neighbour, :func:`ble_protocol.entropy.contexts`; the row length
:func:`width_of` is ``W`` of a ``[B, C, H, W]`` map).

**Centred tables.** ``qN`` maps each input's own ``[min, max]`` to the levels, so the level of
the value 0 moves from input to input unless ``min`` is 0 (a ReLU map). A *centred* table codes
``fold(level - z)`` instead, ``z`` the level of 0 (:func:`zero_level`, from the header's scale
and offset, so both sides agree), ``fold`` the zigzag map (0, -1, 1, -2, ... -> 0, 1, 2, 3,
...): ``2**(N+1)`` symbols whose pmf no longer moves with the range. Calibration keeps the
variant whose cross-fitted code length is smaller (on MobileNetV2's linear bottlenecks,
centred is ~12% shorter at 4 bits; on ReLU maps ``z`` is 0 and plain wins).

**Bundle files** (written by ``coinf calibrate``, read on both sides)::

    priors.json   {"format": "coinf-entropy-priors", "version": 1, "data": "priors.bin",
                   "tables": [{"key", "cut", "tensor", "bits", "axis", "centered",
                               "channels", "contexts", "symbols", "precision", "at",
                               "size", "zstd"}, ...]}
    priors.bin    per table, "size" bytes at byte "at": freqs (C x X x (K + 1)
                  little-endian u16), then offsets (C x little-endian i64), as one zstd
                  frame when "zstd" (~5x smaller: most entries are the floor of 1)

No pickle: JSON and raw little-endian arrays. A table's ``key`` is its
:attr:`ChannelPriors.key`, over its content and its name ``CUT/TENSOR/ansN/axisA``, and is
checked on reading. The manifest's ``entropy_priors`` entry says the bundle has them; a bundle
the process loads with :meth:`Bundle.load` is remembered (``coinf.bundle.PRIOR_ROOTS``), and
:func:`lookup` reads a table from there the first time a packed body or a calibration row names
its key. Calibration data is not part of the bundle identity: two sides that calibrated apart
have other keys, and a body naming a key the receiver lacks is a ProtocolError.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from coinf.ble_protocol import codecs, entropy

from coinf import bundle as bundle_mod
from coinf.errors import BundleError, ErrorCode, ProtocolError

log = logging.getLogger(__name__)

INDEX = "priors.json"
DATA = "priors.bin"
FORMAT = "coinf-entropy-priors"
VERSION = 1
MAX_BITS = 8
MAX_CHANNELS = 4096
#: most frequencies of a fitted table: beyond, one pmf per channel instead of 16 (1 MiB as u16,
#: ~200 kB in the bundle)
MAX_ENTRIES = 1 << 19
ZSTD_LEVEL = 12
#: bound on one table (C x X x (K + 1) frequencies) read from a bundle
MAX_TABLE = 1 << 24

Book = Mapping[str, "TensorPriors"]


def precision_for(bits: int) -> int:
    """Frequency precision of an ``ansN`` table: ``N + 8`` bits (at most 16), so the floor of 1
    on each of the ``2**N + 1`` entries takes at most 1/256 of the probability."""
    return min(entropy.MAX_PRECISION, bits + 8)


def channel_axis(shape: tuple[int, ...]) -> int | None:
    """The axis whose entries get their own pmf (module docstring), None for one channel."""
    nd = len(shape)
    axis = None if nd < 2 else 2 if nd == 3 else 1
    return None if axis is None or shape[axis] > MAX_CHANNELS else axis


def channels_of(shape: tuple[int, ...], axis: int | None) -> int:
    return 1 if axis is None else int(shape[axis])


def width_of(shape: tuple[int, ...], axis: int | None) -> int:
    """Row length of a channel's sequence (its above-context): the last of the other axes when
    there are two or more of them, else 0 (no above)."""
    rest = shape if axis is None else tuple(d for i, d in enumerate(shape) if i != axis)
    return int(rest[-1]) if len(rest) >= 2 else 0


def contexts_for(shape: tuple[int, ...], axis: int | None, bits: int) -> int:
    """1, or :data:`entropy.CONTEXTS` where a channel holds a sequence and the table fits."""
    c = channels_of(shape, axis)
    n = math.prod(shape) // max(c, 1)
    fits = c * entropy.CONTEXTS * ((1 << bits) + 1) <= MAX_ENTRIES
    return entropy.CONTEXTS if n >= 2 and fits else 1


def to_channels(levels: np.ndarray, shape: tuple[int, ...], axis: int | None) -> np.ndarray:
    """Flat C-order levels of a tensor of ``shape`` -> ``(C, N)``."""
    if axis is None:
        return levels.reshape(1, -1)
    moved = np.moveaxis(levels.reshape(shape), axis, 0)
    return np.ascontiguousarray(moved).reshape(shape[axis], -1)


def from_channels(sym: np.ndarray, shape: tuple[int, ...], axis: int | None) -> np.ndarray:
    """Inverse of :func:`to_channels`: flat C-order values of the tensor."""
    if axis is None:
        return sym.reshape(-1)
    rest = tuple(d for i, d in enumerate(shape) if i != axis)
    back = np.moveaxis(sym.reshape((shape[axis], *rest)), 0, axis)
    return np.ascontiguousarray(back).reshape(-1)


def table_name(cut: str, tensor: str, bits: int, axis: int | None,
               centered: bool = False) -> str:
    name = f"{cut}/{tensor}/ans{bits}/axis{'-' if axis is None else axis}"
    return name + "/centered" if centered else name


def zero_level(scale: float, offset: float, bits: int) -> int:
    """The level nearest the value 0 of a tensor quantized with ``scale`` and ``offset`` (its
    minimum), within ``0 .. 2**bits - 1``."""
    top = float((1 << bits) - 1)
    return math.floor(min(max(-offset / scale, 0.0), top) + 0.5)


def fold(d: np.ndarray) -> np.ndarray:
    """Zigzag: 0, -1, 1, -2, 2, ... -> 0, 1, 2, 3, 4, ..."""
    d = d.astype(np.int64)
    return np.where(d >= 0, 2 * d, -2 * d - 1)


def unfold(s: np.ndarray) -> np.ndarray:
    return np.where(s % 2 == 0, s // 2, -(s + 1) // 2)


@dataclass(frozen=True, eq=False)
class TensorPriors:
    """The priors of one crossing tensor at one bit width (``ansN``)."""

    priors: entropy.ChannelPriors
    cut: str
    tensor: str
    bits: int
    axis: int | None
    centered: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.bits <= MAX_BITS or self.priors.symbols != self.symbols:
            raise ValueError(f"ans{self.bits} priors need {self.symbols} symbols per channel, "
                             f"got {self.priors.symbols}")
        name = table_name(self.cut, self.tensor, self.bits, self.axis, self.centered)
        if self.priors.name != name:
            raise ValueError(f"priors named {self.priors.name!r} do not name this table")

    @property
    def symbols(self) -> int:
        """``2**N`` levels, or ``2**(N+1)`` folded differences for a centred table."""
        return 1 << (self.bits + self.centered)

    @property
    def key(self) -> str:
        return self.priors.key

    @classmethod
    def from_counts(cls, counts: np.ndarray, cut: str, tensor: str, bits: int,
                    axis: int | None, pooled_weight: float = 1.0,
                    centered: bool = False) -> TensorPriors:
        """From symbol counts ``(C, K)`` or ``(C, 16, K)`` per context, ``K`` the table's
        :attr:`symbols` (``ChannelPriors.from_counts``)."""
        name = table_name(cut, tensor, bits, axis, centered)
        cp = entropy.ChannelPriors.from_counts(counts, precision_for(bits + centered), name=name,
                                               pooled_weight=pooled_weight)
        return cls(cp, cut, tensor, bits, axis, centered)

    def symbols_of(self, levels: np.ndarray, shape: tuple[int, ...], zero: int) -> np.ndarray:
        """A tensor's flat levels as this table's ``(C, N)`` symbols (``zero``: its
        :func:`zero_level`)."""
        ch = to_channels(levels, shape, self.axis).astype(np.int64)
        return fold(ch - zero) if self.centered else ch

    def fits(self, shape: tuple[int, ...]) -> bool:
        """Whether a tensor of ``shape`` has this table's channels."""
        ok = self.axis is None or (self.axis < len(shape) and channel_axis(shape) == self.axis)
        return ok and channels_of(shape, self.axis) == self.priors.channels


def count_levels(ch: np.ndarray, bits: int, contexts: int, width: int) -> np.ndarray:
    """``(C, contexts, 2**bits)`` counts of the symbols ``ch`` (C, N) in their contexts (one
    lane), as :func:`entropy.contexts` assigns them."""
    c, k = ch.shape[0], 1 << bits
    row = np.arange(c, dtype=np.int64)[:, None] * contexts
    if contexts > 1:
        row = row + entropy.contexts(ch, width)
    got = np.bincount((row * k + ch).reshape(-1), minlength=c * contexts * k)
    return got.reshape(c, contexts, k)


# --- the process's tables ------------------------------------------------------------------

_BOOK: dict[str, TensorPriors] = {}
_INDEXES: dict[Path, tuple[tuple[int, ...], dict[str, dict[str, Any]]]] = {}
_LOCK = threading.Lock()


def register(tables: TensorPriors | Iterable[TensorPriors]) -> None:
    """Make tables known to :func:`lookup` in this process (calibration does, for new ones)."""
    for tp in [tables] if isinstance(tables, TensorPriors) else tables:
        _BOOK[tp.key] = tp


def available() -> bool:
    """Whether this side can decode ``ansN`` at all: some loaded bundle, or this process, has
    priors (the ``decoders`` of HELLO list ``ans`` only then)."""
    return bool(_BOOK) or bool(bundle_mod.PRIOR_ROOTS)


def lookup(key: str, book: Book | None = None) -> TensorPriors | None:
    """The table of ``key``: from ``book`` when given, else this process's, else the priors
    files of the bundles it loaded (read once; again when they change)."""
    if book is not None:
        return book.get(key)
    got = _BOOK.get(key)
    if got is not None:
        return got
    with _LOCK:
        for root in list(bundle_mod.PRIOR_ROOTS):
            entry = _index(root).get(key)
            if entry is None:
                continue
            try:
                tp = _read_table(root, entry)
            except (OSError, ValueError, BundleError) as exc:
                log.warning("entropy priors %s in %s cannot be read: %s", key, root, exc)
                continue
            _BOOK[key] = tp
            return tp
    return None


def has(key: str) -> bool:
    """Whether :func:`lookup` would find ``key``, from the indexes alone (no table is read:
    the planner asks this of every row)."""
    if key in _BOOK:
        return True
    with _LOCK:
        return any(key in _index(root) for root in list(bundle_mod.PRIOR_ROOTS))


def resolve(ref: TensorPriors | str | None, book: Book | None = None) -> TensorPriors | None:
    """A packing spec's priors (a table, or its key) as a table; :class:`BundleError` for a key
    no loaded bundle has (the calibration rows name tables its priors files lack)."""
    if ref is None or isinstance(ref, TensorPriors):
        return ref
    got = lookup(str(ref), book)
    if got is None:
        raise BundleError(f"entropy priors {ref} are not in any loaded bundle's {INDEX}: "
                          f"re-run `coinf calibrate` on this bundle")
    return got


def _index(root: Path) -> dict[str, dict[str, Any]]:
    """key -> entry of a bundle's index, when ``priors.bin`` has the sha256 the index records
    (else none: a damaged or replaced file offers no table); cached until either changes."""
    path = root / INDEX
    try:
        st, sd = path.stat(), (root / DATA).stat()
        sig = (st.st_mtime_ns, st.st_size, sd.st_mtime_ns, sd.st_size)
        cached = _INDEXES.get(root)
        if cached is not None and cached[0] == sig:
            return cached[1]
        index = read_index(root)
        if bundle_mod.sha256_file(root / DATA) != index.get("data_sha256"):
            raise BundleError(f"{DATA} does not have the sha256 its index records")
        entries = {str(e["key"]): e for e in index["tables"]}
    except (OSError, ValueError, KeyError, TypeError, BundleError) as exc:
        log.warning("entropy priors index %s cannot be used: %s", path, exc)
        return {}
    _INDEXES[root] = (sig, entries)
    return entries


# --- bundle files ----------------------------------------------------------------------------


def read_index(root: Path) -> dict[str, Any]:
    """``priors.json`` of a bundle folder, format-checked; BundleError otherwise."""
    path = bundle_mod.inside(root, INDEX)
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BundleError(f"{path}: cannot read the entropy priors index: {exc}") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT or obj.get("version") != VERSION \
            or obj.get("data") != DATA or not isinstance(obj.get("tables"), list):
        raise BundleError(f"{path} is not a version-{VERSION} {FORMAT} index")
    return obj


def read_tables(root: Path) -> list[TensorPriors]:
    """Every table of a bundle folder (none when it has no ``priors.json``)."""
    if not (root / INDEX).is_file():
        return []
    return [_read_table(root, e) for e in read_index(root)["tables"]]


def _read_table(root: Path, e: Mapping[str, Any]) -> TensorPriors:
    c, x, k, at = int(e["channels"]), int(e["contexts"]), int(e["symbols"]), int(e["at"])
    axis = None if e.get("axis") is None else int(e["axis"])
    n = c * x * (k + 1)
    want, size = 2 * n + 8 * c, int(e.get("size", 2 * n + 8 * c))
    if not (c >= 1 and x in (1, entropy.CONTEXTS) and k >= 1 and n <= MAX_TABLE and at >= 0
            and 0 < size <= want + 1024):
        raise BundleError(f"{INDEX}: table {e.get('key')} has a bad size")
    path = bundle_mod.inside(root, DATA)
    with open(path, "rb") as f:
        f.seek(at)
        raw = f.read(size)
    if len(raw) != size:
        raise BundleError(f"{path}: table {e.get('key')} runs past the end of the file")
    if e.get("zstd"):
        raw = _unzstd(raw, want)
    if len(raw) != want:
        raise BundleError(f"{path}: table {e.get('key')} holds {len(raw)} B, not {want} B")
    freqs = np.frombuffer(raw, "<u2", n).reshape(c, x, k + 1)
    offsets = np.frombuffer(raw, "<i8", c, 2 * n)
    cut, tensor, bits, centered = str(e["cut"]), str(e["tensor"]), int(e["bits"]), bool(
        e.get("centered", False))
    try:
        cp = entropy.ChannelPriors(freqs, offsets, int(e["precision"]),
                                   table_name(cut, tensor, bits, axis, centered))
    except ValueError as exc:
        raise BundleError(f"{path}: table {e['key']} is not a valid table: {exc}") from None
    if cp.key != e["key"]:
        raise BundleError(f"{path}: table {e['key']} ({cp.name}) does not match its key")
    return TensorPriors(cp, cut, tensor, bits, axis, centered)


def _unzstd(data: bytes, size: int) -> bytes:
    if not codecs.AVAILABLE:
        raise BundleError(f"{DATA} is zstd-compressed: pip install zstandard")
    import zstandard

    try:
        return bytes(zstandard.ZstdDecompressor().decompress(data, max_output_size=size))
    except zstandard.ZstdError as exc:
        raise BundleError(f"{DATA}: a table does not decompress: {exc}") from None


def write(root: Path, tables: Iterable[TensorPriors]) -> dict[str, Any]:
    """Write ``priors.json`` and ``priors.bin`` into a bundle folder (replacing them); the
    manifest entry (``Bundle.meta["entropy_priors"]``) to record."""
    entries, blobs, at = [], [], 0
    for tp in sorted({t.key: t for t in tables}.values(), key=lambda t: t.priors.name):
        cp = tp.priors
        if int(cp.freqs.max()) > 0xFFFF:
            raise ValueError(f"{cp.name}: a frequency does not fit u16")
        blob = cp.freqs.astype("<u2").tobytes() + cp.offsets.astype("<i8").tobytes()
        if codecs.AVAILABLE:
            import zstandard

            blob = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(blob)
        entries.append({"key": tp.key, "cut": tp.cut, "tensor": tp.tensor, "bits": tp.bits,
                        "axis": tp.axis, "centered": tp.centered, "channels": cp.channels,
                        "contexts": cp.contexts, "symbols": cp.symbols,
                        "precision": cp.precision, "at": at, "size": len(blob),
                        "zstd": codecs.AVAILABLE})
        blobs.append(blob)
        at += len(blob)
    data = b"".join(blobs)
    (root / DATA).write_bytes(data)
    index = {"format": FORMAT, "version": VERSION, "data": DATA,
             "data_sha256": hashlib.sha256(data).hexdigest(), "tables": entries}
    text = json.dumps(index, indent=1, sort_keys=True) + "\n"
    (root / INDEX).write_text(text)
    _INDEXES.pop(root, None)
    return {"index": INDEX, "data": DATA, "tables": len(entries),
            "sha256": hashlib.sha256(text.encode()).hexdigest()}


# --- the packing's payload -----------------------------------------------------------------


def encode_levels(levels: np.ndarray, shape: tuple[int, ...], bits: int,
                  ref: TensorPriors | str | None, scale: float, offset: float,
                  book: Book | None = None) -> bytes | None:
    """The entropy stream of a tensor's ``bits``-bit levels (flat, C order; ``scale`` and
    ``offset`` as in its header) under its priors; None when there are none or they do not
    fit (the caller packs ``qzN`` instead)."""
    tp = resolve(ref, book)
    if tp is None or tp.bits != bits or not tp.fits(shape):
        return None
    sym = tp.symbols_of(levels, shape, zero_level(scale, offset, bits))
    return entropy.encode(sym, tp.priors, width=width_of(shape, tp.axis))


def decode_levels(payload: bytes | memoryview, shape: tuple[int, ...], bits: int,
                  scale: float, offset: float, book: Book | None = None) -> np.ndarray:
    """The flat uint8 levels of an ``ansN`` payload; ProtocolError for unknown priors, priors
    of another tensor or width, or a stream that does not decode."""
    key = entropy.stream_key(payload)
    tp = lookup(key, book)
    if tp is None:
        raise ProtocolError(ErrorCode.MALFORMED, f"packed tensor names entropy priors {key}, "
                            "which this side does not have (its bundle was calibrated apart "
                            "from the sender's: copy one calibrated bundle to both sides)")
    if tp.bits != bits or not tp.fits(shape):
        raise ProtocolError(ErrorCode.MALFORMED, f"packed tensor {list(shape)} at {bits} bits "
                            f"names entropy priors {key} of {tp.priors.name} "
                            f"({tp.priors.channels} channels)")
    c = channels_of(shape, tp.axis)
    sym = entropy.decode(payload, tp.priors, c, math.prod(shape) // c, width_of(shape, tp.axis))
    if sym.size and (int(sym.min()) < 0 or int(sym.max()) >= tp.symbols):
        raise ProtocolError(ErrorCode.MALFORMED, "packed tensor: an escaped level")
    if tp.centered:
        sym = unfold(sym) + zero_level(scale, offset, bits)
        if sym.size and (int(sym.min()) < 0 or int(sym.max()) >= 1 << bits):
            raise ProtocolError(ErrorCode.MALFORMED,
                                f"packed tensor: a level outside 0..{(1 << bits) - 1}")
    return from_channels(sym.astype(np.uint8), shape, tp.axis)
