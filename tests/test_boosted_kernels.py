"""Boosted node-time trees, onnxruntime's optimized graph as slice features, and the context
sweep's coverage of the zoo's ops (issue 17, part 1)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from coinf.device.boosted import Boosted
from coinf.device.incontext import model_features, nchwc_folds_joins, trimmed_mean
from coinf.device.ortgraph import optimized_graph
from coinf.device.slicepred import SlicePredictor, node_vector
from coinf.device.sweep import random_feeds
from coinf.research.context_sweep import random_network, random_sequence_network
from coinf.research.ortkernels import kernels
from coinf.research.slicetrain import NodeSample, fit_boosted, train_slice_predictor

from tests.test_incontext import conv_bn_relu_gemm

# time beyond the suite's 30 s a test: fits tree predictors (up to 17 s alone)
pytestmark = pytest.mark.timeout(120)


def _data(n: int = 400) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 4, size=(n, 3))
    # a step no power law has: 3x slower when feature 1 is above 2
    y = np.log(0.01 * np.exp(x[:, 0]) * np.where(x[:, 1] > 2, 3.0, 1.0))
    return x, y


def test_boosted_trees_learn_a_step_and_survive_json() -> None:
    x, y = _data()
    model = fit_boosted(x, y, trees=150)
    err = np.abs(model(x) - y)
    assert np.median(err) < 0.1  # within ~10 % in time
    again = Boosted.from_json(model.to_json())
    np.testing.assert_allclose(again(x), model(x), rtol=1e-12)
    with pytest.raises(ValueError, match="features per row"):
        model(x[:, :2])


@pytest.mark.parametrize("field, value, match", [
    (0, lambda t: [10 ** 6, *t[0][1:]], "out of range"),        # left child past the end
    (0, lambda t: [0, *t[0][1:]], "precedes"),                # a node its own child: a cycle
    (2, lambda t: [7, *t[2][1:]], "out of range"),            # feature 7 of 3
    (3, lambda t: [float("nan"), *t[3][1:]], "non-finite"),
])
def test_boosted_json_is_validated(field: int, value, match: str) -> None:
    x, y = _data()
    obj = fit_boosted(x, y, trees=3).to_json()
    tree = obj["trees"][0]
    tree[field] = value(tree)
    with pytest.raises(ValueError, match=match):
        Boosted.from_json(obj)
    with pytest.raises(ValueError, match="format"):
        Boosted.from_json({"format": "pickle"})


def test_optimized_graph_counts_the_kernels_that_run() -> None:
    model = conv_bn_relu_gemm()
    k = kernels(model)
    graph = optimized_graph(model)
    assert k.count == len(graph.graph.node)
    # BN and the activations fold into their Conv/Gemm on every CPU
    assert 3 <= k.count < len(model.graph.node)
    assert (k.reorders == 0) == (k.reorder_melems == 0)
    if k.reorders:  # NCHWc on this CPU: each reorder copies at least the pooled 32 values
        assert k.reorder_melems * 1e6 >= 32


def residual_block(channels: int) -> onnx.ModelProto:
    """Conv+ReLU, Conv+ReLU, Conv, Add (the first block's output), ReLU: ResNet's join."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def weight(name: str, cin: int) -> onnx.TensorProto:
        return numpy_helper.from_array(
            rng.normal(0, 0.1, (channels, cin, 3, 3)).astype(np.float32), name)

    conv = {"pads": [1, 1, 1, 1]}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], name="conv0", **conv),
             helper.make_node("Relu", ["a"], ["ar"], name="relu0"),
             helper.make_node("Conv", ["ar", "w1"], ["b"], name="conv1", **conv),
             helper.make_node("Relu", ["b"], ["br"], name="relu1"),
             helper.make_node("Conv", ["br", "w2"], ["c"], name="conv2", **conv),
             helper.make_node("Add", ["c", "ar"], ["d"], name="add"),
             helper.make_node("Relu", ["d"], ["y"], name="relu2")]
    graph = helper.make_graph(
        nodes, "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 24, 24])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 24, 24])],
        [weight("w0", 3), weight("w1", channels), weight("w2", channels)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _nchwc_conv(inputs: list[str], activation: str = "") -> onnx.ModelProto:
    """An optimized graph of one NCHWc Conv named after the tensor ``c`` (see ortgraph)."""
    from onnx import helper

    attrs = {"activation": activation} if activation else {}
    node = helper.make_node("Conv", inputs, ["t"], name="c_nchwc", domain="com.microsoft.nchwc",
                            **attrs)
    return helper.make_model(helper.make_graph([node], "opt", [], []))


def test_sum_fusion_is_read_off_the_nchwc_convolution_with_a_fourth_input() -> None:
    from coinf.device.incontext import sum_fused

    model = residual_block(16)
    assert sum_fused(model, _nchwc_conv(["r0", "w", "", "r1"], "Relu")) == \
        {"add": "conv2", "relu2": "conv2"}
    assert sum_fused(model, _nchwc_conv(["r0", "w", "", "r1"])) == {"add": "conv2"}
    assert sum_fused(model, _nchwc_conv(["r0", "w", "b"], "Relu")) == {}  # no Sum input


@pytest.mark.parametrize("channels", [16, 12])
def test_a_residual_add_onnxruntime_folds_costs_nothing_of_its_own(channels: int) -> None:
    from coinf.device.incontext import sum_fused

    model = residual_block(channels)
    graph = optimized_graph(model)
    folded = sum_fused(model, graph)
    feats = model_features(model, graph)
    # on x86, onnxruntime folds the Add into an NCHWc Conv when the channels fill its blocks
    # (12 never does); elsewhere it may not fold it at all: either way the features follow
    if any(n.domain.endswith("nchwc") and len(n.input) > 3 and n.input[3]
           for n in graph.graph.node):
        assert folded == {"add": "conv2", "relu2": "conv2"}
        assert set(feats) == {"conv0", "conv1", "conv2"}
        assert feats["conv2"][1] == "conv:k+sum+fused"
        assert node_vector(*feats["conv2"])[-1] == 1.0
        assert node_vector(*feats["conv1"])[-1] == 0.0
    else:
        assert folded == {} and {"add", "relu2"} <= set(feats)
        assert all("+sum" not in g for _, g in feats.values())
    assert model_features(model) == feats  # the graph onnxruntime makes, when not given
    if channels == 16:  # the per-process probe agrees with what this block shows
        assert bool(folded) == nchwc_folds_joins()


def test_no_session_is_built_for_a_model_without_a_join_after_a_convolution(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import coinf.device.ortgraph as ortgraph
    from coinf.device.incontext import sum_fused

    def refuse(*_: object) -> None:
        raise AssertionError("a session was built")

    folds = nchwc_folds_joins()  # probed before sessions are refused
    monkeypatch.setattr(ortgraph, "optimized_graph", refuse)
    assert sum_fused(conv_bn_relu_gemm()) == {}
    if folds:  # a join after a convolution does need the optimized graph
        with pytest.raises(AssertionError, match="session was built"):
            sum_fused(residual_block(16))
    else:  # an onnxruntime that folds nothing is never asked
        assert sum_fused(residual_block(16)) == {}


def test_trimmed_mean_resolves_below_the_profilers_microsecond() -> None:
    # the outlier and the smallest value dropped, the rest averaged; a median would say 0.003
    assert trimmed_mean([0.002, 0.003, 0.002, 0.003, 0.1]) == pytest.approx(0.0026667, rel=1e-3)
    assert trimmed_mean([0.002] * 4 + [0.003] * 6) == pytest.approx(0.0026666, rel=1e-3)
    assert trimmed_mean([0.004]) == 0.004


def test_synthetic_networks_cover_the_zoos_ops_and_run() -> None:
    ops: set[str] = set()
    for i in range(24):
        model = (random_sequence_network if i % 2 else random_network)(i)
        onnx.checker.check_model(model, full_check=True)
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        sess.run(None, random_feeds(sess))
        ops |= {n.op_type for n in model.graph.node}
    assert {"LSTM", "GRU", "LRN", "Gather", "ReduceMax", "MatMul", "Slice", "Concat",
            "Tanh", "Sigmoid", "AveragePool", "MaxPool", "Conv", "Gemm"} <= ops


def test_small_networks_run_and_cover_lenet_and_senna_like_layers() -> None:
    from coinf.research.context_sweep import model_name, network

    ops: set[str] = set()
    channels: set[int] = set()
    maps: set[int] = set()
    for i in range(20):
        model = network(i, family="small")
        onnx.checker.check_model(model, full_check=True)
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        sess.run(None, random_feeds(sess))
        ops |= {n.op_type for n in model.graph.node}
        for init in model.graph.initializer:
            if len(init.dims) == 4:  # conv weights: output channels
                channels.add(int(init.dims[0]))
        maps |= {int(i.type.tensor_type.shape.dim[-1].dim_value) for i in model.graph.input
                 if len(i.type.tensor_type.shape.dim) == 4}
    assert {"Conv", "MaxPool", "Gemm", "Gather", "Concat", "Flatten"} <= ops
    assert any(c % 8 for c in channels)  # channel counts the NCHWc-friendly family lacks
    assert min(maps) < 16  # maps smaller than any of the mixed family's
    assert network(3, family="small").SerializeToString() == \
        network(3, family="small").SerializeToString()  # deterministic
    assert model_name(3, "small") == "small3" and model_name(3) == "synthetic3"
    with pytest.raises(ValueError, match="family"):
        network(0, family="huge")


def test_gated_and_mobile_networks_run_and_have_their_models_layers() -> None:
    from coinf.research.context_sweep import network
    from onnx import helper

    def attr(node: onnx.NodeProto, name: str, default: object) -> object:
        return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name),
                    default)

    dilations: set[int] = set()
    split = depthwise = adds = 0
    for family in ("gated", "mobile"):
        for i in range(12):
            model = network(i, family=family)
            onnx.checker.check_model(model, full_check=True)
            sess = ort.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
            sess.run(None, random_feeds(sess))
            convs = [n for n in model.graph.node if n.op_type == "Conv"]
            if family == "gated":
                dilations |= {int(max(attr(n, "dilations", [1]))) for n in convs}
                readers: dict[str, int] = {}
                for n in model.graph.node:
                    if n.op_type in ("Tanh", "Sigmoid"):
                        readers[n.input[0]] = readers.get(n.input[0], 0) + 1
                split += all(v == 1 for v in readers.values())
            else:
                shapes = {t.name: list(t.dims) for t in model.graph.initializer}
                depthwise += sum(int(attr(n, "group", 1)) > 1 and shapes[n.input[1]][1] == 1
                                 for n in convs)
                adds += sum(n.op_type == "Add" for n in model.graph.node)
        assert network(5, family=family).SerializeToString() == \
            network(5, family=family).SerializeToString()  # deterministic
    assert {1, 2, 4, 8} <= dilations  # dilated 1-D convolutions, doubling per layer
    assert 0 < split < 12  # separate filter and gate convolutions in some, shared in others
    assert depthwise > 12 and adds > 0  # depthwise 3x3s and residual Adds


def test_predictor_with_trees_round_trips_and_falls_back_for_unseen_ops() -> None:
    feats = {}
    nodes = []
    for i in range(8):
        fm = model_features(random_network(i))
        feats.update(fm)
        nodes += [NodeSample(f"m{i}", f, g, 1e-3 * (1 + f.flops / 1e6)) for f, g in fm.values()]
    assert len(nodes) >= 50
    pred = train_slice_predictor(nodes, [], {})
    assert pred.boosted is not None and "Conv" in pred.boosted_ops
    again = SlicePredictor.from_json(pred.to_json())
    for f, g in feats.values():
        assert again.node_ms(f, g) == pytest.approx(pred.node_ms(f, g), rel=1e-9)
    # an op the trees never saw uses the power laws
    lstm = next(fg for fg in model_features(random_sequence_network(3)).values()
                if fg[0].op_type in ("LSTM", "GRU", "Gather"))
    assert lstm[0].op_type not in pred.boosted_ops
    assert pred.node_ms(*lstm) == pytest.approx(pred.law_ms(*lstm))
    assert len(node_vector(*lstm)) == pred.boosted.features
    # a predictor from before the residual-join feature (version 2) is refused, saying why
    old = {**pred.to_json(), "version": 2}
    with pytest.raises(ValueError, match=r"version 2; this coinf reads 3 .*profile --train"):
        SlicePredictor.from_json(old)


def test_the_profilers_share_of_each_kernel_is_measured_and_taken_off() -> None:
    from coinf.research.slicetrain import SliceSample, profiler_inflation, profiler_surplus

    fm = model_features(random_network(5))
    names = list(fm)
    nodes = [NodeSample("m", f, g, 0.004) for f, g in fm.values()]  # 4 us each, profiled
    whole_ms = 0.003 * len(nodes)  # unprofiled, the whole model runs 1 us faster per kernel
    whole = SliceSample("m", "c000.tail", tuple(names), len(nodes), 0.0, whole_ms)
    part = SliceSample("m", "c001.tail", tuple(names[1:]), len(nodes) - 1, 0.0, whole_ms / 2)
    assert profiler_inflation(nodes, [part, whole]) == pytest.approx(0.001)
    assert profiler_surplus(nodes, [part, whole]) == {"m": pytest.approx(0.001)}
    assert profiler_inflation(nodes, [part]) == 0.0  # no slice holds every node: unknown
    faster = [SliceSample("m", "c000.tail", tuple(names), len(nodes), 0.0, 0.005 * len(nodes))]
    assert profiler_inflation(nodes, faster) == 0.0  # never negative
    # a long run over few kernels says little about a microsecond per kernel: it is weighted
    # by kernels per ms, so its drift (here 1 ms per kernel the other way) does not win
    fl = model_features(random_network(6))
    long_nodes = [NodeSample("long", f, g, 5.0 / len(fl)) for f, g in fl.values()]
    long_run = SliceSample("long", "c000.tail", tuple(fl), 2, 0.0, 7.0)
    assert profiler_surplus(long_nodes, [long_run]) == {"long": pytest.approx(-1.0)}
    assert profiler_inflation(nodes + long_nodes, [whole, long_run]) == pytest.approx(0.001)
    pred = train_slice_predictor(nodes, [whole], {"m": fm})
    assert pred.profiler_ms == pytest.approx(0.001)
    obj = pred.to_json()
    assert SlicePredictor.from_json(obj).profiler_ms == pytest.approx(0.001)
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="profiler_ms"):
            SlicePredictor.from_json({**obj, "profiler_ms": bad})
