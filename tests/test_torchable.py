"""The tail normaliser for onnx2torch (convert/torchable*.py, issue 50) on small synthetic graphs.

Every rewrite is checked three ways: onnxruntime gives the same outputs before and after it
(float tolerance), onnx2torch converts the result, and torch's outputs match onnxruntime's. Most
cases also show that onnx2torch alone refuses the original graph or gives other values, so a
normaliser that stopped rewriting would fail here. Offline; nothing asserts on time.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from coinf.errors import ModelError

torch = pytest.importorskip("torch")
if importlib.util.find_spec("onnx2torch") is None:  # the Makefile installs it (--no-deps)
    pytest.skip("onnx2torch is not installed", allow_module_level=True)
tq = pytest.importorskip("coinf.convert.torchable")
ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(50)


def _w(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.5).astype(np.float32)


def _model(nodes: Sequence[onnx.NodeProto], shape: Sequence[int], inits: Sequence[object] = (),
           opset: int = 13, outputs: Sequence[str] = ("y",),
           out_shape: Sequence[int] | None = None) -> onnx.ModelProto:
    """One float input ``x`` of ``shape``; output types from shape inference (or ``out_shape``,
    for ops inference skips); checked."""
    tensors = [t if isinstance(t, onnx.TensorProto) else nh.from_array(*t)  # type: ignore[misc]
               for t in inits]
    outs = [onnx.ValueInfoProto(name=o) if out_shape is None else
            h.make_tensor_value_info(o, T.FLOAT, list(out_shape)) for o in outputs]
    g = h.make_graph(list(nodes), "g", [h.make_tensor_value_info("x", T.FLOAT, list(shape))],
                     outs, tensors)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    m = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    onnx.checker.check_model(m, full_check=True)
    return m


def _ort(m: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(m.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})


def _close(got: np.ndarray, ref: np.ndarray, tol: float) -> None:
    assert got.shape == ref.shape, (got.shape, ref.shape)
    scale = max(float(np.abs(ref).max()), 1e-6)
    assert float(np.abs(got.astype(np.float64) - ref).max()) <= tol * scale, \
        float(np.abs(got - ref).max())


def _torch(net: object, x: np.ndarray) -> list[np.ndarray]:
    with torch.no_grad():
        out = net(torch.from_numpy(x))  # type: ignore[operator]
    return [o.numpy() for o in (out if isinstance(out, list | tuple) else [out])]


def _plain_fails(m: onnx.ModelProto, x: np.ndarray) -> bool:
    """onnx2torch alone refuses ``m``, or converts it to other values than onnxruntime's."""
    try:
        net = tq.load_onnx2torch().convert(m)
        got = _torch(net, x)
    except Exception:
        return True
    refs = _ort(m, x)
    return len(got) != len(refs) or any(
        g.shape != r.shape or not np.allclose(g, r, rtol=1e-4, atol=1e-4)
        for g, r in zip(got, refs, strict=True))


def _check(m: onnx.ModelProto, x: np.ndarray | None = None, plain_fails: bool = True
           ) -> onnx.ModelProto:
    """normalise keeps onnxruntime's outputs; torch after to_torch gives them too."""
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    x = RNG.standard_normal(shape).astype(np.float32) if x is None else x
    refs = _ort(m, x)
    norm = tq.normalise(m)
    onnx.checker.check_model(norm)
    for got, ref in zip(_ort(norm, x), refs, strict=True):
        _close(got, ref, 1e-5)
    net, norm2 = tq.to_torch(m)
    for got, ref in zip(_torch(net, x), refs, strict=True):
        _close(got, ref, 1e-4)
    tq.verify(net, norm2, x)
    if plain_fails:
        assert _plain_fails(m, x), "onnx2torch alone already handles this graph"
    return norm


def _ops(m: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in m.graph.node]


