"""The tail service's Ray Serve engine, for real (a local Ray, one replica): its batches equal
the local engine's, and a replica killed between two batches costs no frame (the batch is sent
again while Serve starts another)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from tests.bundles import make_tiny_bundle
from tests.test_fleet import frames

pytest.importorskip("ray")
# Ray Serve's own pydantic deprecations
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# time beyond the suite's 30 s a test: Ray starts its processes and a replica (about 15 s here),
# then Serve replaces the killed replica (a few more)
@pytest.mark.timeout(240)
def test_ray_replicas_answer_as_the_local_engine_and_survive_a_kill(tmp_path: Path) -> None:
    from coinf.ble_protocol.tensors import decode_tensors
    from coinf.handheld.engines import EngineOptions, LocalEngine
    from coinf.handheld.ray_engine import RayEngine

    from tests.wire import result_blob

    bundle = make_tiny_bundle(tmp_path / "b")
    payloads = frames(bundle, "c001", 6)

    def values(outcomes) -> list[np.ndarray]:
        assert all(o.payload is not None for o in outcomes), [o.text for o in outcomes]
        return [decode_tensors(result_blob(o.payload))["y"] for o in outcomes]

    async def main() -> None:
        local = LocalEngine()
        await local.start([bundle])
        want = values(await local.run(bundle.identity, payloads))
        await local.aclose()
        engine = RayEngine("", EngineOptions(min_replicas=1, max_replicas=1))
        await engine.start([bundle])
        try:
            got = values(await engine.run(bundle.identity, payloads))
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
            for _ in range(100):  # STATUS asks Serve in the background: 1 replica runs
                if engine.status()["replicas"] == 1:
                    break
                await asyncio.sleep(0.1)
            assert engine.status()["replicas"] == 1
            pid = await engine._handles[bundle.identity].pid.remote()
            os.kill(pid, signal.SIGKILL)
            again = values(await asyncio.wait_for(engine.run(bundle.identity, payloads), 120))
            for g, w in zip(again, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
            assert await engine._handles[bundle.identity].pid.remote() != pid
        finally:
            await engine.aclose()

    asyncio.run(main())


def heavy_model(path: Path) -> None:
    """x(1x512) through eight 512x512 MatMul+Relu layers: a few ms a frame, so a dozen batches
    in flight keep one replica busy."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(8):
        w = f"w{i}"
        inits.append(numpy_helper.from_array(
            (rng.standard_normal((512, 512)) / 23).astype(np.float32), w))
        nodes += [helper.make_node("MatMul", [prev, w], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu{i}")]
        prev = f"r{i}"
    graph = helper.make_graph(
        nodes, "heavy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 512])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


# time beyond the suite's 30 s a test: Ray's start (about 15 s), then load until Serve's
# autoscaler (2 s upscale delay) has a second replica running
@pytest.mark.timeout(240)
def test_replicas_scale_up_under_load(tmp_path: Path) -> None:
    from coinf.convert.split import split_model
    from coinf.handheld.engines import EngineOptions
    from coinf.handheld.ray_engine import RayEngine

    heavy_model(tmp_path / "m.onnx")
    bundle = split_model(tmp_path / "m.onnx", tmp_path / "b")
    payloads = frames(bundle, bundle.candidates[0].id, 32)

    async def main() -> None:
        engine = RayEngine("", EngineOptions(min_replicas=1, max_replicas=2))
        await engine.start([bundle])
        try:
            seen: list[int | None] = []
            give_up = asyncio.get_running_loop().time() + 120
            while asyncio.get_running_loop().time() < give_up:
                got = await asyncio.gather(*[engine.run(bundle.identity, payloads)
                                             for _ in range(engine.concurrency)])
                assert all(o.payload is not None for batch in got for o in batch)
                seen.append(engine.status()["replicas"])
                if seen[-1] == 2:
                    break
            assert 2 in seen, seen
        finally:
            await engine.aclose()

    asyncio.run(main())
