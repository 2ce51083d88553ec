"""Built-in Pi Zero 2 W / laptop profiles (per-op-type rates) and the demo's planning claim
(issue 17, part 2 and the demo)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from coinf.convert.split import split_model
from coinf.device.defaults import LAPTOP_RATES, PI_ZERO_2W_RATES, OpRates
from coinf.device.emulation import DeviceEmulation, compute_rates, profile_slowdown
from coinf.device.features import node_features
from coinf.device.profile import DeviceProfile, ModelProfile
from coinf.device.runtime import SliceRunner
from coinf.models.zoo import committed_path
from coinf.wearable.options import EmulationOptions
from coinf.wearable.planner.planner import Planner

from coinf.bundle import Bundle
from coinf.cli import main
from coinf.cli.commands.demo import plan_condition
from coinf.errors import InputError


@pytest.fixture(scope="module")
def wearcam(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return split_model(committed_path("wearcam"), tmp_path_factory.mktemp("b") / "wearcam")


def test_pi_is_much_slower_than_the_laptop_per_op_type() -> None:
    feats = node_features(onnx.load(str(committed_path("wearcam"))))
    pi, laptop = PI_ZERO_2W_RATES.model_ms(feats), LAPTOP_RATES.model_ms(feats)
    assert pi > 10 * laptop
    dw = next(f for f in node_features(onnx.load(str(committed_path("mobilenetv2"))))
              if f.kind == "conv" and f.tree[3])
    dense = next(f for f in feats if f.kind == "conv" and f.tree[1] == 3)
    # depthwise convolutions are memory-bound: fewer FLOP/s than dense ones
    assert PI_ZERO_2W_RATES.rate(dw) < PI_ZERO_2W_RATES.rate(dense)
    with pytest.raises(ValueError, match="conv_gflops"):
        OpRates(0, 1, 1, 1, 1, 1, 0, 0)


def test_profile_json_keeps_rates_and_a_measured_profile_is_not_builtin(tmp_path: Path) -> None:
    pi = DeviceProfile.pi_zero_2w()
    assert pi.is_builtin and pi.rates == PI_ZERO_2W_RATES
    pi.save(tmp_path / "p.json")
    again = DeviceProfile.load(tmp_path / "p.json")
    assert again.rates == PI_ZERO_2W_RATES
    again.models["x"] = ModelProfile(nodes={"a": 1.0})
    assert not again.is_builtin


def test_measured_slices_still_win_over_default_rates(wearcam: Bundle) -> None:
    pi = DeviceProfile.pi_zero_2w()
    cand = wearcam.candidates[2]
    pi.models[wearcam.identity] = ModelProfile(candidates={cand.id: {"head_ms": 123.0,
                                                                     "tail_ms": 4.0}})
    planner = Planner(wearcam, pi)
    h, _, src, _ = planner.base_times()[2]
    assert (h, src) == (123.0, "measured slice")
    assert planner.base_times()[-1][2] == "default op rates"


def test_demo_plan_cooperates_on_the_preset_link_and_stays_local_when_it_drops(
        wearcam: Bundle) -> None:
    good = plan_condition(wearcam, "preset", 20_480.0, 30.0, 1000.0)
    chosen, wo, ho = good["chosen"], good["wearable_only"], good["handheld_only"]
    assert chosen["candidate"] not in (wo["candidate"], ho["candidate"])
    assert chosen["wearable_energy_mj"] < wo["wearable_energy_mj"] / 3
    assert chosen["latency_ms"] <= 1000.0 < ho["latency_ms"]
    bad = plan_condition(wearcam, "dropped", 5_000.0, 30.0, 1000.0)
    assert bad["chosen"]["candidate"] == wo["candidate"]
    assert len(good["rows"]) == len(wearcam.candidates)


def test_slowdown_comes_from_the_pi_profile(wearcam: Bundle) -> None:
    slow, pi_ms, here_ms = profile_slowdown(str(wearcam.model_path), DeviceProfile.pi_zero_2w(),
                                            repeats=3)
    assert slow >= 1 and pi_ms > 0 and here_ms > 0
    assert slow == pytest.approx(max(1.0, pi_ms / here_ms))
    with pytest.raises(ValueError, match="op rates"):
        profile_slowdown(str(wearcam.model_path), DeviceProfile("x", "wearable",
                                                                 DeviceProfile.laptop().power))


def test_plan_says_when_profiles_are_builtin(wearcam: Bundle, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COINF_CONFIG", str(tmp_path / "policy.json"))
    assert main(["plan", str(wearcam.root), "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    text = " ".join(notes)
    assert "built-in default 'pi-zero-2w'" in text and "built-in default 'laptop'" in text
    assert "default op rates" in text


def test_an_emulated_wearable_timed_by_the_pi_profile_spends_its_predicted_time_per_head(
        wearcam: Bundle) -> None:
    rates = compute_rates("pi-zero-2w")
    runner = SliceRunner(wearcam, DeviceEmulation(20.0, 1, rates=rates))
    x = np.random.default_rng(0).standard_normal(wearcam.inputs[0].shape).astype(np.float32)
    shares = []
    for cand in (c for c in wearcam.candidates if c.head.file is not None):
        want = rates.model_ms(node_features(onnx.load(str(wearcam.path(cand.head.file))))) / 1e3
        outs, seconds = runner.run_slice(cand, "head", {wearcam.inputs[0].name: x})
        assert outs and seconds >= want  # padded to the profile's time, never shortened
        shares.append(want)
    # deeper heads cost more: the time follows the layers, not one factor on the whole model
    assert len(set(shares)) > 1 and shares == sorted(shares)
    assert DeviceEmulation().slice_seconds("any.onnx") is None  # without rates: stretched


def test_compute_profile_names_a_builtin_profile() -> None:
    assert EmulationOptions(compute_profile="pi-zero-2w").compute_profile == "pi-zero-2w"
    with pytest.raises(InputError, match="compute_profile must be None or one of pi-zero-2w"):
        EmulationOptions(compute_profile="pi-5")
    with pytest.raises(ValueError, match="expected pi-zero-2w"):
        compute_rates("pi-5")


def test_coinf_run_with_a_compute_profile_reports_each_head_at_the_profiles_time(
        wearcam: Bundle, capsys: pytest.CaptureFixture[str]) -> None:
    rates = compute_rates("pi-zero-2w")
    cuts = [c for c in wearcam.candidates if c.head.file is not None][:3]
    assert main(["run", str(wearcam.root), "--split", ",".join(c.id for c in cuts),
                 "--transport", "inprocess", "--repeat", "1", "--threads", "1",
                 "--slowdown", "2", "--compute-profile", "pi-zero-2w", "--json"]) == 0
    rows = {r["candidate"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    for c in cuts:
        want = rates.model_ms(node_features(onnx.load(str(wearcam.path(c.head.file)))))
        assert rows[c.id]["head_ms"] >= want * 0.999  # never shorter than the profile says
        assert rows[c.id]["match"]
