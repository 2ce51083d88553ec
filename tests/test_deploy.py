"""Deployment files: the Pi provisioning script (shellcheck, ``--dry-run`` output), the systemd
and launchd units (their command lines are valid ``coinf`` commands), the handheld installer
(issue 16)."""

from __future__ import annotations

import os
import plistlib
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from coinf.cli import build_parser
from tests import network

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
SCRIPTS = sorted([*DEPLOY.rglob("*.sh"), *(ROOT / ".ci" / "arm").glob("*.sh")])


def _shellcheck() -> str | None:
    """shellcheck; when missing, installed from apt only if the network is allowed
    (``COINF_TEST_NETWORK=1``) and we may (root, apt-get present)."""
    found = shutil.which("shellcheck")
    if found or not network.allowed() or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "install", "-y", "-qq", "shellcheck"], ["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", "shellcheck"]):
        try:
            subprocess.run(cmd, env=env, capture_output=True, timeout=300, check=False)
        except subprocess.TimeoutExpired:
            return None
        if shutil.which("shellcheck"):
            break
    return shutil.which("shellcheck")


@pytest.mark.network  # runs offline when shellcheck is installed; installs it only on request
def test_scripts_are_shellcheck_clean() -> None:
    sc = _shellcheck()
    if sc is None:
        if not network.allowed():
            pytest.skip(network.reason("shellcheck is not installed: installing it with apt-get"))
        pytest.skip("shellcheck is not installed and could not be installed with apt-get "
                    "(not root, or no package index)")
    assert len(SCRIPTS) >= 5
    proc = subprocess.run([sc, "--severity=style", *map(str, SCRIPTS)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:]


def _provision(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(DEPLOY / "pi" / "provision.sh"), "--dry-run", *args],
                          capture_output=True, text=True, timeout=60, check=False)


def _commands(out: str) -> list[str]:
    return [line[2:] for line in out.splitlines() if line.startswith("+ ")]


def test_provision_dry_run_shows_every_step_and_changes_nothing(tmp_path: Path) -> None:
    unit = Path("/etc/systemd/system/coinf-wearable.service")
    existed = unit.exists()
    proc = _provision("--wheel", "dist/coinf-0.2.0-py3-none-any.whl", "--admin", "nobody",
                      "--user", "coinf-test-nouser", "--bundle", str(tmp_path / "b"))
    assert proc.returncode == 0, proc.stderr
    cmds = _commands(proc.stdout)
    text = "\n".join(cmds)
    assert ("useradd --system --home-dir /var/lib/coinf --shell /usr/sbin/nologin --user-group "
            "coinf-test-nouser") in cmds
    assert "usermod -aG coinf-test-nouser nobody" in cmds
    assert "install -d -m 0700 -o coinf-test-nouser -g coinf-test-nouser /var/lib/coinf/bonds" \
        in cmds
    assert ("/opt/coinf/venv/bin/python -m pip install --quiet --upgrade "
            "dist/coinf-0.2.0-py3-none-any.whl[wearable]") in cmds
    assert "write /etc/systemd/system/coinf-wearable.service (mode 0644)" in text
    assert "write /opt/coinf/bin/coinf-svc (mode 0755)" in text
    assert "chmod -R g+rwX /var/lib/coinf/bundle.incoming" in cmds
    assert "systemctl enable coinf-wearable.service" in cmds
    assert cmds[-1] == "systemctl restart coinf-wearable.service"  # a bundle was given
    assert "mv /var/lib/coinf/bundle.incoming /var/lib/coinf/bundle" in cmds
    unit_text = "\n".join(line[6:] for line in proc.stdout.splitlines()
                          if line.startswith("    | "))
    assert "User=coinf-test-nouser" in unit_text
    assert "AmbientCapabilities=CAP_NET_ADMIN CAP_NET_RAW" in unit_text
    assert "@" not in re.sub(r"\S+@\S+", "", unit_text.split("[Unit]")[1])  # all filled in
    assert unit.exists() == existed and not Path("/opt/coinf/venv").exists()


def test_provision_skips_what_is_done() -> None:
    proc = _provision("--wheel", "x.whl", "--user", "root")  # a user that exists
    assert proc.returncode == 0, proc.stderr
    assert "user root exists" in proc.stderr
    assert not any(c.startswith("useradd") for c in _commands(proc.stdout))
    assert "no bundle yet" in proc.stderr


