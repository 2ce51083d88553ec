"""Check a bundle: for every candidate, tail(head(x)) == model(x) and every crossing tensor equals
the same tensor of the whole model, on seeded random inputs, with onnxruntime optimisations off.

Tolerance (float tensors): ``|got - ref| <= ATOL + RTOL * |ref|`` elementwise with
``ATOL = RTOL = 1e-5``, NaNs must match NaNs; integer and bool tensors must be equal exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from coinf.convert.graph import TensorType, ort_session, sample_feed
from onnx import ModelProto, helper

from coinf.bundle import Bundle, Candidate, TensorSpec, check_locations
from coinf.errors import ModelError

RTOL = 1e-5
ATOL = 1e-5


class VerifyError(ModelError):
    """Some candidates do not compose to the whole model."""

    def __init__(self, failures: list[str]) -> None:
        self.failures = failures
        ids = sorted({f.split(":", 1)[0] for f in failures})
        super().__init__(f"verification failed for {len(ids)} candidate(s) {', '.join(ids)}: "
                         + "; ".join(failures[:5]) + (" ..." if len(failures) > 5 else ""))


def _ttype(spec: TensorSpec) -> TensorType:
    return TensorType(int(helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype))), spec.shape)


def mismatch(got: np.ndarray, ref: np.ndarray) -> str | None:
    """None when equal within tolerance, else a short description."""
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape:
        return f"shape {got.shape} != {ref.shape}"
    if got.dtype != ref.dtype:
        return f"dtype {got.dtype} != {ref.dtype}"
    if got.dtype.kind in "fc":
        a, b = got.astype(np.float64), ref.astype(np.float64)
        nan = np.isnan(a) | np.isnan(b)
        if not np.array_equal(np.isnan(a), np.isnan(b)):
            return "NaN positions differ"
        err = np.where(nan, 0.0, np.abs(a - b) - (ATOL + RTOL * np.abs(b)))
        if err.size and float(err.max()) > 0:
            return f"max abs error {float(np.nanmax(np.abs(a - b))):.3g}"
        return None
    return None if np.array_equal(got, ref) else "values differ"


def verify_bundle(bundle: Bundle, seed: int = 0,
                  progress: Callable[[str, int, int], None] | None = None,
                  input_data: Mapping[str, np.ndarray] | None = None,
                  feeds: int = 1) -> list[str]:
    """Verify every candidate; returns failure strings ``"cNNN: what"`` (empty when all pass).

    ``input_data`` (representative inputs, one feed or N on a leading axis) replaces the
    seeded random values of the inputs it has; the first ``feeds`` of them are checked."""
    failures: list[str] = []
    rounds = max(feeds, 1)
    total = rounds * len(bundle.candidates)
    for k in range(rounds):
        feed, ref, outputs = reference(bundle, seed + k, input_data, index=k)
        step = None if progress is None else (
            lambda stage, done, _n, k=k: progress(stage, k * len(bundle.candidates) + done,
                                                  total))
        failures.extend(f for f in _verify_feed(bundle, feed, ref, outputs, step)
                        if f not in failures)
    return failures


def reference(bundle: Bundle, seed: int = 0,
              input_data: Mapping[str, np.ndarray] | None = None, index: int = 0,
              ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[str]]:
    """Inputs (seeded random, or feed ``index`` of ``input_data``), the whole model's value of
    every output and crossing tensor (and of the inputs) on them, and the output names: what
    every slice is checked against."""
    # weights stay in their files: the sessions below read external data from the bundle
    model = onnx.load(str(bundle.model_path), load_external_data=False)
    types = {t.name: _ttype(t) for t in bundle.inputs}
    names = [t.name for t in bundle.inputs]
    feed = sample_feed(model, types, names, input_data, seed=seed, index=index)
    outputs = [t.name for t in bundle.outputs]
    extra: dict[str, TensorSpec] = {}
    for cand in bundle.candidates:
        for t in cand.crossing:
            if t.name not in feed and t.name not in outputs:
                extra.setdefault(t.name, t)
    probe = ModelProto()
    probe.CopyFrom(model)
    for name, spec in extra.items():
        tt = _ttype(spec)
        probe.graph.output.append(helper.make_tensor_value_info(name, tt.elem, list(tt.shape)))
    wanted = outputs + list(extra)
    values = ort_session(probe, weights_dir=bundle.root).run(wanted, feed)
    ref: dict[str, np.ndarray] = dict(feed)
    ref.update(zip(wanted, values, strict=True))
    return feed, ref, outputs


def _verify_feed(bundle: Bundle, feed: dict[str, np.ndarray], ref: dict[str, np.ndarray],
                 outputs: list[str], progress: Callable[[str, int, int], None] | None
                 ) -> list[str]:
    failures: list[str] = []
    total = len(bundle.candidates)
    for k, cand in enumerate(bundle.candidates):
        try:
            failures.extend(_check(bundle, cand, feed, ref, outputs))
        except Exception as exc:  # an onnxruntime failure is a verification failure
            failures.append(f"{cand.id}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
        if progress:
            progress("verify", k + 1, total)
    return failures


def _session(path: Path) -> Any:
    """A slice's exact (unoptimised) session; external data is read from the slice's folder."""
    model = onnx.load(str(path), load_external_data=False)
    check_locations(model, path)
    return ort_session(model, weights_dir=path.parent)


def _check(bundle: Bundle, cand: Candidate, feed: dict[str, np.ndarray],
           ref: dict[str, np.ndarray], outputs: list[str]) -> list[str]:
    bad: list[str] = []
    crossing = [t.name for t in cand.crossing]
    if cand.head.file is not None:
        head = _session(bundle.path(cand.head.file))
        hin = [i.name for i in head.get_inputs()]
        sent = dict(zip(crossing, head.run(crossing, {n: feed[n] for n in hin}), strict=True))
    else:
        sent = {n: feed[n] for n in crossing}
    for spec in cand.crossing:
        got = sent[spec.name]
        why = mismatch(got, ref[spec.name])
        if why:
            bad.append(f"{cand.id}: crossing {spec.name} {why}")
        elif tuple(got.shape) != spec.shape or got.dtype != np.dtype(spec.dtype):
            bad.append(f"{cand.id}: crossing {spec.name} is {got.dtype}{list(got.shape)}, "
                       f"manifest says {spec.dtype}{list(spec.shape)}")
    if cand.tail.file is not None:
        tail = _session(bundle.path(cand.tail.file))
        tin = [i.name for i in tail.get_inputs()]
        result = dict(zip(outputs, tail.run(outputs, {n: sent[n] for n in tin}), strict=True))
    else:
        result = sent
    for name in outputs:
        why = mismatch(result[name], ref[name])
        if why:
            bad.append(f"{cand.id}: output {name} {why}")
    return bad