# -- auto_pad and asymmetric pads ---------------------------------------------------------------
@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("size", [(7, 8), (8, 9), (6, 6)])
@pytest.mark.parametrize("kernel", [2, 3])
@pytest.mark.parametrize("opset", [13, 17])
def test_conv_same_stride2(mode: str, size: tuple[int, int], kernel: int, opset: int) -> None:
    m = _model([h.make_node("Conv", ["x", "w", "b"], ["y"], auto_pad=mode, strides=[2, 2],
                            name="conv_same")], [1, 3, *size],
               [(_w(4, 3, kernel, kernel), "w"), (_w(4), "b")], opset)
    norm = _check(m)
    assert all(a.name != "auto_pad" for n in norm.graph.node for a in n.attribute)


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_depthwise_conv_and_1d_conv(mode: str) -> None:
    dw = _model([h.make_node("Conv", ["x", "w"], ["y"], auto_pad=mode, strides=[2, 2], group=4)],
                [1, 4, 9, 10], [(_w(4, 1, 3, 3), "w")])
    _check(dw, plain_fails=mode != "VALID")
    one = _model([h.make_node("Conv", ["x", "w"], ["y"], auto_pad=mode, strides=[3])],
                 [1, 2, 11], [(_w(3, 2, 4), "w")])
    _check(one, plain_fails=mode != "VALID")


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("include", [0, 1])
def test_pool_same(op: str, mode: str, include: int) -> None:
    extra: dict[str, Any] = {"count_include_pad": include} if op == "AveragePool" else {}
    m = _model([h.make_node(op, ["x"], ["y"], auto_pad=mode, kernel_shape=[3, 2],
                            strides=[2, 2], **extra)], [1, 2, 8, 7])
    _check(m)


def test_average_pool_explicit_asymmetric_pads() -> None:
    m = _model([h.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 1],
                            pads=[0, 1, 1, 2])], [1, 2, 7, 6])
    assert _ops(_check(m)) == ["Pad", "AveragePool", "Mul"]


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("include", [0, 1])
def test_pool_ceil_mode_drops_a_window_in_the_end_padding(op: str, include: int) -> None:
    extra: dict[str, Any] = {"count_include_pad": include} if op == "AveragePool" else {}
    m = _model([h.make_node(op, ["x"], ["y"], kernel_shape=[2, 3], strides=[3, 2],
                            pads=[1, 0, 0, 1], ceil_mode=1, **extra)], [1, 2, 5, 6])
    inferred = [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim]
    x = RNG.standard_normal((1, 2, 5, 6)).astype(np.float32)
    assert _ort(m, x)[0].shape[2] == 2 and inferred[2] == 3  # onnxruntime drops it
    _check(m, x, plain_fails=op == "AveragePool")  # torch drops it too; its pools are symmetric


@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(p: int) -> None:
    m = _model([h.make_node("LpPool", ["x"], ["y"], auto_pad="SAME_UPPER", kernel_shape=[2, 3],
                            strides=[2, 2], p=p)], [1, 2, 7, 8])
    assert "LpPool" not in _ops(_check(m))


@pytest.mark.parametrize("op", ["GlobalMaxPool", "GlobalLpPool"])
def test_global_pools(op: str) -> None:
    extra: dict[str, Any] = {"p": 3} if op == "GlobalLpPool" else {}
    m = _model([h.make_node(op, ["x"], ["y"], **extra)], [1, 3, 5, 4])
    _check(m)


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("kernel", [3, 4])
@pytest.mark.parametrize("length", [4, 5])
def test_conv_transpose_same(mode: str, kernel: int, length: int) -> None:
    m = _model([h.make_node("ConvTranspose", ["x", "w", "b"], ["y"], auto_pad=mode,
                            strides=[2, 2], kernel_shape=[kernel, kernel])],
               [1, 2, length, length + 1], [(_w(2, 3, kernel, kernel), "w"), (_w(3), "b")])
    norm = _check(m, plain_fails=False)  # onnx2torch ignores auto_pad here: wrong sizes, maybe
    assert all(a.name != "auto_pad" for n in norm.graph.node for a in n.attribute)


def test_conv_transpose_same_kernel_below_stride() -> None:
    m = _model([h.make_node("ConvTranspose", ["x", "w", "b"], ["y"], auto_pad="SAME_UPPER",
                            strides=[3, 3])], [1, 2, 4, 5], [(_w(2, 3, 2, 2), "w"), (_w(3), "b")])
    x = RNG.standard_normal((1, 2, 4, 5)).astype(np.float32)
    assert _ort(m, x)[0].shape == (1, 3, 11, 14)  # not stride x input: no pad below 0
    _check(m, x, plain_fails=False)


