"""Bit planes: the bit transposition of DynO's packing (docs/PACKING.md, "Payload layout").

Row ``8*j + k`` of the planes holds bit ``k`` (LSB first) of byte ``j`` of every element,
exactly as one block of the ``bitshuffle`` library. The compiled library is used when it is
installed; the pure-numpy transpose below gives byte-identical output (a Pi without the
library talks to a laptop with it).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

try:  # the compiled SIMD transpose; the pure-numpy one below gives byte-identical output
    import bitshuffle as _bitshuffle
except ImportError:  # pragma: no cover - depends on the platform (no aarch64 wheel)
    _bitshuffle = None

#: Use the compiled ``bitshuffle`` transpose when it is installed (benches flip this to compare).
USE_BITSHUFFLE = _bitshuffle is not None


def _omp_limiter() -> Callable[[], None]:
    """bitshuffle's wheel carries its own OpenMP runtime, which spreads each transpose over
    every core: a few µs of work then waits for threads the head's onnxruntime is keeping busy
    (measured on 2 loaded cores: 20-30 ms per small tensor instead of 0.01 ms). Its thread count
    is a per-thread setting, so each calling thread sets its own to 1, once. This touches only
    that private runtime, not other libraries' OpenMP."""
    import ctypes
    import glob
    import os
    import threading

    done = threading.local()
    libs = [] if _bitshuffle is None else glob.glob(os.path.join(
        os.path.dirname(_bitshuffle.__file__), os.pardir, "bitshuffle.libs", "libgomp*"))
    try:
        set_threads = ctypes.CDLL(libs[0]).omp_set_num_threads if libs else None
    except (OSError, AttributeError):  # pragma: no cover - another build of bitshuffle
        set_threads = None

    def limit() -> None:
        if set_threads is not None and not getattr(done, "ok", False):
            set_threads(1)
            done.ok = True

    return limit


_one_omp_thread = _omp_limiter()

_M1, _M2, _M3 = (np.uint64(0x00AA00AA00AA00AA), np.uint64(0x0000CCCC0000CCCC),
                 np.uint64(0x00000000F0F0F0F0))
_S7, _S14, _S28 = np.uint64(7), np.uint64(14), np.uint64(28)


def _transpose8(x: np.ndarray) -> np.ndarray:
    """Transpose each 8x8 bit matrix held in a uint64 (bit ``8*r + c`` -> ``8*c + r``).

    In place on ``x``; the transposition is its own inverse."""
    t = np.empty_like(x)
    for mask, shift in ((_M1, _S7), (_M2, _S14), (_M3, _S28)):
        np.right_shift(x, shift, out=t)
        np.bitwise_xor(t, x, out=t)
        np.bitwise_and(t, mask, out=t)
        np.bitwise_xor(x, t, out=x)
        np.left_shift(t, shift, out=t)
        np.bitwise_xor(x, t, out=x)
    return x


def _numpy_shuffle(raw: np.ndarray, itemsize: int) -> np.ndarray:
    """Bit planes of ``raw`` (bytes of n elements, n % 8 == 0): shape ``(8*itemsize, n//8)``."""
    m = raw.size // itemsize // 8
    by = raw.reshape(m * 8, itemsize).T  # (itemsize, n): byte j of every element
    out = np.empty((itemsize, 8, m), dtype=np.uint8)
    for j in range(itemsize):
        x = np.ascontiguousarray(by[j]).view(np.uint64)
        out[j] = _transpose8(x.copy()).view(np.uint8).reshape(m, 8).T
    return out.reshape(8 * itemsize, m)


def _numpy_unshuffle(planes: np.ndarray, itemsize: int) -> np.ndarray:
    """Inverse of :func:`_numpy_shuffle`: bytes of the n elements, C order."""
    m = planes.shape[1]
    out = np.empty((m * 8, itemsize), dtype=np.uint8)
    pl = planes.reshape(itemsize, 8, m)
    for j in range(itemsize):
        x = np.array(pl[j].T, order="C").view(np.uint64).reshape(m)  # own, writable copy
        out[:, j] = _transpose8(x).view(np.uint8)
    return out.reshape(-1)


def bit_planes(values: np.ndarray, use_library: bool | None = None) -> np.ndarray:
    """Bit planes of a 1-D array whose length is a multiple of 8: ``(8*itemsize, n//8)`` uint8."""
    itemsize = values.dtype.itemsize
    if values.size == 0:
        return np.zeros((8 * itemsize, 0), dtype=np.uint8)
    if (USE_BITSHUFFLE if use_library is None else use_library) and _bitshuffle is not None:
        _one_omp_thread()
        shuffled = _bitshuffle.bitshuffle(values, values.size)
        return shuffled.view(np.uint8).reshape(8 * itemsize, values.size // 8)
    return _numpy_shuffle(values.view(np.uint8), itemsize)


def from_bit_planes(
    planes: np.ndarray, dtype: np.dtype, use_library: bool | None = None
) -> np.ndarray:
    """Inverse of :func:`bit_planes`; ``planes`` has all ``8*itemsize`` rows."""
    n = planes.shape[1] * 8
    if n == 0:
        return np.zeros(0, dtype=dtype)
    if (USE_BITSHUFFLE if use_library is None else use_library) and _bitshuffle is not None:
        _one_omp_thread()
        return _bitshuffle.bitunshuffle(planes.reshape(-1).view(dtype), n)
    return _numpy_unshuffle(planes, dtype.itemsize).view(dtype)
