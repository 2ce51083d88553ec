"""Spatial partition (MeDNN GTDP): stitched tiles equal the whole model, GTDP covers the map."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from coinf.ble_protocol.request import Tile
from coinf.convert.gtdp import Worker, gtdp, plan_groups
from coinf.convert.spatial import Rect, input_region
from coinf.device.spatial import SpatialModel, check_tile, tile_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from coinf.errors import InputError, ModelError

# time beyond the suite's 30 s a test: tiles the zoo's VGG over helpers (10 s alone)
pytestmark = pytest.mark.timeout(120)


def _model(nodes: list, inits: list, out: str, in_shape: tuple[int, ...],
           out_shape: tuple[int, ...] | None = None) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, *in_shape])
    y = helper.make_tensor_value_info(out, TensorProto.FLOAT,
                                      None if out_shape is None else [1, *out_shape])
    g = helper.make_graph(nodes, "stack", [x], [y], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@st.composite
def conv_stacks(draw: st.DrawFn) -> tuple[onnx.ModelProto, tuple[int, int, int]]:
    """A random stack of Conv / MaxPool / AveragePool / Relu layers on a random input map."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    c = draw(st.sampled_from([1, 2, 4]))
    h, w = draw(st.integers(9, 24)), draw(st.integers(9, 24))
    in_shape = (c, h, w)
    x = "x"
    nodes: list = []
    inits: list = []
    for i in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["conv", "conv", "conv", "maxpool", "avgpool", "relu"]))
        y = f"t{i}"
        if kind == "relu":
            nodes.append(helper.make_node("Relu", [x], [y]))
            x = y
            continue
        k = draw(st.integers(1, 3))
        s = draw(st.integers(1, 2))
        if kind == "conv":
            auto = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
            d = 1 if auto.startswith("SAME") else draw(st.integers(1, 2))  # ORT: no dilated SAME
            groups = draw(st.sampled_from([g for g in (1, 2, c) if c % g == 0]))
            cout = groups * draw(st.integers(1, 2))
            attrs: dict[str, object] = {"strides": [s, s], "dilations": [d, d], "group": groups}
            if auto == "NOTSET":
                attrs["pads"] = [draw(st.integers(0, k - 1)) for _ in range(4)]
            else:
                attrs["auto_pad"] = auto
            span = d * (k - 1) + 1
            if h < span or w < span:
                break
            wt = rng.standard_normal((cout, c // groups, k, k)).astype(np.float32)
            bias = rng.standard_normal(cout).astype(np.float32)
            inits += [numpy_helper.from_array(wt, f"w{i}"), numpy_helper.from_array(bias, f"b{i}")]
            nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [y],
                                          kernel_shape=[k, k], **attrs))
        else:
            op = "MaxPool" if kind == "maxpool" else "AveragePool"
            k = max(k, 2)
            p = draw(st.integers(0, k // 2))
            attrs = {"kernel_shape": [k, k], "strides": [s, s], "pads": [p, p, p, p],
                     "ceil_mode": draw(st.integers(0, 1)) if op == "MaxPool" else 0}
            if op == "AveragePool":
                attrs["count_include_pad"] = draw(st.integers(0, 1))
            if h + 2 * p < k or w + 2 * p < k:
                break
            nodes.append(helper.make_node(op, [x], [y], **attrs))
        x = y
        inferred = onnx.shape_inference.infer_shapes(_model(nodes, inits, x, in_shape))
        shape = [d.dim_value for d in inferred.graph.output[0].type.tensor_type.shape.dim]
        if len(shape) != 4 or min(shape[2:]) < 1:
            nodes.pop()
            x = nodes[-1].output[0] if nodes else "x"
            break
        c, h, w = shape[1], shape[2], shape[3]
    if not nodes:
        nodes.append(helper.make_node("Relu", ["x"], ["t0"]))
        x = "t0"
    return _model(nodes, inits, x, in_shape, (c, h, w)), in_shape


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(stack=conv_stacks(), n=st.integers(2, 4), data=st.data())
def test_stitched_tiles_equal_the_whole_model(tmp_path: Path, stack: tuple, n: int,
                                              data: st.DataObject) -> None:
    model, in_shape = stack
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    speeds = data.draw(st.lists(st.floats(0.5, 4.0), min_size=n, max_size=n))
    workers = [Worker(f"w{i}", s * 1e9, data.draw(st.sampled_from([1e6, 1e8, float("inf")])))
               for i, s in enumerate(speeds)]
    strategy = data.draw(st.sampled_from(["per-layer", "fused", "whole"]))
    try:
        sm = SpatialModel(path)
    except ModelError:  # the first node is a pool tiles cannot reproduce (checked below)
        node = model.graph.node[0]
        assert node.op_type == "MaxPool"
        assert any(a.name == "ceil_mode" and a.i == 1 for a in node.attribute)
        return
    x = np.random.default_rng(0).standard_normal((1, *in_shape)).astype(np.float32)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = list(sm.run({"x": x}, sm.plan(workers, strategy)).values())
    stop = len(sm.chain)  # every layer is partitioned, but for a ceil-mode pool whose last
    if stop < len(model.graph.node):  # window starts in its end padding (runs as the rest)
        node = model.graph.node[stop]
        assert node.op_type == "MaxPool"
        assert any(a.name == "ceil_mode" and a.i == 1 for a in node.attribute)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-5)


@given(h=st.integers(1, 40), w=st.integers(1, 40),
       weights=st.lists(st.floats(0.1, 10.0), min_size=1, max_size=5))
@settings(max_examples=200, deadline=None)
def test_gtdp_covers_the_map_and_the_fastest_device_works(h: int, w: int,
                                                          weights: list[float]) -> None:
    rects = gtdp(Rect(0, h, 0, w), weights)
    assert len(rects) == len(weights)
    cover = np.zeros((h, w), dtype=int)
    for r in rects:
        if not r.empty():
            cover[r.r0:r.r1, r.c0:r.c1] += 1
    assert (cover == 1).all()  # every pixel computed exactly once
    fastest = int(np.argmax(weights))
    assert not rects[fastest].empty()
    if h * w >= len(weights):
        assert all(not r.empty() for r in rects)


def test_gtdp_splits_by_the_shorter_edge_in_proportion() -> None:
    a, b = gtdp(Rect(0, 10, 0, 30), [1.0, 2.0])
    assert (a.h, b.h) == (10, 10)  # a vertical line of length 10, not a horizontal one of 30
    assert (a.w, b.w) == (10, 20)


def test_input_region_pads_only_at_the_border() -> None:
    from coinf.convert.spatial import Layer, Window

    conv = Layer(0, "Conv", Window((3, 3), (1, 1), (1, 1), (1, 1, 1, 1)), (1, 8, 8), (1, 8, 8))
    region, pads, _ = input_region([conv], 0, 1, Rect(0, 4, 4, 8))
    assert region == Rect(0, 5, 3, 8)
    assert pads == [(1, 0, 0, 1)]  # top and right are the map's border; left/bottom are halo
    with pytest.raises(ModelError, match="not inside"):
        input_region([conv], 0, 1, Rect(0, 9, 0, 8))


def test_tiles_are_validated() -> None:
    key = tile_of(0, 3, Rect(1, 5, 0, 7))
    assert key == Tile(0, 3, 1, 5, 0, 7)
    assert check_tile(key, 3) == (0, 3, Rect(1, 5, 0, 7))
    for bad in (Tile(0, 9, 0, 1, 0, 1), Tile(2, 2, 0, 1, 0, 1), Tile(0, 1, 3, 3, 0, 1)):
        with pytest.raises(ModelError):
            check_tile(bad, 3)


def test_zoo_vgg_tiles_and_hostile_regions() -> None:
    from coinf.models.zoo import committed_path

    path = committed_path("vgg")
    sm = SpatialModel(path)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).random((1, 3, 64, 64), dtype=np.float32)
    ref = sess.run(None, {"image": x})[0]
    workers = [Worker(f"d{i}", 1e9, 12.5e6, 0.002) for i in range(4)]
    for strategy in ("per-layer", "fused"):
        plan = sm.plan(workers, strategy)
        assert all(not t.out.empty() for t in plan.groups[0].tiles)
        np.testing.assert_allclose(sm.run({"image": x}, plan)["logits"], ref, rtol=1e-5,
                                   atol=1e-5)
    key = tile_of(0, 2, Rect(0, 32, 0, 32))
    with pytest.raises(ModelError, match="expected"):
        sm.run_tile(key, np.zeros((1, 3, 7, 7), dtype=np.float32))
    with pytest.raises(ModelError, match="no spatial layers"):
        SpatialModel(committed_path("gru_text"))
    with pytest.raises(InputError, match="unknown spatial strategy"):
        plan_groups(sm.chain, workers, "diagonal")


