"""Rate points from the cut's statistics (convert/bottleneck_rate.py), histogram tables and
training in feature space (convert/bottleneck_train.py), on the zoo's trained LeNet and real
digits. Nothing here asserts on time."""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import shutil
from pathlib import Path

import numpy as np
import pytest
from coinf.convert import bottleneck as bn
from coinf.convert import bottleneck_rate as br

from coinf.bundle import Bundle
from coinf.cli import main

# time beyond the suite's 30 s a test: trains and sweeps rate points (up to 17 s alone)
pytestmark = pytest.mark.timeout(180)

torch = pytest.importorskip("torch")
if importlib.util.find_spec("onnx2torch") is None:  # the Makefile installs it (--no-deps)
    pytest.skip("onnx2torch is not installed", allow_module_level=True)
bt = pytest.importorskip("coinf.convert.bottleneck_train")

CUT = "c002"  # lenet_digits: pool1, (1, 6, 12, 12)


@pytest.fixture(scope="module")
def lenet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(uncalibrated bundle, the same calibrated with top-1 on real digits, train.npz)."""
    from coinf.convert.split import split_model
    from coinf.models import zoo

    tmp = tmp_path_factory.mktemp("lenet-rate")
    root = tmp / "b"
    split_model(zoo.committed_path("lenet_digits"), root)
    d = zoo.digits_data()
    np.savez(tmp / "train.npz", image=d.x_train[:200].astype(np.float32))
    np.savez(tmp / "val.npz", image=d.x_val[:80].astype(np.float32))
    cal = tmp / "cal"
    shutil.copytree(root, cal)
    assert main(["calibrate", str(cal), "--data", str(tmp / "val.npz"), "--bits", "2,4,8"]) == 0
    return root, cal, tmp / "train.npz"


def _crossing(root: Path, data: Path) -> tuple[Bundle, object, np.ndarray]:
    bundle = Bundle.load(root)
    cand, _ = bn.check_cut(bundle, CUT)
    tail, _ = bn.distill_model(bundle, cand)
    x, _ = bn.run_slices(bundle, cand, tail, bn.load_data(bundle, data))
    return bundle, cand, x


def test_histogram_bytes_is_the_latents_own_entropy() -> None:
    # four symbols equally often in each channel: 2 bits a value, 2 x 16 values a frame
    sym = np.tile(np.arange(4, dtype=np.float32), 8 * 2 * 4).reshape(8, 2, 16)
    assert br.histogram_bytes(sym) == pytest.approx(2 * 2 * 16 / 8 + 4)
    assert br.histogram_bytes(np.zeros((8, 2, 16), np.float32)) == pytest.approx(4)


def test_only_a_classifiers_scores_are_distilled_as_classes() -> None:
    """A (N, K) target is a classifier's only when a class-scoring op makes it: a pitch track
    over K frames (swift-f0's ``Exp``) is matched value by value."""
    from onnx import TensorProto, helper

    def model(op: str) -> object:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
        nodes = [helper.make_node(op, ["x"], ["t"]), helper.make_node("Flatten", ["t"], ["y"])]
        return helper.make_model(helper.make_graph(nodes, "g", [x], [y]))

    arrays = [np.zeros((4, 8), np.float32)]
    assert bn.target_kinds(arrays) == ["kl"]  # no graph: the shape alone
    assert bn.target_kinds(arrays, model("Softmax")) == ["kl"]  # over a reshape
    assert bn.target_kinds(arrays, model("Exp")) == ["mse"]
    assert bn.target_kinds([np.zeros((4, 1, 8), np.float32)], model("Softmax")) == ["mse"]


def test_pick_gains_takes_the_coarsest_within_the_tolerance_and_finer_ones() -> None:
    steps = [br.Step(g, 100 * g, 0.1 / g, loss) for g, loss in
             [(0.5, 9.0), (1.0, 3.0), (2.0, 0.8), (4.0, 0.2), (8.0, 0.0)]]
    assert br.pick_gains(steps, 1.0) == [2.0, 4.0, 8.0]
    assert br.pick_gains(steps, 5.0) == [1.0, 2.0, 4.0]
    assert br.pick_gains(steps, 0.0) == [2.0, 4.0, 8.0]  # at the ladder's end: the finest
    assert br.pick_gains(steps, 1.0, n=1) == [2.0]
    assert br.pick_gains(steps, 1.0, n=2) == [2.0, 4.0]
    assert br.pick_gains(steps, -1.0) == [2.0, 4.0, 8.0]  # none fits: the finest
    # no metric: the output error decides (0.1 / g <= 5 % from g = 2)
    bare = [dataclasses.replace(s, loss_pp=None) for s in steps]
    assert br.pick_gains(bare, 1.0) == [2.0, 4.0, 8.0]
    assert br.pick_gains(bare[:3], 1.0) == [0.5, 1.0, 2.0]


def test_the_sweep_measures_rate_and_task_loss_of_the_untrained_coder(
        lenet: tuple[Path, Path, Path]) -> None:
    root, cal, data = lenet
    bundle, cand, x = _crossing(cal, data)
    cfg = bt.Config(lam=1e-8, latent=6, hidden=8, stride=1)
    gains = (0.05, 0.5, 2.0, 8.0, 64.0)
    steps = br.sweep(bundle, cand, x, br.numpy_coder(bt.initial_model(cfg, x)), gains, 48)
    assert [s.gain for s in steps] == list(gains)
    sizes = [s.bytes for s in steps]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1] / 3  # a coarser step, fewer bytes
    assert all(s.loss_pp is not None for s in steps)  # top-1, the calibration's metric
    assert steps[-1].loss_pp <= 2.5 and steps[-1].rel_l2 < steps[0].rel_l2
    assert steps[0].loss_pp > steps[-1].loss_pp
    ref = br.reference(bundle.candidate(CUT), 100.0)
    assert ref is not None and ref.bytes > 0 and ref.spec
    # a bundle never calibrated has no metric: the output error alone
    plain, pcand, _ = _crossing(root, data)
    bare = br.sweep(plain, pcand, x, br.numpy_coder(bt.initial_model(cfg, x)), (2.0,), 16)
    assert bare[0].loss_pp is None and br.reference(pcand, 1.0) is None


