"""Entropy stages for packed tensors beyond LZ4: zstd over quantized levels (codec QUANTZ).

Bit planes + LZ4 (codec QUANT) remove runs of zeros fast, but they do not code the skewed
distribution of the levels of a ReLU map: most levels are 0 or 1, a few are high. zstd's
Huffman-coded literals do. QUANTZ sends the levels as they are (one byte per level up to 8 bits,
two little-endian bytes up to 16) in one zstd frame. On LeNet's first ReLU at 3 bits it packs
36% denser than QUANT at the same accuracy (docs/PACKING.md).

The frame is magicless (``ZSTD_f_zstd1_magicless``, 4 B saved), without checksum or dictionary;
the wire header already fixes the uncompressed size, so the frame need not carry it.

:mod:`ble_protocol.packing` calls :func:`compress_levels` and :func:`decompress_levels`; nothing
else here knows about the wire header. ``zstandard`` is optional: without it :data:`AVAILABLE`
is false, packing falls back to QUANT and a QUANTZ body is refused as unsupported.
"""

from __future__ import annotations

from typing import Any

_zstd: Any
try:
    import zstandard as _zstd
except ImportError:  # pragma: no cover - an install without the optional dependency
    _zstd = None

AVAILABLE = _zstd is not None
#: Compression level for payloads up to :data:`SMALL_PAYLOAD` bytes: a cut's tensor of a few
#: kB costs tens of microseconds at this level and gains ~10% over level 1 (BENCHMARKS.md).
LEVEL_SMALL = 6
#: Level for larger payloads, where speed matters more than the last percent (>= 300 MB/s).
LEVEL_LARGE = 1
SMALL_PAYLOAD = 64 * 1024

_compressors: dict[int, Any] = {}
_decompressor: Any = None


class CodecUnavailable(Exception):
    """The entropy stage's library is not installed here."""


def _compressor(level: int) -> Any:
    c = _compressors.get(level)
    if c is None:
        assert _zstd is not None
        params = _zstd.ZstdCompressionParameters.from_level(
            level, format=_zstd.FORMAT_ZSTD1_MAGICLESS, write_content_size=False,
            write_checksum=False, write_dict_id=False)
        c = _compressors[level] = _zstd.ZstdCompressor(compression_params=params)
    return c


def compress_levels(payload: bytes | memoryview) -> bytes:
    """One magicless zstd frame of ``payload`` (level by size, see :data:`LEVEL_SMALL`)."""
    if _zstd is None:
        raise CodecUnavailable("zstandard is not installed")
    size = memoryview(payload).nbytes
    level = LEVEL_SMALL if size <= SMALL_PAYLOAD else LEVEL_LARGE
    return bytes(_compressor(level).compress(payload))


def decompress_levels(payload: bytes | memoryview, raw_size: int) -> bytes:
    """Decode one frame into exactly ``raw_size`` bytes; ``ValueError`` on anything else.

    Hostile input: the output buffer is ``raw_size`` (fixed by the already validated header,
    itself bounded by the receiver's byte budget) and decoding stops there, so a frame cannot
    make it allocate more; a frame that claims another content size, uses a dictionary, holds
    extra data after the frame or does not fill ``raw_size`` exactly is refused.
    """
    global _decompressor
    if _zstd is None:
        raise CodecUnavailable("zstandard is not installed")
    data = bytes(payload)
    try:
        params = _zstd.get_frame_parameters(data, format=_zstd.FORMAT_ZSTD1_MAGICLESS)
    except _zstd.ZstdError as exc:
        raise ValueError(f"not a zstd frame header: {exc}") from None
    if params.content_size not in (_zstd.CONTENTSIZE_UNKNOWN, raw_size):
        raise ValueError(f"zstd frame claims {params.content_size} B, header says {raw_size} B")
    if params.dict_id:
        raise ValueError("zstd frame needs a dictionary")
    if _decompressor is None:
        _decompressor = _zstd.ZstdDecompressor(format=_zstd.FORMAT_ZSTD1_MAGICLESS)
    try:
        out = _decompressor.decompress(data, max_output_size=raw_size, allow_extra_data=False)
    except _zstd.ZstdError as exc:
        raise ValueError(f"zstd payload does not decompress: {exc}") from None
    if len(out) != raw_size:
        raise ValueError(f"zstd payload gave {len(out)} B, header says {raw_size} B")
    return bytes(out)
