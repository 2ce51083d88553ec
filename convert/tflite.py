"""Per-split TFLite slices: convert a bundle's ONNX heads and tails to float32 ``.tflite``,
verify each, and list the ones that passed in the manifest (docs/BUNDLE.md, "TFLite slices").

Layout-safe by construction. onnx2tf moves NCHW tensors to channels-last on its own terms, so
before converting, every tensor that crosses a link is flattened in ONNX: a head ends in a
``Reshape`` to ``[1, numel]`` of each crossing tensor, a tail starts with a ``Reshape`` back to
its real shape, and the TFLite slice's tensors are named ``in<i>`` / ``out<j>``. A TFLite head's
output bytes are therefore the ONNX head's bytes, and any TFLite/ONNX mix composes across the
link. Raw model inputs of a head keep their ONNX layout (onnx2tf's
``keep_shape_absolutely_input_names``).

Nothing ships unverified: each converted slice is run with LiteRT against onnxruntime on the
whole model's tensors (max error relative to the reference's largest magnitude <= ``RTOL``),
then every TFLite/ONNX combination of a candidate is composed against the whole model. A slice
that fails to convert, to load, or to match is left out with its reason in the manifest.

The converter, onnx2tf 2.6.9 (TF-free ``flatbuffer_direct`` backend), declares Python >= 3.12
though it runs on 3.11, so pip cannot take it as a requirement: :func:`install_converter`
installs it (``coinf convert tflite --install-converter``, ``make tflite``), and it runs in a
child process (:mod:`convert.tflite_worker`), optionally in another interpreter.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from coinf.convert.graph import ort_session
from coinf.convert.litert import LiteRTSlice
from coinf.convert.verify import reference
from onnx import ModelProto, helper, numpy_helper

from coinf.bundle import Bundle, Candidate
from coinf.deps import litert_package
from coinf.errors import BundleError, MissingDependency

Progress = Callable[[str, int, int], None]
CONVERTER = "onnx2tf==2.6.9"
#: what onnx2tf 2.6.9 imports, installed by name before it (its own metadata is not usable)
CONVERTER_DEPS = ("ai-edge-litert>=2.3", "flatbuffers", "ml-dtypes", "sng4onnx", "sne4onnx",
                  "psutil", "tqdm", "protobuf")
RTOL = 1e-4
JOB_TIMEOUT_S = 600.0
WORKER = Path(__file__).with_name("tflite_worker.py")
PARTS = ("head", "tail")


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """``max |got - ref| / max |ref|`` for floats (0 when equal); 0 or inf for other dtypes."""
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape:
        return math.inf
    if ref.dtype.kind not in "fc":
        return 0.0 if np.array_equal(got, ref) else math.inf
    a, b = got.astype(np.float64), ref.astype(np.float64)
    if not np.array_equal(np.isnan(a), np.isnan(b)):
        return math.inf
    a, b = np.nan_to_num(a), np.nan_to_num(b)
    if a.size == 0:
        return 0.0
    return float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-12))


# -- the converter ----------------------------------------------------------------------------
def converter_python(python: str | None = None) -> str:
    """The interpreter that runs onnx2tf: ``python`` if given, else this one when it has onnx2tf;
    otherwise :class:`MissingDependency` saying how to install it."""
    if python:
        if shutil.which(python) is None and not Path(python).is_file():
            raise MissingDependency(f"--python {python}: no such interpreter")
        return python
    if importlib.util.find_spec("onnx2tf") is None:
        raise MissingDependency(
            f"converting to TFLite needs {CONVERTER}, which pip cannot install as a requirement "
            "(it declares Python >= 3.12 but runs on 3.11): run `coinf convert tflite BUNDLE "
            "--install-converter` (or `make tflite`) to install it into this environment")
    return sys.executable


def install_converter(quiet: bool = True) -> None:
    """pip-install the converter's dependencies by name, then onnx2tf itself without its
    metadata's Python pin, into this environment."""
    pip = [sys.executable, "-m", "pip", "install"] + (["--quiet"] if quiet else [])
    for args in (list(CONVERTER_DEPS), ["--no-deps", "--ignore-requires-python", CONVERTER]):
        done = subprocess.run(pip + args, check=False)
        if done.returncode != 0:
            raise MissingDependency(f"installing {' '.join(args)} failed (pip exit "
                                    f"{done.returncode})")
    importlib.invalidate_caches()