def test_conv_transpose_output_shape_and_asymmetric_pads() -> None:
    shaped = _model([h.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2],
                                 output_shape=[9, 11])], [1, 2, 5, 6], [(_w(2, 3, 3, 3), "w")])
    _check(shaped)
    padded = _model([h.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2],
                                 pads=[0, 1, 1, 0], output_padding=[1, 1])],
                    [1, 2, 5, 6], [(_w(2, 3, 3, 3), "w")])
    assert "Slice" in _ops(_check(padded))


# -- Resize -------------------------------------------------------------------------------------
RESIZES = [
    ("nearest", "asymmetric", "round_prefer_floor", [1, 1, 3, 2.5]),
    ("nearest", "half_pixel", "round_prefer_floor", [1, 1, 0.5, 0.375]),  # ties on H
    ("nearest", "half_pixel", "round_prefer_ceil", [1, 1, 1.5, 0.5]),
    ("nearest", "tf_half_pixel_for_nn", "floor", [1, 1, 0.5, 0.75]),
    ("nearest", "align_corners", "ceil", [1, 1, 1.75, 2]),
    ("linear", "asymmetric", "", [1, 1, 2, 2]),
    ("linear", "half_pixel", "", [1, 2, 2, 1]),  # the channels scale: torch cannot
    ("cubic", "half_pixel", "", [1, 1, 2, 2]),  # TensorFlow's a = -0.5
    ("cubic", "asymmetric", "", [1, 1, 0.5, 1.5]),
]


@pytest.mark.parametrize(("mode", "ctm", "nearest", "scales"), RESIZES)
def test_resize_modes(mode: str, ctm: str, nearest: str, scales: list[float]) -> None:
    attrs: dict[str, Any] = {"mode": mode, "coordinate_transformation_mode": ctm}
    if nearest:
        attrs["nearest_mode"] = nearest
    if mode == "cubic":
        attrs["cubic_coeff_a"] = -0.5
        attrs["exclude_outside"] = int(ctm == "asymmetric")
    m = _model([h.make_node("Resize", ["x", "", "s"], ["y"], **attrs)], [1, 2, 6, 8],
               [(np.array(scales, np.float32), "s")])
    assert "Resize" not in _ops(_check(m))


def test_resize_crop_and_resize_sizes_and_3d() -> None:
    crop = _model([h.make_node("Resize", ["x", "roi", "", "sz"], ["y"], mode="linear",
                               coordinate_transformation_mode="tf_crop_and_resize",
                               extrapolation_value=-3.0)], [1, 2, 6, 8],
                  [(np.array([0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3], np.float32), "roi"),
                   (np.array([1, 2, 7, 5], np.int64), "sz")])
    _check(crop)
    seq = _model([h.make_node("Resize", ["x", "", "s"], ["y"], mode="linear",
                              coordinate_transformation_mode="asymmetric")], [1, 3, 10],
                 [(np.array([1, 1, 1.5], np.float32), "s")])
    _check(seq)


def test_resize_torch_reproduces_is_left_alone() -> None:
    m = _model([h.make_node("Resize", ["x", "", "s"], ["y"], mode="nearest",
                            coordinate_transformation_mode="asymmetric", nearest_mode="floor")],
               [1, 2, 4, 5], [(np.array([1, 1, 2, 2], np.float32), "s")])
    assert "Resize" in _ops(_check(m, plain_fails=False))
    lin = _model([h.make_node("Resize", ["x", "", "s"], ["y"], mode="linear")], [1, 2, 4, 5],
                 [(np.array([1, 1, 2, 2], np.float32), "s")])
    assert "Resize" in _ops(_check(lin, plain_fails=False))


# -- operators and attributes -------------------------------------------------------------------
def test_compare_or_equal_at_opset_16() -> None:
    zero = (np.zeros(1, np.float32), "zero")
    m = _model([h.make_node("GreaterOrEqual", ["x", "zero"], ["ge"]),
                h.make_node("LessOrEqual", ["x", "zero"], ["le"]),
                h.make_node("Where", ["ge", "x", "zero"], ["a"]),
                h.make_node("Where", ["le", "a", "x"], ["y"])], [1, 3, 4], [zero], opset=16)
    x = RNG.standard_normal((1, 3, 4)).astype(np.float32)
    x[0, 0, :2] = 0.0  # the equal case
    _check(m, x)


