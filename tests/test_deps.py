"""The one-line error for a missing optional package names the command that installs it here."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from coinf import deps

ROOT = Path(__file__).resolve().parents[1]


def test_from_the_checkout_the_hint_is_the_checkouts_own_pip_command(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert deps.checkout() == ROOT
    line = deps.missing_message("matplotlib", "--png")
    assert line.startswith("--png needs 'matplotlib', which is not installed")
    command = line.split("extra: ", 1)[1].rstrip(")")
    argv = shlex.split(command)
    assert argv[1:5] == ["-m", "pip", "install", "-e"] and argv[5] == ".[convert]"
    assert (ROOT / argv[0]).resolve() == Path(deps.sys.executable).resolve()
    assert "COINF_WHEEL" not in line


def test_elsewhere_the_hint_names_the_checkout_by_path(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(deps.install_command("demo"))
    assert argv[-1] == f"{ROOT}[demo]"


def test_an_installed_wheel_names_the_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deps, "checkout", lambda: None)
    assert "COINF_WHEEL.whl[convert]" in deps.missing_message("tqdm", "progress")
