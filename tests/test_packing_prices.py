"""What the planner charges for packing, and which rows are reference points (issue 49).

Packing (quantize + shuffle + LZ4, rANS, a standard codec) is integer work that a Pi core does
about ``CODEC_SLOWDOWN`` x slower than this machine, not the K x of the DNN compute: the
planner prices it from measured pack times stretched the way an emulated wearable stretches
them, and every packing of the model input counts as a reference point."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from coinf.convert import calibrate as cal
from coinf.convert.codec_speed import codec_times
from coinf.convert.feeds import load_dataset
from coinf.device.profile import DeviceProfile, ModelProfile
from coinf.wearable.planner.adapt import LinkEstimate
from coinf.wearable.planner.codec_costs import (
    CODEC_SLOWDOWN,
    is_packing_work,
    packing_stretch,
)
from coinf.wearable.planner.planner import Planner
from coinf.wearable.planner.references import references
from coinf.wearable.policy import Policy

from coinf.bundle import Bundle
from tests.planner_bundle import make_bundle

LINK = LinkEstimate(5_000_000, 5_000_000, 0)  # Wi-Fi-like: packing time matters


def _with_rows(b: Bundle, rows: dict[str, list[dict[str, Any]]]) -> Bundle:
    b.candidates = tuple(replace(c, extra={**c.extra, "packing": rows.get(c.id, [])})
                         for c in b.candidates)
    return b


def _profiles(b: Bundle, slowdown: float) -> tuple[DeviceProfile, DeviceProfile]:
    """An emulated wearable ``slowdown`` x slower than this machine, a laptop handheld."""
    w, h = DeviceProfile.pi_zero_2w(), DeviceProfile.laptop()
    w.slowdown = slowdown
    w.models[b.identity] = ModelProfile(candidates={
        "c000": {"head_ms": 0.0}, "c001": {"head_ms": 5.0}, "c002": {"head_ms": 40.0},
        "c003": {"head_ms": 41.0}})
    h.models[b.identity] = ModelProfile(candidates={
        "c000": {"tail_ms": 2.0}, "c001": {"tail_ms": 1.5}, "c002": {"tail_ms": 0.1},
        "c003": {"tail_ms": 0.0}})
    return w, h


def _q7(**times: float) -> dict[str, Any]:
    return {"spec": "q7", "codec": "q", "bits": 7, "mean_bytes": 3000.0,
            "accuracy_drop_pp": 0.0, **times}


def test_an_emulated_wearable_pays_its_profiled_pack_time_as_the_emulation_stretches_it(
        tmp_path: Path) -> None:
    """A pack time profiled on this machine, for a wearable emulated K x slower: the
    emulation stretches packing min(K, CODEC_SLOWDOWN) x, so the planner charges that, not
    K x (a x40 profile priced 7 ms of packing at 280 ms where the emulated wearable spends
    70)."""
    b = _with_rows(make_bundle(tmp_path / "b"), {"c000": [_q7(encode_ms=1.0, decode_ms=0.2)]})
    for k in (4.0, 40.0):
        w, h = _profiles(b, k)
        w.models[b.identity].candidates["c000"]["encode_q7_ms"] = 7.0
        rows = {r.id: r for r in Planner(b, w, h, Policy(objective="latency")).costs(LINK)}
        assert rows["c000~q7"].head_ms == pytest.approx(7.0 * min(k, CODEC_SLOWDOWN))
        assert rows["c000~q7"].tail_ms == pytest.approx(2.0 + 0.2)


def test_without_measured_times_pack_mb_s_is_a_pi_cores_rate(tmp_path: Path) -> None:
    """A row calibrated before packings were timed: ``pack_mb_s`` (a Pi core's rate) for a
    device profile and any emulation at least CODEC_SLOWDOWN x slower, this machine's
    (CODEC_SLOWDOWN x faster) stretched by K below that -- never pack_mb_s x K."""
    b = _with_rows(make_bundle(tmp_path / "b"), {"c000": [_q7()]})
    pi_ms = b.candidate("c000").crossing_bytes / 50e3
    for k, want in ((1.0, pi_ms), (4.0, pi_ms * 4.0 / CODEC_SLOWDOWN), (40.0, pi_ms)):
        w, h = _profiles(b, k)
        p = Planner(b, w, h, Policy(objective="latency"), pack_mb_s=50.0)
        rows = {r.id: r for r in p.costs(LINK)}
        assert rows["c000~q7"].head_ms == pytest.approx(want)


def test_the_emulation_stretches_what_the_planner_charges() -> None:
    """One rule on both sides: every packing but raw is packing work."""
    for spec in (*cal.DEFAULT_SPECS, "raw"):
        assert is_packing_work(spec) == (spec != "raw")
    assert packing_stretch(1.0) == 1.0 and packing_stretch(4.0) == 4.0
    assert packing_stretch(75.0) == CODEC_SLOWDOWN


def _calibrated(tmp_path: Path, specs: tuple[str, ...]) -> Bundle:
    b = make_bundle(tmp_path / "b", hw=16)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", x=rng.random((40, 3, 16, 16), dtype=np.float32))
    data = load_dataset(str(tmp_path / "x.npz"), b)
    cal.store(b, cal.calibrate(b, data, specs, ["c000", "c001"]), data)
    return Bundle.load(b.root)


def test_calibration_and_profiles_time_every_packing(tmp_path: Path) -> None:
    """q/qz rows carry their pack times like codec rows, and ``coinf profile --bundle`` times
    them on the device, so no packing is priced from a guessed rate."""
    b = _calibrated(tmp_path, ("q7", "qz6", "f16"))
    for cid in ("c000", "c001"):
        rows = cal.packing_rows(b.candidate(cid))
        assert {r["spec"] for r in rows} == {"q7", "qz6", "f16"}
        assert all(r["encode_ms"] > 0 and r["decode_ms"] > 0 for r in rows)
        measured = codec_times(b.candidate(cid), repeats=2)
        assert set(measured) == {f"{k}_{s}_ms" for k in ("encode", "decode")
                                 for s in ("q7", "qz6", "f16")}


def test_a_profiled_pack_time_wins_without_calibrated_times(tmp_path: Path) -> None:
    """A bundle calibrated before packings were timed, profiled on the device since: the
    profile's pack time is what the wearable spends, not the pack_mb_s estimate."""
    b = _with_rows(make_bundle(tmp_path / "b"), {"c000": [_q7()]})
    w, h = _profiles(b, 40.0)
    w.models[b.identity].candidates["c000"]["encode_q7_ms"] = 3.0
    rows = {r.id: r for r in Planner(b, w, h, Policy(objective="latency")).costs(LINK)}
    assert rows["c000~q7"].head_ms == pytest.approx(3.0 * CODEC_SLOWDOWN)


def test_every_packing_of_the_input_is_a_reference_point(tmp_path: Path) -> None:
    """``handheld_codec`` is the best packing of the model input, a quantizing one included:
    here q7 sends 4x fewer bytes than PNG for less time, so it is the reference."""
    png = {"spec": "png", "codec": "png", "bits": 8, "mean_bytes": 9000.0,
           "accuracy_drop_pp": 0.0, "encode_ms": 1.0, "decode_ms": 0.5}
    b = _with_rows(make_bundle(tmp_path / "b"),
                   {"c000": [_q7(encode_ms=0.2, decode_ms=0.1), png]})
    w, h = _profiles(b, 1.0)
    p = Planner(b, w, h, Policy(objective="latency"))
    link = LinkEstimate(20_000, 20_000, 0)
    d = p.decide(link)
    rows = {r.id: r for r in d.rows}
    assert rows["c000~q7"].latency_ms() < rows["c000~png"].latency_ms()
    assert references(p, d, link_estimate=link)["handheld_codec"] == "c000~q7"
