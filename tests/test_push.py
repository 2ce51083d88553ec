"""``coinf push`` against a local "wearable": a fake ``ssh`` on PATH runs the remote commands
here, and a real control socket (the service's reload handler) answers (issue 16)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from coinf.wearable.control import BundleHolder, control_request, start_control

from coinf.cli.commands.push import local_digests, parse_sha256sum, tree_digest
from tests.bundles import make_tiny_bundle

FAKE_SSH = """#!/bin/sh
# a fake ssh: skip options and the host, run the command here (what sshd would do)
while [ $# -gt 0 ]; do
  case "$1" in -p|-o|-i|-l) shift 2;; -*) shift;; *) break;; esac
done
shift  # the host
if [ -n "$CORRUPT" ] && printf %s "$*" | grep -q sha256sum; then
  printf 'x' >> "$CORRUPT"
fi
exec sh -c "$*"
"""


@pytest.fixture()
def fake_ssh(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(ssh.stat().st_mode | stat.S_IEXEC)
    return bin_dir


@pytest.fixture()
def service(tmp_path: Path) -> Iterator[tuple[BundleHolder, Path, Path]]:
    """A serving bundle at DEST and the service's control socket, on a loop thread."""
    dest = tmp_path / "pi" / "bundle"
    make_tiny_bundle(dest, seed=1)
    holder = BundleHolder(dest)
    sock = tmp_path / "run" / "control.sock"
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(start_control(holder, sock))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield holder, dest, sock
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        server.close()
        loop.close()


def _push(fake_ssh: Path, *args: str, env: dict[str, str] | None = None,
          ) -> subprocess.CompletedProcess[str]:
    coinf = str(Path(sys.executable).with_name("coinf"))
    full_env = {**os.environ, "PATH": f"{fake_ssh}:{os.environ['PATH']}", **(env or {})}
    return subprocess.run([sys.executable, "-m", "coinf", "push", *args,
                           "--remote-coinf", coinf, "--copy", "tar"],
                          capture_output=True, text=True, env=full_env, timeout=120, check=False)


def test_push_copies_verifies_and_reloads(fake_ssh: Path, service: tuple, tmp_path: Path,
                                          ) -> None:
    holder, dest, sock = service
    new = make_tiny_bundle(tmp_path / "new", seed=7)
    assert new.identity != holder.identity
    proc = _push(fake_ssh, str(new.root), "pi@wearable", "--dest", str(dest),
                 "--control", str(sock))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["verified"] is True and report["identity"] == new.identity
    assert report["reload"] == {"ok": True, "identity": new.identity,
                                "previous": report["reload"]["previous"]}
    assert holder.identity == new.identity  # the running service serves the pushed bundle
    assert local_digests(dest) == local_digests(new.root)
    assert report["sha256"] == tree_digest(local_digests(new.root))
    assert (dest.parent / "bundle.old" / "manifest.json").is_file()  # the previous one kept
    assert control_request(sock, {"op": "status"})["identity"] == new.identity


def test_corrupted_copy_is_refused_and_nothing_swapped(fake_ssh: Path, service: tuple,
                                                       tmp_path: Path) -> None:
    holder, dest, sock = service
    before = holder.identity
    new = make_tiny_bundle(tmp_path / "new", seed=8)
    victim = dest.parent / "bundle.incoming" / "c001" / "head.onnx"
    proc = _push(fake_ssh, str(new.root), "pi@wearable", "--dest", str(dest),
                 "--control", str(sock), env={"CORRUPT": str(victim)})
    assert proc.returncode == 1
    assert "c001/head.onnx: sha256" in proc.stderr and "unchanged" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert holder.identity == before and _identity(dest) == before


def _identity(path: Path) -> str:
    from coinf.bundle import Bundle

    return str(Bundle.load(path).identity)


def test_dry_run_prints_every_step_and_runs_none(fake_ssh: Path, tmp_path: Path) -> None:
    new = make_tiny_bundle(tmp_path / "new")
    proc = _push(fake_ssh, str(new.root), "pi@wearable", "--dry-run", "--ssh", "ssh -p 2222")
    assert proc.returncode == 0, proc.stderr
    steps = json.loads(proc.stdout)["dry_run"]
    assert len(steps) == 4
    assert steps[0].startswith("tar -C ") and "ssh -p 2222 pi@wearable" in steps[0]
    assert "sha256sum" in steps[1] and "/var/lib/coinf/bundle.incoming" in steps[1]
    assert "mv /var/lib/coinf/bundle.incoming /var/lib/coinf/bundle" in steps[2]
    assert f"--expect {new.identity}" in steps[3] and "wearable reload" in steps[3]
    assert not Path("/var/lib/coinf/bundle.incoming").exists()


