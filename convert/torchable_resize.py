"""ONNX Resize as per-axis index or matrix tables, for :mod:`coinf.convert.torchable`.

onnx2torch maps Resize onto torch's ``interpolate``, which reproduces only some ONNX modes (the
others it converts with a warning and other values). On static shapes every mode is separable:
nearest picks one input index per output position (a Gather), linear and cubic weight a few
(a MatMul by an ``(out, in)`` matrix). Nearest indices are read off onnxruntime itself; linear
and cubic weights follow its coordinates (float32, double where it uses double) and borders;
like it, an axis of scale 1 is copied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

F32 = np.float32


@dataclass
class Plan:
    """``steps``: (axis, "gather" | "matmul", indices (out,) or weights (out, in)) in order;
    ``inside``/``outside``: tf_crop_and_resize's factor and extrapolation term (out shape)."""

    steps: list[tuple[int, str, np.ndarray]]
    inside: np.ndarray | None = None
    outside: np.ndarray | None = None


def torch_exact(attrs: Mapping[str, Any], shape: Sequence[int], out: Sequence[int]) -> bool:
    """Whether onnx2torch's interpolate gives onnxruntime's values for this Resize."""
    mode = attrs.get("mode", "nearest")
    ctm = attrs.get("coordinate_transformation_mode", "half_pixel")
    if len(shape) not in (3, 4, 5) or list(shape[:2]) != list(out[:2]):
        return False
    if ctm == "pytorch_half_pixel" and min(out[2:]) > 1:
        ctm = "half_pixel"
    if mode == "nearest":  # torch multiplies by 1/scale: exact for powers of two only
        factors = [o / i for i, o in zip(shape[2:], out[2:], strict=True)]
        return (ctm == "asymmetric" and attrs.get("nearest_mode", "round_prefer_floor") == "floor"
                and all(f >= 1 and f == int(f) and int(f) & (int(f) - 1) == 0 for f in factors))
    if ctm not in ("half_pixel", "align_corners"):
        return False
    if mode == "linear":
        return True
    return (mode == "cubic" and len(shape) == 4 and attrs.get("exclude_outside", 0) == 0
            and abs(attrs.get("cubic_coeff_a", -0.75) + 0.75) < 1e-7)


def _coords(ctm: str, length: int, out: int, scale: np.float32,
            roi: tuple[float, float]) -> np.ndarray:
    x = np.arange(out, dtype=F32)
    half = F32(0.5)
    if ctm == "half_pixel":
        return (x + half) / scale - half
    if ctm == "pytorch_half_pixel":
        return (x + half) / scale - half if out > 1 else np.zeros(out, F32)
    if ctm == "half_pixel_symmetric":  # the offset in float32, the sum in double
        adjust = F32(out) / (scale * F32(length))
        offset = np.float64(F32(length) / F32(2) * (F32(1) - adjust))
        return (offset + (x.astype(np.float64) + 0.5) / np.float64(scale) - 0.5).astype(F32)
    if ctm == "align_corners":
        return x * F32(length - 1) / F32(out - 1) if out > 1 else np.zeros(out, F32)
    if ctm == "asymmetric":
        return x / scale
    if ctm == "tf_half_pixel_for_nn":
        return (x + half) / scale
    if ctm == "tf_crop_and_resize":
        start, end = F32(roi[0]), F32(roi[1])
        if out > 1:
            return start * F32(length - 1) + x * (end - start) * F32(length - 1) / F32(out - 1)
        return np.full(out, half * (start + end) * F32(length - 1), F32)
    raise ValueError(f"coordinate_transformation_mode {ctm!r} is not an ONNX value")


