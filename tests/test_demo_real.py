"""The demo's preparation on a real pretrained model (swift-f0's pitch network, small enough for
a test): built from its wheel, split, calibrated on real-style inputs with the task's metric,
the calibration reused, and the four reference points planned."""

from __future__ import annotations

from pathlib import Path

import pytest
from coinf.convert import calibrate as cal
from coinf.models import pretrained

from coinf.bundle import Bundle
from coinf.cli.commands import demo_prep
from coinf.cli.commands.demo import KINDS, plan_condition

# time beyond the suite's 30 s a test:
# builds, splits and calibrates a real model in its fixture (31 s alone)
pytestmark = pytest.mark.timeout(300)

SAMPLES = 24


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> demo_prep.Prepared:
    if pretrained.installed_version(pretrained.spec_for("swift_f0")) != "0.3.0":
        pytest.skip("swift-f0==0.3.0 is not installed (the `pretrained` extra)")
    return demo_prep.prepare("swift_f0", tmp_path_factory.mktemp("demo"), SAMPLES)


def test_prepare_builds_splits_and_calibrates_with_the_task_metric(
        prepared: demo_prep.Prepared) -> None:
    assert prepared.info["pretrained"] is True and prepared.info["license"] == "MIT"
    bundle = Bundle.load(prepared.bundle_dir)
    meta = bundle.meta[cal.META_KEY]
    assert meta["samples"] == SAMPLES and meta["metric_spec"]["name"].startswith("cents")
    rows = {c.id: [r["spec"] for r in cal.packing_rows(c)] for c in bundle.candidates}
    first = bundle.candidates[0].id
    assert {"pcm16", "flac"} <= set(rows[first])  # the waveform input gets the audio codecs
    assert not {"jpeg-q90", "png"} & set(rows[first])  # and no image codec
    calibrated = [cid for cid, specs in rows.items() if specs and cid != first]
    assert len(calibrated) == demo_prep.CUTS
    assert all("pcm16" not in rows[c] for c in calibrated)  # activations are no waveforms
    assert prepared.input_file is not None and prepared.input_file.is_file()


def test_a_second_prepare_reuses_everything(prepared: demo_prep.Prepared,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: object, **__: object) -> None:
        raise AssertionError("calibrated again")

    monkeypatch.setattr(demo_prep, "calibrate_jobs", boom)
    out = Path(prepared.bundle_dir).parent
    again = demo_prep.prepare("swift_f0", out, SAMPLES)
    assert again.bundle_dir == prepared.bundle_dir
    with pytest.raises(AssertionError, match="calibrated again"):
        demo_prep.prepare("swift_f0", out, SAMPLES + 1)  # another request calibrates anew


def test_the_plan_names_every_reference_point(prepared: demo_prep.Prepared) -> None:
    bundle = Bundle.load(prepared.bundle_dir)
    c = plan_condition(bundle, "preset", 20_480.0, 30.0, 1000.0)
    plan = c["plan"]
    assert set(plan["reference"]) == set(KINDS)
    assert plan["reference"]["wearable_only"]["id"] == bundle.candidates[-1].id
    assert plan["reference"]["handheld_raw"]["id"] == bundle.candidates[0].id
    codec = plan["reference"]["handheld_codec"]
    if codec is None:  # 24 samples cannot bound a loss under 1 pp: it says why
        assert "refused" in plan["reference_missing"]["handheld_codec"]
    else:  # any packing of the input: PCM16, FLAC, or a quantizing or lossless one
        assert codec["cut"] == bundle.candidates[0].id and codec["packing"] != "raw"
    ids = {r["candidate"] for r in c["rows"]}
    assert plan["chosen"]["id"] in ids


def test_an_unknown_model_is_one_clear_error(tmp_path: Path) -> None:
    from coinf.errors import UserError

    with pytest.raises(UserError, match="pretrained: mobilenetv2_imagenet"):
        demo_prep.prepare("nosuchmodel", tmp_path, 10)


def test_the_choice_is_judged_in_the_demo_objective() -> None:
    from coinf.cli.commands.demo import objective_comparison

    local = {"id": "c063", "latency_ms": 450.0, "wearable_mj": 620.0}
    raw = {"id": "c000", "latency_ms": 3300.0, "wearable_mj": 500.0}  # cheaper, over budget
    split = {"id": "c062~qz8", "latency_ms": 500.0, "wearable_mj": 600.0}
    got = objective_comparison(local, [local, raw, split], 1000.0)
    assert got["best_is"] == "c062~qz8" and got["ratio"] == pytest.approx(620 / 600, abs=1e-4)
    assert objective_comparison(local, [local, raw], 1000.0)["ratio"] == 1.0
    slow = objective_comparison(raw, [raw], 1000.0)  # nothing meets the budget: latency
    assert slow["metric"] == "latency_ms" and not slow["chosen_within_budget"]


