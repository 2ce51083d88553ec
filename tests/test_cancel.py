"""A cancelled request stops the work itself: onnxruntime's run and an emulated device's sleep."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from coinf.ble_protocol.tensors import encode_tensors
from coinf.device.cancel import Cancelled, CancelToken
from coinf.device.emulation import DeviceEmulation
from coinf.device.runtime import SliceRunner
from coinf.handheld.daemon import HandheldDaemon, RequestCancelled

from tests.bundles import make_tiny_bundle
from tests.wire import tail_request

X = np.ones((1, 16), np.float32)


@pytest.fixture()
def bundle(tmp_path):
    return make_tiny_bundle(tmp_path / "tiny")


def test_a_set_token_terminates_the_onnxruntime_run(bundle):
    runner = SliceRunner(bundle)
    cand = bundle.candidate("c001")
    token = CancelToken()
    out, _ = runner.run_slice(cand, "head", {"x": X}, token)  # not set: runs normally
    assert out
    token.set()
    with pytest.raises(Cancelled):
        runner.run_slice(cand, "head", {"x": X}, token)


def run_in_thread(fn) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, errors


def test_cancel_wakes_an_emulated_slow_device(bundle):
    # x 1e9: the emulated step would sleep for days unless the token stops it
    runner = SliceRunner(bundle, DeviceEmulation(slowdown=1e9))
    token = CancelToken()
    thread, errors = run_in_thread(
        lambda: runner.run_slice(bundle.candidate("c001"), "tail", {"h": np.ones((1, 8),
                                                                                np.float32)},
                                 token))
    thread.join(0.2)
    assert thread.is_alive()  # it is sleeping as a slow device would
    token.set()
    thread.join(30)  # hang guard
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], Cancelled)


def test_the_daemon_stops_a_cancelled_tail_mid_run(bundle):
    cand = bundle.candidate("c001")
    (crossing,) = cand.crossing
    payload = tail_request(bundle, cand.id, encode_tensors(
        {crossing.name: np.ones(crossing.shape, np.dtype(crossing.dtype))}))
    daemon = HandheldDaemon(bundle, DeviceEmulation(slowdown=1e9))
    token = CancelToken()
    thread, errors = run_in_thread(lambda: daemon.run_request(payload, token))
    thread.join(0.2)
    assert thread.is_alive()
    token.set()
    thread.join(30)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], RequestCancelled)
