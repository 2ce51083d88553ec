"""Codec packings in the planner, the handshake and a Session: calibrated on real photos, offered
only when the handheld decodes them, and compared against the four reference points."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from coinf.ble_protocol import media
from coinf.ble_protocol.negotiate import LEGACY_DECODERS, decodable
from coinf.ble_protocol.packing import pack, unpack
from coinf.convert import calibrate as cal
from coinf.convert.feeds import load_dataset
from coinf.convert.packcal import tensor_specs
from coinf.wearable.planner.adapt import LinkEstimate
from coinf.wearable.planner.codec_costs import codec_factor
from coinf.wearable.planner.planner import Planner
from coinf.wearable.planner.references import KINDS, plan_json
from coinf.wearable.policy import Policy

from coinf import Session
from coinf.bundle import Bundle
from tests.bundles import fixed
from tests.planner_bundle import make_bundle

pytest.importorskip("PIL")
SPECS = ("q8", "jpeg-q90", "webp-q75", "png")
N = 320  # enough for a 95% bound under 1 pp when nothing changes (299)


def photos(n: int, hw: int = 32) -> np.ndarray:
    """Crops of scikit-learn's two sample photos, scaled to [0, 1] like a camera frame."""
    datasets = pytest.importorskip("sklearn.datasets")
    from PIL import Image

    imgs = datasets.load_sample_images().images
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        im = imgs[i % 2]
        s = int(rng.integers(hw, 200))
        y, x = int(rng.integers(0, im.shape[0] - s)), int(rng.integers(0, im.shape[1] - s))
        crop = Image.fromarray(im[y:y + s, x:x + s]).resize((hw, hw), Image.BILINEAR)
        out.append(np.asarray(crop, np.float32).transpose(2, 0, 1) / 255.0)
    return np.stack(out)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    if not {"jpeg", "webp", "png"} <= media.available():
        pytest.skip("the codecs extra is not installed")
    root = tmp_path_factory.mktemp("codecplan")
    b = make_bundle(root / "b")
    np.savez(root / "photos.npz", x=photos(N))
    data = load_dataset(str(root / "photos.npz"), b)
    cal.store(b, cal.calibrate(b, data, SPECS), data)
    return Bundle.load(b.root)


def test_codec_rows_only_where_an_image_crosses(bundle: Bundle) -> None:
    specs = {c.id: [r["spec"] for r in cal.packing_rows(c)] for c in bundle.candidates}
    assert specs["c000"] == list(SPECS)  # the model input: a 3-channel frame
    assert specs["c001"] == ["q8"]  # 16 channels: not an image
    row = {r["spec"]: r for r in cal.packing_rows(bundle.candidate("c000"))}
    assert row["jpeg-q90"]["mean_bytes"] < row["q8"]["mean_bytes"] / 2
    assert row["png"]["encode_ms"] > 0 and row["png"]["decode_ms"] > 0
    assert row["jpeg-q90"]["bits"] == 8 and row["jpeg-q90"]["quality"] == 90


def test_the_pixel_map_is_calibrated_so_png_of_8bit_frames_is_exact(bundle: Bundle) -> None:
    """The frames are 8-bit pixels / 255: over 320 of them each channel spans [0, 1], so the
    calibrated map gives back the very pixels and PNG loses nothing (per-input ranges would
    not: a frame whose red spans 3..250 maps 248 values onto 256 levels)."""
    cand = bundle.candidate("c000")
    spec = tensor_specs(cand, "png")["x"]
    assert spec.ranges is not None and len(spec.ranges) == 3
    assert all(lo == pytest.approx(0, abs=0.02) and hi == pytest.approx(1, abs=0.02)
               for lo, hi in spec.ranges)
    lo = np.array([r[0] for r in spec.ranges], np.float32)[None, :, None, None]
    hi = np.array([r[1] for r in spec.ranges], np.float32)[None, :, None, None]
    frame = np.clip(photos(1)[0][None] * 0.8 + 0.1, lo, hi)  # spans less than its channel
    exact = np.round(frame * 255).astype(np.float32) / 255
    calibrated = unpack(pack(exact, spec))
    own = unpack(pack(exact, "png"))
    assert np.abs(calibrated - exact).max() < 1e-5  # the very pixels
    assert np.abs(own - exact).max() > 1e-4  # this frame's own range: levels off the pixels
    row = {r["spec"]: r for r in cal.packing_rows(cand)}["png"]
    assert row["rel_l2"] < 1e-3 and row["accuracy_drop_pp"] == 0


def _planner(bundle: Bundle, objective: str = "energy") -> Planner:
    return Planner(bundle, policy=Policy(objective=objective))


def test_the_planner_never_offers_what_the_peer_cannot_decode(bundle: Bundle) -> None:
    p = _planner(bundle)
    link = LinkEstimate(20_000, 20_000, 30)
    ids = {r.id for r in p.costs(link)}
    assert "c000~jpeg-q90" in ids
    p.peer_decoders = LEGACY_DECODERS
    p.reset_configs()
    ids = {r.id for r in p.costs(link)}
    assert not any("jpeg" in i or "webp" in i or "png" in i for i in ids)
    assert "cannot decode jpeg" in p.excluded_configs["c000~jpeg-q90"]
    assert "c000~q8" in ids