# -- over links: helpers are handheld daemons ---------------------------------------------------
@pytest.fixture(scope="module")
def vgg_bundle(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from coinf.convert.split import split_model
    from coinf.models.zoo import committed_path

    return split_model(committed_path("vgg"), tmp_path_factory.mktemp("sp") / "vgg",
                       max_candidates=4)


class Killable:
    """An in-process helper that can be switched off for good (its daemon closed, no reconnect)."""

    def __init__(self, bundle) -> None:  # type: ignore[no-untyped-def]
        from coinf.ble_protocol.shaped import Channel
        from coinf.ble_protocol.transport import open_connector

        self.inner = open_connector("inprocess", bundle=bundle,
                                    channel=Channel(6.25e6, latency_s=0.002), threads=1)
        self.dead = False
        self.spec = "killable"

    async def connect(self, timeout: float):  # type: ignore[no-untyped-def]
        from coinf.errors import LinkClosed

        if self.dead:
            raise LinkClosed("helper switched off")
        return await self.inner.connect(timeout)

    async def kill(self) -> None:
        self.dead = True
        await self.inner.aclose()

    async def aclose(self) -> None:
        await self.inner.aclose()


def _helpers(bundle, n: int):  # type: ignore[no-untyped-def]
    from coinf.research.spatial_session import TileHelper

    return [TileHelper(Worker(f"h{i}", 1e9, 6.25e6, 0.002), Killable(bundle))  # type: ignore[arg-type]
            for i in range(n)]


def test_three_devices_over_links_equal_the_whole_model(vgg_bundle) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from coinf.research.spatial_session import SpatialSession

    x = np.random.default_rng(2).random((1, 3, 64, 64), dtype=np.float32)
    ref = ort.InferenceSession(str(vgg_bundle.model_path),
                               providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]

    async def main() -> None:
        helpers = _helpers(vgg_bundle, 2)
        async with SpatialSession(vgg_bundle, Worker("me", 1e9), helpers,
                                  strategy="per-layer") as s:
            out, stats = await s.run({"image": x})
            np.testing.assert_allclose(out["logits"], ref, rtol=1e-5, atol=1e-5)
            assert stats.groups == len(s.plan().groups) > 1
            assert stats.bytes_sent > 0 and stats.replans == 0
            assert all(h.connector.inner.daemon.requests > 0  # type: ignore[attr-defined]
                       for h in helpers)
            # a helper dies mid-stream: the frame is recomputed without it, nothing lost
            frame = asyncio.ensure_future(s.run({"image": x}))
            await asyncio.sleep(0.02)  # the frame is on its way through the groups
            await helpers[0].connector.kill()  # type: ignore[attr-defined]
            out, stats = await frame
            np.testing.assert_allclose(out["logits"], ref, rtol=1e-5, atol=1e-5)
            assert stats.replans == 1 and stats.workers == ["me", "h1"]

    asyncio.run(main())


def test_helper_refuses_hostile_tile_requests(vgg_bundle) -> None:  # type: ignore[no-untyped-def]
    from coinf.ble_protocol.messages import ProtocolError
    from coinf.device.spatial import TileRunner

    tiles = TileRunner(vgg_bundle.model_path)
    key = tile_of(0, 2, Rect(0, 32, 0, 32))
    assert tiles.budget(key) == 3 * 33 * 33 * 4  # the halo'd region, never what a peer declares
    bad = [(key, {"region": np.zeros((1, 3, 32, 32), np.float32)}),
           (key, {"region": np.zeros((1, 3, 33, 33), np.float64)}),
           (key, {"other": np.zeros((1, 3, 33, 33), np.float32)}),
           (Tile(0, 99, 0, 1, 0, 1), {"region": np.zeros((1, 3, 1, 1), np.float32)}),
           (None, {"map": np.zeros((1, 2), np.float32)})]  # REST with a wrong map
    for k, feeds in bad:
        with pytest.raises(ProtocolError):
            tiles.run(k, feeds)
    with pytest.raises(ProtocolError):
        tiles.budget(Tile(0, 2, 0, 99, 0, 1))
    out, _ = tiles.run(key, {"region": np.ones((1, 3, 33, 33), np.float32)})
    assert out["tile"].shape[2:] == (32, 32)


def test_a_slow_link_keeps_everything_here(vgg_bundle) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from coinf.research.spatial_session import SpatialSession, TileHelper

    x = np.random.default_rng(3).random((1, 3, 64, 64), dtype=np.float32)
    ref = ort.InferenceSession(str(vgg_bundle.model_path),
                               providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]

    async def main() -> None:
        slow = Killable(vgg_bundle)
        helper = TileHelper(Worker("far", 1e9, 1000.0, 0.05), slow)  # type: ignore[arg-type]
        async with SpatialSession(vgg_bundle, Worker("me", 1e9), [helper]) as s:
            assert s.plan().local_only  # 1 kB/s: no tile is worth sending
            out, stats = await s.run({"image": x})
            np.testing.assert_allclose(out["logits"], ref, rtol=1e-5, atol=1e-5)
            assert stats.bytes_sent == 0 and slow.inner.daemon.requests == 0

    asyncio.run(main())
