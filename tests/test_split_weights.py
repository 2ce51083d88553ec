"""Splitting models with large weights (issue 17): one shared ``weights.bin``, no weight byte
duplicated, slices that load and verify, relocatable bundles, identity, hostile locations."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from coinf.convert import split as split_mod
from coinf.convert.split import split_model
from coinf.convert.verify import verify_bundle
from coinf.convert.weights import WEIGHTS_FILE
from onnx import TensorProto, helper, numpy_helper

from coinf.bundle import Bundle, check_locations, open_slice
from coinf.errors import BundleError

WIDTHS = (256, 1024, 512, 10)  # three dense layers: ~3.1 MB of float32 weights


def mlp(path: Path, seed: int = 0) -> int:
    """An MLP with large initializers; returns their total bytes."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    for i, (a, b) in enumerate(itertools.pairwise(WIDTHS)):
        w = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
        # the last bias is inline (< 1 kB): the same for every seed, so that only weights.bin
        # differs between seeds
        bias = (rng.standard_normal(b) if b > 10 else np.arange(b) / 10).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(bias, f"b{i}")]
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [f"g{i}"], name=f"fc{i}"))
        prev = f"g{i}"
        if i < len(WIDTHS) - 2:
            nodes.append(helper.make_node("Relu", [prev], [f"r{i}"], name=f"relu{i}"))
            prev = f"r{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"], name="out"))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", 1, [1, 256])],
                              [helper.make_tensor_value_info("y", 1, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return sum(len(t.raw_data) for t in model.graph.initializer)


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> tuple[Bundle, int, Path]:
    tmp = tmp_path_factory.mktemp("big")
    weight_bytes = mlp(tmp / "mlp.onnx")
    with pytest.MonkeyPatch.context() as mp:  # auto mode, with a threshold this model passes
        mp.setattr(split_mod, "SHARED_AUTO_BYTES", 1 << 20)
        bundle = split_model(tmp / "mlp.onnx", tmp / "b", verify=True)
    return bundle, weight_bytes, tmp


def test_slices_share_one_weights_file_without_copies(split: tuple[Bundle, int, Path]) -> None:
    bundle, weight_bytes, _ = split
    weights = bundle.root / WEIGHTS_FILE
    assert bundle.meta["weights"]["file"] == WEIGHTS_FILE
    assert len(bundle.candidates) >= 4  # so self-contained slices would copy the weights often
    # every weight byte once: the file is the weights plus at most 63 B of alignment each
    n = bundle.meta["weights"]["tensors"]
    assert n == 5  # the last bias (10 floats) is under 1 kB and stays inline
    shared = weight_bytes - 40
    source = (bundle.root.parent / "mlp.onnx").stat().st_size
    assert shared <= weights.stat().st_size <= source + 64 * n
    # and nothing else in the bundle holds weights: all .onnx files together are tiny
    onnx_bytes = sum(p.stat().st_size for p in bundle.root.glob("*.onnx"))
    assert onnx_bytes < 0.02 * weight_bytes, onnx_bytes
    total = sum(p.stat().st_size for p in bundle.root.rglob("*") if p.is_file())
    assert total < 1.05 * weight_bytes
    for cand in bundle.candidates:
        for part in (cand.head, cand.tail):
            if part.file is None:
                continue
            model = onnx.load(str(bundle.path(part.file)), load_external_data=False)
            for t in model.graph.initializer:
                if t.data_location == TensorProto.EXTERNAL:
                    entry = {e.key: e.value for e in t.external_data}
                    assert entry["location"] == WEIGHTS_FILE  # relative: relocatable
                    assert int(entry["offset"]) + int(entry["length"]) <= weights.stat().st_size


def test_verified_and_runs_from_a_copy_elsewhere(split: tuple[Bundle, int, Path]) -> None:
    bundle, _, tmp = split
    assert bundle.meta["verified"]["ok"] is True
    moved = tmp / "elsewhere" / "copy"
    shutil.copytree(bundle.root, moved)  # e.g. scp to the Pi
    renamed = tmp / "b-renamed"
    bundle.root.rename(renamed)  # the original folder is gone: nothing points back at it
    try:
        copy = Bundle.load(moved)
        assert copy.identity == bundle.identity
        assert verify_bundle(copy) == []
        feed = {"x": np.random.default_rng(1).standard_normal((1, 256)).astype(np.float32)}
        whole = open_slice(copy.model_path).run(None, feed)[0]
        cand = copy.candidates[len(copy.candidates) // 2]
        assert cand.head.file and cand.tail.file
        head = open_slice(copy.path(cand.head.file))
        crossing = dict(zip([o.name for o in head.get_outputs()], head.run(None, feed),
                            strict=True))
        tail = open_slice(copy.path(cand.tail.file))
        out = tail.run(None, {i.name: crossing[i.name] for i in tail.get_inputs()})[0]
        np.testing.assert_allclose(out, whole, rtol=1e-5, atol=1e-5)
    finally:
        renamed.rename(bundle.root)


def test_identity_covers_the_shared_weights(split: tuple[Bundle, int, Path]) -> None:
    """Same architecture, other weights: model.onnx is the same pointer file, the identity is
    not."""
    bundle, _, tmp = split
    mlp(tmp / "other.onnx", seed=1)
    other = split_model(tmp / "other.onnx", tmp / "b-other", shared_weights=True)
    assert other.model_sha256 == bundle.model_sha256
    assert other.meta["weights"]["sha256"] != bundle.meta["weights"]["sha256"]
    assert other.identity != bundle.identity


def test_small_models_stay_self_contained(tmp_path: Path) -> None:
    mlp(tmp_path / "m.onnx")
    bundle = split_model(tmp_path / "m.onnx", tmp_path / "b", shared_weights=False)
    assert not (bundle.root / WEIGHTS_FILE).exists() and "weights" not in bundle.meta
    for cand in bundle.candidates:
        if cand.head.file:
            model = onnx.load(str(bundle.path(cand.head.file)), load_external_data=False)
            assert all(t.data_location != TensorProto.EXTERNAL for t in model.graph.initializer)
    assert verify_bundle(bundle) == []


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/hostname", "sub/../../x.bin"])
def test_slices_naming_weights_outside_the_bundle_are_refused(
        split: tuple[Bundle, int, Path], tmp_path: Path, location: str) -> None:
    bundle, _, _ = split
    evil = tmp_path / "b"
    shutil.copytree(bundle.root, evil)
    cand = next(c for c in bundle.candidates if c.head.file)
    assert cand.head.file is not None
    path = evil / cand.head.file
    model = onnx.load(str(path), load_external_data=False)
    t = next(t for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL)
    for e in t.external_data:
        if e.key == "location":
            e.value = location
    path.write_bytes(model.SerializeToString())
    with pytest.raises(BundleError, match="outside the bundle"):
        check_locations(model, path)
    with pytest.raises(BundleError, match="outside the bundle"):
        open_slice(path)
    assert any("outside the bundle" in f for f in verify_bundle(Bundle.load(evil)))


def test_bench_split_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``coinf bench split``: each job in a child process, figures consistent with each other."""
    import json

    from coinf.cli import main

    mlp(tmp_path / "m.onnx")
    assert main(["bench", "split", str(tmp_path / "m.onnx"), "--json", "--repeats", "1",
                 "--tmp", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model_bytes"] == (tmp_path / "m.onnx").stat().st_size
    assert out["nodes"] == 6 and out["candidates"] >= 4
    assert out["ratio"] == pytest.approx(out["split_s"] / out["load_s"], rel=0.02, abs=0.01)
    assert out["rss_ratio"] == pytest.approx(out["peak_rss_bytes"] / out["model_bytes"],
                                             rel=0.01)
    # a child's peak is its own (not the parent's): at least its imports, far below pytest's
    assert 0 < out["child_baseline_rss_bytes"] <= out["peak_rss_bytes"]
    assert main(["bench", "split", str(tmp_path / "missing.onnx"), "--json"]) == 2
    assert "no such model file" in capsys.readouterr().err


def test_weights_in_typed_fields_take_the_parsing_path(tmp_path: Path) -> None:
    """``float_data`` instead of ``raw_data``: the wire-format fast path steps aside, the model
    is parsed and each large initializer is written once, 64-byte aligned."""
    from coinf.convert.weights import light_from_file

    mlp(tmp_path / "raw.onnx")
    model = onnx.load(str(tmp_path / "raw.onnx"))
    for t in model.graph.initializer:
        arr = numpy_helper.to_array(t)
        t.ClearField("raw_data")
        t.float_data.extend(arr.reshape(-1).tolist())
    onnx.save(model, str(tmp_path / "typed.onnx"))
    assert light_from_file(tmp_path / "typed.onnx", tmp_path / "w.bin") is None
    assert light_from_file(tmp_path / "raw.onnx", tmp_path / "w.bin") is not None
    bundle = split_model(tmp_path / "typed.onnx", tmp_path / "b", shared_weights=True,
                         verify=True)
    assert bundle.meta["verified"]["ok"] is True
    shared = sum(len(numpy_helper.to_array(t).tobytes()) for t in model.graph.initializer
                 if t.name != "b2")
    size = (bundle.root / WEIGHTS_FILE).stat().st_size
    assert shared <= size < shared + 64 * 5
