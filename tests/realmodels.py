"""Small ONNX models reproducing what exported real models do (issue 15); not a test module.

Each builder returns a checked ``ModelProto``: an ``If`` on an int64 scalar input, two axes
sharing one symbol, a first dim that is not a batch, a scalar input, a recurrent state
input/output pair, and a detector whose output 0 is box regression.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

F = T.FLOAT
RNG = np.random.default_rng(15)


def _w(*shape: int, scale: float = 0.5) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:  # type: ignore[no-untyped-def]
    g = h.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def if_on_rate() -> onnx.ModelProto:
    """x[1,8] and an int64 scalar ``sr``: ``If sr == 16000`` picks a 3-node branch giving
    [1,16] (then) or a 1-node branch giving [1,4] (else); only [1,16] fits the MatMul after."""
    w1, w2, w3, w4 = _w(8, 16), _w(16, 16), _w(8, 4), _w(16, 5)
    then = h.make_graph(
        [h.make_node("MatMul", ["x", "W1"], ["t1"], name="t_mm1"),
         h.make_node("Relu", ["t1"], ["t2"], name="t_relu"),
         h.make_node("MatMul", ["t2", "W2"], ["t3"], name="t_mm2"),
         h.make_node("Tanh", ["t3"], ["t_out"], name="t_tanh")],
        "then", [], [h.make_tensor_value_info("t_out", F, [1, 16])])
    other = h.make_graph([h.make_node("MatMul", ["x", "W3"], ["e_out"], name="e_mm")],
                         "else", [], [h.make_tensor_value_info("e_out", F, [1, 4])])
    nodes = [
        h.make_node("Constant", [], ["rate"], value=nh.from_array(np.array(16000, np.int64))),
        h.make_node("Equal", ["sr", "rate"], ["is16k"], name="eq"),
        h.make_node("If", ["is16k"], ["feat"], name="branch", then_branch=then,
                    else_branch=other),
        h.make_node("MatMul", ["feat", "W4"], ["logits"], name="head_mm"),
    ]
    return _model(nodes, [h.make_tensor_value_info("x", F, [1, 8]),
                          h.make_tensor_value_info("sr", T.INT64, [])],
                  [h.make_tensor_value_info("logits", F, [1, 5])],
                  [nh.from_array(a, n) for n, a in
                   (("W1", w1), ("W2", w2), ("W3", w3), ("W4", w4))])


def shared_symbol() -> onnx.ModelProto:
    """Paddle-style: x[1,1,?,?] (H and W both named ``?``); conv, pool over H, FC over W."""
    wc = _w(4, 1, 3, 3)
    nodes = [
        h.make_node("Conv", ["x", "Wc"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c"], ["r"], name="relu"),
        h.make_node("ReduceMean", ["r"], ["m"], name="pool_h", axes=[2], keepdims=0),
        h.make_node("Transpose", ["m"], ["t"], name="tr", perm=[0, 2, 1]),
        h.make_node("MatMul", ["t", "Wf"], ["y"], name="fc"),
    ]
    return _model(nodes, [h.make_tensor_value_info("x", F, [1, 1, "?", "?"])],
                  [h.make_tensor_value_info("y", F, [1, "?", 6])],
                  [nh.from_array(wc, "Wc"), nh.from_array(_w(4, 6), "Wf")], opset=13)


def frames_first() -> onnx.ModelProto:
    """x[8,3]: 8 frames of 3 features (the first dim is not a batch) -> per-frame classes."""
    nodes = [h.make_node("MatMul", ["x", "A"], ["a"], name="mm1"),
             h.make_node("Relu", ["a"], ["b"], name="relu"),
             h.make_node("MatMul", ["b", "B"], ["y"], name="mm2")]
    return _model(nodes, [h.make_tensor_value_info("x", F, [8, 3])],
                  [h.make_tensor_value_info("y", F, [8, 4])],
                  [nh.from_array(_w(3, 12), "A"), nh.from_array(_w(12, 4), "B")])


def scalar_gain() -> onnx.ModelProto:
    """x[1,6] and a float scalar ``gain`` (shape []) scaling the hidden layer."""
    nodes = [h.make_node("MatMul", ["x", "A"], ["a"], name="mm1"),
             h.make_node("Mul", ["a", "gain"], ["g"], name="gain_mul"),
             h.make_node("Relu", ["g"], ["b"], name="relu"),
             h.make_node("MatMul", ["b", "B"], ["y"], name="mm2")]
    return _model(nodes, [h.make_tensor_value_info("x", F, [1, 6]),
                          h.make_tensor_value_info("gain", F, [])],
                  [h.make_tensor_value_info("y", F, [1, 5])],
                  [nh.from_array(_w(6, 16), "A"), nh.from_array(_w(16, 5), "B")])


def recurrent() -> onnx.ModelProto:
    """An RNN cell: ``stateN = tanh(relu(x Wx) U + state Wh)``, ``prob = sigmoid(stateN Wy)``;
    the caller feeds ``stateN`` back as ``state``."""
    nodes = [h.make_node("MatMul", ["x", "Wx"], ["fx"], name="feat_mm"),
             h.make_node("Relu", ["fx"], ["fr"], name="feat_relu"),
             h.make_node("MatMul", ["fr", "U"], ["xu"], name="in_mm"),
             h.make_node("MatMul", ["state", "Wh"], ["hh"], name="rec_mm"),
             h.make_node("Add", ["xu", "hh"], ["pre"], name="cell_add"),
             h.make_node("Tanh", ["pre"], ["stateN"], name="cell_tanh"),
             h.make_node("MatMul", ["stateN", "Wy"], ["lo"], name="out_mm"),
             h.make_node("Sigmoid", ["lo"], ["prob"], name="out_sig")]
    wh = _w(8, 8, scale=0.9)
    return _model(nodes, [h.make_tensor_value_info("x", F, [1, 4]),
                          h.make_tensor_value_info("state", F, [1, 8])],
                  [h.make_tensor_value_info("prob", F, [1, 1]),
                   h.make_tensor_value_info("stateN", F, [1, 8])],
                  [nh.from_array(_w(4, 16), "Wx"), nh.from_array(_w(16, 8), "U"),
                   nh.from_array(wh, "Wh"), nh.from_array(_w(8, 1, scale=2.0), "Wy")])


def detector() -> onnx.ModelProto:
    """image[1,1,8,8] -> conv features -> ``boxes`` [1,16,4] (regression, output 0) and
    ``scores`` [1,16] (sigmoid face scores, output 1)."""
    # the four box coordinates are strongly correlated (as regressions are): their argmax
    # means nothing and flips with any noise, unlike the face decisions
    wb = (np.repeat(_w(6, 1), 4, axis=1) + _w(6, 4, scale=0.02)).astype(np.float32)
    nodes = [h.make_node("Conv", ["image", "Wc"], ["c"], name="conv", strides=[2, 2]),
             h.make_node("Relu", ["c"], ["r"], name="relu"),
             h.make_node("Reshape", ["r", "shp"], ["f"], name="flat"),
             h.make_node("Transpose", ["f"], ["ft"], name="tr", perm=[0, 2, 1]),
             h.make_node("MatMul", ["ft", "Wb"], ["boxes"], name="box_fc"),
             h.make_node("MatMul", ["ft", "Ws"], ["s"], name="score_fc"),
             h.make_node("Squeeze", ["s", "ax"], ["sq0"], name="sq"),
             h.make_node("Add", ["sq0", "bias"], ["sq"], name="score_bias"),
             h.make_node("Sigmoid", ["sq"], ["scores"], name="sig")]
    inits = [nh.from_array(_w(6, 1, 2, 2), "Wc"), nh.from_array(np.int64([1, 6, 16]), "shp"),
             nh.from_array(wb, "Wb"), nh.from_array(_w(6, 1, scale=1.0), "Ws"),
             nh.from_array(np.int64([2]), "ax"), nh.from_array(np.float32([-3.0]), "bias")]
    return _model(nodes, [h.make_tensor_value_info("image", F, [1, 1, 8, 8])],
                  [h.make_tensor_value_info("boxes", F, [1, 16, 4]),
                   h.make_tensor_value_info("scores", F, [1, 16])], inits)
