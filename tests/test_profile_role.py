"""`coinf profile` on the laptop must not overwrite the wearable's profile (issue 18)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from coinf.device import profile as profile_mod

from coinf.cli import main
from tests.disk import fill_the_disk

PI = {"node": "raspberrypi", "machine": "aarch64", "system": "Linux"}
LAPTOP = {"node": "laptop", "machine": "x86_64", "system": "Linux"}


def on(monkeypatch: pytest.MonkeyPatch, host: dict[str, str], board: str = "") -> None:
    import platform

    monkeypatch.setattr(profile_mod, "this_host", lambda: dict(host))
    monkeypatch.setattr(profile_mod, "_board_model", lambda: board)
    monkeypatch.setattr(platform, "machine", lambda: host["machine"])
    monkeypatch.setattr(platform, "system", lambda: host["system"])


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_role_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    on(monkeypatch, PI, "Raspberry Pi Zero 2 W Rev 1.0")
    assert profile_mod.detect_role() == "wearable"
    on(monkeypatch, LAPTOP)
    assert profile_mod.detect_role() == "handheld"
    on(monkeypatch, {"node": "m1", "machine": "arm64", "system": "Darwin"})
    assert profile_mod.detect_role() == "handheld"
    on(monkeypatch, {"node": "board", "machine": "aarch64", "system": "Linux"})
    assert profile_mod.detect_role() is None


def test_ambiguous_machine_must_name_its_role(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    on(monkeypatch, {"node": "board", "machine": "aarch64", "system": "Linux"})
    assert main(["profile", "--out", str(tmp_path / "p.json"), "--threads", "2"]) == 2
    assert "--role" in error_line(capsys)
    assert not (tmp_path / "p.json").exists()
    assert main(["profile", "--role", "wearable", "--out", str(tmp_path / "p.json"),
                 "--threads", "2"]) == 0


def test_laptop_does_not_overwrite_the_wearable_profile(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "wearable-profile.json"
    on(monkeypatch, PI, "Raspberry Pi Zero 2 W Rev 1.0")
    assert main(["profile", "--out", str(out), "--threads", "4"]) == 0  # role detected
    saved = json.loads(out.read_text())
    assert saved["role"] == "wearable" and saved["host"] == PI
    capsys.readouterr()
    before = out.read_text()

    on(monkeypatch, LAPTOP)  # the profile copied to the laptop; `coinf profile` run there
    # detected as the handheld: refuses the wearable's file
    assert main(["profile", "--out", str(out), "--threads", "2"]) == 2
    assert "is the wearable profile" in error_line(capsys)
    # even when told it is the wearable: another machine measured this profile
    assert main(["profile", "--role", "wearable", "--out", str(out), "--threads", "2"]) == 2
    err = error_line(capsys)
    assert "raspberrypi (aarch64)" in err and "laptop (x86_64)" in err and "--force" in err
    assert out.read_text() == before
    # printing it is fine
    assert main(["profile", "--role", "wearable", "--out", str(out)]) == 0
    capsys.readouterr()
    # --force replaces it, starting from the defaults, and records this machine
    assert main(["profile", "--role", "wearable", "--out", str(out), "--threads", "2",
                 "--force"]) == 0
    assert json.loads(out.read_text())["host"] == LAPTOP


def test_same_machine_updates_its_profile(monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    out = tmp_path / "h.json"
    on(monkeypatch, LAPTOP)
    assert main(["profile", "--out", str(out), "--threads", "2"]) == 0
    assert main(["profile", "--out", str(out), "--slowdown", "2"]) == 0
    saved = json.loads(out.read_text())
    assert saved["role"] == "handheld" and saved["threads"] == 2 and saved["slowdown"] == 2.0
    # an old profile without a host is updated, and gets one
    saved.pop("host")
    out.write_text(json.dumps(saved))
    assert main(["profile", "--out", str(out), "--threads", "3"]) == 0
    assert json.loads(out.read_text())["host"] == LAPTOP


def test_a_failed_save_leaves_the_old_profile_whole(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    path = tmp_path / "handheld.json"
    old = profile_mod.DeviceProfile.default("handheld")
    old.name = "before"
    old.save(path)
    new = profile_mod.DeviceProfile.default("handheld")
    new.name = "after"

    fill_the_disk(monkeypatch)
    with pytest.raises(OSError):
        new.save(path)
    monkeypatch.undo()
    assert profile_mod.DeviceProfile.load(path).name == "before"
    assert [p.name for p in tmp_path.iterdir()] == ["handheld.json"]  # no temporary file left
    new.save(path)
    assert profile_mod.DeviceProfile.load(path).name == "after"
    assert [p.name for p in tmp_path.iterdir()] == ["handheld.json"]
