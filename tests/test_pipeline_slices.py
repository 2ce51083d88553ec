"""Slices between two cuts (convert.stage_slices): built from the bundle's model, verified,
cached; a chain of them composes to the whole model."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from coinf.convert.split import split_model
from coinf.convert.stage_slices import StageSlices, nested, parse_slice_name, slice_name

from coinf.errors import BundleError

LENET = Path(__file__).resolve().parents[1] / "models" / "onnx" / "lenet_digits.onnx"


def run(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    values = sess.run(names, {i.name: feeds[i.name] for i in sess.get_inputs()})
    return dict(zip(names, values, strict=True))


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory):
    return split_model(LENET, tmp_path_factory.mktemp("pipe") / "lenet")


def test_chain_of_slices_equals_the_whole_model(bundle) -> None:
    slices = StageSlices(bundle)
    ids = [c.id for c in bundle.candidates]
    x = np.random.default_rng(1).standard_normal(bundle.inputs[0].shape).astype(np.float32)
    feeds = {bundle.inputs[0].name: x}
    whole = run(bundle.model_path, feeds)
    for chain in ([ids[0], ids[2], ids[4], ids[-1]], [ids[1], ids[3], ids[6], ids[-1]]):
        values = dict(feeds)
        if chain[0] != ids[0]:
            values.update(run(slices.path(ids[0], chain[0]), values))
        for a, b in itertools.pairwise(chain):
            values.update(run(slices.path(a, b), values))
        for t in bundle.outputs:
            np.testing.assert_allclose(values[t.name], whole[t.name], rtol=1e-5, atol=1e-5)
    middle = slices.path(ids[2], ids[4])
    assert middle.parent.name == bundle.identity and middle.is_file()
    assert slices.path(ids[0], ids[3]) == bundle.path(bundle.candidate(ids[3]).head.file)
    assert slices.path(ids[3], ids[-1]) == bundle.path(bundle.candidate(ids[3]).tail.file)


def test_bad_slices_are_refused(bundle) -> None:
    slices = StageSlices(bundle)
    a, b = bundle.candidates[4].id, bundle.candidates[2].id
    assert nested(bundle.candidates[2], bundle.candidates[4])
    with pytest.raises(BundleError, match="not before"):
        slices.path(a, b)
    with pytest.raises(BundleError, match="empty"):
        slices.path(a, a)
    with pytest.raises(BundleError, match="unknown candidate"):
        slices.path("c999", a)
    assert parse_slice_name(slice_name("c001", "c004")) == ("c001", "c004")
    with pytest.raises(BundleError, match="FROM"):
        parse_slice_name("c001")


def test_a_middle_slice_that_does_not_compose_is_not_cached(bundle, tmp_path, monkeypatch) -> None:
    import coinf.convert.stage_slices as mod

    real = mod.build_slice

    def broken(g, nodes, inputs, outputs, name):  # drop the middle's last node
        return real(g, list(nodes)[:-1], inputs, outputs, name)

    monkeypatch.setattr(mod, "build_slice", broken)
    slices = StageSlices(bundle, cache_dir=tmp_path)
    ids = [c.id for c in bundle.candidates]
    with pytest.raises(BundleError):
        slices.path(ids[1], ids[4])
    assert not list(tmp_path.rglob("*.onnx"))
