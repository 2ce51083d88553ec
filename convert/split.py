"""Make a split bundle: load + analyse, enumerate cuts, slice, write, optionally verify."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx
from coinf.convert.cost import NodeCost, all_costs
from coinf.convert.cuts import DEFAULT_MAX_CANDIDATES, Cut, enumerate_cuts
from coinf.convert.graph import Graph
from coinf.convert.realmodel import Preparation
from coinf.convert.slicer import build_slice, param_bytes
from coinf.convert.verify import ATOL, RTOL, VerifyError, verify_bundle
from coinf.convert.weights import MIN_BYTES, WEIGHTS_FILE, internalize, shared_tensors
from onnx import ModelProto

from coinf import __version__
from coinf.bundle import MANIFEST, Bundle, Candidate, Part, TensorSpec, sha256_file
from coinf.errors import BundleError

Progress = Callable[[str, int, int], None]
MODEL_FILE = "model.onnx"
EXTERNAL_THRESHOLD = 1_800_000_000  # bytes; above this a file's weights go to FILE.data
SHARED_MIN_BYTES = MIN_BYTES  # smaller initializers stay inside the slices (WEIGHTS_FILE too)
# auto mode shares weights when self-contained slices would hold more than this in all: 16 MB
# (K candidates x the weights). 256 MB let a 3.4 MB MobileNetV2 make a 214 MB bundle (issue 18).
SHARED_AUTO_BYTES = 16 * 1024 * 1024
_CAND_DIR = re.compile(r"^c\d{3,}$")
_CAND_FILE = re.compile(r"^c\d{3,}\.(head|tail)\.onnx$")


def spec(g: Graph, name: str) -> TensorSpec:
    t = g.ttype(name)
    return TensorSpec(name, t.shape, t.dtype.name, t.nbytes)


def save_model(model: ModelProto, path: Path) -> None:
    """Write a model self-contained, or with one external ``.data`` file when huge."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if model.ByteSize() > EXTERNAL_THRESHOLD:
        onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=path.name + ".data", size_threshold=1024)
    else:
        path.write_bytes(model.SerializeToString())


