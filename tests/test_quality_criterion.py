"""Quality as a user measures it: the model's own noise floor, the stable inputs a packing is
judged on, and exact packings that need no sample bound (docs/PACKING.md, "Quality")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from coinf.ble_protocol import media, packing
from coinf.convert import calibrate as cal
from coinf.convert import noise, packcal
from coinf.convert.feeds import Dataset, load_dataset
from coinf.convert.metrics import Metric
from coinf.wearable.planner.adapt import LinkEstimate
from coinf.wearable.planner.planner import Planner
from coinf.wearable.planner.references import plan_json
from coinf.wearable.policy import Policy
from onnx import TensorProto, helper

from coinf.bundle import Bundle, Candidate, Part, TensorSpec
from coinf.cli import main
from coinf.errors import InputError
from tests.planner_bundle import make_bundle
from tests.test_codec_plan import photos

STEP = 1 / 255.0


def test_the_lsb_of_a_normalized_8bit_frame_is_its_pixel_step() -> None:
    """Pixels p / 255 normalised per channel: one LSB is 1 / 255 / std of that channel, found
    in the data; token ids are never perturbed."""
    rng = np.random.default_rng(0)
    pix = rng.integers(0, 256, size=(20, 1, 3, 8, 8)).astype(np.float64)
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    x = ((pix / 255.0 - mean[:, None, None]) / std[:, None, None]).astype(np.float32)
    tokens = rng.integers(0, 100, size=(20, 1, 4)).astype(np.int64)
    data = Dataset("t", {"image": x, "tokens": tokens})
    lsb = noise.input_lsb(data)
    assert set(lsb) == {"image"}
    got = lsb["image"]
    assert got.grid and got.step.shape == (1, 3, 1, 1)
    np.testing.assert_allclose(got.step.ravel(), 1 / 255.0 / std, rtol=1e-3)
    moved = noise.perturb(data.feed(3), lsb, 3)
    assert np.array_equal(moved["tokens"], data.feed(3)["tokens"])
    steps = (moved["image"] - x[3]) / got.step
    inside = (pix[3] > 0) & (pix[3] < 255)  # at the ends of the range a step down/up is clipped
    np.testing.assert_allclose(np.abs(steps[inside]), 1.0, rtol=1e-3)
    assert np.all(np.abs(steps) <= 1.0 + 1e-3)


def test_a_tensor_off_any_grid_gets_its_range_over_the_levels() -> None:
    x = np.random.default_rng(1).standard_normal((10, 1, 50)).astype(np.float32)
    got = noise.input_lsb(Dataset("t", {"w": x}))["w"]
    assert not got.grid
    assert float(got.step) == pytest.approx((x.max() - x.min()) / 65535.0, rel=1e-6)


def _argmax_bundle(root: Path, n_in: int = 4) -> Bundle:
    """x[1,4] -relu-> h -identity matmul-> y[1,4]: the answer is argmax(x) (inputs >= 0)."""
    root.mkdir(parents=True)
    eye = onnx.numpy_helper.from_array(np.eye(n_in, dtype=np.float32), "I")

    def graph(nodes: list[onnx.NodeProto], i: str, o: str, inits: list) -> onnx.ModelProto:
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(i, TensorProto.FLOAT,
                                                                         [1, n_in])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, [1, n_in])],
                              inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        return m

    head = [helper.make_node("Relu", ["x"], ["h"])]
    tail = [helper.make_node("MatMul", ["h", "I"], ["y"])]
    (root / "c001").mkdir()
    onnx.save(graph(head + tail, "x", "y", [eye]), root / "model.onnx")
    onnx.save(graph(head, "x", "h", []), root / "c001/head.onnx")
    onnx.save(graph(tail, "h", "y", [eye]), root / "c001/tail.onnx")
    x, h, y = (TensorSpec(n, (1, n_in), "float32", 4 * n_in) for n in "xhy")
    none = Part(None, 0, 0, ())
    whole = Part("model.onnx", 40, 64, ("all",))
    b = Bundle(root=root, model_file="model.onnx", model_sha256="0" * 64, inputs=(x,),
               outputs=(y,), candidates=(
                   Candidate("c000", "handheld-only", (x,), none, whole),
                   Candidate("c001", "relu", (h,), Part("c001/head.onnx", 4, 0, ("relu",)),
                             Part("c001/tail.onnx", 32, 64, ("mm",))),
                   Candidate("c002", "wearable-only", (y,), whole, none)))
    b.save()
    return Bundle.load(root)


def _margin_data(n: int) -> np.ndarray:
    """Inputs on the 8-bit grid: the first half with the two largest values tied (one LSB of
    noise decides between them), the second with a clear winner (at least 40 steps)."""
    rng = np.random.default_rng(5)
    pix = rng.integers(0, 100, size=(n, 4))
    top = rng.integers(0, 4, size=n)
    for i in range(n):
        pix[i, top[i]] = 200
        if i < n // 2:
            pix[i, (top[i] + 1) % 4] = 200
    pix[0, :] = [0, 255, 255, 0]  # the grid spans all 256 levels
    return (pix / 255.0).astype(np.float32)


def test_unstable_inputs_are_not_judged_and_the_floor_is_recorded(tmp_path: Path) -> None:
    n = 400
    x = _margin_data(n)
    b = _argmax_bundle(tmp_path / "b")
    np.savez(tmp_path / "d.npz", x=x)
    data = load_dataset(str(tmp_path / "d.npz"), b)
    results = cal.calibrate(b, data, ["q3", "q8"], ["c001"])
    cal.store(b, results, data)
    rows = {r["spec"]: r for r in results["c001"]}

    # stability recomputed here with numpy: the answer under the same one-LSB perturbation
    lsb = noise.input_lsb(data)
    assert lsb["x"].grid and float(lsb["x"].step) == pytest.approx(STEP, rel=1e-4)
    moved = np.stack([noise.perturb(data.feed(i), lsb, i)["x"][0] for i in range(n)])
    clean = np.maximum(x, 0).argmax(1)
    stable = np.maximum(moved, 0).argmax(1) == clean
    assert stable[n // 2:].all()  # a 40-step lead survives one step of noise
    assert 0 < stable[: n // 2].sum() < n // 2  # a tie does not, about half the time

    # a packing is judged on the stable inputs only, against the unpacked answer
    q3 = np.stack([packing.unpack(packing.pack(np.maximum(x[i:i + 1], 0), "q3"))[0]
                   for i in range(n)])
    flips = q3.argmax(1) != clean
    row = rows["q3"]
    assert row["criterion"] == "stable"
    assert row["samples"] == int(stable.sum()) and row["inputs"] == n
    assert row["accuracy_drop_pp"] == pytest.approx(100 * flips[stable].mean(), abs=1e-3)
    assert row["accuracy_drop_all_pp"] == pytest.approx(100 * flips.mean(), abs=1e-3)
    assert row["noise_floor_pp"] == pytest.approx(100 * (~stable).mean(), abs=1e-3)

    meta = Bundle.load(b.root).meta[cal.META_KEY]
    assert meta["criterion"] == "stable" and meta["judged"] == int(stable.sum())
    assert meta["noise_floor_pp"] == pytest.approx(100 * (~stable).mean(), abs=1e-3)
    line = cal.criterion_line(Bundle.load(b.root).meta)
    assert line is not None and f"{int(stable.sum())} of {n} inputs" in line
    assert f"{100 * (~stable).mean():.2f} pp" in line


def test_with_labels_the_criterion_is_accuracy_and_the_floor_is_still_measured(
        tmp_path: Path) -> None:
    n = 120
    x = _margin_data(n)
    labels = np.maximum(x, 0).argmax(1)
    labels[::7] = (labels[::7] + 1) % 4  # the model is wrong on these
    b = _argmax_bundle(tmp_path / "b")
    np.savez(tmp_path / "d.npz", x=x, labels=labels)
    data = load_dataset(str(tmp_path / "d.npz"), b)
    row = cal.calibrate(b, data, ["q8"], ["c001"])["c001"][0]
    assert row["criterion"] == "labels" and row["samples"] == n
    assert row["noise_floor_pp"] > 0  # the ties still flip under noise


def test_an_exact_codec_needs_no_sample_bound_and_the_plan_says_so(tmp_path: Path) -> None:
    """Issue 49: with 12 inputs no lossy packing can show <= 1 pp, but PNG of frames made of
    8-bit pixels comes back to float rounding: it is accepted; JPEG is refused on its bound."""
    if not {"jpeg", "png"} <= media.available():
        pytest.skip("the codecs extra is not installed")
    b = make_bundle(tmp_path / "b")
    np.savez(tmp_path / "p.npz", x=photos(12))
    data = load_dataset(str(tmp_path / "p.npz"), b)
    cal.store(b, cal.calibrate(b, data, ["png", "jpeg-q90"], ["c000"]), data)
    b = Bundle.load(b.root)
    cand = b.candidate("c000")
    rows = {r["spec"]: r for r in cal.packing_rows(cand)}
    assert rows["png"]["exact"] is True and "exact" not in rows["jpeg-q90"]
    assert rows["png"]["accuracy_drop_upper_pp"] > 1  # what the old rule refused it for
    assert cal.is_exact(cand, "png") and not cal.is_exact(cand, "jpeg-q90")
    assert cal.accuracy_bound(cand, "png") == (0.0, None)

    planner = Planner(b, policy=Policy(objective="energy"), packings=["png", "jpeg-q90"])
    link = LinkEstimate(20_000.0, 20_000.0, 30.0)
    decision = planner.decide(link)
    assert "c000~png" not in planner.excluded_configs
    assert "95% upper bound" in planner.excluded_configs["c000~jpeg-q90"]
    entry = {e["id"]: e for e in plan_json(planner, decision, link_estimate=link)["candidates"]}
    assert entry["c000~png"]["exact"] is True and "exact" not in entry.get("c000~jpeg-q90", {})


def test_coinf_calibrate_says_which_criterion_and_floor(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    b = _argmax_bundle(tmp_path / "b")
    np.savez(tmp_path / "d.npz", x=_margin_data(60))
    assert main(["calibrate", str(b.root), "--data", str(tmp_path / "d.npz"),
                 "--bits", "8"]) == 0
    out = capsys.readouterr()
    assert "quality: agreement with the unpacked model on the " in out.out
    assert "whose answer survives 1 LSB of input noise" in out.out
    assert "the model's own noise floor: " in out.out
    assert "samples cannot establish" in out.err


def test_a_continuous_metric_judges_every_input() -> None:
    assert not noise.is_decision(Metric("cosine"))
    assert noise.is_decision(Metric("top1")) and noise.is_decision(Metric("boxes@0.5"))


def test_png_of_a_normalized_frame_is_exact(tmp_path: Path) -> None:
    """ImageNet normalisation ``(p / 255 - mean) / std`` in float32: the calibrated pixel map
    must find the grid's step to float precision, or the top pixels come back 1e-4 off (0.6 %
    of a step) and PNG would not be exact."""
    if "png" not in media.available():
        pytest.skip("the codecs extra is not installed")
    mean = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
    std = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]
    frames = photos(12)
    frames[0, :, 0, 0], frames[0, :, 0, 1] = 0.0, 1.0  # the full 0..255 range in each channel
    x = ((frames - mean) / std).astype(np.float32)
    b = make_bundle(tmp_path / "b")
    np.savez(tmp_path / "n.npz", x=x)
    data = load_dataset(str(tmp_path / "n.npz"), b)
    row = cal.calibrate(b, data, ["png"], ["c000"])["c000"][0]
    assert row.get("exact") is True, row["rel_l2"]


def test_ctc_labels_make_the_criterion_word_accuracy(tmp_path: Path) -> None:
    """A recogniser's labels are rows of class ids (padded with -1): the criterion is the
    share of inputs whose greedy decoding spells the label, against labels, on every input."""
    rng = np.random.default_rng(2)
    n = 60
    ids = rng.integers(1, 4, size=(n, 4))
    ids[:, 1] = 0  # a blank between the first two: "a b" decodes to [a, b] even when a == b
    labels = np.full((n, 6), -1, np.int64)
    for i in range(n):
        word = [int(c) for k, c in enumerate(ids[i]) if c and (k == 0 or c != ids[i][k - 1])]
        labels[i, :len(word)] = word
    labels[::5, 0] = 3 - (labels[::5, 0] - 1)  # the "model" misreads these
    b = _argmax_bundle(tmp_path / "b")
    np.savez(tmp_path / "d.npz", x=ids.astype(np.float32), labels=labels)
    data = load_dataset(str(tmp_path / "d.npz"), b)
    assert data.labels is not None and data.labels.shape == (n, 6)
    opts = packcal.Options(metric=Metric("ctc"))
    table = cal.calibrate(b, data, ["f32", "q2"], ["c001"], options=opts)["c001"]
    rows = {r["spec"]: r for r in table}
    assert all(r["criterion"] == "labels" and r["samples"] == n for r in rows.values())
    assert rows["f32"]["accuracy_drop_pp"] == 0.0
    q2 = np.stack([packing.unpack(packing.pack(np.maximum(ids[i:i + 1], 0).astype(np.float32),
                                               "q2"))[0] for i in range(n)])
    from coinf.convert.metrics import _ctc

    def right(rows_ids: np.ndarray) -> np.ndarray:
        return np.array([_ctc(r.astype(np.int64)) == [c for c in lab if c >= 0]
                         for r, lab in zip(rows_ids, labels, strict=True)])

    want = 100 * (right(ids).mean() - right(np.rint(q2)).mean())
    assert rows["q2"]["accuracy_drop_pp"] == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize(("labels", "metric", "match"), [
    (np.full(30, 4), "top1", "label 4 is not a class id of 'y'; expected class ids 0..3"),
    (np.full((30, 3), 0), "ctc",
     "label 0 is not a class id of 'y'; expected class ids 1..3 \\(0 is the blank"),
])
def test_labels_the_model_cannot_output_are_one_error_naming_the_file(
        tmp_path: Path, labels: np.ndarray, metric: str, match: str) -> None:
    b = _argmax_bundle(tmp_path / "b")
    np.savez(tmp_path / "d.npz", x=_margin_data(30), labels=labels)
    data = load_dataset(str(tmp_path / "d.npz"), b)
    with pytest.raises(InputError, match=f"^d.npz: {match}"):
        cal.calibrate(b, data, ["q8"], ["c001"], options=packcal.Options(metric=Metric(metric)))


def test_candidates_calibrated_in_worker_processes_match_one_process(tmp_path: Path) -> None:
    """convert/pool.py: the same rows from two worker processes as from this one (the entropy
    tables workers fit reach store(): tests/test_demo_real.py, whose swift_f0 cuts fit them)."""
    from coinf.convert.pool import calibrate_many

    b = _argmax_bundle(tmp_path / "b", n_in=8)
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(3).random((40, 8)).astype(np.float32))
    jobs = [("c000", ("q8", "f32")), ("c001", ("q3", "q4"))]
    opts = packcal.Options(metric=Metric("top1"))
    one = calibrate_many(b.root, tmp_path / "d.npz", jobs, opts, workers=1)
    two = calibrate_many(b.root, tmp_path / "d.npz", jobs, opts, workers=2)
    assert list(two) == ["c000", "c001"]
    for cid, rows in one.items():
        for a, c in zip(rows, two[cid], strict=True):
            assert (a["spec"], a["mean_bytes"], a["samples"]) == (c["spec"], c["mean_bytes"],
                                                                  c["samples"])
            assert a["accuracy_drop_pp"] == pytest.approx(c["accuracy_drop_pp"], abs=1e-9)
    assert [r["spec"] for r in two["c001"]] == ["q3", "q4"]


@pytest.mark.parametrize(("labels", "metric", "match"), [
    (np.full(30, 1), "ctc", "hold one class id per input; --metric ctc is judged against a row"),
    (np.full((30, 2), 1), "top1", "hold a row of ids per input; --metric top1 is judged against "
                                  "one class id"),
    (np.full(30, 440.0), "top1", "hold one number per input; --metric top1 is judged against "
                                 "one class id"),
    (np.full((30, 2), 1), "cents@50", "hold a row of ids per input; --metric cents@50 is "
                                      "judged against one pitch in Hz"),
    (np.full(30, -1.0), "cents@50", "label -1 is no pitch; expected a frequency in Hz > 0"),
    (np.full(30, 1), "lines@0.5", "hold one class id per input; --metric lines@0.5 is judged "
                                  r"against line boxes \[L, 4\]"),
    (np.full((30, 2, 4), 0.5, np.float32), "top1", "hold line boxes per input; --metric top1 "
                                                   "is judged against one class id"),
    (np.tile(np.float32([0.5, 0, 0.2, 1]), (30, 1, 1)), "lines@0.5",
     "a line box is not x0 < x1, y0 < y1 within 0..1"),
])
def test_labels_of_the_wrong_kind_for_the_metric_are_refused(
        tmp_path: Path, labels: np.ndarray, metric: str, match: str) -> None:
    """Stale or mismatched labels are never silently ignored (the criterion would quietly
    become another one)."""
    b = _argmax_bundle(tmp_path / "b")
    np.savez(tmp_path / "d.npz", x=_margin_data(30), labels=labels)
    data = load_dataset(str(tmp_path / "d.npz"), b)
    with pytest.raises(InputError, match=f"^d.npz: (the labels )?{match}"):
        cal.calibrate(b, data, ["q8"], ["c001"],
                      options=packcal.Options(metric=Metric(metric)))


def test_pitch_labels_make_the_criterion_raw_pitch_accuracy(tmp_path: Path) -> None:
    """A pitch tracker's labels are one pitch (Hz) per input: the criterion is the share of
    frames within T cents of it (raw pitch accuracy), the drop the clean run's minus the
    packed run's, against labels, on every input."""
    rng = np.random.default_rng(4)
    n, frames = 60, 8
    f0 = rng.uniform(60, 1500, n).astype(np.float32)
    cents = rng.uniform(-80, 80, (n, frames))  # the "model" misses some frames by > 50 cents
    x = (f0[:, None] * 2.0 ** (cents / 1200)).astype(np.float32)
    b = _argmax_bundle(tmp_path / "b", n_in=frames)
    np.savez(tmp_path / "d.npz", x=x, labels=f0)
    data = load_dataset(str(tmp_path / "d.npz"), b)
    assert data.labels is not None and data.labels.dtype.kind == "f"
    metric = Metric("cents@50")
    table = cal.calibrate(b, data, ["f32", "q2"], ["c001"],
                          options=packcal.Options(metric=metric))["c001"]
    rows = {r["spec"]: r for r in table}
    assert all(r["criterion"] == "labels" and r["samples"] == n for r in rows.values())
    assert rows["f32"]["accuracy_drop_pp"] == 0.0

    def rpa(pitch: np.ndarray) -> float:
        return float(np.mean(np.abs(1200 * np.log2(pitch / f0[:, None])) <= 50))

    q2 = np.concatenate([packing.unpack(packing.pack(x[i:i + 1], "q2")) for i in range(n)])
    want = 100 * (rpa(x) - rpa(q2))
    assert want > 1  # the test can fail: coarse levels move frames across the line
    assert rows["q2"]["accuracy_drop_pp"] == pytest.approx(want, abs=1e-6)
    assert metric.correct(x[0], float(f0[0])) == pytest.approx(
        float(np.mean(np.abs(cents[0]) <= 50)), abs=1e-6)


