"""If/Loop/Scan bodies that read tensors of the enclosing graph (outer-scope captures).

A sub-graph may use a name of an enclosing graph without listing it as an input of its node.
Such a capture is a real input of the node: it orders the node after the producer, makes it
dynamic, crosses a cut whose tail holds the node (or is replicated when constant), and names
defined only inside a body never appear at the graph level.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from coinf.convert.graph import Graph, captures, load_graph, node_inputs, ort_session, subgraphs
from coinf.convert.split import split_model
from coinf.convert.verify import verify_bundle
from onnx import GraphProto, ModelProto, TensorProto, helper, numpy_helper

from coinf.bundle import Bundle, Candidate

F = TensorProto.FLOAT
IR = 8


def _vi(name: str, shape: tuple[int, ...] = (1, 4), elem: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, list(shape))


def _const(name: str, value: float) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=f"{name}_node",
                            value=numpy_helper.from_array(np.float32(value), f"{name}_value"))


def _model(nodes: list[onnx.NodeProto], inits: list[TensorProto]) -> ModelProto:
    graph = helper.make_graph(nodes, "scope", [_vi("x")], [_vi("y")], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = IR
    onnx.checker.check_model(model, full_check=True)
    return model


def _init(name: str, value: object) -> TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def if_model(post: str = "Relu") -> ModelProto:
    """(a) Relu -> a; ReduceSum(a) > 1 -> cond; If(cond): a*2 | a*-1, reading ``a`` from the
    outer scope (not an If input); then ``post`` -> y."""
    then_g = helper.make_graph([_const("two", 2.0), helper.make_node("Mul", ["a", "two"], ["t"])],
                               "then", [], [_vi("t")])
    else_g = helper.make_graph([_const("m1", -1.0), helper.make_node("Mul", ["a", "m1"], ["e"])],
                               "else", [], [_vi("e")])
    return _model([
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("ReduceSum", ["a"], ["s"], name="rsum", keepdims=0),
        helper.make_node("Greater", ["s", "one"], ["cond"], name="gt"),
        helper.make_node("If", ["cond"], ["iy"], name="branch", then_branch=then_g,
                         else_branch=else_g),
        helper.make_node(post, ["iy"], ["y"], name="post"),
    ], [_init("one", np.float32(1.0))])


def loop_model() -> ModelProto:
    """(b) A Loop whose body adds the outer ``a`` to its carried value; its body holds an If
    that reads the outer ``a`` and ``w``, the outer ``flag`` and the body-local ``half_acc``."""
    inner_then = helper.make_graph([helper.make_node("Add", ["half_acc", "a"], ["it"])], "it",
                                   [], [_vi("it")])
    inner_else = helper.make_graph([helper.make_node("Mul", ["half_acc", "w"], ["ie"])], "ie",
                                   [], [_vi("ie")])
    body = helper.make_graph(
        [helper.make_node("Mul", ["acc", "half"], ["half_acc"]),
         helper.make_node("If", ["flag"], ["acc2"], then_branch=inner_then,
                          else_branch=inner_else),
         helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [_vi("i", (), TensorProto.INT64), _vi("c_in", (), TensorProto.BOOL), _vi("acc")],
        [_vi("c_out", (), TensorProto.BOOL), _vi("acc2")])
    return _model([
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("ReduceSum", ["x"], ["s0"], name="rsum", keepdims=0),
        helper.make_node("Greater", ["s0", "zero"], ["flag"], name="gt"),
        helper.make_node("Sigmoid", ["x"], ["s"], name="sig"),
        helper.make_node("Loop", ["trips", "yes", "s"], ["lf"], name="loop", body=body),
        helper.make_node("Softmax", ["lf"], ["y"], name="post"),
    ], [_init("trips", np.int64(3)), _init("yes", np.bool_(True)), _init("zero", np.float32(0)),
        _init("half", np.float32(0.5)), _init("w", np.float32([[1, 2, 3, 4]]))])


def const_model() -> ModelProto:
    """(c) An If whose branches read the outer initializer ``w`` and the outer constant node
    output ``w2`` (= w * w), besides the dynamic ``a``; the condition depends on the input."""
    then_g = helper.make_graph([helper.make_node("Mul", ["a", "w"], ["t"])], "then", [],
                               [_vi("t")])
    else_g = helper.make_graph([helper.make_node("Sub", ["a", "w2"], ["e"])], "else", [],
                               [_vi("e")])
    return _model([
        helper.make_node("Mul", ["w", "w"], ["w2"], name="square_w"),  # constant
        helper.make_node("Tanh", ["x"], ["a"], name="tanh"),
        helper.make_node("ReduceSum", ["x"], ["s"], name="rsum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["cond"], name="gt"),
        helper.make_node("If", ["cond"], ["iy"], name="branch", then_branch=then_g,
                         else_branch=else_g),
        helper.make_node("Softmax", ["iy"], ["y"], name="post"),
    ], [_init("zero", np.float32(0)), _init("w", np.float32([[0.5, -1, 1.5, 2]]))])


# -- helpers ------------------------------------------------------------------------------------
def _local_names(graph: GraphProto) -> Iterator[str]:
    """Every name defined inside the sub-graphs of ``graph``'s nodes, recursively."""
    for node in graph.node:
        for sub in subgraphs(node):
            yield from (i.name for i in sub.input)
            yield from (t.name for t in sub.initializer)
            for inner in sub.node:
                yield from (o for o in inner.output if o)
            yield from _local_names(sub)