def test_clip_with_one_or_run_time_bounds() -> None:
    top = _model([h.make_node("Clip", ["x", "", "hi"], ["y"])], [1, 2, 5],
                 [(np.array(0.3, np.float32), "hi")])
    assert _check(top, plain_fails=True)
    dyn = _model([h.make_node("ReduceMean", ["x"], ["lo"], keepdims=0),
                  h.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
                  h.make_node("Mul", ["m", "half"], ["hi"]),
                  h.make_node("Clip", ["x", "lo", "hi"], ["y"])], [1, 2, 5],
                 [(np.array(0.5, np.float32), "half")])
    assert "Clip" not in _ops(_check(dyn))


def test_clip_of_integer_indices_stays_integer() -> None:
    """swift-f0's tail clips an int64 index before a Gather; onnx2torch's Clip returns floats
    there, which Gather refuses: Max then Min keep the type."""
    table = (RNG.standard_normal((3, 4)).astype(np.float32), "table")
    m = _model([h.make_node("ArgMax", ["x"], ["i"], axis=1, keepdims=0),
                h.make_node("Clip", ["i", "lo", "hi"], ["c"]),
                h.make_node("Gather", ["table", "c"], ["y"], axis=0)], [1, 4],
               [table, (np.array(0, np.int64), "lo"), (np.array(2, np.int64), "hi")])
    x = np.array([[0.1, 0.2, 0.3, 0.9]], np.float32)  # argmax 3, clipped to 2
    assert "Clip" not in _ops(_check(m, x))


def test_a_node_torch_cannot_run_is_one_line_naming_it() -> None:
    """verify names the ONNX node whose translation fails in torch, never a traceback."""
    m = _model([h.make_node("ArgMax", ["x"], ["i"], axis=1, keepdims=0),
                h.make_node("Cast", ["i"], ["f"], to=T.FLOAT),
                h.make_node("Gather", ["table", "f_idx"], ["y"], axis=0, name="take")], [1, 4],
               [(RNG.standard_normal((3, 4)).astype(np.float32), "table"),
                (np.array(1, np.int64), "f_idx")])
    net, norm = tq.to_torch(m)
    gather = next(mod for mod in net.modules()
                  if type(mod).__name__.startswith("OnnxGather"))
    gather.forward = lambda *_: (_ for _ in ()).throw(ValueError("indices are float32"))
    with pytest.raises(ModelError, match=r"^node 'take' \(Gather\): torch cannot run "
                                         r"onnx2torch's translation \(ValueError: indices"):
        tq.verify(net, norm, np.ones((1, 4), np.float32))


def test_depth_to_space_dcr_and_space_to_depth() -> None:
    d2s = _model([h.make_node("DepthToSpace", ["x"], ["y"], blocksize=2, mode="DCR")],
                 [1, 8, 3, 4])
    _check(d2s)
    s2d = _model([h.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2)], [1, 3, 4, 6])
    _check(s2d)


def test_batch_norm_runs_in_eval_mode() -> None:
    m = _model([h.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])],
               [2, 3, 4, 4], [(_w(3), "s"), (_w(3), "b"), (_w(3), "m"),
                              (np.abs(_w(3)) + 0.5, "v")])
    _check(m, plain_fails=False)


def test_gradients_flow_through_the_rewritten_forms() -> None:
    """Training needs the input's gradient through Gather, MatMul, Pad, Slice, Mul."""
    m = _model([
        h.make_node("Resize", ["x", "", "s"], ["r"], mode="linear",
                    coordinate_transformation_mode="asymmetric"),
        h.make_node("Resize", ["r", "", "s2"], ["n"], mode="nearest",
                    coordinate_transformation_mode="half_pixel"),
        h.make_node("AveragePool", ["n"], ["a"], auto_pad="SAME_UPPER", kernel_shape=[2, 2],
                    strides=[2, 2]),
        h.make_node("ConvTranspose", ["a", "w"], ["y"], pads=[0, 1, 1, 0], strides=[2, 2])],
        [1, 2, 5, 6], [(np.array([1, 1, 1.5, 2], np.float32), "s"),
                       (np.array([1, 1, 0.6, 0.75], np.float32), "s2"), (_w(2, 2, 3, 3), "w")])
    net, _ = tq.to_torch(m)
    x = torch.from_numpy(RNG.standard_normal((1, 2, 5, 6)).astype(np.float32))
    x.requires_grad_(True)
    net(x).square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    _check(m, x.detach().numpy())