def test_codec_time_is_charged_to_both_sides(bundle: Bundle) -> None:
    p = _planner(bundle)
    rows = {r.id: r for r in p.costs(LinkEstimate(20_000, 20_000, 30))}
    row = {r["spec"]: r for r in cal.packing_rows(bundle.candidate("c000"))}["png"]
    assert p.codec_ms["c000~png"] == pytest.approx(
        (row["encode_ms"] * p.codec_slowdown, row["decode_ms"]), rel=1e-6)
    assert rows["c000~png"].head_ms == pytest.approx(row["encode_ms"] * p.codec_slowdown)
    assert rows["c000~png"].tail_ms == pytest.approx(rows["c000"].tail_ms + row["decode_ms"])
    p.wearable.slowdown = 4.0  # an emulated wearable: encoding is stretched 4x, not 40x
    assert codec_factor(p.wearable) == 4.0
    p.wearable.slowdown = 40.0
    assert codec_factor(p.wearable) == p.codec_slowdown


def test_profiled_codec_times_win_over_calibrated_ones(bundle: Bundle) -> None:
    from coinf.convert.codec_speed import codec_times
    from coinf.device.profile import ModelProfile

    measured = codec_times(bundle.candidate("c000"), repeats=2)
    assert set(measured) == {f"{k}_{s}_ms" for k in ("encode", "decode") for s in SPECS}
    assert all(v > 0 for v in measured.values())
    p = _planner(bundle)
    p.wearable.models[bundle.identity] = ModelProfile(
        candidates={"c000": {"encode_png_ms": 7.0}})
    p.handheld.models[bundle.identity] = ModelProfile(
        candidates={"c000": {"decode_png_ms": 0.5}})
    rows = {r.id: r for r in p.costs(LinkEstimate(20_000, 20_000, 30))}
    assert rows["c000~png"].head_ms == pytest.approx(7.0)
    assert rows["c000~png"].tail_ms == pytest.approx(rows["c000"].tail_ms + 0.5)


@pytest.mark.parametrize("objective,key", [("energy", "wearable_mj"), ("latency", "latency_ms")])
def test_the_choice_is_no_worse_than_any_reference_point(bundle: Bundle, objective: str,
                                                         key: str) -> None:
    p = _planner(bundle, objective)
    link = LinkEstimate(20_000, 20_000, 30)
    d = p.decide(link)
    out = plan_json(p, d, link_estimate=link)
    refs = out["reference"]
    assert set(refs) == set(KINDS)
    assert refs["wearable_only"]["cut"] == "c003"
    assert refs["handheld_raw"]["id"] == "c000"
    assert refs["handheld_codec"]["packing"] in SPECS  # every packing of the input counts
    assert refs["best_split"]["cut"] in ("c001", "c002")
    assert out["chosen"]["id"] == d.winner
    if objective == "energy":  # energy counts the whole system here (both weights 1)
        energy = {r.id: r.energy_mj() for r in d.rows}
        assert all(energy[d.winner] <= energy[e["id"]] + 1e-9 for e in refs.values())
    else:
        assert all(out["chosen"][key] <= e[key] + 1e-6 for e in refs.values())
    # a codec sends far fewer bytes than the float frame, for a quality loss within the bound
    assert refs["handheld_codec"]["bytes"] < refs["handheld_raw"]["bytes"] / 4
    assert refs["handheld_codec"]["quality_loss_bound"] <= 1.0


def test_both_sides_announce_their_decoders() -> None:
    have = decodable()
    assert {"q", "f16", "f32", "raw"} <= set(have)
    assert set(media.available()) <= set(have)


def test_a_session_sends_a_jpeg_frame_and_gets_the_model_output(bundle: Bundle) -> None:
    x = photos(3)
    with Session(bundle.root, fixed("c000", "jpeg-q95")) as sess:
        for frame in x:
            feed = {"x": frame[None]}
            got = sess.run(None, feed)[0]
            assert sess.last_run.packing == "jpeg-q95" and not sess.last_run.local
            assert sess.last_run.bytes_up < frame.nbytes / 4
            with Session(bundle.root, fixed("c003")) as local:
                want = local.run(None, feed)[0]
            assert np.allclose(got, want, atol=0.05)
    with Session(bundle.root, fixed("c000", "png")) as sess:
        assert sess.run(None, {"x": x[0][None]})[0].shape == (1, 10)
    assert Path(bundle.root).exists()


def test_a_fixed_codec_the_handheld_lacks_is_refused_before_sending(
        bundle: Bundle, monkeypatch: pytest.MonkeyPatch) -> None:
    from coinf.handheld import daemon

    from coinf.errors import InputError

    monkeypatch.setattr(daemon, "decodable", lambda: sorted(LEGACY_DECODERS))
    with Session(bundle.root, fixed("c000", "jpeg-q90")) as sess, \
            pytest.raises(InputError, match="cannot be sent: the handheld cannot decode jpeg"):
        sess.run(None, {"x": photos(1)})
    with Session(bundle.root, fixed("c000", "q8")) as sess:  # what it lists still goes
        assert sess.run(None, {"x": photos(1)})[0].shape == (1, 10)


def test_a_non_float_tensor_under_a_codec_travels_exactly() -> None:
    x = np.arange(192, dtype=np.int32).reshape(1, 3, 8, 8)
    assert np.array_equal(unpack(pack(x, "png")), x)


def test_coinf_run_takes_a_packing_per_configuration(bundle: Bundle, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from coinf.cli import main

    np.save(tmp_path / "x.npy", photos(1))
    assert main(["run", str(bundle.root), "--split", "c000~png,c003,c000~q8", "--repeat", "1",
                 "--input", f"x={tmp_path / 'x.npy'}", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["candidate"], r["packing"], r["lossy"]) for r in rows] == [
        ("c000", "png", True), ("c003", "raw", False), ("c000", "q8", True)]
    assert rows[0]["bytes_up"] < photos(1).nbytes / 2 and rows[0]["top1_same"]
    assert main(["run", str(bundle.root), "--split", "c000~jpeg-q0"]) == 2
    err = capsys.readouterr().err
    assert "--split c000~jpeg-q0" in err and err.strip().count("\n") == 0
