"""`coinf split` end to end: summary, listing, bad input, determinism, a 2000-node graph."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from coinf.convert.cost import all_costs
from coinf.convert.cuts import enumerate_cuts
from coinf.convert.graph import load_graph

from coinf.cli import main
from tests import convert_graphs as cg


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    rc = main(args)
    out, err = capsys.readouterr()
    return rc, out, err


def test_split_summary_and_list(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    onnx.save(cg.diamond(), str(tmp_path / "m.onnx"))
    rc, out, err = run_cli(["split", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "b"),
                            "--verify", "--max-candidates", "6"], capsys)
    assert rc == 0, err
    assert "c000" in out and "c005" in out and "c006" not in out and "candidates   6" in out
    assert "slice: 6/6" in err  # plain progress lines when stderr is not a tty
    rc, out, _ = run_cli(["split", "--list", str(tmp_path / "b")], capsys)
    assert rc == 0 and "wearable-only" in out and "handheld-only" in out
    rc, out, _ = run_cli(["split", "--list", str(tmp_path / "b"), "--show", "c002"], capsys)
    assert rc == 0 and '"id": "c002"' in out
    # re-splitting into an existing bundle directory is refused (one line, exit 2) ...
    before = sorted(p.name for p in (tmp_path / "b").iterdir())
    rc, _, err = run_cli(["split", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "b")], capsys)
    assert rc == 2 and "already exists" in err and "--force" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == before
    # ... and replaces it with --force, leaving no temporary folder behind
    rc, out, err = run_cli(["split", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "b"),
                            "--force", "--max-candidates", "4"], capsys)
    assert rc == 0, err
    assert "candidates   4" in out and not (tmp_path / "b" / "c004").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "m.onnx"]


def _bad_inputs(tmp: Path) -> dict[str, tuple[list[str], str]]:
    (tmp / "text.onnx").write_text("this is not a model\n")
    broken = cg.diamond()
    broken.graph.node[3].input[0] = "nowhere"  # uses an undefined tensor
    onnx.save(broken, str(tmp / "broken.onnx"))
    onnx.save(cg.custom_op(), str(tmp / "custom.onnx"))
    onnx.save(cg.diamond(), str(tmp / "ok.onnx"))
    (tmp / "full").mkdir()
    (tmp / "full" / "notes.txt").write_text("mine")
    main(["split", str(tmp / "ok.onnx"), "-o", str(tmp / "b")])
    return {
        "not onnx": (["split", str(tmp / "text.onnx"), "-o", str(tmp / "o1")],
                     "not a readable ONNX model"),
        "missing": (["split", str(tmp / "nope.onnx"), "-o", str(tmp / "o2")], "no such model"),
        "checker": (["split", str(tmp / "broken.onnx"), "-o", str(tmp / "o3")],
                    "fails the ONNX checker"),
        "shapes": (["split", str(tmp / "custom.onnx"), "-o", str(tmp / "o4")],
                   "cannot resolve the shape of tensor 'm'"),
        "unknown id": (["split", "--list", str(tmp / "b"), "--show", "c999"],
                       "unknown candidate id 'c999'"),
        "non-empty dir": (["split", str(tmp / "ok.onnx"), "-o", str(tmp / "full")],
                          "is not empty and holds no bundle"),
        "bad dim": (["split", str(tmp / "ok.onnx"), "-o", str(tmp / "o5"), "--dim", "batch"],
                    "expected NAME=VALUE"),
        "unknown dim": (["split", str(tmp / "ok.onnx"), "-o", str(tmp / "o6"), "--dim", "b=2"],
                        "unknown dim name(s) b"),
        "cap": (["split", str(tmp / "ok.onnx"), "-o", str(tmp / "o7"), "--max-candidates", "1"],
                "--max-candidates must be >= 2"),
        "not a bundle": (["split", "--list", str(tmp / "full")], "has no manifest.json"),
    }


def test_bad_input_one_line_exit_2(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    cases = _bad_inputs(tmp_path)
    capsys.readouterr()
    for what, (args, needle) in cases.items():
        rc, _, err = run_cli(args, capsys)
        lines = [ln for ln in err.splitlines() if ln.startswith("coinf split: error:")]
        assert rc == 2, what
        assert len(lines) == 1 and needle in lines[0], (what, err)
        assert "Traceback" not in err, what
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == ["notes.txt"]


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_deterministic_bundles(tmp_path: Path) -> None:
    from coinf.convert.split import split_model

    onnx.save(cg.with_if(), str(tmp_path / "a.onnx"))
    onnx.save(cg.with_if(), str(tmp_path / "b.onnx"))
    b1 = split_model(tmp_path / "a.onnx", tmp_path / "one")
    b2 = split_model(tmp_path / "b.onnx", tmp_path / "two")
    t1, t2 = _tree(tmp_path / "one"), _tree(tmp_path / "two")
    assert t1.keys() == t2.keys() and len(t1) > 3
    t1.pop("manifest.json"), t2.pop("manifest.json")
    assert t1 == t2
    m1, m2 = b1.to_json(), b2.to_json()
    m1["source"]["file"] = m2["source"]["file"]  # the only intended difference
    assert m1 == m2 and b1.identity == b2.identity


def test_2000_node_graph_enumeration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Speed sanity without a clock: on a 2000-node DAG, enumeration walks each of its three
    orders once (incremental prefixes, O(edges) each) and computes a crossing set from scratch
    only for the cuts it keeps, never for every prefix."""
    from coinf.convert import cuts as cuts_mod

    walks: list[int] = []  # pool size after each walk
    crossings = [0]
    walk, crossing = cuts_mod._Dag.walk, cuts_mod._Dag.crossing

    def counted_walk(self, order, oid, pool):  # type: ignore[no-untyped-def]
        walk(self, order, oid, pool)
        walks.append(len(pool))

    def counted_crossing(self, head):  # type: ignore[no-untyped-def]
        crossings[0] += 1
        return crossing(self, head)

    monkeypatch.setattr(cuts_mod._Dag, "walk", counted_walk)
    monkeypatch.setattr(cuts_mod._Dag, "crossing", counted_crossing)
    path = tmp_path / "big.onnx"
    onnx.save(cg.chain_blocks(286, width=4), str(path))  # 286 * 7 + 1 = 2003 nodes
    g = load_graph(path)
    costs = all_costs(g)
    cuts = enumerate_cuts(g, costs, 64)
    assert len(walks) == 3 and crossings[0] == len(cuts) - 1  # the last is the graph's outputs
    wide = enumerate_cuts(g, costs, 1000)
    assert len(walks) == 6 and crossings[0] == len(cuts) - 1 + len(wide) - 1
    assert walks[2] == walks[5] <= 3 * len(g.nodes)  # deduplicated heads, at most one per prefix
    assert len(g.nodes) == 2003 and len(cuts) == 64 and len(wide) == 1000
    # 286 single-tensor cuts compete for 62 slots: in-block cuts keep a quarter of them
    reasons = [c.reason for c in cuts]
    assert reasons.count("single-tensor") == 62 - 15 and reasons.count("in-block") == 15
    assert all(len(c.crossing) == (2 if r == "in-block" else 1) for c, r in
               zip(cuts[1:-1], reasons[1:-1], strict=True))
    assert sum(1 for c in wide if len(c.crossing) > 1) > 500