def _split(model: ModelProto, tmp_path: Path) -> tuple[Graph, Bundle]:
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return load_graph(path), split_model(path, tmp_path / "b", verify=True)


def _feeds(*rows: list[float]) -> dict[str, np.ndarray]:
    """Representative inputs, one feed per row (stacked on a new leading axis)."""
    return {"x": np.array([[r] for r in rows], dtype=np.float32)}


def _slices(bundle: Bundle, cand: Candidate) -> Iterator[ModelProto]:
    for part in (cand.head, cand.tail):
        if part.file is not None:
            yield onnx.load(str(bundle.path(part.file)))


def _check_scope(model: ModelProto, g: Graph, bundle: Bundle) -> None:
    """Names local to a body are nowhere at the graph level, in no crossing set and no slice's
    interface; every candidate verifies (split_model(verify=True) passed)."""
    local = set(_local_names(model.graph))
    assert local, "the model has sub-graphs with local names"
    top = set(g.types) | set(g.producer) | g.dynamic_tensors | set(g.consumers)
    assert not local & top
    assert bundle.meta["verified"]["ok"] is True
    for cand in bundle.candidates:
        assert not local & {t.name for t in cand.crossing}, cand.id
        for sl in _slices(bundle, cand):
            io = {v.name for v in [*sl.graph.input, *sl.graph.output]}
            assert not local & io, cand.id


# -- tests --------------------------------------------------------------------------------------
def test_captures_are_inputs_recursively() -> None:
    model = loop_model()
    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    (body,) = subgraphs(loop)
    # the body reads half; its If reads flag, and its branches a, w and half_acc (body-local)
    assert sorted(captures(body)) == ["a", "flag", "half", "w"]
    ins = node_inputs(loop)
    assert ins[:3] == ("trips", "yes", "s") and sorted(ins[3:]) == ["a", "flag", "half", "w"]
    branch = next(n for n in if_model().graph.node if n.op_type == "If")
    assert node_inputs(branch) == ("cond", "a")  # "two"/"m1" are defined inside


