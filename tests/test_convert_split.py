"""Composition and cut invariants on hand-built and hypothesis-generated graphs."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from coinf.convert.graph import load_graph
from coinf.convert.split import split_model
from coinf.convert.verify import VerifyError, verify_bundle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coinf.bundle import Bundle
from tests import convert_graphs as cg


def check_invariants(bundle: Bundle) -> None:
    """Extremes, ids, downward-closed heads, crossing sets as defined, no constant crossing."""
    g = load_graph(bundle.model_path)
    by_name = {n.name: n for n in g.nodes}
    cands = bundle.candidates
    assert cands[0].is_handheld_only and cands[0].label == "handheld-only"
    assert cands[-1].is_wearable_only and cands[-1].label == "wearable-only"
    assert len({c.label for c in cands}) == len(cands), "labels must be unique"
    assert [c.id for c in cands] == [f"c{k:03d}" for k in range(len(cands))]
    assert [c.head.flops for c in cands] == sorted(c.head.flops for c in cands)
    dyn_names = {n.name for n in g.nodes if n.dynamic}
    assert set(cands[-1].head.nodes) == dyn_names and not cands[0].head.nodes
    assert [t.name for t in cands[-1].crossing] == g.outputs
    heads = set()
    for c in cands:
        head = set(c.head.nodes)
        assert head | set(c.tail.nodes) == dyn_names and not head & set(c.tail.nodes)
        heads.add(frozenset(head))
        for name in head:  # downward closed over dynamic producers
            for t in by_name[name].inputs:
                p = g.producer.get(t)
                if p is not None and g.nodes[p].dynamic:
                    assert g.nodes[p].name in head, f"{c.id}: {name} needs {g.nodes[p].name}"
        if c.is_wearable_only:
            continue
        need = set(g.outputs)
        for n in g.nodes:
            if n.dynamic and n.name not in head:
                need.update(n.inputs)
        avail = set(g.inputs) | {o for n in g.nodes if n.name in head for o in n.outputs}
        expect = need & avail & g.dynamic_tensors
        got = {t.name for t in c.crossing}
        assert got == expect, c.id
        assert got <= g.dynamic_tensors, f"{c.id} transfers a constant tensor"
    assert len(heads) == len(cands), "duplicate cuts"


def split_and_check(m: onnx.ModelProto, tmp: Path, **kw) -> Bundle:  # type: ignore[no-untyped-def]
    path = tmp / "m.onnx"
    onnx.save(m, str(path))
    bundle = split_model(path, tmp / "b", **kw)
    check_invariants(bundle)
    assert verify_bundle(bundle) == []
    return bundle


def test_diamond_composes_for_every_candidate(tmp_path: Path) -> None:
    bundle = split_and_check(cg.diamond(), tmp_path, verify=True)
    g = load_graph(tmp_path / "m.onnx")
    # exporter constants never cross: only x/z or dynamic tensors do
    assert all(t.name not in ("k", "w2", "shape24", "ms") for c in bundle.candidates
               for t in c.crossing)
    assert "Shape_9" in g.folded  # the unnamed Shape got a stable name and was folded
    assert bundle.meta["verified"]["ok"]
    # multi-tensor cuts exist (inside the diamond) as well as single-tensor ones
    counts = {len(c.crossing) for c in bundle.candidates[1:-1]}
    assert min(counts) == 2 and max(counts) >= 3  # z joins late: no single-tensor cut
    # graph output y2 computed in the head travels and is passed through by the tail
    assert any("y2" in {t.name for t in c.crossing} for c in bundle.candidates[1:-1])


def test_late_input_crosses_raw(tmp_path: Path) -> None:
    bundle = split_and_check(cg.diamond(), tmp_path)
    c = next(c for c in bundle.candidates[1:-1] if c.head.nodes == ("mm",))
    assert {t.name for t in c.crossing} == {"a", "z"}


def test_verify_catches_a_broken_tail(tmp_path: Path) -> None:
    onnx.save(cg.diamond(), str(tmp_path / "m.onnx"))
    bundle = split_model(tmp_path / "m.onnx", tmp_path / "b")
    victim = bundle.candidates[2]
    assert victim.tail.file is not None
    tail = onnx.load(str(bundle.path(victim.tail.file)))
    for node in tail.graph.node:
        if node.op_type == "Tanh":
            node.op_type = "Sigmoid"
    onnx.save(tail, str(bundle.path(victim.tail.file)))
    failures = verify_bundle(bundle)
    assert failures and all(f.startswith(victim.id) for f in failures)
    message = str(VerifyError(failures))
    assert message.startswith("verification failed for 1 candidate(s)") and victim.id in message


def test_max_candidates_caps_and_keeps_extremes(tmp_path: Path) -> None:
    onnx.save(cg.chain_blocks(30), str(tmp_path / "m.onnx"))
    for k in (2, 5, 17):
        bundle = split_model(tmp_path / "m.onnx", tmp_path / f"b{k}", max_candidates=k)
        assert len(bundle.candidates) == k
        check_invariants(bundle)
    big = split_model(tmp_path / "m.onnx", tmp_path / "big", max_candidates=64)
    reasons = {c.extra["selected_as"] for c in big.candidates}
    assert {"single-tensor", "in-block"} <= reasons


dag_spec = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 50), st.integers(0, 50)),
                    min_size=1, max_size=14)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=dag_spec, n_inputs=st.integers(1, 2), out_mask=st.integers(0, 2**14 - 1),
       cap=st.sampled_from([3, 8, 64]))
def test_random_dags_compose(spec, n_inputs, out_mask, cap) -> None:  # type: ignore[no-untyped-def]
    m = cg.random_dag(spec, n_inputs, out_mask)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.onnx"
        onnx.save(m, str(path))
        bundle = split_model(path, Path(d) / "b", max_candidates=cap)
        check_invariants(bundle)
        assert len(bundle.candidates) <= cap
        assert verify_bundle(bundle, seed=len(spec)) == []


def test_crossing_tensors_match_whole_model(tmp_path: Path) -> None:
    """Independent of verify.py: run each head and compare with the whole model's tensors."""
    import onnxruntime as ort

    bundle = split_and_check(cg.diamond(), tmp_path)
    whole = onnx.load(str(bundle.model_path))
    names = sorted({t.name for c in bundle.candidates for t in c.crossing} - {"x", "z"})
    have = {o.name for o in whole.graph.output}
    whole.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in have)
    rng = np.random.default_rng(5)
    feed = {"x": rng.standard_normal((1, 8)).astype(np.float32),
            "z": rng.standard_normal((1, 8)).astype(np.float32)}
    sess = ort.InferenceSession(whole.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed), strict=True))
    ref.update(feed)
    for c in bundle.candidates[1:]:
        head = ort.InferenceSession(str(bundle.path(c.head.file)),
                                    providers=["CPUExecutionProvider"])
        hin = {i.name: feed[i.name] for i in head.get_inputs()}
        for spec, got in zip(c.crossing, head.run([t.name for t in c.crossing], hin), strict=True):
            np.testing.assert_allclose(got, ref[spec.name], rtol=1e-5, atol=1e-6)
            assert got.nbytes == spec.nbytes and tuple(got.shape) == spec.shape