def _nearest(attrs: Mapping[str, Any], rank: int, ax: int, length: int, size: int,
             scale: float | None, roi: tuple[float, float]) -> np.ndarray:
    """The input index onnxruntime picks for each output position along ``ax`` (-1: outside
    a tf_crop_and_resize roi), read off the same Resize run on an index ramp: its float32
    rounding at exact ties cannot be recomputed reliably."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    shape, ones = [1] * rank, np.ones(rank, np.float32)
    shape[ax] = length
    kept = {k: v for k, v in attrs.items()
            if k in ("mode", "coordinate_transformation_mode", "nearest_mode")}
    bounds = np.array([0.0] * rank + [1.0] * rank, np.float32)
    bounds[ax], bounds[rank + ax] = roi
    inits = [numpy_helper.from_array(bounds, "roi")]
    if scale is not None:
        ones[ax] = scale
        inits.append(numpy_helper.from_array(ones, "scales"))
        inputs = ["x", "roi", "scales"]
    else:
        sizes = np.array(shape, np.int64)
        sizes[ax] = size
        inits += [numpy_helper.from_array(np.zeros(0, np.float32), "scales"),
                  numpy_helper.from_array(sizes, "sizes")]
        inputs = ["x", "roi", "scales", "sizes"]
    node = helper.make_node("Resize", inputs, ["y"], extrapolation_value=-1.0, **kept)
    graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, shape)], [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                        None)], inits)
    opset = 19 if attrs.get("coordinate_transformation_mode") == "half_pixel_symmetric" else 11
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.log_severity_level = 1, 3
    (y,) = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"]).run(
        None, {"x": np.arange(length, dtype=np.float32).reshape(shape)})
    return np.rint(y.reshape(-1)).astype(np.int64)


def _weights(coord: np.ndarray, mode: str, length: int, a: float, exclude: bool) -> np.ndarray:
    """(out, in) matrix of linear or cubic weights; indices past the border repeat the edge
    (or, with ``exclude``, drop out and the rest renormalise)."""
    w = np.zeros((len(coord), length), np.float64)
    base = np.floor(coord).astype(np.int64)
    t = (coord - base).astype(np.float64)
    if mode == "linear":
        taps, coeffs = [0, 1], [1 - t, t]
    elif mode == "cubic":
        taps = [-1, 0, 1, 2]
        s = [t + 1, t, 1 - t, 2 - t]
        coeffs = [((a * s[0] - 5 * a) * s[0] + 8 * a) * s[0] - 4 * a,
                  ((a + 2) * s[1] - (a + 3)) * s[1] * s[1] + 1,
                  ((a + 2) * s[2] - (a + 3)) * s[2] * s[2] + 1,
                  ((a * s[3] - 5 * a) * s[3] + 8 * a) * s[3] - 4 * a]
    else:
        raise ValueError(f"mode {mode!r} is not an ONNX value")
    rows = np.arange(len(coord))
    for tap, c in zip(taps, coeffs, strict=True):
        idx = base + tap
        ok = (idx >= 0) & (idx < length)
        if exclude:
            np.add.at(w, (rows[ok], idx[ok]), c[ok])
        else:
            np.add.at(w, (rows, np.clip(idx, 0, length - 1)), c)
    if exclude:
        w /= w.sum(1, keepdims=True)
    return w


def resize_plan(attrs: Mapping[str, Any], shape: Sequence[int], out: Sequence[int],
                roi: np.ndarray | None, scales: np.ndarray | None, force: bool = False
                ) -> Plan | None:
    """The tables reproducing a Resize from static ``shape`` to ``out`` (None: onnx2torch's own
    translation is already exact, unless ``force``). ``roi``/``scales``: the constant inputs.
    ValueError for what has no table here (antialias, keep_aspect_ratio_policy)."""
    if attrs.get("antialias", 0) or attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise ValueError("antialias and keep_aspect_ratio_policy are not normalised")
    rank = len(shape)
    axes = [int(a) % rank for a in attrs.get("axes", range(rank))]
    full_scales: list[float | None] = [None] * rank
    if scales is not None and scales.size:
        for i, ax in enumerate(axes):
            full_scales[ax] = float(scales[i])
    full_roi = [(0.0, 1.0)] * rank
    if roi is not None and roi.size:
        for i, ax in enumerate(axes):
            full_roi[ax] = (float(roi[i]), float(roi[len(axes) + i]))
    if not force and torch_exact(attrs, shape, out) and (roi is None or not roi.size or
                                           attrs.get("coordinate_transformation_mode")
                                           != "tf_crop_and_resize"):
        return None
    mode = attrs.get("mode", "nearest")
    ctm = attrs.get("coordinate_transformation_mode", "half_pixel")
    crop = ctm == "tf_crop_and_resize"
    plan, inside = Plan([]), np.ones(tuple(out), bool)
    for ax in range(rank):
        length, size = int(shape[ax]), int(out[ax])
        given = full_scales[ax]
        scale = F32(given) if given is not None else F32(size) / F32(length)
        if length == size and scale == 1:  # onnxruntime copies the axis (even its roi)
            continue
        if mode == "nearest":
            table = _nearest(attrs, rank, ax, length, size, given, full_roi[ax])
            ok = table >= 0
            plan.steps.append((ax, "gather", np.maximum(table, 0)))
        else:
            coord = _coords(ctm, length, size, scale, full_roi[ax])
            ok = (coord >= 0) & (coord <= length - 1)
            table = _weights(coord, mode, length, float(attrs.get("cubic_coeff_a", -0.75)),
                             bool(attrs.get("exclude_outside", 0)))
            plan.steps.append((ax, "matmul", table))
        if crop:
            inside &= ok.reshape([-1 if i == ax else 1 for i in range(rank)])
    if crop:
        plan.inside = inside.astype(np.float64)
        plan.outside = (~inside) * float(attrs.get("extrapolation_value", 0.0))
    return plan