def test_a_resumed_run_reuses_the_sweep_it_wrote(lenet: tuple[Path, Path, Path],
                                                 tmp_path: Path) -> None:
    """``--resume`` reads the sweep back instead of running the tail again; other crossings,
    another coder or a damaged file are swept anew."""
    _root, cal, data = lenet
    bundle, cand, x = _crossing(cal, data)
    x = x[:24]
    cfg = bt.Config(lam=1e-8, latent=6, hidden=8, stride=1)
    made: list[int] = []

    def coder() -> object:
        made.append(1)
        return br.numpy_coder(bt.initial_model(cfg, x))

    path = tmp_path / "sweep.json"
    first = br.cached_sweep(path, False, bundle, cand, x, coder, cfg.key())
    assert len(made) == 1 and path.is_file()
    again = br.cached_sweep(path, True, bundle, cand, x, coder, cfg.key())
    assert len(made) == 1 and again == first  # read back, nothing swept
    br.cached_sweep(path, False, bundle, cand, x, coder, cfg.key())
    assert len(made) == 2  # without --resume: swept again
    br.cached_sweep(path, True, bundle, cand, x[:20], coder, cfg.key())
    assert len(made) == 3  # other training crossings
    br.cached_sweep(path, True, bundle, cand, x[:20], coder, "other")
    assert len(made) == 4  # another coder
    path.write_text('{"key": ')
    assert br.cached_sweep(path, True, bundle, cand, x[:20], coder, "other") == \
        br.cached_sweep(path, True, bundle, cand, x[:20], coder, "other")
    assert len(made) == 5  # the damaged file was swept again, and the rewrite then reused


def test_task_loss_judges_reconstructions_with_the_calibrated_metric(
        lenet: tuple[Path, Path, Path]) -> None:
    root, cal, data = lenet
    bundle, cand, x = _crossing(cal, data)
    x = x[:48]
    refs = br.answers(bundle, cand, x)
    assert refs is not None and len(refs) == len(x)
    assert br.task_loss(bundle, cand, refs, x.copy()) == pytest.approx(0.0)
    encode, decode = br.numpy_coder(bt.initial_model(bt.Config(lam=0.0, latent=6, hidden=8,
                                                               stride=1), x))(0.05)
    coarse = br.task_loss(bundle, cand, refs, decode(encode(x)))
    assert coarse is not None and coarse > 5.0  # one rounding step spans the whole range
    plain, pcand, _ = _crossing(root, data)
    assert br.answers(plain, pcand, x) is None  # never calibrated: no metric
    assert br.task_loss(plain, pcand, None, x) is None