def test_line_labels_make_the_criterion_f1_against_the_labelled_lines(tmp_path: Path) -> None:
    """A text detector's labels are line boxes: the criterion is the F1 of the mask's regions
    (lines@T) against them, the drop the clean run's F1 minus the packed run's."""
    from coinf.convert import textlines

    n, w = 60, 16
    rng = np.random.default_rng(8)
    x = np.zeros((n, w), np.float32)
    labels = np.full((n, 4, 4), -1.0, np.float32)
    for i in range(n):  # two "lines" per row: runs of faint and strong positive values
        for k, (lo, hi) in enumerate(((1, 6), (9, 15))):
            x[i, lo:hi] = rng.uniform(0.02, 1.0, hi - lo)
            labels[i, k] = [lo / w, 0.0, hi / w, 1.0]
    b = _argmax_bundle(tmp_path / "b", n_in=w)
    np.savez(tmp_path / "d.npz", x=x, labels=labels)
    data = load_dataset(str(tmp_path / "d.npz"), b)
    assert data.labels is not None and data.labels.shape == (n, 4, 4)
    table = cal.calibrate(b, data, ["f32", "q2"], ["c001"],
                          options=packcal.Options(metric=Metric("lines@0.5")))["c001"]
    rows = {r["spec"]: r for r in table}
    assert all(r["criterion"] == "labels" and r["samples"] == n for r in rows.values())
    assert rows["f32"]["accuracy_drop_pp"] == 0.0

    def f1(y: np.ndarray) -> np.ndarray:
        return np.array([textlines.f1(textlines.label_boxes(labels[i]),
                                      textlines.line_boxes(y[i:i + 1]), 0.5) for i in range(n)])

    q2 = np.concatenate([packing.unpack(packing.pack(x[i:i + 1], "q2")) for i in range(n)])
    want = 100 * float(np.mean(np.maximum(f1(x) - f1(q2), 0)))
    assert want > 1  # the test can fail: coarse levels zero faint values and break lines
    assert rows["q2"]["model_accuracy_pct"] == pytest.approx(100 * float(np.mean(f1(x))),
                                                             abs=1e-4)
    assert rows["q2"]["accuracy_drop_pp"] == pytest.approx(want, abs=1e-4)  # rounded