@pytest.mark.parametrize("post", ["Relu", "Softmax"])
def test_if_reading_outer_value_splits_and_verifies(tmp_path: Path, post: str) -> None:
    model = if_model(post)
    g, bundle = _split(model, tmp_path)
    branch = next(n for n in g.nodes if n.name == "branch")
    assert branch.dynamic and set(branch.inputs) == {"cond", "a"}
    _check_scope(model, g, bundle)
    # the cut before the If whose only reason to send ``a`` is the branch's capture
    before = next(c for c in bundle.candidates
                  if set(c.head.nodes) == {"relu", "rsum", "gt"})
    assert [t.name for t in before.crossing] == ["a", "cond"]
    # both branches: sum(relu(x)) > 1 takes then (2a), else (-a)
    pos, neg = [1.0, -2.0, 0.5, 3.0], [0.25, -1.0, 0.5, -3.0]
    sess = ort_session(model)
    for row, factor in ((pos, 2.0), (neg, -1.0)):
        a = np.maximum(np.float32([row]), 0)
        z = factor * a
        want = np.maximum(z, 0) if post == "Relu" else np.exp(z) / np.exp(z).sum()
        np.testing.assert_allclose(sess.run(["y"], {"x": np.float32([row])})[0], want,
                                   rtol=1e-6)
    assert verify_bundle(bundle, input_data=_feeds(pos, neg), feeds=2) == []
    if post == "Softmax":  # a cut whose head holds the If (the tail holds Softmax only)
        holds = next(c for c in bundle.candidates
                     if "branch" in c.head.nodes and c.tail.file is not None
                     and c.tail.nodes == ("post",))
        assert [t.name for t in holds.crossing] == ["iy"]


def test_loop_reading_outer_values_splits_and_verifies(tmp_path: Path) -> None:
    model = loop_model()
    g, bundle = _split(model, tmp_path)
    loop = next(n for n in g.nodes if n.name == "loop")
    assert {"a", "flag", "w", "half"} <= set(loop.inputs)
    assert not {"acc", "half_acc", "c_in", "i"} & set(loop.inputs)
    _check_scope(model, g, bundle)
    # relu's ``a`` feeds the Loop only through its body: a cut before the Loop must send it
    before = [c for c in bundle.candidates if "relu" in c.head.nodes and "loop" in c.tail.nodes]
    assert before and all("a" in {t.name for t in c.crossing} for c in before)
    assert any("loop" in c.head.nodes and c.tail.nodes for c in bundle.candidates)
    # both inner branches (flag = sum(x) > 0)
    feeds = _feeds([1.0, 2.0, -0.5, 0.25], [-1.0, 0.5, -2.0, 0.25])
    assert verify_bundle(bundle, input_data=feeds, feeds=2) == []


def test_if_reading_outer_constants_replicates_them(tmp_path: Path) -> None:
    model = const_model()
    g, bundle = _split(model, tmp_path)
    branch = next(n for n in g.nodes if n.name == "branch")
    assert {"w", "w2", "a", "cond"} == set(branch.inputs) and branch.dynamic
    assert not next(n for n in g.nodes if n.name == "square_w").dynamic
    _check_scope(model, g, bundle)
    for cand in bundle.candidates:
        assert not {"w", "w2"} & {t.name for t in cand.crossing}, cand.id
        for sl in _slices(bundle, cand):
            names = {n.name for n in sl.graph.node}
            if "branch" in names:  # the slice running the If carries what its branches read
                assert "w" in {t.name for t in sl.graph.initializer}
                assert "square_w" in names
    feeds = _feeds([1.0, 2.0, -0.5, 0.25], [-1.0, 0.5, -2.0, 0.25])
    assert verify_bundle(bundle, input_data=feeds, feeds=2) == []


def test_weights_inside_bodies_count_in_param_bytes(tmp_path: Path) -> None:
    _, bundle = _split(if_model("Softmax"), tmp_path)
    # "one" (initializer) and the Constants "two" and "m1" inside the branches: 3 float32
    assert bundle.meta["stats"]["param_bytes"] == 12
    last = bundle.candidates[-1]
    assert last.head.param_bytes == 12 and last.tail.param_bytes == 0
    first = bundle.candidates[0]
    assert first.head.param_bytes == 0 and first.tail.param_bytes == 12