def test_dropout_layer_norm_and_cast_like() -> None:
    drop = _model([h.make_node("Dropout", ["x", "r"], ["y", "mask"], seed=7)], [1, 4],
                  [(np.array(0.3, np.float32), "r")])
    _check(drop)
    ln = _model([h.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv"],
                             axis=-1)], [1, 3, 6], [(_w(6), "s"), (_w(6), "b")], opset=17)
    _check(ln, plain_fails=False)
    like = _model([h.make_node("CastLike", ["x", "i"], ["c"]),
                   h.make_node("Cast", ["c"], ["y"], to=T.FLOAT)], [1, 5],
                  [(np.array([1], np.int32), "i")], opset=15)
    _check(like, RNG.standard_normal((1, 5)).astype(np.float32) * 4)


def test_selu_size_and_reshape_allowzero() -> None:
    selu = _model([h.make_node("Selu", ["x"], ["y"], alpha=1.2, gamma=0.8)], [1, 6])
    _check(selu)
    size = _model([h.make_node("Size", ["x"], ["n"]),
                   h.make_node("Cast", ["n"], ["nf"], to=T.FLOAT),
                   h.make_node("Div", ["x", "nf"], ["y"])], [1, 3, 4])
    _check(size)
    zero = _model([h.make_node("Reshape", ["x", "shape"], ["y"], allowzero=1)], [1, 3, 4],
                  [(np.array([1, 12], np.int64), "shape")], opset=14)
    _check(zero)


def test_silent_mistranslations_are_fixed() -> None:
    cumsum = _model([h.make_node("CumSum", ["x", "ax"], ["y"])], [1, 5],
                    [(np.array(1, np.int64), "ax")], opset=14)
    _check(cumsum)  # onnx2torch reverses it
    reduce = _model([h.make_node("ReduceMax", ["x"], ["y"], axes=[-2, -1], keepdims=0)],
                    [1, 3, 4, 5])
    _check(reduce)  # onnx2torch shifts the second negative axis
    prelu = _model([h.make_node("PRelu", ["x", "slope"], ["y"])], [1, 4, 3, 4],
                   [(np.array([0.1, 0.2, 0.3, 0.4], np.float32), "slope")])
    _check(prelu)  # ONNX: the slope runs along W; onnx2torch put it on the channels


def test_shapes_inference_leaves_out_are_measured() -> None:
    """torch's GroupNorm export: a Reshape back to Shape(x) that shape inference cannot follow,
    before a pool whose rewrite needs the static shape."""
    m = _model([h.make_node("Reshape", ["x", "groups"], ["g"]),
                h.make_node("InstanceNormalization", ["g", "ones", "zeros"], ["n"]),
                h.make_node("Shape", ["x"], ["shp"]),
                h.make_node("Reshape", ["n", "shp"], ["back"]),
                h.make_node("AveragePool", ["back"], ["y"], kernel_shape=[2, 2], strides=[2, 2],
                            ceil_mode=1, name="pool")], [1, 4, 5, 5],
               [(np.array([1, 2, -1], np.int64), "groups"), (np.ones(2, np.float32), "ones"),
                (np.zeros(2, np.float32), "zeros")], out_shape=[1, 4, 3, 3])
    assert not tq.Ctx(tq.infer(m)).shapes.get("back")  # inference alone leaves it out
    _check(m)


def test_graph_outputs_of_multi_output_nodes() -> None:
    """onnx2torch returned TopK's (values, indices) for its values output, and the two outputs
    of one Split as one."""
    topk = _model([h.make_node("TopK", ["x", "k"], ["y", "i"], axis=-1, largest=0)], [2, 6],
                  [(np.array([3], np.int64), "k")])
    _check(topk)
    split = _model([h.make_node("Split", ["x"], ["a", "b"], axis=1),
                    h.make_node("Relu", ["b"], ["c"])], [2, 6], outputs=("a", "b", "c"))
    net, _ = tq.to_torch(split)
    assert len(_torch(net, np.zeros((2, 6), np.float32))) == 3
    _check(split)


def test_weights_behind_constants_and_casts_are_folded() -> None:
    w16 = _w(3, 2, 3, 3).astype(np.float16)
    m = _model([h.make_node("Constant", [], ["w16"], value=nh.from_array(w16, "w16v")),
                h.make_node("Cast", ["w16"], ["w"], to=T.FLOAT),
                h.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], [1, 2, 5, 5])
    norm = _check(m)
    assert _ops(norm) == ["Conv"]