def test_reload_of_a_broken_bundle_keeps_the_old_one(service: tuple) -> None:
    holder, dest, sock = service
    before = holder.identity
    (dest / "manifest.json").write_text("{")
    reply = control_request(sock, {"op": "reload"})
    assert reply["ok"] is False and "does not load" in reply["error"]
    assert holder.identity == before
    assert control_request(sock, {"op": "nope"})["ok"] is False


def test_sha256sum_parsing_is_strict() -> None:
    good = "a" * 64 + "  ./manifest.json\n"
    assert parse_sha256sum(good) == {"./manifest.json": "a" * 64}
    from coinf.cli.commands.push import PushError

    with pytest.raises(PushError, match="expected 'HEX  PATH'"):
        parse_sha256sum("sha256sum: ./x: Permission denied\n")


def test_the_wearable_service_reloads_over_its_control_socket(tmp_path: Path) -> None:
    """``coinf wearable --control`` (what the systemd unit runs) on the emulated radio:
    status and reload through the socket, from the command line the unit's ExecReload uses."""
    from coinf.ble_protocol.radio import spawn

    dest = tmp_path / "bundle"
    first = make_tiny_bundle(dest, seed=2)
    sock = tmp_path / "control.sock"
    wspec, _, stop_radio = spawn("pi-zero-2w")
    service = subprocess.Popen(
        [sys.executable, "-m", "coinf", "wearable", "--bundle", str(dest), "--hci", wspec,
         "--control", str(sock), "--keystore", str(tmp_path / "b" / "bonds.json")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        cli = [sys.executable, "-m", "coinf", "wearable"]
        for _ in range(200):  # until the service listens
            if sock.exists() or service.poll() is not None:
                break
            threading.Event().wait(0.1)
        assert sock.exists(), service.communicate(timeout=10)
        status = subprocess.run([sys.executable, "-m", "coinf", "status", "--control",
                                 str(sock)], capture_output=True, text=True, timeout=60,
                                check=False)
        assert status.returncode == 0 and json.loads(status.stdout)["identity"] == \
            first.identity
        second = make_tiny_bundle(tmp_path / "next", seed=3)
        shutil.rmtree(dest)
        shutil.copytree(second.root, dest)
        reload = subprocess.run([*cli, "reload", "--control", str(sock), "--expect",
                                 second.identity], capture_output=True, text=True, timeout=60,
                                check=False)
        assert reload.returncode == 0, reload.stderr
        assert json.loads(reload.stdout) == {"ok": True, "identity": second.identity,
                                             "previous": first.identity}
        wrong = subprocess.run([*cli, "status", "--control", str(sock), "--expect", "nope"],
                               capture_output=True, text=True, timeout=60, check=False)
        assert wrong.returncode == 2 and "expected nope" in wrong.stderr
        assert service.poll() is None  # still serving
    finally:
        service.terminate()
        try:
            service.wait(10)
        except subprocess.TimeoutExpired:
            service.kill()
        stop_radio()
    missing = subprocess.run([sys.executable, "-m", "coinf", "wearable", "reload", "--control",
                              str(tmp_path / "none.sock")], capture_output=True, text=True,
                             timeout=60, check=False)
    assert missing.returncode == 2 and "no wearable service control socket" in missing.stderr


@pytest.mark.parametrize("line, why", [
    (b"[" * 5000 + b"]" * 5000, "nested"),
    (b'["reload"]', "JSON object"),
    (b'{"op": "rm -rf"}', "unknown op"),
    (b'{"op": {"a": 1}}', "unknown op dict"),
    (b"", "empty"),
    (b'{"op": "reload"' + b" " * 5000 + b"}", "over 4096"),
])
def test_a_control_line_is_checked_before_it_is_acted_on(line: bytes, why: str) -> None:
    from coinf.wearable.control import parse_request

    from coinf.errors import ProtocolError

    with pytest.raises(ProtocolError) as info:
        parse_request(line)
    assert "\n" not in str(info.value) and len(str(info.value)) < 200
    assert parse_request(b'{"op": "status"}\r\n') == {"op": "status"}
