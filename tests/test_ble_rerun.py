"""A second wearable run right after the first, over the same radio and the same handheld
daemon, connects (issue 18: the handheld's reconnect loop used to die when the first wearable
went away in the middle of a reconnection handshake)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from coinf.ble_protocol.radio import spawn

from tests.ble_servers import cli_pairing
from tests.bundles import make_tiny_bundle

# time beyond the suite's 30 s a test: two runs over the emulated BLE radio (13 s alone)
pytestmark = pytest.mark.timeout(120)


def coinf(*args: str) -> list[str]:
    return [sys.executable, "-m", "coinf", *args]


def test_a_second_run_right_after_the_first_connects(tmp_path) -> None:
    bundle = make_tiny_bundle(tmp_path / "tiny")
    wspec, hspec, stop_radio = spawn("pi-zero-2w", overrides=["time_scale=0.5"])
    handheld = subprocess.Popen(
        coinf("handheld", "--bundle", str(bundle.root), "--transport", "ble", "--hci", hspec,
              *cli_pairing(tmp_path, "handheld")),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert handheld.stdout is not None
        assert "serving" in handheld.stdout.readline()
        for attempt in range(3):
            run = subprocess.run(
                coinf("run", str(bundle.root), "--split", "c001", "--transport", "ble",
                      "--hci", wspec, "--json", "--repeat", "1",
                      *cli_pairing(tmp_path, "wearable")),
                capture_output=True, text=True, timeout=180,  # hang guard only
            )
            assert run.returncode == 0, f"run {attempt}: {run.stderr[-800:]}"
            time.sleep(1.0)  # the next wearable starts while the handheld is reconnecting
        assert handheld.poll() is None  # the daemon is still serving
    finally:
        handheld.terminate()
        handheld.wait(10)
        stop_radio()