_I64 = np.int64
#: what tf2onnx / paddle2onnx / torch.onnx emit that onnx2torch converts right already
TAKEN: dict[str, tuple[list[onnx.NodeProto], list[int], list[object], int]] = {
    "squeeze-11 attr": ([h.make_node("Squeeze", ["x"], ["y"], axes=[1])], [2, 1, 3], [], 11),
    "squeeze-13 input": ([h.make_node("Squeeze", ["x", "a"], ["y"])], [2, 1, 3],
                         [(np.array([-2], _I64), "a")], 13),
    "split-11 attr": ([h.make_node("Split", ["x"], ["a", "b"], axis=1, split=[1, 3]),
                       h.make_node("Sub", ["b", "a"], ["y"])], [2, 4], [], 11),
    "slice steps": ([h.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"])], [3, 8],
                    [(np.array([7, 0], _I64), "s"), (np.array([-9, 8], _I64), "e"),
                     (np.array([1, 0], _I64), "a"), (np.array([-2, 3], _I64), "st")], 13),
    "hardsigmoid keras": ([h.make_node("HardSigmoid", ["x"], ["y"], alpha=0.2)], [2, 8], [], 13),
    "pad reflect": ([h.make_node("Pad", ["x", "p"], ["y"], mode="reflect")], [1, 2, 5, 5],
                    [(np.array([0, 0, 1, 2, 0, 0, 2, 1], _I64), "p")], 13),
    "clip-6 attrs": ([h.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.5)], [2, 4], [], 9),
    "prelu nhwc": ([h.make_node("PRelu", ["x", "s"], ["y"])], [1, 4, 5, 3],
                   [(np.array([[[0.1, 0.2, 0.3]]], np.float32), "s")], 13),
}


@pytest.mark.parametrize("name", sorted(TAKEN))
def test_constructs_onnx2torch_takes_stay_exact(name: str) -> None:
    nodes, shape, inits, opset = TAKEN[name]
    _check(_model(nodes, shape, inits, opset), plain_fails=False)


def test_onnx2torch_handles_softmax_before_13_unchanged() -> None:
    m = _model([h.make_node("Softmax", ["x"], ["y"], axis=1)], [1, 3, 2, 2], opset=11)
    assert tq.opset_of(_check(m, plain_fails=False)) == 11  # converts already: opset kept


def test_opset_11_isnan_is_upgraded() -> None:
    m = _model([h.make_node("IsNaN", ["x"], ["nan"]),
                h.make_node("Where", ["nan", "zero", "x"], ["y"])], [1, 6],
               [(np.zeros(1, np.float32), "zero")], opset=11)
    x = RNG.standard_normal((1, 6)).astype(np.float32)
    x[0, 2] = np.nan
    assert tq.opset_of(_check(m, x)) == 17


# -- opsets -------------------------------------------------------------------------------------
def test_opset_18_down_to_17() -> None:
    m = _model([h.make_node("ReduceMean", ["x", "ax"], ["r"], keepdims=1),
                h.make_node("Sub", ["x", "r"], ["c"]),
                h.make_node("Split", ["c"], ["s0", "s1", "s2"], axis=3, num_outputs=3),
                h.make_node("Pad", ["s0", "p", "", "pax"], ["pp"], mode="reflect"),
                h.make_node("Mish", ["s1"], ["mi"]),
                h.make_node("Resize", ["s2", "", "sc"], ["rs"], mode="linear",
                            coordinate_transformation_mode="half_pixel_symmetric"),
                h.make_node("Concat", ["pp", "mi", "rs"], ["y"], axis=3)], [1, 2, 4, 7],
               [(np.array([2, 3], np.int64), "ax"), (np.array([0, 1, 0, 1], np.int64), "p"),
                (np.array([2, 3], np.int64), "pax"),
                (np.array([1, 1, 1, 0.5], np.float32), "sc")], opset=18)
    norm = _check(m)
    assert tq.opset_of(norm) == 17


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_opset_20_gelu(approximate: str) -> None:
    m = _model([h.make_node("Gelu", ["x"], ["y"], approximate=approximate)], [1, 8], opset=20)
    _check(m)


