"""End-user policies: rules change decisions as specified; the config file and `coinf policy`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from coinf.device.status import DeviceStatus
from coinf.wearable.planner import CandidateCost, coinf_schedule
from coinf.wearable.policy import (
    PROFILES,
    Policy,
    PolicyError,
    load_policy,
    policy_from_json,
    set_policy,
)

from coinf.cli import main
from tests.disk import fill_the_disk

# offloading saves the wearable energy but costs the handheld; local does the opposite
ROWS = [
    CandidateCost("handheld-only", 0, 30, 200, 5, wearable_energy_mj=30,
                  handheld_energy_mj=60, crossing_bytes=4000),
    CandidateCost("c1", 20, 10, 20, 5, wearable_energy_mj=45, handheld_energy_mj=20,
                  crossing_bytes=400),
    CandidateCost("wearable-only", 100, 0, 0, 0, wearable_energy_mj=140,
                  handheld_energy_mj=0, crossing_bytes=0),
]


def pick(policy: Policy, wear: DeviceStatus | None = None,
         hand: DeviceStatus | None = None) -> str:
    ww, wh, _ = policy.weights(wear, hand)
    return coinf_schedule(ROWS, None, w_wearable=ww, w_handheld=wh).winner


def test_battery_rule_r1_follows_the_emptier_battery() -> None:
    p = PROFILES["balanced"]
    assert pick(p) == "c1"  # 65 vs 90 vs 140
    # wearable almost empty, handheld full: wearable energy dominates -> offload everything
    assert pick(p, DeviceStatus(battery_pct=5), DeviceStatus(battery_pct=100)) == "handheld-only"
    # handheld almost empty, wearable full: keep the work on the wearable
    assert pick(p, DeviceStatus(battery_pct=100), DeviceStatus(battery_pct=2)) == "wearable-only"
    # the rule off: batteries ignored
    off = Policy(battery_aware=False)
    assert pick(off, DeviceStatus(battery_pct=5), DeviceStatus(battery_pct=100)) == "c1"


def test_charging_rule_r2_makes_handheld_energy_free() -> None:
    p = PROFILES["balanced"]
    ww, wh, why = p.weights(DeviceStatus(battery_pct=50),
                            DeviceStatus(battery_pct=3, charging=True))
    assert (ww, wh) == (1.0, 0.0) and "R2" in why[-1]
    assert pick(p, DeviceStatus(battery_pct=100), DeviceStatus(battery_pct=3, charging=True)) \
        == "handheld-only"
    assert pick(Policy(charging_rule=False, battery_aware=False), None,
                DeviceStatus(charging=True)) == "c1"


def test_named_profiles() -> None:
    assert pick(PROFILES["save-wearable"]) == "handheld-only"
    # 0.2/0.8: handheld-only 54, c1 25, wearable-only 28 -> c1; offloading everything is worst
    assert pick(PROFILES["save-handheld"]) == "c1"
    assert pick(Policy(w_wearable=0.1, w_handheld=1, battery_aware=False)) == "wearable-only"
    assert PROFILES["performance"].objective == "latency"
    assert PROFILES["streaming"].streaming


def test_policy_file_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "cfg" / "policy.json"
    monkeypatch.setenv("COINF_CONFIG", str(cfg))
    pol, path, exists = load_policy()
    assert path == cfg and not exists and pol.profile == "balanced"
    assert main(["policy", "set", "profile=save-wearable", "latency_budget_ms=150",
                 "constraints=latency<=200,accuracy_drop<=1"]) == 0
    pol, _, exists = load_policy()
    assert exists and pol.profile == "save-wearable" and pol.latency_budget_ms == 150
    assert pol.w_handheld == 0.0
    assert [str(c) for c in pol.dyno_constraints()] == ["latency <= 200 ms",
                                                         "accuracy_drop <= 1 pp"]
    assert main(["policy", "set", "battery_aware=false"]) == 0  # keeps the earlier overrides
    pol, _, _ = load_policy()
    assert pol.latency_budget_ms == 150 and not pol.battery_aware
    capsys.readouterr()
    assert main(["policy", "show"]) == 0
    shown = capsys.readouterr().out
    assert str(cfg) in shown and '"save-wearable"' in shown
    # bad input: one-line errors, exit 2, file untouched
    before = cfg.read_text()
    assert main(["policy", "set", "w_wearable=-1"]) == 2
    assert main(["policy", "set", "profile=turbo"]) == 2
    assert main(["policy", "set", "constraints=latency~5"]) == 2
    assert main(["policy", "set", "nonsense"]) == 2
    assert cfg.read_text() == before
    err = capsys.readouterr().err
    assert "w_wearable" in err and "turbo" in err and "Traceback" not in err
    # settings after --file (argparse alone leaves them over as unrecognised)
    other = tmp_path / "other.json"
    assert main(["policy", "set", "--file", str(other), "latency_budget_ms=90",
                 "streaming=true"]) == 0
    pol, _, _ = load_policy(other)
    assert pol.latency_budget_ms == 90 and pol.streaming
    with pytest.raises(SystemExit):  # an unknown option is still refused, not taken as a setting
        main(["policy", "set", "--file", str(other), "--latency=3"])
    assert load_policy(other)[0].latency_budget_ms == 90

    # a full disk half-way through a save leaves the old policy whole
    fill_the_disk(monkeypatch)
    with pytest.raises(OSError):
        set_policy({"latency_budget_ms": "70"}, other)
    monkeypatch.undo()
    assert load_policy(other)[0].latency_budget_ms == 90
    assert sorted(p.name for p in other.parent.iterdir()) == ["cfg", "other.json"]


def test_policy_json_validation() -> None:
    with pytest.raises(PolicyError, match="objective"):
        policy_from_json({"objective": "fastest"})
    with pytest.raises(PolicyError, match="latency_budget_ms"):
        policy_from_json({"latency_budget_ms": -5})
    with pytest.raises(PolicyError, match="JSON object"):
        policy_from_json([1, 2])
    p = policy_from_json({"profile": "balanced", "constraints": [["latency", "<=", 100]],
                          "targets": ["energy", ["throughput", "max"]]})
    assert p.dyno_constraints()[0].threshold == 100
    assert [t.goal for t in p.dyno_targets()] == ["min", "max"]
    assert json.loads(json.dumps(p.to_json()))["targets"][0] == "energy"


@pytest.mark.parametrize(
    "env",
    [{"COINF_CONFIG": "/tmp/x/policy.json"}, {"XDG_CONFIG_HOME": "/tmp/xdg"}, {}],
    ids=["COINF_CONFIG", "XDG_CONFIG_HOME", "home"],
)
def test_profiles_live_next_to_the_policy_file(env: dict[str, str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """device.config (what profiles use) and wearable.policy name the same policy file."""
    from coinf.device.config import config_path
    from coinf.device.profile import default_profile_path
    from coinf.wearable import policy

    monkeypatch.delenv("COINF_CONFIG", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert policy.config_path() == config_path()
    assert default_profile_path("wearable") == config_path().parent / "wearable-profile.json"