def test_shared_weights_bundle(tmp_path: Path) -> None:
    import numpy as np
    from coinf.convert.split import split_model

    m = cg.chain_blocks(3)
    w = np.arange(64 * 4, dtype=np.float32).reshape(4, 64) / 100  # 1 kB: goes to weights.bin
    m.graph.initializer.append(onnx.numpy_helper.from_array(w, "wide"))
    m.graph.node.append(onnx.helper.make_node("MatMul", ["y", "wide"], ["y2"], name="proj"))
    m.graph.output.append(onnx.helper.make_tensor_value_info("y2", onnx.TensorProto.FLOAT, [1, 64]))
    onnx.save(m, str(tmp_path / "m.onnx"))
    plain = split_model(tmp_path / "m.onnx", tmp_path / "plain")  # auto: small, not shared
    assert "weights" not in plain.meta
    shared = split_model(tmp_path / "m.onnx", tmp_path / "shared", shared_weights=True,
                         verify=True)
    assert shared.meta["verified"]["ok"] and shared.meta["weights"]["tensors"] == 1
    # the weights once: weights.bin is a copy of the model file, which holds them (issue 17)
    assert w.nbytes <= (tmp_path / "shared" / "weights.bin").stat().st_size \
        <= (tmp_path / "m.onnx").stat().st_size
    assert shared.candidates[1].head.file == "c001.head.onnx"
    size = {d: sum(p.stat().st_size for p in (tmp_path / d).rglob("*") if p.is_file())
            for d in ("plain", "shared")}
    assert size["shared"] < size["plain"] - len(plain.candidates) * w.nbytes // 2
    (tmp_path / "shared" / "weights.bin").rename(tmp_path / "w.bin")
    rc = main(["split", "--list", str(tmp_path / "shared")])
    assert rc == 2  # "shared weights file weights.bin is missing"
    # re-splitting the shared bundle without sharing leaves no stale flat files behind
    split_model(tmp_path / "m.onnx", tmp_path / "shared", shared_weights=False, force=True)
    assert not list((tmp_path / "shared").glob("*.head.onnx"))
    assert not (tmp_path / "shared" / "weights.bin").exists()