def test_opset_9_upsample_is_upgraded() -> None:
    m = _model([h.make_node("Upsample", ["x", "s"], ["y"], mode="nearest")], [1, 2, 3, 3],
               [(np.array([1, 1, 2, 2], np.float32), "s")], opset=9)
    assert tq.opset_of(_check(m)) == 17


# -- refusals: one line naming the node ---------------------------------------------------------
def _refused(m: onnx.ModelProto) -> str:
    with pytest.raises(ModelError) as err:
        tq.to_torch(m)
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_unconvertible_operator_names_the_node() -> None:
    m = _model([h.make_node("Hardmax", ["x"], ["y"], name="head/hardmax")], [1, 5])
    assert _refused(m) == ("node 'head/hardmax' (Hardmax): onnx2torch has no converter for "
                           "Hardmax at opset 13")
    lstm = _model([h.make_node("LSTM", ["x", "W", "R"], ["", "y"], hidden_size=3, name="rnn")],
                  [2, 1, 4], [(_w(1, 12, 4), "W"), (_w(1, 12, 3), "R")], outputs=("y",))
    assert _refused(lstm).startswith("node 'rnn' (LSTM): onnx2torch has no converter for LSTM")


def test_refusals_before_conversion() -> None:
    wrap = _model([h.make_node("Pad", ["x", "p"], ["y"], mode="wrap", name="pw")], [1, 2, 5],
                  [(np.array([0, 0, 1, 0, 0, 1], np.int64), "p")], opset=19)
    assert _refused(wrap) == ("node 'pw' (Pad): mode 'wrap' (opset 19) has no form onnx2torch "
                              "converts")
    gn = _model([h.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2,
                             name="gn")], [1, 4, 3], [(_w(4), "s"), (_w(4), "b")], opset=21,
                out_shape=[1, 4, 3])
    assert _refused(gn).startswith("node 'gn' (GroupNormalization): GroupNormalization of "
                                   "opset 21 has no opset-17 form")
    dyn = _model([h.make_node("Shape", ["x"], ["shp"]),
                  h.make_node("Cast", ["shp"], ["w"], to=T.FLOAT),
                  h.make_node("Unsqueeze", ["w", "ax"], ["w4"]),
                  h.make_node("Conv", ["x", "w4"], ["y"], name="dynconv")], [1, 1, 1, 1],
                 [(np.array([0, 1, 2], np.int64), "ax")])
    assert _refused(dyn).startswith("node 'dynconv' (Conv): onnx2torch takes its input 'w4' "
                                    "only as a constant")


def test_verify_names_the_first_node_that_differs() -> None:
    w = _w(4, 3)

    def net_for(act: str) -> onnx.ModelProto:
        return _model([h.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
                       h.make_node(act, ["a"], ["b"], name="act"),
                       h.make_node("Mul", ["b", "two"], ["y"], name="scale")], [1, 4],
                      [(w, "w"), (np.array(2, np.float32), "two")])

    good, _ = tq.to_torch(net_for("Sigmoid"))
    _, other = tq.to_torch(net_for("Tanh"))  # same names, another activation
    x = RNG.standard_normal((1, 4)).astype(np.float32)
    with pytest.raises(ModelError, match=r"^node 'act' \(Tanh\): onnx2torch's translation"):
        tq.verify(good, other, x)