def check_out_dir(out: Path, force: bool) -> None:
    """Refuse an ``out`` that :func:`split_model` must not replace.

    A missing path or an empty directory is fine; an existing bundle only with ``force``; anything
    else (a file, a directory holding other things) never.
    """
    if out.exists() and not out.is_dir():
        raise BundleError(f"output {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not (out / MANIFEST).is_file():
            raise BundleError(f"output directory {out} is not empty and holds no bundle "
                              f"({MANIFEST} missing); choose a new or empty directory")
        if not force:
            raise BundleError(f"bundle {out} already exists; pass --force (force=True) to "
                              f"replace it, or choose another output")


def _install(tmp: Path, out: Path) -> None:
    """Move the finished bundle ``tmp`` to ``out``, replacing an old bundle or empty directory."""
    old: Path | None = None
    if out.is_dir():
        for child in out.iterdir():  # the user's own files in a replaced bundle folder stay
            ours = (_CAND_DIR.match(child.name) or _CAND_FILE.match(child.name)
                    or child.name in (MANIFEST, MODEL_FILE, MODEL_FILE + ".data", WEIGHTS_FILE))
            if not ours and not (tmp / child.name).exists():
                child.rename(tmp / child.name)
        if any(out.iterdir()):
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            old.rmdir()
            out.rename(old)
        else:
            out.rmdir()
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def split_model(model_path: str | Path, out_dir: str | Path, *,
                dims: Mapping[str, int] | None = None, verify: bool = False,
                progress: Progress | None = None,
                max_candidates: int = DEFAULT_MAX_CANDIDATES,
                shared_weights: bool | None = None, force: bool = False,
                freeze: Mapping[str, Any] | None = None,
                input_data: str | Path | Mapping[str, Any] | None = None,
                state: Sequence[tuple[str, str]] | None = None,
                post: str | None = None) -> Bundle:
    """Slice ``model_path`` into a bundle in ``out_dir`` and return it (loaded back from disk).

    With ``verify=True`` every candidate is checked (:mod:`convert.verify`) and
    :class:`~convert.verify.VerifyError` lists the failing candidates. With
    ``shared_weights=True`` every initializer of >= 1 kB is stored once in ``weights.bin`` and
    all slices (flat names ``cNNN.head.onnx``) reference it as ONNX external data; ``None``
    (default) shares when self-contained slices would hold more than 16 MB of weights.

    The bundle is written into a hidden sibling folder (``.NAME.tmp-*``) and renamed to
    ``out_dir`` only when complete: an error or an interruption (KeyboardInterrupt) leaves
    ``out_dir`` as it was and no temporary folder behind. An existing bundle in ``out_dir`` is
    replaced only with ``force=True`` (:class:`BundleError` otherwise, before any work). A bundle
    that fails verification is still installed (its manifest records the failures) and
    :class:`~convert.verify.VerifyError` is raised after.

    ``freeze`` (``{input: value}``), ``input_data`` (an .npz path or arrays: representative
    inputs) and ``state`` (``[(input, output)]`` recurrent pairs) are for models exported by
    other tools: :mod:`convert.realmodel`. ``post`` appends a post-processing (``topk:5``,
    ``argmax``, ``boxes:100`` or a FILE.onnx: :mod:`convert.post`) so that only what the app
    needs comes back.
    """
    out = Path(out_dir)
    check_out_dir(out, force)  # raises before any work is done
    step = progress or (lambda stage, done, total: None)
    prep = Preparation.of(freeze, input_data, state, post)  # reads --input-data before any work
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as exc:
        raise BundleError(f"output {out}: cannot write next to it in {out.parent} "
                          f"({exc.strerror or exc})") from None
    try:
        step("load", 0, 1)
        # large initializers go straight to the bundle's weights.bin (convert/weights.py)
        g = prep.load(model_path, dims, weights=tmp / WEIGHTS_FILE)
        costs = all_costs(g)
        step("load", 1, 1)
        cuts = enumerate_cuts(g, costs, max_candidates)
        check_out_dir(out, force)  # again: something may have appeared there meanwhile
        failures = _write_bundle(g, costs, cuts, model_path, tmp, max_candidates,
                                 shared_weights, verify, progress, step, prep)
        _install(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if failures:
        raise VerifyError(failures)
    return Bundle.load(out)


def _write_bundle(g: Graph, costs: list[NodeCost], cuts: list[Cut], model_path: str | Path,
                  out: Path, max_candidates: int, shared_weights: bool | None, verify: bool,
                  progress: Progress | None, step: Progress,
                  prep: Preparation | None = None) -> list[str]:
    """Write every file of the bundle into ``out``; return the verification failures."""
    if shared_weights is None:
        shared_weights = len(cuts) * param_bytes(g, range(len(g.nodes))) > SHARED_AUTO_BYTES
    shared = bool(shared_weights)
    weights = out / WEIGHTS_FILE
    if not shared:  # self-contained slices: the (small) weights go back inside the model
        internalize(g.model, out)
        weights.unlink(missing_ok=True)

    save_model(g.model, out / MODEL_FILE)
    dyn = [n.index for n in g.nodes if n.dynamic]
    candidates: list[Candidate] = []
    for k, cut in enumerate(cuts):
        # the last cut (wearable-only) needs no tail when nothing is left for it to run
        candidates.append(_write_candidate(g, costs, cut, f"c{k:03d}", dyn, out, shared,
                                           with_tail=k < len(cuts) - 1))
        step("slice", k + 1, len(cuts))
    meta = _meta(g, costs, dyn, model_path, max_candidates)
    if prep is not None:
        prep.annotate(g, candidates, meta)
    if shared:
        meta["weights"] = {"file": WEIGHTS_FILE, "sha256": g.weights_sha256 or sha256_file(weights),
                           "tensors": shared_tensors(g.model)}
    bundle = Bundle(root=out, model_file=MODEL_FILE, model_sha256=sha256_file(out / MODEL_FILE),
                    inputs=tuple(spec(g, t) for t in g.inputs),
                    outputs=tuple(spec(g, t) for t in g.outputs),
                    candidates=tuple(candidates), meta=meta)
    bundle.save()
    if verify:
        failures = verify_bundle(bundle, progress=progress,
                                 **(prep.verify_kwargs() if prep else {}))
        bundle.meta["verified"] = {"ok": not failures, "rtol": RTOL, "atol": ATOL, "seed": 0,
                                   "failures": failures}
        bundle.save()
        return list(failures)
    return []


def _write_candidate(g: Graph, costs: list[NodeCost], cut: Cut, cid: str, dyn: list[int],
                     out: Path, shared: bool, with_tail: bool) -> Candidate:
    """Write the head and tail slices of ``cut`` into ``out`` (the tail also when it runs no
    node, if ``with_tail``) and return its manifest entry."""
    head_nodes = [i for i in dyn if i in cut.head]
    tail_nodes = [i for i in dyn if i not in cut.head]
    crossing = list(cut.crossing)
    head_file = tail_file = None
    if head_nodes:
        head_inputs = sorted({t for i in head_nodes for t in g.nodes[i].inputs
                              if t in g.inputs} | {t for t in crossing if t in g.inputs},
                             key=g.inputs.index)
        head_file = f"{cid}.head.onnx" if shared else f"{cid}/head.onnx"
        save_model(build_slice(g, head_nodes, head_inputs, crossing, "head"), out / head_file)
    if tail_nodes or with_tail:
        tail_file = f"{cid}.tail.onnx" if shared else f"{cid}/tail.onnx"
        save_model(build_slice(g, tail_nodes, crossing, g.outputs, "tail"), out / tail_file)
    names = [g.nodes[i].name for i in range(len(g.nodes))]
    return Candidate(
        id=cid, label=cut.label,
        crossing=tuple(spec(g, t) for t in crossing),
        head=Part(head_file, sum(costs[i].flops for i in head_nodes),
                  param_bytes(g, _with_consts(g, head_nodes)),
                  tuple(names[i] for i in head_nodes),
                  sha256_file(out / head_file) if head_file else None),
        tail=Part(tail_file, sum(costs[i].flops for i in tail_nodes),
                  param_bytes(g, _with_consts(g, tail_nodes)),
                  tuple(names[i] for i in tail_nodes),
                  sha256_file(out / tail_file) if tail_file else None),
        extra={"selected_as": cut.reason,
               "head_macs": sum(costs[i].macs for i in head_nodes),
               "tail_macs": sum(costs[i].macs for i in tail_nodes)},
    )


def _meta(g: Graph, costs: list[NodeCost], dyn: list[int], model_path: str | Path,
          max_candidates: int) -> dict[str, Any]:
    """The manifest's ``meta``: version, source model, dims, graph statistics, selection."""
    return {
        "coinf_version": __version__,
        "source": {"file": Path(model_path).name,
                   "sha256": g.source_sha256 or sha256_file(model_path)},
        "dims": g.dims,
        "stats": {
            "nodes": len(g.nodes),
            "dynamic_nodes": len(dyn),
            "constant_nodes": len(g.nodes) - len(dyn),
            "folded_shape_nodes": len(g.folded),
            "total_flops": sum(costs[i].flops for i in dyn),
            "total_macs": sum(costs[i].macs for i in dyn),
            "param_bytes": param_bytes(g, range(len(g.nodes))),
            "opset": g.opset,
            "ir_version": int(g.model.ir_version),
            "shape_source": g.shape_source,
        },
        "selection": {
            "max_candidates": max_candidates,
            "orders": ["file", "depth-first", "greedy-frontier"],
            "tiers": ["pareto", "single-tensor", "in-block", "spread"],
        },
    }


def _with_consts(g: Graph, nodes: list[int]) -> list[int]:
    from coinf.convert.slicer import closure

    return closure(g, nodes)

