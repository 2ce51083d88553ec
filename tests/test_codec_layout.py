"""Image layout for codec rows: sample tensors follow the codecs' own rule (issue 49).

A calibrated NCHW model 3 pixels wide (input [1,3,8,3]) makes a [1,16,8,3] feature map,
which the image codecs read as a channels-last 16x8 picture of 3 channels
(``media.image_layout``). ``coinf profile --bundle`` built its sample frame channels-first
and died on a numpy broadcast; the input itself is no image and gets no codec rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from coinf.ble_protocol import media
from coinf.convert import calibrate as cal
from coinf.convert.codec_speed import _sample, codec_times
from coinf.convert.feeds import load_dataset
from coinf.convert.split import split_model
from coinf.device.profile import profile_bundle
from onnx import TensorProto, helper, numpy_helper

from coinf.bundle import Bundle

SPECS = ("q8", "png")


def _narrow_model(path: Path) -> None:
    """x[1,3,8,3] -conv(16, 3x3, same)-> relu -> gap -> flatten -> fc -> y[1,4]; class 0
    wins by a wide margin, so no packing changes the answer and calibration establishes that
    on 300 inputs."""
    rng = np.random.default_rng(0)
    inits = {"w1": rng.standard_normal((16, 3, 3, 3)), "b1": rng.standard_normal(16),
             "wf": rng.standard_normal((4, 16)), "bf": rng.standard_normal(4)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], "conv1", kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["b"], "relu1"),
             helper.make_node("GlobalAveragePool", ["b"], ["d"], "gap"),
             helper.make_node("Flatten", ["d"], ["e"], "flatten"),
             helper.make_node("Gemm", ["e", "wf", "bf"], ["y"], "fc", transB=1)]
    graph = helper.make_graph(
        nodes, "narrow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array((0.3 * v).astype(np.float32), k) for k, v in inits.items()])
    graph.initializer[-1].CopyFrom(numpy_helper.from_array(np.array([100, 0, 0, 0], np.float32),
                                                           "bf"))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    if "png" not in media.available():
        pytest.skip("the codecs extra is not installed")
    root = tmp_path_factory.mktemp("layout")
    _narrow_model(root / "narrow.onnx")
    split_model(root / "narrow.onnx", root / "b", force=True)
    b = Bundle.load(root / "b")
    np.savez(root / "x.npz", x=np.random.default_rng(1).random((300, 3, 8, 3), np.float32))
    data = load_dataset(str(root / "x.npz"), b)
    cal.store(b, cal.calibrate(b, data, SPECS), data)
    return Bundle.load(b.root)


def _shape(b: Bundle, cid: str) -> tuple[int, ...]:
    (t,) = b.candidate(cid).crossing
    return tuple(t.shape)


@pytest.mark.parametrize("shape,channel_axis", [((1, 16, 8, 3), 3), ((1, 3, 8, 8), 1),
                                                ((1, 224, 224, 3), 3), ((1, 1, 8, 16), 1)])
def test_sample_frames_are_laid_out_as_the_codec_reads_them(
        shape: tuple[int, ...], channel_axis: int) -> None:
    """Each channel of an image-like sample is the same picture (plus noise) in the layout
    ``image_layout`` names."""
    last, c, h, w = media.image_layout(shape)  # type: ignore[misc]
    assert last == (channel_axis == 3)
    x = _sample(shape, "float32", np.random.default_rng(0))
    planes = np.moveaxis(x[0], channel_axis - 1, 0)
    assert planes.shape == (c, h, w)
    assert np.abs(planes - planes[0]).max() < 0.6  # the same field, noise apart
    assert planes[0].std() > 0.3  # a picture, not a flat one


def test_profile_and_plan_never_crash_on_a_narrow_frame(bundle: Bundle) -> None:
    """``coinf profile --bundle`` times every calibrated packing (the [1,16,8,3] map's PNG
    among them), and the planner prices it; the [1,3,8,3] input has no codec rows."""
    specs = {c.id: [r["spec"] for r in cal.packing_rows(c)] for c in bundle.candidates}
    assert _shape(bundle, "c000") == (1, 3, 8, 3) and specs["c000"] == ["q8"]  # no image
    assert _shape(bundle, "c001") == (1, 16, 8, 3) and specs["c001"] == list(SPECS)
    for cand in bundle.candidates:
        assert set(codec_times(cand, repeats=1)) == {
            f"{k}_{r['spec']}_ms" for r in cal.packing_rows(cand) for k in ("encode", "decode")}
    from coinf.device.profile import DeviceProfile
    from coinf.wearable.planner.adapt import LinkEstimate
    from coinf.wearable.planner.planner import Planner

    wear = DeviceProfile.pi_zero_2w()
    wear.models[bundle.identity] = profile_bundle(bundle, 1, warmup=1, repeats=1)
    d = Planner(bundle, wear).decide(LinkEstimate(5_000_000, 5_000_000, 1))
    assert "c001~png" in {r.id for r in d.rows}


def test_bench_plan_runs_on_a_narrow_frame(bundle: Bundle) -> None:
    from coinf.cli.bench.plan import plan_one

    r = plan_one(bundle.root, bandwidth_kbps=5000, slowdown=2.0, threads=1, runs=1,
                 objective="latency", repeats=1)
    ids = {c["id"] for c in r["candidates"]}
    assert "c001~png" in ids and not any(i.startswith("c000~png") for i in ids)
