"""Hand-built and generated ONNX graphs for the convert tests (not a test module)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

IR = 8  # onnxruntime in the venv reads IR <= 13
F = T.FLOAT


def model(nodes, inputs, outputs, inits=(), opset=17, ir=IR, name="g"):  # type: ignore[no-untyped-def]
    g = h.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = ir
    return m


def init(name: str, arr: np.ndarray) -> T:
    return nh.from_array(np.asarray(arr), name)


def diamond() -> onnx.ModelProto:
    """Two inputs, branches, a skip, a constant sub-graph, Shape/Reshape chain, two outputs.

    Exporter-style: Constant nodes first, a Shape of a dynamic tensor feeding Reshape.
    """
    rng = np.random.default_rng(1)
    nodes = [
        h.make_node("Constant", [], ["k"], value=init("kv", np.float32([2.0]))),
        h.make_node("Constant", [], ["shape24"], value=init("sv", np.int64([2, 4]))),
        h.make_node("Add", ["w", "k"], ["w2"], name="const_add"),  # constant sub-graph
        h.make_node("MatMul", ["x", "w2"], ["a"], name="mm"),
        h.make_node("Relu", ["a"], ["b1"], name="relu"),
        h.make_node("Sigmoid", ["a"], ["b2"], name="sig"),
        h.make_node("Mul", ["b2", "z"], ["b3"], name="mul_z"),  # second input joins late
        h.make_node("Add", ["b1", "b3"], ["m"], name="merge"),
        h.make_node("Reshape", ["m", "shape24"], ["r"], name="reshape"),
        h.make_node("Shape", ["m"], ["ms"]),  # unnamed on purpose; Shape of a dynamic tensor
        h.make_node("Reshape", ["r", "ms"], ["r2"], name="reshape_back"),
        h.make_node("Add", ["r2", "a"], ["y"], name="skip"),
        h.make_node("Tanh", ["b1"], ["y2"], name="side_out"),
    ]
    inputs = [h.make_tensor_value_info("x", F, [1, 8]), h.make_tensor_value_info("z", F, [1, 8])]
    outputs = [h.make_tensor_value_info("y", F, [1, 8]),
               h.make_tensor_value_info("y2", F, [1, 8])]
    inits = [init("w", rng.standard_normal((8, 8)).astype(np.float32))]
    return model(nodes, inputs, outputs, inits)


def old_style(path: Path) -> Path:
    """IR 3 / opset 9 model whose initializers are also listed as graph inputs."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    b = rng.standard_normal((4,)).astype(np.float32)
    nodes = [h.make_node("Gemm", ["x", "W", "B"], ["g"], name="fc"),
             h.make_node("Relu", ["g"], ["r"], name="relu"),
             h.make_node("Mul", ["r", "W2"], ["y"], name="scale")]
    inputs = [h.make_tensor_value_info("x", F, [2, 6]),
              h.make_tensor_value_info("W", F, [6, 4]),
              h.make_tensor_value_info("B", F, [4]),
              h.make_tensor_value_info("W2", F, [4])]
    outputs = [h.make_tensor_value_info("y", F, [2, 4])]
    m = model(nodes, inputs, outputs, [init("W", w), init("B", b), init("W2", b * 2)],
              opset=9, ir=3)
    onnx.save(m, str(path))
    return path


def with_if() -> onnx.ModelProto:
    """An If whose branches capture outer-scope tensors (one dynamic, one initializer)."""
    then_g = h.make_graph([h.make_node("Add", ["h", "c"], ["t_out"], name="then_add")], "then",
                          [], [h.make_tensor_value_info("t_out", F, [1, 4])])
    else_g = h.make_graph([h.make_node("Mul", ["h", "h"], ["e_out"], name="else_mul")], "else",
                          [], [h.make_tensor_value_info("e_out", F, [1, 4])])
    nodes = [
        h.make_node("Relu", ["x"], ["h"], name="relu"),
        h.make_node("Neg", ["x"], ["n"], name="neg"),
        h.make_node("ReduceSum", ["n"], ["s"], name="rsum", keepdims=0),
        h.make_node("Less", ["s", "zero"], ["cond"], name="less"),
        h.make_node("If", ["cond"], ["iy"], name="branch", then_branch=then_g, else_branch=else_g),
        h.make_node("Add", ["iy", "n"], ["y"], name="out"),
    ]
    inits = [init("c", np.float32([[1, 2, 3, 4]])), init("zero", np.float32(0.0))]
    return model(nodes, [h.make_tensor_value_info("x", F, [1, 4])],
                 [h.make_tensor_value_info("y", F, [1, 4])], inits)