@pytest.mark.parametrize(("args", "message"), [
    ((), "--wheel FILE is required"),
    (("--wheel", "coinf.tar.gz"), "expected a .whl file"),
    (("--frobnicate",), "unknown option --frobnicate"),
])
def test_provision_refuses_bad_arguments(args: tuple[str, ...], message: str) -> None:
    proc = _provision(*args)
    assert proc.returncode == 2 and message in proc.stderr


def test_provision_uninstall_dry_run() -> None:
    proc = _provision("--uninstall")
    assert proc.returncode == 0, proc.stderr
    assert "systemctl daemon-reload" in _commands(proc.stdout)
    assert "kept /var/lib/coinf" in proc.stderr and "uninstalled" in proc.stderr


def _coinf_argv(line: str, **subst: str) -> list[str]:
    for k, v in subst.items():
        line = line.replace(k, v)
    argv = shlex.split(line)
    assert argv[0].endswith("/venv/bin/coinf"), argv
    return argv[1:]


def _unit_lines(path: Path, key: str) -> list[str]:
    return [ln.split("=", 1)[1] for ln in path.read_text().splitlines()
            if ln.startswith(f"{key}=")]


def test_unit_command_lines_are_valid_coinf_commands() -> None:
    parser = build_parser()
    pi = DEPLOY / "pi" / "coinf-wearable.service"
    subst = {"@PREFIX@": "/opt/coinf", "@STATE@": "/var/lib/coinf",
             "${COINF_HCI}": "hci-socket:0"}
    start = parser.parse_args(_coinf_argv(_unit_lines(pi, "ExecStart")[0], **subst))
    assert (start.command, start.bundle, start.hci, start.control) == (
        "wearable", "/var/lib/coinf/bundle", "hci-socket:0", "/run/coinf/control.sock")
    reload = parser.parse_args(_coinf_argv(_unit_lines(pi, "ExecReload")[0], **subst))
    assert (reload.op, reload.control) == ("reload", start.control)
    user = DEPLOY / "handheld" / "coinf-handheld.service"
    hh = parser.parse_args(_coinf_argv(_unit_lines(user, "ExecStart")[0], **{"%h": "/home/u"}))
    assert (hh.command, hh.transport, hh.bundle) == (
        "handheld", "ble", "/home/u/.local/share/coinf/bundle")
    plist = plistlib.loads((DEPLOY / "handheld" / "org.coinf.handheld.plist").read_bytes())
    argv = [a.replace("@HOME@", "/Users/u") for a in plist["ProgramArguments"]]
    mac = parser.parse_args(argv[1:])
    assert argv[0] == "/Users/u/.local/share/coinf/venv/bin/coinf"
    assert (mac.command, mac.transport, mac.bundle) == (hh.command, hh.transport,
                                                        "/Users/u/.local/share/coinf/bundle")
    assert plist["Label"] == "org.coinf.handheld" and plist["RunAtLoad"] is True


@pytest.mark.parametrize(("system", "expect"), [
    ("Linux", "systemctl --user enable --now coinf-handheld.service"),
    ("Darwin", "launchctl bootstrap gui/"),
])
def test_handheld_installer_dry_run(system: str, expect: str, tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data"),
           "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    proc = subprocess.run(["bash", str(DEPLOY / "handheld" / "install.sh"), "--dry-run",
                           "--system", system, "--wheel", "coinf.whl", "--bundle", "b"],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert expect in proc.stdout
    assert f"{tmp_path}/data/coinf/venv/bin/python -m pip install --quiet --upgrade " \
           f"coinf.whl[handheld]" in proc.stdout
    assert not (tmp_path / "data").exists()  # a dry run creates nothing


def test_the_pi_wheel_drops_what_the_cli_says_it_drops() -> None:
    """setup.py's PI_DROP_* (``make wheel-pi``) and :data:`coinf.deps.PI_LEFT_OUT` (the one-line
    "not part of the Pi install" errors) name the same modules, none of them on the runtime's
    path (checked on the wheel itself by tests/arm)."""
    import ast

    from coinf.deps import PI_LEFT_OUT

    consts = {t.id: ast.literal_eval(node.value.args[0] if isinstance(node.value, ast.Call)
                                     else node.value)
              for node in ast.parse((ROOT / "setup.py").read_text()).body
              if isinstance(node, ast.Assign)
              for t in node.targets if isinstance(t, ast.Name) and t.id.startswith("PI_DROP")}
    assert set(consts["PI_DROP_PACKAGES"]) | set(consts["PI_DROP_MODULES"]) == set(PI_LEFT_OUT)
    assert not any(m.startswith(("coinf.wearable", "coinf.ble_protocol", "coinf.device"))
                   for m in PI_LEFT_OUT)