@pytest.mark.parametrize("opset", [9, 13])
def test_low_opsets(tmp_path: Path, opset: int) -> None:
    m = cg.chain_blocks(3)
    m.opset_import[0].version = opset
    split_and_check(m, tmp_path)


def test_constant_graph_outputs(tmp_path: Path) -> None:
    """Outputs independent of the input are recomputed by every tail, never sent."""
    bundle = split_and_check(cg.constant_outputs(), tmp_path, verify=True)
    for c in bundle.candidates[:-1]:
        assert not {"filled", "table"} & {t.name for t in c.crossing}
    assert [t.name for t in bundle.candidates[-1].crossing] == ["y", "filled", "table"]


def _interrupt_third_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    import coinf.convert.split as split_mod

    real = split_mod.build_slice
    calls = []

    def flaky(*args, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(split_mod, "build_slice", flaky)


def test_interrupted_split_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    onnx.save(cg.diamond(), str(tmp_path / "m.onnx"))
    _interrupt_third_slice(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        split_model(tmp_path / "m.onnx", tmp_path / "b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # no b, no .b.tmp-*


def test_interrupted_resplit_keeps_the_old_bundle(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    onnx.save(cg.diamond(), str(tmp_path / "m.onnx"))
    old = split_model(tmp_path / "m.onnx", tmp_path / "b", max_candidates=4)
    _interrupt_third_slice(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        split_model(tmp_path / "m.onnx", tmp_path / "b", force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "m.onnx"]
    assert len(Bundle.load(tmp_path / "b").candidates) == len(old.candidates) == 4


def test_existing_bundle_needs_force(tmp_path: Path) -> None:
    from coinf.errors import BundleError

    onnx.save(cg.diamond(), str(tmp_path / "m.onnx"))
    split_model(tmp_path / "m.onnx", tmp_path / "b", max_candidates=4)
    with pytest.raises(BundleError, match="already exists"):
        split_model(tmp_path / "m.onnx", tmp_path / "b")
    (tmp_path / "empty").mkdir()  # an empty folder is fine
    assert len(split_model(tmp_path / "m.onnx", tmp_path / "empty").candidates) > 4


def test_forced_resplit_keeps_the_users_files(tmp_path: Path) -> None:
    onnx.save(cg.diamond(), str(tmp_path / "m.onnx"))
    split_model(tmp_path / "m.onnx", tmp_path / "b", shared_weights=True)
    (tmp_path / "b" / "notes.txt").write_text("mine")
    split_model(tmp_path / "m.onnx", tmp_path / "b", shared_weights=False, force=True)
    assert (tmp_path / "b" / "notes.txt").read_text() == "mine"
    assert not list((tmp_path / "b").glob("*.head.onnx"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "m.onnx"]
