"""onnxruntime's intra-op workers sleep between runs on both sides (no spinning): a device
that runs one slice per frame must not burn a core waiting for the next one."""

from __future__ import annotations

import numpy as np
import pytest
from coinf.device.emulation import DeviceEmulation
from coinf.device.ort_options import NO_SPINNING
from coinf.device.runtime import SliceRunner
from coinf.device.sweep import session_options
from coinf.handheld.daemon import HandheldDaemon

from tests.bundles import make_tiny_bundle

KEY, OFF = NO_SPINNING


@pytest.fixture()
def bundle(tmp_path):
    return make_tiny_bundle(tmp_path / "tiny")


def spinning(sess) -> str:
    return sess.get_session_options().get_session_config_entry(KEY)


@pytest.mark.parametrize("threads", [0, 1, 2])
def test_the_wearables_slices_run_with_sleeping_workers(bundle, threads):
    runner = SliceRunner(bundle, DeviceEmulation(threads=threads))
    cand = bundle.candidate("c001")
    out, _ = runner.run_slice(cand, "head", {"x": np.ones((1, 16), np.float32)})
    assert out  # the session ran with these options
    assert spinning(runner.slice_session(cand, "head")) == OFF


def test_the_handhelds_tails_run_with_sleeping_workers(bundle):
    daemon = HandheldDaemon(bundle, DeviceEmulation())  # threads 0: onnxruntime's pool
    assert spinning(daemon.tails.session(bundle.candidate("c001"))) == OFF


def test_the_profiler_times_nodes_as_the_slices_run():
    assert session_options(2).get_session_config_entry(KEY) == OFF