def test_the_demo_measures_over_the_emulated_wifi_air(prepared: demo_prep.Prepared) -> None:
    """Three processes: the handheld daemon, the Wi-Fi air relay and the wearable; the
    offloaded configuration gives the whole model's answer through the shaped TCP link."""
    import argparse

    from coinf.cli.commands.demo import measure

    bundle = Bundle.load(prepared.bundle_dir)
    ids = [bundle.candidates[0].id, bundle.candidates[-1].id]
    args = argparse.Namespace(transport="wifi", wifi_preset="pi-zero-2w-wifi",
                              preset="pi-zero-2w", repeat=1)
    rows, where = measure(args, prepared.bundle_dir, ids, 1.0, prepared.input_file)
    assert "emulated pi-zero-2w-wifi Wi-Fi air" in where
    by = {r["candidate"]: r for r in rows}
    assert set(by) == set(ids) and all(r["match"] for r in rows)
    assert by[ids[0]]["bytes_up"] > 0 and by[ids[0]]["transfer_ms"] > 0


def test_a_map_cell_is_measured_end_to_end_and_judged(prepared: demo_prep.Prepared) -> None:
    """bench map's cell over the emulated Wi-Fi: the planner's choice and its reference points
    run for real; the regret is the choice's measured latency over the best point's."""
    import argparse

    from coinf.cli.bench import map as bench_map

    bundle = Bundle.load(prepared.bundle_dir)
    plan = bench_map.plan_points(bundle, "wifi", "latency")
    points = {e["id"]: e for e in (plan["chosen"], *plan["reference"].values()) if e}
    args = argparse.Namespace(repeat=1, max_run_s=60.0, wearable_compute="profile")
    measured = bench_map.measure_link(prepared, "wifi", points, 1.0, args)
    assert set(measured) == set(points) and all(m["measured"] for m in measured.values())
    c = bench_map.cell(bundle, plan, measured, "latency")
    best = min(measured.values(), key=lambda m: m["latency_ms"])
    assert c["regret"] == pytest.approx(
        measured[c["chosen"]["id"]]["latency_ms"] / best["latency_ms"], rel=1e-3)
    assert c["regret"] >= 1.0 and c["winner_kind"] in ("local", "offload", "split")
    local = measured[bundle.candidates[-1].id]["latency_ms"]
    assert c["best_vs_local"] == pytest.approx(local / best["latency_ms"], rel=1e-2)
    s = bench_map.summary([{"model": "m", "link": "wifi", **c}])
    assert s["measured_cells"] == 1 and s["regret_max"] == c["regret"]


def test_the_demo_chooses_the_link_with_the_planner(prepared: demo_prep.Prepared) -> None:
    """``--transport auto``: both of the Pi's links are priced; the one chosen is the link whose
    winner is best in the demo's objective, and a fast enough Wi-Fi wins a frame that takes
    seconds over BLE."""
    from coinf.cli.commands.demo import choose_link, demo_links, format_links

    bundle = Bundle.load(prepared.bundle_dir)
    links = demo_links("pi-zero-2w", "pi-zero-2w-wifi")
    assert links["ble"].kind == "ble" and links["wifi"].kind == "wifi"
    assert links["wifi"].up_bps > 50 * links["ble"].up_bps
    choice = choose_link(bundle, links, 1000.0)
    per = choice.to_json()["per_link"]
    assert set(per) == {"ble", "wifi"}
    within = [n for n, e in per.items() if e["latency_ms"] <= 1000.0]
    want = min(within, key=lambda n: per[n]["wearable_mj"]) if within \
        else min(per, key=lambda n: per[n]["latency_ms"])
    assert choice.link in (want, None)
    if choice.link is None:  # the best is the wearable keeping the work: no link carries it
        assert per[want]["winner"] == bundle.candidates[-1].id
    text = format_links(choice, "wifi" if choice.link == "wifi" else "ble")
    assert "ble" in text and "wifi" in text and "the demo runs over" in text