def test_feature_space_training_needs_no_tail_and_lowers_its_objective(
        lenet: tuple[Path, Path, Path]) -> None:
    torch.set_num_threads(1)
    _, _, x = _crossing(*lenet[::2])
    cfg = bt.Config(lam=1e-6, latent=4, hidden=8, stride=1, steps=120, batch=8, gain=2.0,
                    space="features")
    run = bt.train_point(cfg, x, [], [], None)
    assert run.finished and len(run.history) == 120
    assert np.mean(run.history[-20:]) < 0.9 * np.mean(run.history[:20]), run.history[::20]


def test_tables_follow_the_rounded_latents() -> None:
    """The exported tables are the training latents' histograms (smoothed): a frame of common
    symbols costs less than the untrained prior would say."""
    x = np.random.default_rng(0).standard_normal((64, 2, 4, 4)).astype(np.float32)
    model = bt.initial_model(bt.Config(lam=0.0, latent=2, hidden=4, stride=1, gain=1.0), x)
    codes = bt.latents(model, x)
    priors = bt.priors_for(model, codes)
    got = float(priors.bits(codes).mean())
    ideal = 8 * (br.histogram_bytes(codes) - 4)
    assert ideal <= got <= 1.15 * ideal + 8, (got, ideal)


def _compress(lenet: tuple[Path, Path, Path], tmp_path: Path) -> tuple[Path, list[str]]:
    """A copy of the calibrated bundle and the compress arguments every test here shares."""
    _, cal, data = lenet
    root = tmp_path / "b"
    shutil.copytree(cal, root)
    return root, ["compress", str(root), "--data", str(data), "--test",
                  str(data.parent / "val.npz"), "--hidden", "8", "--batch", "8",
                  "--tolerance", "5"]