# -- preparing a slice ------------------------------------------------------------------------
def _shape(vi: onnx.ValueInfoProto) -> list[int]:
    return [int(d.dim_value) for d in vi.type.tensor_type.shape.dim]


def _spec(vi: onnx.ValueInfoProto) -> dict[str, Any]:
    elem = vi.type.tensor_type.elem_type
    return {"name": vi.name, "shape": _shape(vi),
            "dtype": np.dtype(helper.tensor_dtype_to_np_dtype(elem)).name}


def prepare_slice(model: ModelProto, keep_layout: bool) -> tuple[ModelProto, dict[str, Any]]:
    """The slice made layout-safe for onnx2tf, and its manifest I/O record.

    Inputs become ``in<i>``: in ONNX layout when ``keep_layout`` (a head's raw model inputs),
    else flattened to ``[1, numel]`` and reshaped back inside. Every computed output becomes
    ``out<j>`` = its ``[1, numel]`` reshape. An output that is an input passes through outside.
    """
    m = ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {t.name for t in g.initializer}
    ins = [vi for vi in g.input if vi.name not in inits]
    in_names = {vi.name for vi in ins}
    passthrough = [vi.name for vi in g.output if vi.name in in_names]
    consumed = {t for n in g.node for t in n.input}
    used = [vi for vi in ins if vi.name in consumed]
    outs = [vi for vi in g.output if vi.name not in in_names]
    pre: list[onnx.NodeProto] = []
    post: list[onnx.NodeProto] = []
    new_inputs: list[onnx.ValueInfoProto] = []
    for i, vi in enumerate(used):
        elem, shape, new = vi.type.tensor_type.elem_type, _shape(vi), f"in{i}"
        if keep_layout:
            for node in g.node:
                for k, t in enumerate(node.input):
                    if t == vi.name:
                        node.input[k] = new
            new_inputs.append(helper.make_tensor_value_info(new, elem, shape))
        else:
            new_inputs.append(helper.make_tensor_value_info(new, elem, [1, math.prod(shape)]))
            const = f"coinf_shape_in{i}"
            g.initializer.append(numpy_helper.from_array(np.array(shape, np.int64), const))
            pre.append(helper.make_node("Reshape", [new, const], [vi.name],
                                        name=f"coinf_unflatten_{i}"))
    flat = "coinf_shape_flat"
    if outs:
        g.initializer.append(numpy_helper.from_array(np.array([1, -1], np.int64), flat))
    new_outputs = []
    for j, vi in enumerate(outs):
        elem, n = vi.type.tensor_type.elem_type, math.prod(_shape(vi))
        post.append(helper.make_node("Reshape", [vi.name, flat], [f"out{j}"],
                                     name=f"coinf_flatten_{j}"))
        new_outputs.append(helper.make_tensor_value_info(f"out{j}", elem, [1, n]))
    nodes = list(g.node)
    del g.node[:]
    g.node.extend(pre + nodes + post)
    keep_inits = [t for t in g.input if t.name in inits]
    del g.input[:]
    g.input.extend(new_inputs + keep_inits)
    del g.output[:]
    g.output.extend(new_outputs)
    entry = {"inputs": [_spec(vi) for vi in used], "outputs": [_spec(vi) for vi in outs],
             "passthrough": passthrough, "layout": "onnx" if keep_layout else "flat"}
    return m, entry


# -- converting a bundle ----------------------------------------------------------------------
@dataclass
class SliceOutcome:
    """One slice's conversion: its manifest record (``file`` or ``error``) and error figures."""

    cid: str
    part: str
    entry: dict[str, Any] = field(default_factory=dict)
    tmp: Path | None = None
    error: str = ""
    max_rel_err: float = math.nan
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass
class Summary:
    """What :func:`convert_bundle` did: per slice outcomes, converted/total, seconds."""

    outcomes: list[SliceOutcome]
    seconds: float

    @property
    def converted(self) -> int:
        return sum(o.ok for o in self.outcomes)

    @property
    def total(self) -> int:
        return len(self.outcomes)

    def rows(self) -> list[tuple[str, str, str]]:
        """(candidate, head, tail) cells: ``ok 3.1e-07``, ``-`` (no slice) or the failure."""
        cells: dict[str, dict[str, str]] = {}
        for o in self.outcomes:
            text = f"ok {o.max_rel_err:.1e}" if o.ok else f"LEFT OUT: {o.error}"
            cells.setdefault(o.cid, {})[o.part] = text
        return [(cid, c.get("head", "-"), c.get("tail", "-")) for cid, c in cells.items()]


