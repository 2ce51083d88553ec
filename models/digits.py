"""scikit-learn's handwritten digits as a deterministic train/val/test split (no network needed).

The 8x8 images (values 0..16) are scaled to [0, 1] and bilinearly upsampled to 28x28 with a fixed
interpolation matrix, so the arrays are shaped like the ``lenet_digits`` input (N, 1, 28, 28)
(or to 32x32 for ``digitnet``: ``digits_data(size=32)``, same split).
Needs numpy and scikit-learn only (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DIGITS_SEED = 0
"""Seed of the stratified split; recorded in ``lenet_digits.json``."""
IMAGE_SIZE = 28
SPLIT_FRACTIONS = (0.6, 0.2, 0.2)  # train, val, test


@dataclass(frozen=True)
class DigitsSplit:
    """Float32 images (N, 1, 28, 28) in [0, 1] and int64 labels (N,) for each part of the split."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    seed: int


def _interp_matrix(src: int, dst: int) -> np.ndarray:
    """(dst, src) matrix of 1-D linear interpolation with aligned corners."""
    pos = np.linspace(0.0, src - 1, dst)
    lo = np.clip(np.floor(pos).astype(np.int64), 0, src - 2)
    frac = pos - lo
    mat = np.zeros((dst, src), dtype=np.float64)
    mat[np.arange(dst), lo] = 1.0 - frac
    mat[np.arange(dst), lo + 1] += frac
    return mat


def upsample(images: np.ndarray, size: int = IMAGE_SIZE) -> np.ndarray:
    """Bilinearly resize (N, h, w) images to (N, 1, size, size) float32."""
    n, h, w = images.shape
    rows, cols = _interp_matrix(h, size), _interp_matrix(w, size)
    out = np.einsum("ih,nhw,jw->nij", rows, images.astype(np.float64), cols)
    return out.astype(np.float32).reshape(n, 1, size, size)


def digits_data(seed: int = DIGITS_SEED, size: int = IMAGE_SIZE) -> DigitsSplit:
    """The stratified 60/20/20 split of the 1,797 sklearn digits, same arrays on every call;
    ``size`` is the side of the upsampled images (28 for ``lenet_digits``, 32 for ``digitnet``);
    the split does not depend on it."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = upsample(np.asarray(data.images, dtype=np.float64) / 16.0, size)
    y = np.asarray(data.target, dtype=np.int64)
    idx = np.arange(len(y))
    train_idx, rest = train_test_split(
        idx, train_size=SPLIT_FRACTIONS[0], random_state=seed, stratify=y
    )
    val_idx, test_idx = train_test_split(rest, test_size=0.5, random_state=seed, stratify=y[rest])
    return DigitsSplit(
        x[train_idx], y[train_idx], x[val_idx], y[val_idx], x[test_idx], y[test_idx], seed
    )