# -- wired into coinf compress ------------------------------------------------------------------
def _detector() -> onnx.ModelProto:
    """A MediaPipe-style face detector body: SAME_UPPER stride-2 convs, a depthwise block with
    a residual, a SAME max pool, two heads flattened and concatenated."""
    nodes = [
        h.make_node("Conv", ["image", "w0", "b0"], ["c0"], auto_pad="SAME_UPPER", strides=[2, 2],
                    name="conv0"),
        h.make_node("Relu", ["c0"], ["r0"], name="relu0"),
        h.make_node("Conv", ["r0", "wd", "bd"], ["d1"], auto_pad="SAME_UPPER", group=8,
                    name="dw1"),
        h.make_node("Conv", ["d1", "wp", "bp"], ["p1"], name="pw1"),
        h.make_node("Add", ["p1", "r0"], ["a1"], name="add1"),
        h.make_node("Relu", ["a1"], ["r1"], name="relu1"),
        h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], auto_pad="SAME_UPPER", strides=[2, 2],
                    name="conv2"),
        h.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        h.make_node("MaxPool", ["r2"], ["m2"], auto_pad="SAME_UPPER", kernel_shape=[2, 2],
                    strides=[2, 2], name="pool2"),
        h.make_node("Conv", ["m2", "wc", "bc"], ["cls"], name="cls"),
        h.make_node("Conv", ["m2", "wr", "br"], ["reg"], name="reg"),
        h.make_node("Reshape", ["cls", "flat"], ["cls_f"], name="cls_flat"),
        h.make_node("Reshape", ["reg", "flat"], ["reg_f"], name="reg_flat"),
        h.make_node("Concat", ["cls_f", "reg_f"], ["scores"], axis=1, name="concat"),
    ]
    inits = [(_w(8, 3, 3, 3), "w0"), (_w(8), "b0"), (_w(8, 1, 3, 3), "wd"), (_w(8), "bd"),
             (_w(8, 8, 1, 1), "wp"), (_w(8), "bp"), (_w(12, 8, 3, 3), "w2"), (_w(12), "b2"),
             (_w(2, 12, 1, 1), "wc"), (_w(2), "bc"), (_w(4, 12, 1, 1), "wr"), (_w(4), "br"),
             (np.array([1, -1], np.int64), "flat")]
    g = h.make_graph(nodes, "detector", [h.make_tensor_value_info("image", T.FLOAT,
                                                                  [1, 3, 15, 15])],
                     [h.make_tensor_value_info("scores", T.FLOAT, [1, 24])],
                     [nh.from_array(a, n) for a, n in inits])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def test_compress_trains_through_same_upper_convs(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from coinf.convert.split import split_model

    from coinf.bundle import Bundle
    from coinf.cli import main

    src = tmp_path / "detector.onnx"
    onnx.save(_detector(), src)
    root = tmp_path / "b"
    split_model(src, root)
    bundle = Bundle.load(root)
    cut = next(c.id for c in bundle.candidates
               if len(c.crossing) == 1 and c.crossing[0].name == "r1")
    plain = tq.load_onnx2torch()
    tail_file = bundle.candidate(cut).tail.file
    assert tail_file is not None
    tail = onnx.load(str(bundle.path(tail_file)))
    with pytest.raises(NotImplementedError, match="SAME_UPPER"):
        plain.convert(tail)  # what `coinf compress` stopped on before the normaliser
    data = RNG.standard_normal((40, 1, 3, 15, 15)).astype(np.float32)
    np.savez(tmp_path / "train.npz", image=data)
    torch.set_num_threads(1)
    rc = main(["compress", str(root), "--cut", cut, "--data", str(tmp_path / "train.npz"),
               "--steps", "3", "--lambda", "1e-3", "--latent", "2", "--hidden", "4",
               "--batch", "4", "--stride", "1", "--tolerance", "100",
               "--work", str(tmp_path / "work")])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert [c.kind for c in Bundle.load(root).compressors(cut)] == ["learned"]


def test_a_tail_torch_cannot_take_trains_in_feature_space_with_a_note_naming_the_node(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from coinf.convert.split import split_model

    from coinf.bundle import Bundle
    from coinf.cli import main

    m = _detector()
    relu = next(n for n in m.graph.node if n.name == "relu2")
    relu.op_type, relu.name = "Hardmax", "hm2"  # no converter in onnx2torch
    src = tmp_path / "detector.onnx"
    onnx.save(m, src)
    root = tmp_path / "b"
    split_model(src, root)
    bundle = Bundle.load(root)
    cut = next(c.id for c in bundle.candidates
               if len(c.crossing) == 1 and c.crossing[0].name == "r1")
    np.savez(tmp_path / "train.npz",
             image=RNG.standard_normal((40, 1, 3, 15, 15)).astype(np.float32))
    rc = main(["compress", str(root), "--cut", cut, "--data", str(tmp_path / "train.npz"),
               "--steps", "3", "--tolerance", "100", "--work", str(tmp_path / "work")])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert (f"note: {cut}: trained in feature space, without the tail (--cut {cut}: tail node "
            f"'hm2' (Hardmax): onnx2torch has no converter for Hardmax at opset 13)") in err
    (comp,) = Bundle.load(root).compressors(cut)
    assert comp.kind == "learned" and comp.rate_bytes > 0
