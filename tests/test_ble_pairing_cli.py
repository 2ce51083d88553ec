"""Issue 40, part 2 on the command line: a pairing that cannot succeed ends `coinf run` and
`coinf handheld` with one line and exit code 4 (not a timeout), over the radio process with
bumble's real SMP; the passkey comes from a 0600 file, never argv."""

from __future__ import annotations

import os
import subprocess
import sys

from coinf.ble_protocol.radio import spawn

from coinf.cli.passkey import write_passkey_file
from tests.ble_servers import TEST_PASSKEY, cli_pairing
from tests.bundles import make_tiny_bundle

HANG_GUARD_S = 120  # not a figure: a run that never ends fails here instead of hanging CI


def coinf(*args: str) -> list[str]:
    return [sys.executable, "-m", "coinf", *args]


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.startswith("coinf ")]
    assert "Traceback" not in stderr, stderr[-2000:]
    assert len(lines) == 1, stderr[-2000:]
    return lines[0]


def test_handheld_and_run_stop_with_exit_4_when_the_window_is_closed(tmp_path) -> None:
    """The wearable (`coinf run --transport ble`, no passkey: window closed) and a handheld
    with no bond: the handheld stops at its first refused pairing (window_closed) and the run
    ends at the first failed pairing, both with exit code 4 and one line."""
    bundle = make_tiny_bundle(tmp_path / "tiny")
    wspec, hspec, stop_radio = spawn("ble5-2m", overrides=["time_scale=0.5"])
    try:
        handheld = subprocess.Popen(
            coinf("handheld", "--bundle", str(bundle.root), "--transport", "ble", "--hci", hspec,
                  *cli_pairing(tmp_path, "handheld")),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert handheld.stdout is not None and "serving" in handheld.stdout.readline()
            run = subprocess.run(
                coinf("run", str(bundle.root), "--split", "c001", "--transport", "ble", "--hci",
                      wspec, "--repeat", "1", "--keystore", str(tmp_path / "w" / "bonds.json")),
                capture_output=True, text=True, timeout=HANG_GUARD_S)
            _, herr = handheld.communicate(timeout=HANG_GUARD_S)
        finally:
            if handheld.poll() is None:
                handheld.kill()
                handheld.wait(10)
        assert run.returncode == 4, run.stderr[-2000:]
        assert "pairing failed (window_closed)" in one_error_line(run.stderr)
        assert handheld.returncode == 4, herr[-2000:]
        line = one_error_line(herr)
        assert "pairing failed (window_closed)" in line and "coinf wearable pair" in line
    finally:
        stop_radio()


def test_run_with_a_wrong_passkey_stops_with_exit_4_when_the_window_closes(tmp_path) -> None:
    """The handheld types a wrong passkey (it stops at once, exit 4); the run keeps its window
    open for others (a failure may be a stranger's) and exits 4 when it closes without a bond,
    naming the failures it saw."""
    bundle = make_tiny_bundle(tmp_path / "tiny")
    wrong = tmp_path / "wrong"
    wrong.mkdir(mode=0o700)
    wspec, hspec, stop_radio = spawn("ble5-2m", overrides=["time_scale=0.5"])
    try:
        handheld = subprocess.Popen(
            coinf("handheld", "--bundle", str(bundle.root), "--transport", "ble", "--hci", hspec,
                  "--passkey-file", write_passkey_file(wrong, TEST_PASSKEY + 1), "--keystore",
                  str(tmp_path / "h" / "bonds.json")),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert handheld.stdout is not None and "serving" in handheld.stdout.readline()
            run = subprocess.run(
                coinf("run", str(bundle.root), "--split", "c001", "--transport", "ble", "--hci",
                      wspec, "--repeat", "1", "--window-s", "6",
                      *cli_pairing(tmp_path, "wearable")),
                capture_output=True, text=True, timeout=HANG_GUARD_S)
        finally:
            handheld.terminate()
            handheld.wait(10)
        assert run.returncode == 4, run.stderr[-2000:]
        line = one_error_line(run.stderr)
        assert "pairing failed (wrong_passkey)" in line
        assert "window closed without a new bond" in line and "from 1 address(es)" in line
    finally:
        stop_radio()


def test_a_passkey_file_others_can_read_is_refused(tmp_path) -> None:
    bundle = make_tiny_bundle(tmp_path / "tiny")
    loose = tmp_path / "passkey"
    loose.write_text(f"{TEST_PASSKEY}\n")
    os.chmod(loose, 0o644)
    proc = subprocess.run(
        coinf("run", str(bundle.root), "--transport", "ble", "--hci", "tcp-client:127.0.0.1:1",
              "--passkey-file", str(loose)), capture_output=True, text=True,
        timeout=HANG_GUARD_S)
    assert proc.returncode == 2
    assert "chmod 600" in one_error_line(proc.stderr)


def test_run_opens_the_pairing_window_for_a_bounded_time_only(tmp_path) -> None:
    """`coinf run --transport ble --passkey-file`: the window lasts --window-s (default 120 s),
    never the whole run (it was math.inf); the bond store defaults to the private one."""
    from coinf.cli import build_parser
    from coinf.cli.commands.run import ble_options

    bundle = make_tiny_bundle(tmp_path / "tiny")
    key = write_passkey_file(tmp_path, TEST_PASSKEY)
    parser = build_parser("run")
    base = ["run", str(bundle.root), "--transport", "ble", "--hci", "tcp-client:127.0.0.1:1"]
    options = ble_options(parser.parse_args([*base, "--passkey-file", key]))
    assert options is not None and options["pairing_window_s"] == 120
    assert options["passkey"] == TEST_PASSKEY and options["keystore"].endswith("wearable.json")
    options = ble_options(parser.parse_args([*base, "--passkey-file", key, "--window-s", "30"]))
    assert options is not None and options["pairing_window_s"] == 30
    options = ble_options(parser.parse_args(base))
    assert options is not None and "pairing_window_s" not in options and "passkey" not in options