def tflite_file(bundle_file: str) -> str:
    """``c001/head.onnx`` -> ``c001/head.tflite`` (also ``c001.head.onnx`` -> ``.tflite``)."""
    return str(Path(bundle_file).with_suffix(".tflite"))


def _run_worker(jobs: list[dict[str, Any]], python: str, progress: Progress | None,
                timeout_s: float) -> list[dict[str, Any]]:
    """Convert every job in one child process (restarted after a crash or a hung job)."""
    results: list[dict[str, Any] | None] = [None] * len(jobs)
    with tempfile.TemporaryDirectory(prefix="coinf-tflite-jobs-") as tmp:
        jobs_file, out_file = Path(tmp) / "jobs.json", Path(tmp) / "results.jsonl"
        jobs_file.write_text(json.dumps(jobs))
        out_file.touch()
        start = 0
        while start < len(jobs):
            with open(Path(tmp) / "worker.log", "ab") as log:
                proc = subprocess.Popen(
                    [python, str(WORKER), str(jobs_file), str(out_file), str(start)],
                    stdout=log, stderr=log, stdin=subprocess.DEVNULL)
                deadline = time.monotonic() + timeout_s
                read = 0
                try:
                    while True:
                        lines = out_file.read_text().splitlines()
                        for line in lines[read:]:
                            res = json.loads(line)
                            results[res["job"]] = res
                            deadline = time.monotonic() + timeout_s
                            if progress:
                                progress("tflite", sum(r is not None for r in results),
                                         len(jobs))
                        read = len(lines)
                        nxt = next((i for i in range(start, len(jobs)) if results[i] is None),
                                   len(jobs))
                        if nxt == len(jobs) or proc.poll() is not None:
                            break
                        if time.monotonic() > deadline:
                            results[nxt] = {"job": nxt, "ok": False,
                                            "error": f"converter timed out after {timeout_s:.0f} s"}
                            break
                        time.sleep(0.05)
                finally:
                    if proc.poll() is None:
                        proc.kill()
                    proc.wait()
            nxt = next((i for i in range(start, len(jobs)) if results[i] is None), len(jobs))
            if nxt < len(jobs) and nxt == start and proc.returncode not in (0, None):
                results[nxt] = {"job": nxt, "ok": False,
                                "error": f"converter process died (exit {proc.returncode})"}
            start = next((i for i in range(start, len(jobs)) if results[i] is None), len(jobs))
    return [r or {"ok": False, "error": "not converted"} for r in results]


def convert_bundle(bundle: Bundle, *, candidates: Iterable[str] | None = None,
                   python: str | None = None, progress: Progress | None = None,
                   timeout_s: float = JOB_TIMEOUT_S, seed: int = 0) -> Summary:
    """Convert, verify and record the TFLite slices of ``bundle`` (all candidates, or the ids
    in ``candidates``); rewrites its manifest. Returns the per-slice :class:`Summary`."""
    t0 = time.perf_counter()
    exe = converter_python(python)
    if litert_package() is None:
        raise MissingDependency("verifying TFLite slices needs ai-edge-litert "
                                "(pip install 'coinf[tflite]')")
    wanted = set(candidates) if candidates is not None else None
    chosen = [c for c in bundle.candidates if wanted is None or c.id in wanted]
    if wanted is not None and len(chosen) != len(wanted):
        known = {c.id for c in bundle.candidates}
        raise BundleError(f"unknown candidate(s) {sorted(wanted - known)} in {bundle.root}")
    outcomes = [SliceOutcome(c.id, p) for c in chosen for p in PARTS
                if (c.head if p == "head" else c.tail).file is not None]
    with tempfile.TemporaryDirectory(prefix="coinf-tflite-") as tmpdir:
        tmp = Path(tmpdir)
        _convert(bundle, outcomes, tmp, exe, progress, timeout_s, onnx_layout=False)
        _verify(bundle, chosen, outcomes, seed, progress)
        # A tail with flattened inputs that failed gets a second try with its inputs in ONNX
        # layout (keep_shape_absolutely, like a head): onnx2tf mishandles some Reshape->Conv1D
        # prologues (TextCNN: "TRANSPOSE perm 4 != dims 3"). Its bytes are ONNX-ordered too.
        retry = [o for o in outcomes if not o.ok and o.part == "tail"]
        if retry:
            first = {o.cid: o.error for o in retry}
            _convert(bundle, retry, tmp, exe, progress, timeout_s, onnx_layout=True)
            ids = {o.cid for o in retry}
            _verify(bundle, [c for c in chosen if c.id in ids],
                    [o for o in outcomes if o.cid in ids], seed, progress)
            for o in retry:
                if not o.ok:
                    o.error = (f"{first[o.cid]}; with ONNX-layout inputs: {o.error}")[:400]
        _record(bundle, outcomes)
    summary = Summary(outcomes, time.perf_counter() - t0)
    bundle.meta["tflite"] = {
        "converter": f"{CONVERTER} flatbuffer_direct", "precision": "float32",
        "layout": "crossing tensors flattened to [1, numel] in ONNX order (a tail that failed "
                  "so: its inputs in ONNX layout); raw inputs in ONNX layout",
        "rtol": RTOL, "seed": seed,
        "converted": sum(1 for c in bundle.candidates for p in PARTS
                         if isinstance(c.extra.get("tflite", {}).get(p), dict)
                         and "error" not in c.extra["tflite"][p]),
        "total": sum(1 for c in bundle.candidates for p in (c.head, c.tail) if p.file),
    }
    bundle.save()
    return summary


