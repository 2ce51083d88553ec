"""Every result checked on every path of the spatial partition (issue 41, part 5).

The helpers are the ordinary handheld daemon over the in-process link (and a unix socket), as in
tests/test_spatial.py; each fault is injected by replacing the daemon's tile runner, never by
mocking the link. For every fault of a helper -- it dies, times out, answers ERROR, answers a
tile of the wrong shape, dtype or name, NaN or infinite values, an extra or a missing tile --
the frame's outputs equal the whole model's (the helper dropped, the frame computed again
without it), and without ``fallback`` the helper's error is raised as a LinkError.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from coinf.ble_protocol.messages import ErrorCode, ProtocolError
from coinf.ble_protocol.shaped import Channel
from coinf.ble_protocol.transport import open_connector
from coinf.convert.gtdp import Worker
from coinf.research.spatial_session import SpatialSession, TileHelper

from coinf.bundle import Bundle
from coinf.errors import LinkError, PeerResultError

TIMEOUT_S = 2.5  # a loaded 2-core machine may take over 1 s for a good tile

Tiles = dict[str, np.ndarray]
Fault = Callable[[str, Tiles], Tiles]


@pytest.fixture(scope="module")
def vgg_bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    from coinf.convert.split import split_model
    from coinf.models.zoo import committed_path

    return split_model(committed_path("vgg"), tmp_path_factory.mktemp("spc") / "vgg",
                       max_candidates=4)


@pytest.fixture(scope="module")
def frame(vgg_bundle: Bundle) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(5).random((1, 3, 64, 64), dtype=np.float32)
    ref = ort.InferenceSession(str(vgg_bundle.model_path),
                               providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
    return x, ref


class Helper:
    """An in-process handheld daemon whose tile runner can be made to misbehave."""

    def __init__(self, bundle: Bundle) -> None:
        self.connector: Any = open_connector("inprocess", bundle=bundle,
                                             channel=Channel(6.25e6, latency_s=0.002), threads=1)
        self.daemon = self.connector.daemon
        self.calls: list[str] = []
        self.faulted: list[str] = []

    def inject(self, fault: Fault | None = None, *, only: str = "tiles",
               before: Callable[[str], None] | None = None) -> None:
        """Wrap the daemon's tile runner: ``before(key)`` runs first (it may raise or stall),
        ``fault`` rewrites the real result. ``only``: "tiles" (``sp:I-J:...``) or "rest"."""
        real = self.daemon.tiles.run

        def run(key: Any, feeds: Mapping[str, np.ndarray], cancel: Any = None
                ) -> tuple[Tiles, float]:
            self.calls.append(key)
            hit = (key is None) == (only == "rest")
            if hit and before is not None:
                self.faulted.append(key)
                before(key)
            out, s = real(key, feeds, cancel)
            if hit and fault is not None:
                self.faulted.append(key)
                out = fault(key, dict(out))
            return out, s

        self.daemon.tiles.run = run

    def tile_helper(self, worker: Worker | None = None) -> TileHelper:
        return TileHelper(worker or Worker("h0", 1e9, 6.25e6, 0.002), self.connector)


def _run(bundle: Bundle, helper: Helper, x: np.ndarray, *, fallback: bool = True,
         worker: Worker | None = None, during: Callable[[], Any] | None = None
         ) -> tuple[Any, Any, Any]:
    """One frame on this device + ``helper`` (per-layer groups: several exchanges)."""

    async def main() -> tuple[Any, Any, Any]:
        async with SpatialSession(bundle, Worker("me", 1e9), [helper.tile_helper(worker)],
                                  strategy="per-layer", timeout=TIMEOUT_S,
                                  fallback=fallback) as s:
            assert not s.plan().local_only and len(s.plan().workers) == 2
            task = asyncio.ensure_future(s.run({"image": x}))
            if during is not None:
                await during()
            try:
                out, stats = await task
            except Exception as exc:  # returned for the test to judge
                return None, None, exc
            return out, stats, s.workers()[0]

    return asyncio.run(main())


# -- the faults: each rewrites a real tile result ------------------------------------------------
def _nan(_key: Any, res: Tiles) -> Tiles:
    t = res["tile"].copy()
    t[0, 0, 0, 0] = np.nan
    return {"tile": t}


def _inf(_key: Any, res: Tiles) -> Tiles:
    t = res["tile"].copy()
    t[0, -1, -1, -1] = np.inf
    return {"tile": t}


BAD_TILES: dict[str, Fault] = {
    "wrong shape (one column short)": lambda _k, r: {"tile": np.ascontiguousarray(
        r["tile"][..., :-1])},
    "wrong shape (same bytes, transposed)": lambda _k, r: {"tile": np.ascontiguousarray(
        r["tile"].transpose(0, 1, 3, 2))} if r["tile"].shape[2] != r["tile"].shape[3]
        else {"tile": r["tile"].reshape(1, -1, 1, r["tile"].shape[3])},
    "wrong dtype (float64)": lambda _k, r: {"tile": r["tile"].astype(np.float64)},
    "wrong dtype (float16)": lambda _k, r: {"tile": r["tile"].astype(np.float16)},
    "wrong name": lambda _k, r: {"map": r["tile"]},
    "NaN": _nan,
    "Inf": _inf,
    "an extra tile": lambda _k, r: {"tile": r["tile"], "tile2": r["tile"][..., :1]},
    "an extra empty tile": lambda _k, r: {"tile": r["tile"], "z": np.zeros(0, np.float32)},
    "a missing tile": lambda _k, r: {},
}


def _raise_malformed(key: Any) -> None:
    raise ProtocolError(ErrorCode.MALFORMED, f"helper refuses {key}")


def _raise_runtime(key: Any) -> None:
    raise RuntimeError(f"tile {key} exploded")


def _raise_unknown(key: Any) -> None:
    raise ProtocolError(ErrorCode.UNKNOWN_CANDIDATE, f"no tile {key}")


ERRORS: dict[str, Callable[[str], None]] = {
    "ERROR MALFORMED": _raise_malformed,
    "ERROR TAIL_FAILED": _raise_runtime,
    "ERROR UNKNOWN_CANDIDATE": _raise_unknown,
}


def _assert_recovered(out: Any, stats: Any, alive: Any, ref: np.ndarray,
                      helper: Helper) -> None:
    assert not isinstance(alive, BaseException), f"raised {alive!r}"
    assert helper.faulted, "the fault was never triggered"
    assert np.isfinite(out["logits"]).all()
    np.testing.assert_allclose(out["logits"], ref, rtol=1e-5, atol=1e-5)
    assert stats.replans == 1 and stats.workers == ["me"]
    assert [w.name for w in alive] == ["me"]  # the helper is dropped


@pytest.mark.parametrize("name", sorted(BAD_TILES))
def test_a_bad_tile_is_never_used(vgg_bundle: Bundle, frame: Any, name: str) -> None:
    x, ref = frame
    helper = Helper(vgg_bundle)
    helper.inject(BAD_TILES[name])
    _assert_recovered(*_run(vgg_bundle, helper, x), ref, helper)


@pytest.mark.parametrize("name", sorted(BAD_TILES))
def test_without_fallback_a_bad_tile_raises_a_peer_result_error(vgg_bundle: Bundle, frame: Any,
                                                                 name: str) -> None:
    x, _ = frame
    helper = Helper(vgg_bundle)
    helper.inject(BAD_TILES[name])
    out, _, exc = _run(vgg_bundle, helper, x, fallback=False)
    assert out is None and isinstance(exc, PeerResultError), repr(exc)
    assert exc.transient


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_a_helper_answering_error_is_dropped(vgg_bundle: Bundle, frame: Any, name: str) -> None:
    x, ref = frame
    helper = Helper(vgg_bundle)
    helper.inject(before=ERRORS[name])
    _assert_recovered(*_run(vgg_bundle, helper, x), ref, helper)
    out, _, exc = _run(vgg_bundle, helper, x, fallback=False)
    assert out is None and isinstance(exc, LinkError) and not isinstance(exc, PeerResultError)


def test_a_helper_that_times_out_is_dropped(vgg_bundle: Bundle, frame: Any) -> None:
    x, ref = frame
    helper = Helper(vgg_bundle)
    helper.inject(before=lambda _key: time.sleep(TIMEOUT_S * 2))
    _assert_recovered(*_run(vgg_bundle, helper, x), ref, helper)
    helper = Helper(vgg_bundle)
    helper.inject(before=lambda _key: time.sleep(TIMEOUT_S * 2))
    _, _, exc = _run(vgg_bundle, helper, x, fallback=False)
    assert isinstance(exc, ProtocolError) and exc.code == ErrorCode.TIMEOUT


def test_a_helper_that_dies_mid_tile_is_dropped(vgg_bundle: Bundle, frame: Any) -> None:
    x, ref = frame
    for fallback in (True, False):
        helper = Helper(vgg_bundle)
        computing = threading.Event()

        def stall(_key: str, computing: threading.Event = computing) -> None:
            computing.set()
            time.sleep(0.3)

        helper.inject(before=stall)

        async def kill(h: Helper = helper, started: threading.Event = computing) -> None:
            while not started.is_set():
                await asyncio.sleep(0.005)
            await h.connector.aclose()  # the daemon goes away with the tile under way

        result = _run(vgg_bundle, helper, x, fallback=fallback, during=kill)
        if fallback:
            _assert_recovered(*result, ref, helper)
        else:
            assert isinstance(result[2], LinkError) and result[2].transient


# -- the layers after the chain on the helper (sp:rest): its outputs are a split's result -------
@pytest.mark.parametrize("fault", ["NaN", "wrong shape", "extra output", "missing output"])
def test_bad_outputs_of_the_rest_are_never_used(vgg_bundle: Bundle, frame: Any,
                                                fault: str) -> None:
    x, ref = frame

    def forge(_key: str, res: Tiles) -> Tiles:
        (name, arr), = res.items()
        if fault == "NaN":
            return {name: np.full_like(arr, np.nan)}
        if fault == "wrong shape":
            return {name: arr[..., :-1].copy()}
        if fault == "extra output":
            return {name: arr, "extra": np.zeros(1, np.float32)}
        return {}

    helper = Helper(vgg_bundle)
    helper.inject(forge, only="rest")
    fast = Worker("h0", 1e13, 1e12)  # so much faster, on so fast a link: the rest runs there
    out, stats, alive = _run(vgg_bundle, helper, x, worker=fast)
    assert helper.faulted == [None], helper.calls
    _assert_recovered(out, stats, alive, ref, helper)


def test_finite_tiles_that_make_the_outputs_infinite_are_recomputed_here(
        vgg_bundle: Bundle, frame: Any) -> None:
    """Every tile passes its check (finite, right shape), but the outputs computed from them
    are not finite: no helper is to blame alone, so the frame is computed here whole."""
    x, ref = frame
    helper = Helper(vgg_bundle)
    helper.inject(lambda _k, r: {"tile": np.full_like(r["tile"], 3e38)})
    out, stats, alive = _run(vgg_bundle, helper, x)
    assert helper.faulted and not isinstance(alive, BaseException)
    np.testing.assert_allclose(out["logits"], ref, rtol=1e-5, atol=1e-5)
    assert stats.fallback and "NaN or infinite" in stats.fallback
    helper = Helper(vgg_bundle)
    helper.inject(lambda _k, r: {"tile": np.full_like(r["tile"], 3e38)})
    _, _, exc = _run(vgg_bundle, helper, x, fallback=False)
    assert isinstance(exc, PeerResultError)


def test_an_oversized_tile_over_a_socket_is_refused_unread(vgg_bundle: Bundle, frame: Any,
                                                          tmp_path: Path) -> None:
    """The real daemon on a unix socket answers every tile with 32 MiB: the wearable refuses it
    from the frame header (over the tile's RESULT bound) and computes the frame without it."""
    from coinf.ble_protocol.loopback import serve_socket

    x, ref = frame
    helper = Helper(vgg_bundle)
    helper.inject(lambda _k, r: {"tile": np.zeros(8 << 20, np.float32)})
    address = f"unix:{tmp_path / 'h.sock'}"

    async def main() -> tuple[Any, Any, int]:
        server = await serve_socket(address, helper.daemon.serve)
        try:
            connector = open_connector(address)
            async with SpatialSession(vgg_bundle, Worker("me", 1e9),
                                      [TileHelper(Worker("h0", 1e9, 6.25e6, 0.002), connector)],
                                      strategy="per-layer", timeout=5.0) as s:
                out, stats = await s.run({"image": x})
                return out, stats, s._conns[0].links_opened
        finally:
            server.close()
            await helper.daemon.aclose()

    out, stats, links = asyncio.run(main())
    np.testing.assert_allclose(out["logits"], ref, rtol=1e-5, atol=1e-5)
    assert stats.replans == 1 and helper.faulted and links == 1
