"""Ctrl-C during `coinf run` over a link: exit 130 with one line, no asyncio noise (issue 18)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from coinf.ble_protocol.radio import spawn
from coinf.convert.split import split_model
from coinf.models.zoo import committed_path

from tests.procs import ROOT, coinf_cmd, handheld_daemon


@pytest.fixture(scope="module")
def lenet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("b") / "lenet"
    split_model(committed_path("lenet_digits"), root, max_candidates=4)
    return root


@contextmanager
def coinf_process(args: list[str]) -> Iterator[subprocess.Popen[str]]:
    """``coinf ARGS`` running (unbuffered, stdout and stderr piped); killed if still alive when
    the block ends."""
    proc = subprocess.Popen(coinf_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def interrupt(args: list[str], after_s: float) -> tuple[int, str]:
    """Start ``coinf ARGS``, SIGINT it ``after_s`` seconds later, and return (exit code,
    stderr)."""
    with coinf_process(args) as proc:
        time.sleep(after_s)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    return proc.returncode, err


def assert_clean(rc: int, err: str) -> None:
    assert rc == 130, err
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("[")]  # --all progress
    assert lines == ["coinf run: interrupted"], err


def test_ctrl_c_while_waiting_for_a_handheld_over_ble(lenet: Path) -> None:
    wspec, _, stop = spawn("pi-zero-2w")  # a radio, and no handheld ever attaches
    try:
        rc, err = interrupt(["run", str(lenet), "--split", "c001", "--transport", "ble",
                             "--hci", wspec], after_s=4.0)
    finally:
        stop()
    assert_clean(rc, err)


@pytest.mark.skipif(sys.platform != "linux", reason="unix socket")
def test_ctrl_c_with_requests_in_flight(lenet: Path, tmp_path: Path) -> None:
    address = f"unix:{tmp_path}/hh.sock"
    with handheld_daemon(lenet, address, "--slowdown", "20"):
        # thousands of round trips: whenever the signal lands, a request is in flight
        rc, err = interrupt(["run", str(lenet), "--all", "--repeat", "100000", "--transport",
                             "socket", "--handheld", address], after_s=3.0)
    assert_clean(rc, err)


def _processes_naming(text: str) -> list[int]:
    """PIDs of live processes whose command line contains ``text`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().split(") ", 1)[1][:1]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_sigterm_stops_the_helper_processes_a_bench_started(lenet: Path) -> None:
    """SIGTERM during `coinf bench pipeline` (helpers as `coinf handheld` processes): exit 143
    with one line, after its `finally` stopped every helper process it started."""
    with coinf_process(["bench", "pipeline", "--bundle", str(lenet), "--devices", "3",
                        "--frames", "400", "--warmup", "400", "--slowdown", "20"]) as proc:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:  # until its helpers serve
            seen.append(line)
            if "helper processes serving" in line:
                break
        helpers = _processes_naming(f"handheld --bundle {lenet}")
        assert len(helpers) == 2, seen
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert "coinf bench: terminated" in err and "Traceback" not in err, err
    assert _processes_naming(f"handheld --bundle {lenet}") == []