def _convert(bundle: Bundle, targets: list[SliceOutcome], tmp: Path, exe: str,
             progress: Progress | None, timeout_s: float, onnx_layout: bool) -> None:
    """Prepare and convert ``targets``; a head always keeps its inputs' ONNX layout, a tail
    only with ``onnx_layout`` (else its inputs are flattened)."""
    jobs: list[dict[str, Any]] = []
    owners: list[SliceOutcome] = []
    for out in targets:
        cand = bundle.candidate(out.cid)
        part = cand.head if out.part == "head" else cand.tail
        keep = out.part == "head" or onnx_layout
        out.error, out.tmp, out.max_rel_err = "", None, math.nan
        try:
            model = onnx.load(str(bundle.path(str(part.file))))
            prepared, out.entry = prepare_slice(model, keep_layout=keep)
        except Exception as exc:  # a slice onnx cannot load or edit
            out.error = f"cannot prepare: {type(exc).__name__}: {exc}"[:300]
            continue
        if not out.entry["outputs"]:
            continue  # nothing to compute: pure pass-through, no file needed
        stem = f"{out.cid}_{out.part}_{out.entry['layout']}"
        src = tmp / f"{stem}.onnx"
        src.write_bytes(prepared.SerializeToString())
        out.tmp = tmp / f"{stem}.tflite"
        jobs.append({"onnx": str(src), "tflite": str(out.tmp),
                     "keep": [f"in{i}" for i in range(len(out.entry["inputs"]))] if keep else []})
        owners.append(out)
    for out, res in zip(owners, _run_worker(jobs, exe, progress, timeout_s), strict=True):
        out.seconds += float(res.get("seconds", 0.0))
        if not res.get("ok"):
            out.error = f"conversion failed: {res.get('error', '?')}"


def _verify(bundle: Bundle, chosen: list[Candidate], outcomes: list[SliceOutcome], seed: int,
            progress: Progress | None) -> None:
    """Slice vs onnxruntime, then every TFLite/ONNX mix of a candidate vs the whole model."""
    feed, ref, outputs = reference(bundle, seed)
    by = {(o.cid, o.part): o for o in outcomes}
    for k, cand in enumerate(chosen):
        lite: dict[str, LiteRTSlice] = {}
        onnx_parts: dict[str, Any] = {}
        for part_name in PARTS:
            out = by.get((cand.id, part_name))
            if out is None:
                continue
            part = cand.head if part_name == "head" else cand.tail
            onnx_parts[part_name] = ort_session(onnx.load(str(bundle.path(str(part.file)))))
            if not out.ok:
                continue
            try:
                lite[part_name] = _open_lite(out)
                sess = onnx_parts[part_name]
                names = [o.name for o in sess.get_outputs()]
                feeds = {i.name: ref[i.name] for i in sess.get_inputs()}
                want = sess.run(names, feeds)
                got = lite[part_name].run(names, feeds)
                out.max_rel_err = max((rel_err(a, b) for a, b in zip(got, want, strict=True)),
                                      default=0.0)
                if not out.max_rel_err <= RTOL:
                    out.error = f"differs from onnxruntime (relative error {out.max_rel_err:.2g})"
            except Exception as exc:  # LiteRT load/run failure ("Tensor data is null", ...)
                first = (str(exc).strip().splitlines() or [""])[0]
                out.error = f"LiteRT run failed: {type(exc).__name__}: {first}"[:300]
            if out.error:
                lite.pop(part_name, None)
        _compose(cand, feed, ref, outputs, lite, onnx_parts, by)
        if progress:
            progress("verify tflite", k + 1, len(chosen))