def chain_blocks(n_blocks: int, width: int = 4) -> onnx.ModelProto:
    """A long graph of Inception-like blocks: split into ``width`` branches then merge."""
    nodes = []
    cur = "x"
    for b in range(n_blocks):
        branches = []
        for j in range(width):
            out = f"b{b}_{j}"
            nodes.append(h.make_node("Relu" if j % 2 else "Sigmoid", [cur], [out],
                                     name=f"blk{b}_br{j}"))
            branches.append(out)
        acc = branches[0]
        for j in range(1, width):
            nxt = f"b{b}_s{j}"
            nodes.append(h.make_node("Add", [acc, branches[j]], [nxt], name=f"blk{b}_add{j}"))
            acc = nxt
        cur = acc
    nodes.append(h.make_node("Identity", [cur], ["y"], name="out"))
    return model(nodes, [h.make_tensor_value_info("x", F, [1, 4])],
                 [h.make_tensor_value_info("y", F, [1, 4])])


def custom_op() -> onnx.ModelProto:
    """A model with an op no runtime knows: its output shape cannot be resolved."""
    nodes = [h.make_node("Mystery", ["x"], ["m"], name="mystery", domain="com.example"),
             h.make_node("Relu", ["m"], ["y"], name="relu")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", F, [1, 4])],
                     [h.make_tensor_value_info("y", F, [1, 4])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.example", 1)])
    m.ir_version = IR
    return m


def random_dag(spec: list[tuple[int, int, int]], n_inputs: int, out_mask: int) -> onnx.ModelProto:
    """A DAG from a hypothesis-drawn spec: each entry ``(kind, i, j)`` adds one node reading
    earlier tensors ``i``/``j`` (indices taken modulo what exists). All tensors are [1, 6]."""
    rng = np.random.default_rng(len(spec) * 7 + n_inputs)
    tensors = [f"in{k}" for k in range(n_inputs)]
    nodes = [
        h.make_node("Constant", [], ["cshape"], value=init("cs", np.int64([2, 3])), name="cshape"),
        h.make_node("Add", ["wa", "wb"], ["cw"], name="const_w"),  # constant sub-graph
        h.make_node("ConstantOfShape", ["cshape"], ["cfill"], name="cfill",
                    value=init("one", np.float32([0.5]))),
    ]
    inits = [init("wa", rng.standard_normal((1, 6)).astype(np.float32)),
             init("wb", rng.standard_normal((1, 6)).astype(np.float32)),
             init("wm", rng.standard_normal((6, 6)).astype(np.float32) * 0.3)]
    for k, (kind, i, j) in enumerate(spec):
        a = tensors[i % len(tensors)]
        b = tensors[j % len(tensors)]
        out = f"t{k}"
        name = f"n{k}"
        kind %= 7
        if kind == 0:
            nodes.append(h.make_node("Add", [a, b], [out], name=name))
        elif kind == 1:
            nodes.append(h.make_node("Tanh", [a], [out], name=name))
        elif kind == 2:
            nodes.append(h.make_node("Mul", [a, "cw"], [out], name=name))
        elif kind == 3:
            nodes.append(h.make_node("MatMul", [a, "wm"], [out], name=name))
        elif kind == 4:  # Shape/Reshape chain through [2, 3] and back
            nodes.append(h.make_node("Reshape", [a, "cshape"], [out + "_r"], name=name + "_r"))
            nodes.append(h.make_node("Add", [out + "_r", "cfill"], [out + "_f"],
                                     name=name + "_f"))
            nodes.append(h.make_node("Shape", [a], [out + "_s"], name=name + "_s"))
            nodes.append(h.make_node("Reshape", [out + "_f", out + "_s"], [out], name=name))
        elif kind == 5:  # Concat + Slice back to width 6
            nodes.append(h.make_node("Concat", [a, b], [out + "_c"], name=name + "_c", axis=1))
            nodes.append(h.make_node("Slice", [out + "_c", "s0", "s1", "s2"], [out], name=name))
        else:
            nodes.append(h.make_node("Sub", [a, b], [out], name=name))
        tensors.append(out)
    inits += [init("s0", np.int64([3])), init("s1", np.int64([9])), init("s2", np.int64([1]))]
    produced = tensors[n_inputs:]
    outs = [t for k, t in enumerate(produced) if out_mask >> k & 1] or [produced[-1]]
    if produced[-1] not in outs:
        outs.append(produced[-1])
    inputs = [h.make_tensor_value_info(t, F, [1, 6]) for t in tensors[:n_inputs]]
    outputs = [h.make_tensor_value_info(t, F, [1, 6]) for t in outs]
    return model(nodes, inputs, outputs, inits)


def constant_outputs() -> onnx.ModelProto:
    """Graph outputs that do not depend on the input: an initializer and a constant sub-graph."""
    nodes = [h.make_node("Relu", ["x"], ["r"], name="relu"),
             h.make_node("Exp", ["r"], ["y"], name="exp"),
             h.make_node("ConstantOfShape", ["shp"], ["filled"], name="fill",
                         value=init("v", np.float32([3.0])))]
    inits = [init("shp", np.int64([2, 2])), init("table", np.float32([1, 2, 3]))]
    return model(nodes, [h.make_tensor_value_info("x", F, [1, 4])],
                 [h.make_tensor_value_info("y", F, [1, 4]),
                  h.make_tensor_value_info("filled", F, [2, 2]),
                  h.make_tensor_value_info("table", F, [3])], inits)


def opaque_shape() -> onnx.ModelProto:
    """Reshape to a shape computed through float math: ONNX data propagation gives up, so the
    loader must learn the shapes from an onnxruntime run."""
    nodes = [h.make_node("Shape", ["x"], ["s"], name="shape"),
             h.make_node("Cast", ["s"], ["sf"], to=T.FLOAT, name="castf"),
             h.make_node("Abs", ["sf"], ["sq"], name="abs"),
             h.make_node("Max", ["sq", "sq"], ["m"], name="max"),
             h.make_node("Cast", ["m"], ["si"], to=T.INT64, name="casti"),
             h.make_node("Reshape", ["x", "si"], ["r"], name="reshape"),
             h.make_node("Relu", ["r"], ["y"], name="relu")]
    return model(nodes, [h.make_tensor_value_info("x", F, ["batch", 4])],
                 [h.make_tensor_value_info("y", F, ["a", "b"])])


def with_loop() -> onnx.ModelProto:
    """A Loop whose body holds an If; both capture outer-scope tensors (nested captures)."""
    inner_then = h.make_graph([h.make_node("Add", ["acc", "h"], ["t"], name="in_then")], "it",
                              [], [h.make_tensor_value_info("t", F, [1, 4])])
    inner_else = h.make_graph([h.make_node("Sub", ["acc", "k"], ["e"], name="in_else")], "ie",
                              [], [h.make_tensor_value_info("e", F, [1, 4])])
    body = h.make_graph(
        [h.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
         h.make_node("If", ["flag"], ["acc_out"], name="body_if", then_branch=inner_then,
                     else_branch=inner_else)],
        "body",
        [h.make_tensor_value_info("i", T.INT64, []),
         h.make_tensor_value_info("cond_in", T.BOOL, []),
         h.make_tensor_value_info("acc", F, [1, 4])],
        [h.make_tensor_value_info("cond_out", T.BOOL, []),
         h.make_tensor_value_info("acc_out", F, [1, 4])])
    nodes = [
        h.make_node("Relu", ["x"], ["h"], name="relu"),
        h.make_node("ReduceMax", ["x"], ["mx"], name="rmax", keepdims=0),
        h.make_node("Greater", ["mx", "zero"], ["flag"], name="gt"),
        h.make_node("Sigmoid", ["x"], ["s"], name="sig"),
        h.make_node("Loop", ["trips", "yes", "s"], ["acc_final"], name="loop", body=body),
        h.make_node("Mul", ["acc_final", "h"], ["y"], name="out"),
    ]
    inits = [init("trips", np.int64(3)), init("yes", np.bool_(True)),
             init("zero", np.float32(0.0)), init("k", np.float32([[0.5, 1, 1.5, 2]]))]
    return model(nodes, [h.make_tensor_value_info("x", F, [1, 4])],
                 [h.make_tensor_value_info("y", F, [1, 4])], inits)
