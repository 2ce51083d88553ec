"""Session.stream: order, equality with per-frame runs, back-pressure, errors, dropping."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from coinf.wearable.stream import RealtimeSource, effective_accuracy

from coinf import EmulationOptions, LinkOptions, Session
from tests.bundles import fixed, make_tiny_bundle


@pytest.fixture()
def bundle(tmp_path):
    return make_tiny_bundle(tmp_path / "tiny")


def frames(n, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 16)).astype(np.float32)} for _ in range(n)]


@pytest.mark.parametrize("split", ["c000", "c001", "c002"])
def test_stream_in_order_and_equal_to_per_frame_runs(bundle, split):
    data = frames(20)
    with Session(bundle, fixed(split)) as sess:
        expected = [sess.run(None, f)[0] for f in data]
        results = list(sess.stream(data, depth=4))
    assert [r.index for r in results] == list(range(20))
    for r, e in zip(results, expected, strict=True):
        np.testing.assert_array_equal(r.value()[0], e)


def test_producer_is_held_back(bundle):
    pulled = 0
    lock = threading.Lock()

    def producer():
        nonlocal pulled
        for f in frames(1000):
            with lock:
                pulled += 1
            yield f

    depth = 3
    with Session(bundle, fixed("c001", emulation=EmulationOptions(handheld_slowdown=200))) as sess:
        stream = sess.stream(producer(), depth=depth)
        for k, _ in enumerate(stream):
            # never more than `depth` frames pulled ahead of what was consumed
            assert pulled <= k + 1 + depth
            if k == 15:
                break
        stream.close()
    assert pulled <= 16 + depth


def test_a_failing_frame_is_that_frames_error(bundle):
    data = frames(6)
    data[2] = {"x": np.ones((1, 3), np.float32)}  # wrong shape
    with Session(bundle, fixed("c001")) as sess:
        results = list(sess.stream(data))
    assert [r.error is None for r in results] == [True, True, False, True, True, True]
    with pytest.raises(ValueError, match="shape"):
        results[2].value()


def test_failure_on_the_handheld_side_does_not_hang(bundle, tmp_path):
    # corrupt the tail file of c001 after loading the bundle: the handheld fails that request
    (bundle.root / "c001" / "tail.onnx").write_bytes(b"not onnx")
    with Session(bundle, fixed("c001", link=LinkOptions(timeout=10, fallback=False))) as sess:
        results = list(sess.stream(frames(3)))
    # every frame fails with the handheld's error reply, none by the 10 s timeout
    assert all(r.error is not None for r in results)
    assert all("tail_failed" in str(r.error) for r in results), [r.error for r in results]
    assert not any("timeout" in str(r.error).lower() for r in results)


def test_realtime_source_drops_and_counts():
    src = RealtimeSource(frames(100), rate_hz=200.0, limit=40)
    got = 0
    for _ in src:
        got += 1
        time.sleep(0.02)  # consumer 4x slower than the source
    assert src.delivered == got
    assert src.offered == 40
    assert src.dropped == 40 - got
    assert src.dropped > 10  # could not keep up: most frames dropped, none queued
    assert effective_accuracy(50.0, 0.98, 200.0) == pytest.approx(0.245)


def test_realtime_source_keeps_everything_when_fast_enough():
    src = RealtimeSource(frames(10), rate_hz=100.0, limit=10)
    assert len(list(src)) == 10
    assert src.dropped == 0


def test_astream_with_an_async_source(bundle):
    import asyncio

    data = frames(12, seed=4)

    async def camera():
        for f in data:
            await asyncio.sleep(0)
            yield f

    async def main(sess):
        ticks = 0

        async def ticker():  # the caller's loop stays responsive while frames are computed
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        t = asyncio.create_task(ticker())
        out = [r async for r in sess.astream(camera(), depth=3)]
        t.cancel()
        return out, ticks

    with Session(bundle, fixed("c001", emulation=EmulationOptions(handheld_slowdown=100))) as sess:
        expected = [sess.run(None, f)[0] for f in data]
        results, ticks = asyncio.run(main(sess))
    assert [r.index for r in results] == list(range(12))
    for r, e in zip(results, expected, strict=True):
        np.testing.assert_array_equal(r.value()[0], e)
    assert ticks > 1


def test_astream_stops_early_without_hanging(bundle):
    import asyncio

    async def main(sess):
        got = []
        async for r in sess.astream(frames(100)):
            got.append(r)
            if len(got) == 3:
                break
        return got

    with Session(bundle, fixed("c001")) as sess:
        assert len(asyncio.run(main(sess))) == 3


def test_bench_stream_reports_every_figure(bundle, capsys, tmp_path):
    import json

    from coinf.cli import main

    rc = main(["bench", "stream", "--bundle", str(bundle.root), "--split", "c001",
               "--bandwidth-kbps", "200", "--frames", "6", "--repeats", "1", "--rate", "500",
               "--json", "--png", str(tmp_path / "s.png")])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cut"] == "c001"
    assert out["png"] and (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    assert set(out["stage_ms"]) == {"head", "pack", "transfer", "tail", "return"}
    assert out["bound_fps"] == pytest.approx(1000 / max(out["stage_ms"].values()), rel=1e-3)
    assert out["efficiency"] == pytest.approx(out["throughput_fps"] / out["bound_fps"], rel=1e-3)
    rt = out["realtime"]
    assert rt["offered"] == 6 and rt["processed"] + rt["dropped"] == 6
    assert rt["effective_accuracy"] <= rt["accuracy"] == 1.0