def _open_lite(out: SliceOutcome) -> LiteRTSlice:
    """Load a converted slice; when LiteRT's default XNNPACK delegate cannot prepare it (seen on
    TextCNN tails), fall back to the builtin kernels and record ``xnnpack: false``."""
    try:
        return LiteRTSlice(out.tmp, out.entry)
    except BundleError as exc:
        if "XNNPack" not in str(exc):
            raise
    out.entry["xnnpack"] = False
    return LiteRTSlice(out.tmp, out.entry)


def _compose(cand: Candidate, feed: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray],
             outputs: list[str], lite: dict[str, Any], onnx_parts: dict[str, Any],
             by: dict[tuple[str, str], SliceOutcome]) -> None:
    """Run head -> tail for every mix that has a TFLite part; a mix off the whole model by more
    than RTOL leaves its TFLite part(s) out (the tail first when both are TFLite)."""
    crossing = [t.name for t in cand.crossing]
    for head_rt in ("onnx", "tflite"):
        for tail_rt in ("onnx", "tflite"):
            if "tflite" not in (head_rt, tail_rt):
                continue
            head = (lite if head_rt == "tflite" else onnx_parts).get("head")
            tail = (lite if tail_rt == "tflite" else onnx_parts).get("tail")
            if (head is None and "head" in onnx_parts) or (tail is None and "tail" in onnx_parts):
                continue
            try:
                err = _mix_error(head, tail, feed, ref, outputs, crossing)
                why = f"is off the whole model (relative error {err:.2g})"
            except Exception as exc:  # a LiteRT failure on the composed tensors
                err = math.inf
                first = (str(exc).strip().splitlines() or [""])[0]
                why = f"failed: {type(exc).__name__}: {first}"[:250]
            if err <= RTOL:
                continue
            blame = "tail" if tail_rt == "tflite" else "head"
            out = by[(cand.id, blame)]
            if out.ok:
                out.error = f"composition {head_rt} head -> {tail_rt} tail {why}"
                lite.pop(blame, None)


def _mix_error(head: Any, tail: Any, feed: Mapping[str, np.ndarray],
               ref: Mapping[str, np.ndarray], outputs: list[str], crossing: list[str]) -> float:
    """The largest relative error of ``tail(head(feed))`` against the whole model."""
    sent = dict(feed)
    if head is not None:
        names = [o.name for o in head.get_outputs()]
        sent.update(zip(names, head.run(names, {i.name: feed[i.name]
                                                for i in head.get_inputs()}), strict=True))
    if tail is not None:
        tin = {i.name: sent[i.name] for i in tail.get_inputs()}
        result = dict(zip(outputs, tail.run(outputs, tin), strict=True))
    else:
        result = {n: sent[n] for n in crossing}
    return max(rel_err(result[n], ref[n]) for n in outputs)


def _record(bundle: Bundle, outcomes: list[SliceOutcome]) -> None:
    """Move verified files into the bundle and write each candidate's ``tflite`` record."""
    for out in outcomes:
        cand = bundle.candidate(out.cid)
        part = cand.head if out.part == "head" else cand.tail
        rel = tflite_file(str(part.file))
        target = bundle.path(rel)
        record = cand.extra.setdefault("tflite", {})
        if not out.ok:
            target.unlink(missing_ok=True)  # a stale file from an earlier conversion
            record[out.part] = {"error": out.error}
            continue
        entry = dict(out.entry)
        if out.tmp is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(out.tmp), target)
            entry["file"] = rel
        else:
            entry["file"] = None
        entry["max_rel_err"] = float(f"{out.max_rel_err:.3g}") if out.tmp else 0.0
        record[out.part] = entry
