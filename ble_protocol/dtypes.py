"""Tensor element types on the wire: ONNX TensorProto codes <-> numpy dtypes, and the rank cap.

Shared by the RAW tensor codec (:mod:`ble_protocol.tensors`) and the packed codec
(:mod:`ble_protocol.packing`); it imports neither, so the two codecs do not import each other
for their common vocabulary.
"""

from __future__ import annotations

import numpy as np

MAX_NDIM = 8

# ONNX TensorProto.DataType codes <-> numpy dtypes (little-endian).
ONNX_TO_NUMPY: dict[int, np.dtype] = {
    1: np.dtype("<f4"),
    2: np.dtype("u1"),
    3: np.dtype("i1"),
    4: np.dtype("<u2"),
    5: np.dtype("<i2"),
    6: np.dtype("<i4"),
    7: np.dtype("<i8"),
    9: np.dtype("?"),
    10: np.dtype("<f2"),
    11: np.dtype("<f8"),
    12: np.dtype("<u4"),
    13: np.dtype("<u8"),
}
NUMPY_TO_ONNX: dict[np.dtype, int] = {v: k for k, v in ONNX_TO_NUMPY.items()}

__all__ = ["MAX_NDIM", "NUMPY_TO_ONNX", "ONNX_TO_NUMPY"]