# time beyond the suite's 30 s a test: two compress runs, each sweeping 15 gains (2 min on 2
# shared cores)
@pytest.mark.timeout(420)
def test_compress_without_a_cut_sweeps_and_prints_its_rate_points(
        lenet: tuple[Path, Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    root, base = _compress(lenet, tmp_path)
    assert main([*base, "--cuts", "1", "--steps", "3", "--latent", "4",
                 "--work", str(tmp_path / "w")]) == 0
    got = capsys.readouterr()
    err = got.err
    assert f"{CUT}: rate points at gains " in err and "as swept before training" in err
    lines = got.out.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("lambda"))
    losses = [line for line in lines if " pp " in line and not line.startswith("bundle")]
    assert "task loss" in header and len(losses) == 3, got.out  # calibrated: each one's loss
    comps = Bundle.load(root).compressors(CUT)
    assert len(comps) == 3 and len({c.gamma for c in comps}) == 3
    assert "never calibrated" not in err
    # a bundle never calibrated: the points come from output error, and the user is told how
    # to choose them by the task instead
    bare = tmp_path / "bare"
    shutil.copytree(lenet[0], bare)
    assert main(["compress", str(bare), *base[2:], "--cuts", "1", "--steps", "1", "--latent",
                 "4", "--work", str(tmp_path / "w2")]) == 0
    err = capsys.readouterr().err
    assert "was never calibrated with a task metric" in err and "coinf calibrate" in err, err
    assert "output error" in err


def test_a_point_training_made_worse_falls_back_to_the_untrained_coder(
        lenet: tuple[Path, Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    root, base = _compress(lenet, tmp_path)
    cal, data = lenet[1:]
    args = [*base, "--cut", CUT, "--gain", "8", "--latent", "6", "--stride", "1",
            "--lambda", "1e-8"]
    # a learning rate of 1 wrecks the coder within a few steps
    assert main([*args, "--steps", "6", "--lr", "1", "--work", str(tmp_path / "w1")]) == 0
    got = capsys.readouterr()
    assert "the untrained coder is kept" in got.err, got.err
    wrecked = Bundle.load(root).compressors(CUT)[0]
    bundle, cand, x = _crossing(cal, data)
    start = br.sweep(bundle, cand, x, br.numpy_coder(bt.initial_model(bt.Config(
        lam=1e-8, latent=6, hidden=8, stride=1, gain=8.0), x)), (8.0,))[0]
    assert start.loss_pp is not None and start.loss_pp <= 5.0  # the untrained coder is fine
    assert wrecked.accuracy["raw"] >= 0.9  # and that is what was exported and measured


def test_worse_means_dominated_by_the_untrained_coder() -> None:
    ladder = [br.Step(4.0, 1000.0, 0.2, 3.0), br.Step(8.0, 2000.0, 0.1, 1.0)]
    assert not br.worse(br.Step(8.0, 1500.0, 0.15, 2.0), ladder)  # between: a trade
    assert not br.worse(br.Step(8.0, 800.0, 0.3, 5.0), ladder)  # fewer bytes, more loss
    assert br.worse(br.Step(8.0, 2100.0, 0.1, 1.0), ladder)  # same loss, more bytes
    assert br.worse(br.Step(8.0, 1900.0, 0.1, 3.5), ladder)  # the swift-f0 wreck's shape
    assert not br.worse(br.Step(8.0, 2000.0, 0.1, 1.0), ladder)  # a tie is kept
    assert br.worse(br.Step(8.0, float("nan"), 0.1, 1.0), ladder)
    assert br.worse(br.Step(8.0, 1500.0, 0.1, float("nan")), ladder)
    # without a metric the output error decides
    bare = [dataclasses.replace(s, loss_pp=None) for s in ladder]
    assert br.worse(br.Step(8.0, 2100.0, 0.12, None), bare)
    assert not br.worse(br.Step(8.0, 2100.0, 0.05, None), bare)


def test_the_matched_lambda_is_the_quantisers_slope_and_holds_the_rate(
        lenet: tuple[Path, Path, Path]) -> None:
    torch.set_num_threads(1)
    _, _, x = _crossing(*lenet[::2])
    cfg = bt.Config(lam=0.0, latent=6, hidden=8, stride=1, steps=150, batch=8, gain=2.0,
                    space="features")
    model = bt.initial_model(cfg, x)
    fine, finer = br.matched_lambda(model, x, 16.0), br.matched_lambda(model, x, 64.0)
    # a fine uniform step: the error per value is step^2 / 12, a fourth of the step 16x less
    assert 10 < fine / finer < 22, (fine, finer)
    lam = br.matched_lambda(model, x, cfg.gain)
    assert lam > fine > 0
    std = x.std((0, 2, 3), keepdims=True) + 1e-3

    def rate_and_error(m: object) -> tuple[float, float]:
        codes = bt.latents(m, x)
        back = m.decode(torch.from_numpy(codes)).detach().numpy()  # type: ignore[attr-defined]
        return br.histogram_bytes(codes), float(np.mean(((back - x) / std) ** 2))

    start = rate_and_error(model)
    free = rate_and_error(bt.train_point(cfg, x, [], [], None).model)
    held = rate_and_error(bt.train_point(dataclasses.replace(cfg, lam=lam), x, [], [],
                                         None).model)
    # with the rate free, training buys fidelity with bytes; at the matched lambda it gets
    # both fewer bytes and less error than the untrained coder it started from
    assert free[0] > start[0] and free[1] < start[1], (start, free)
    assert held[0] < start[0] and held[1] < start[1], (start, held)


def test_the_learning_rate_warms_up_then_anneals_over_the_planned_steps() -> None:
    lr = [bt.learning_rate(1e-3, k, 100) for k in range(100)]
    assert lr[0] == pytest.approx(4e-5) and max(lr) == pytest.approx(1e-3, rel=1e-6)
    assert lr.index(max(lr)) == 5 and lr[-1] < 1e-5  # 5 % warm-up; near 0 at the end
    assert all(a >= b for a, b in itertools.pairwise(lr[5:]))
    # a schedule fitted to fewer steps ends as low, sooner
    assert bt.learning_rate(1e-3, 19, 20) < 1e-5 < bt.learning_rate(1e-3, 19, 100)
