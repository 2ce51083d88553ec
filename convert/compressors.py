"""Compressor sets: autoencoders for a model's cuts, attached to its bundle (issue 13, S2/S3).

A compressor set is a directory made offline (``coinf models compressors -o DIR``)::

    DIR/backbone.onnx           the whole model (one backbone serves every gamma)
    DIR/<cut>-g<N>.enc.onnx     inputs: exactly a cut's crossing tensors; one output "code"
    DIR/<cut>-g<N>.dec.onnx     input "code"; outputs: exactly the crossing tensors
    DIR/index.json              {"format": 1, "model": "backbone.onnx", "base_accuracy": {...},
                                 "compressors": [{"crossing", "gamma", "encoder", "decoder",
                                   "code_shape", "code_dtype", "flops", "model_flops",
                                   "accuracy": {"raw": acc, "<packing spec>": acc}}]}

:func:`load_set` validates it (every field; :class:`InputError` naming the field), and
:func:`attach` adds it to a bundle split from the same model (``coinf split DIR/backbone.onnx``,
then ``coinf convert compressors BUNDLE DIR``): the backbone must be the bundle's source, each
compressor's crossing set must be a candidate's, the encoder's and decoder's signatures must
match it, and head -> encoder -> decoder -> tail must run and give the model's output shapes.
The files are copied to ``BUNDLE/compressors/`` and recorded in the manifest, which changes the
bundle's identity (docs/BUNDLE.md). :class:`CodecRunner` runs them (wearable and helpers).
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from coinf.ble_protocol.messages import ErrorCode, ProtocolError
from coinf.ble_protocol.packing import PackSpec, packed_size

from coinf.bundle import (
    COMPRESSORS_DIR,
    Bundle,
    Candidate,
    Compressor,
    TensorSpec,
    open_slice,
    sha256_file,
)
from coinf.errors import BundleError, InputError

INDEX = "index.json"
SET_FORMAT = 1
CODE = "code"
MAX_GAMMA = 999


@dataclass(frozen=True)
class SetEntry:
    """One compressor of a set, as its index lists it (validated)."""

    crossing: tuple[str, ...]
    gamma: int
    encoder: Path
    decoder: Path
    code_shape: tuple[int, ...]
    code_dtype: str
    flops: int
    model_flops: int
    accuracy: dict[str, float]


@dataclass(frozen=True)
class CompressorSet:
    root: Path
    model: Path
    test_set: str
    base_accuracy: dict[str, float]
    entries: tuple[SetEntry, ...]


def _field(obj: Any, key: str, where: str) -> Any:
    if not isinstance(obj, Mapping) or key not in obj:
        raise InputError(f"{where}: missing field {key!r}")
    return obj[key]


def _int(v: Any, where: str, lo: int = 0, hi: int | None = None) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
        span = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise InputError(f"{where} must be an integer {span}, got {v!r}")
    return v


def _accuracy(v: Any, where: str) -> dict[str, float]:
    if not isinstance(v, Mapping) or "raw" not in v:
        raise InputError(f"{where} must be an object with at least \"raw\", got {v!r}"[:200])
    out: dict[str, float] = {}
    for spec, acc in v.items():
        if spec != "raw":
            try:
                PackSpec.parse(str(spec))
            except ValueError as exc:
                raise InputError(f"{where}: key {spec!r} is not a packing spec ({exc})") from None
        if not isinstance(acc, int | float) or isinstance(acc, bool) or not 0 <= acc <= 1:
            raise InputError(f"{where}[{spec!r}] must be an accuracy in [0, 1], got {acc!r}")
        out[str(spec)] = float(acc)
    return out


def _file(root: Path, name: Any, where: str) -> Path:
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", ".."):
        raise InputError(f"{where} must be a file name in the set's folder, got {name!r}")
    path = root / name
    if not path.is_file():
        raise InputError(f"{where}: file {path} is missing")
    return path


def load_set(root: str | Path) -> CompressorSet:
    """Read and validate ``DIR/index.json``; :class:`InputError` names the bad field."""
    root = Path(root)
    index = root / INDEX
    if not index.is_file():
        raise InputError(f"{root} is not a compressor set: no {INDEX} (make one with "
                         f"`coinf models compressors -o DIR`)")
    try:
        obj = json.loads(index.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{index} is not readable JSON: {exc}") from None
    w = str(index)
    if _field(obj, "format", w) != SET_FORMAT:
        raise InputError(f"{w}: format must be {SET_FORMAT}, got {obj['format']!r}")
    model = _file(root, _field(obj, "model", w), f"{w}: model")
    test_set = obj.get("test_set", "")
    if not isinstance(test_set, str):
        raise InputError(f"{w}: test_set must be a string, got {test_set!r}")
    base = _accuracy(_field(obj, "base_accuracy", w), f"{w}: base_accuracy")
    comps = _field(obj, "compressors", w)
    if not isinstance(comps, list) or not comps:
        raise InputError(f"{w}: compressors must be a non-empty list")
    entries: list[SetEntry] = []
    seen: set[tuple[tuple[str, ...], int]] = set()
    for i, e in enumerate(comps):
        at = f"{w}: compressors[{i}]"
        crossing = _field(e, "crossing", at)
        if (not isinstance(crossing, list) or not crossing
                or not all(isinstance(n, str) and n for n in crossing)
                or len(set(crossing)) != len(crossing)):
            raise InputError(f"{at}.crossing must be a non-empty list of distinct tensor "
                             f"names, got {crossing!r}"[:240])
        gamma = _int(_field(e, "gamma", at), f"{at}.gamma", 2, MAX_GAMMA)
        shape = _field(e, "code_shape", at)
        if not isinstance(shape, list) or not 1 <= len(shape) <= 8:
            raise InputError(f"{at}.code_shape must be a list of 1..8 dimensions, got {shape!r}")
        dims = tuple(_int(d, f"{at}.code_shape[{k}]", 1) for k, d in enumerate(shape))
        dtype = _field(e, "code_dtype", at)
        if dtype not in ("float32", "float16"):
            raise InputError(f"{at}.code_dtype must be float32 or float16, got {dtype!r}")
        key = (tuple(sorted(crossing)), gamma)
        if key in seen:
            raise InputError(f"{at}: a second compressor with gamma {gamma} at {crossing}")
        seen.add(key)
        entries.append(SetEntry(
            tuple(crossing), gamma, _file(root, _field(e, "encoder", at), f"{at}.encoder"),
            _file(root, _field(e, "decoder", at), f"{at}.decoder"), dims, dtype,
            _int(_field(e, "flops", at), f"{at}.flops"),
            _int(_field(e, "model_flops", at), f"{at}.model_flops"),
            _accuracy(_field(e, "accuracy", at), f"{at}.accuracy")))
    return CompressorSet(root, model, test_set, base, tuple(entries))


# -- signatures ---------------------------------------------------------------------------------
def _signature(path: Path, which: str) -> list[TensorSpec]:
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise InputError(f"{path} is not a readable ONNX model: {exc}"[:300]) from None
    inits = {t.name for t in model.graph.initializer}
    values = (model.graph.input if which == "inputs" else model.graph.output)
    out = []
    for v in values:
        if v.name in inits:
            continue
        tt = v.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
        dt = np.dtype(tensor_dtype_to_np_dtype(tt.elem_type))
        out.append(TensorSpec(v.name, dims, dt.name, int(np.prod(dims)) * dt.itemsize))
    return out


def _expect(path: Path, which: str, want: list[TensorSpec]) -> None:
    got = {t.name: t for t in _signature(path, which)}
    exp = {t.name: t for t in want}
    if set(got) != set(exp):
        raise InputError(f"{path.name}: {which} are {sorted(got)}, expected exactly "
                         f"{sorted(exp)}")
    for name, t in exp.items():
        g = got[name]
        if g.shape != t.shape or g.dtype != t.dtype:
            raise InputError(f"{path.name}: {which[:-1]} {name!r} is {g.dtype}{list(g.shape)}, "
                             f"expected {t.dtype}{list(t.shape)}")


def code_spec(shape: tuple[int, ...], dtype: str) -> TensorSpec:
    return TensorSpec(CODE, shape, dtype, int(np.prod(shape)) * np.dtype(dtype).itemsize)


# -- attaching ----------------------------------------------------------------------------------
def _find(bundle: Bundle, crossing: tuple[str, ...]) -> Candidate:
    for cand in bundle.candidates:
        if {t.name for t in cand.crossing} == set(crossing) and not cand.is_wearable_only:
            return cand
    raise InputError(f"no candidate of bundle {bundle.root} has the crossing set "
                     f"{sorted(crossing)} (re-split the backbone, or check the set's index)")


def _random_inputs(bundle: Bundle, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.shape).astype(t.dtype)
            if np.dtype(t.dtype).kind == "f" else np.zeros(t.shape, t.dtype)
            for t in bundle.inputs}


def attach(bundle_dir: str | Path | Bundle, set_dir: str | Path) -> Bundle:
    """Check a compressor set against a bundle, copy it in and record it (module docstring).
    Replaces compressors attached before. Returns the reloaded bundle."""
    bundle = bundle_dir if isinstance(bundle_dir, Bundle) else Bundle.load(bundle_dir)
    cset = load_set(set_dir)
    sha = sha256_file(cset.model)
    source = bundle.meta.get("source", {})
    if sha not in (bundle.model_sha256, source.get("sha256") if isinstance(source, dict)
                   else None):
        raise InputError(f"{cset.model} (sha256 {sha[:16]}) is not the model bundle "
                         f"{bundle.root} was split from: split it with `coinf split "
                         f"{cset.model} -o BUNDLE`")
    feeds = _random_inputs(bundle)
    planned: list[tuple[SetEntry, Candidate, dict[str, int]]] = []
    for e in cset.entries:
        cand = _find(bundle, e.crossing)
        code = code_spec(e.code_shape, e.code_dtype)
        _expect(e.encoder, "inputs", list(cand.crossing))
        _expect(e.encoder, "outputs", [code])
        _expect(e.decoder, "inputs", [code])
        _expect(e.decoder, "outputs", list(cand.crossing))
        planned.append((e, cand, _verify(bundle, cand, e, feeds)))
    out = bundle.root / COMPRESSORS_DIR
    if out.exists():
        shutil.rmtree(out)
    out.mkdir()
    entries = []
    for e, cand, sizes in planned:
        stem = f"{cand.id}-g{e.gamma}"
        enc, dec = f"{COMPRESSORS_DIR}/{stem}.enc.onnx", f"{COMPRESSORS_DIR}/{stem}.dec.onnx"
        shutil.copyfile(e.encoder, bundle.root / enc)
        shutil.copyfile(e.decoder, bundle.root / dec)
        digest = f"{sha256_file(e.encoder)[:16]}{sha256_file(e.decoder)[:16]}"
        entries.append(Compressor(cand.id, e.gamma, enc, dec, code_spec(e.code_shape,
                                  e.code_dtype), e.flops, e.accuracy, sizes,
                                  cset.base_accuracy["raw"], digest).to_json())
    entries.sort(key=lambda x: (x["candidate"], x["gamma"]))
    bundle.meta["compressors"] = {"format": SET_FORMAT, "source_sha256": sha,
                                  "test_set": cset.test_set,
                                  "base_accuracy": cset.base_accuracy, "entries": entries}
    bundle.save()
    return Bundle.load(bundle.root)


def _verify(bundle: Bundle, cand: Candidate, e: SetEntry, feeds: dict[str, np.ndarray]
            ) -> dict[str, int]:
    """head -> encoder -> decoder -> tail runs and gives the model's output shapes; returns
    the code's bytes per packing (raw and every packing the set lists)."""
    where = f"compressor g{e.gamma} at {cand.id}"
    try:
        if cand.head.file is None:
            crossing = {t.name: feeds[t.name] for t in cand.crossing}
        else:
            head = open_slice(bundle.path(cand.head.file))
            names = [o.name for o in head.get_outputs()]
            got = dict(zip(names, head.run(names, {i.name: feeds[i.name]
                                                   for i in head.get_inputs()}), strict=True))
            crossing = {t.name: got[t.name] if t.name in got else feeds[t.name]
                        for t in cand.crossing}
        (code,) = open_slice(e.encoder).run([CODE], crossing)
        dec = open_slice(e.decoder)
        names = [o.name for o in dec.get_outputs()]
        restored = dict(zip(names, dec.run(names, {CODE: code}), strict=True))
        assert cand.tail.file is not None
        tail = open_slice(bundle.path(cand.tail.file))
        names = [o.name for o in tail.get_outputs()]
        outs = dict(zip(names, tail.run(names, {i.name: restored[i.name]
                                                for i in tail.get_inputs()}), strict=True))
    except (InputError, BundleError):
        raise
    except Exception as exc:
        raise InputError(f"{where}: head -> encoder -> decoder -> tail does not run: "
                         f"{exc}"[:400]) from None
    for t in bundle.outputs:
        arr = outs.get(t.name)
        if arr is None or tuple(arr.shape) != t.shape or not np.all(np.isfinite(arr)):
            raise InputError(f"{where}: output {t.name!r} is "
                             f"{None if arr is None else list(arr.shape)}, expected finite "
                             f"{list(t.shape)}")
    return {spec: (int(code.nbytes) if spec == "raw" else packed_size(code, spec))
            for spec in e.accuracy}


# -- running ------------------------------------------------------------------------------------
def check_code(comp: Compressor, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
    """Tensors from the wire must be exactly ``comp``'s code (name, dtype, shape)."""
    if set(feeds) != {CODE}:
        raise ProtocolError(ErrorCode.MALFORMED, f"compressor {comp.label}: expected exactly "
                            f"one tensor {CODE!r}, got {sorted(feeds)[:8]}")
    arr = feeds[CODE]
    if tuple(arr.shape) != comp.code.shape or arr.dtype != np.dtype(comp.code.dtype):
        raise ProtocolError(ErrorCode.MALFORMED, f"compressor {comp.label}: code is "
                            f"{arr.dtype}{list(arr.shape)}, expected "
                            f"{comp.code.dtype}{list(comp.code.shape)}")
    return arr


def register_latent(bundle: Bundle, comp: Compressor) -> Any:
    """The entropy coder's table of a learned compressor's pmf file, registered by key
    (:mod:`coinf.ble_protocol.latent`); BundleError if the file is not a valid table."""
    from coinf.ble_protocol import latent
    from coinf.convert.bottleneck import Priors

    assert comp.priors is not None
    pmf = Priors.read(bundle.path(comp.priors))
    table = latent.table(pmf.offsets, pmf.freqs, pmf.precision,
                         f"{comp.candidate}/g{comp.gamma}/{comp.sha256[:16]}")
    latent.register(table)
    return table


class CodecRunner:
    """Runs a bundle's encoders and decoders (onnxruntime sessions opened once). Thread-safe."""

    def __init__(self, bundle: Bundle, sess_options: Any = None) -> None:
        self.bundle = bundle
        self.sess_options = sess_options
        self._sessions: dict[str, Any] = {}
        self._lock = threading.Lock()
        #: (cut, gamma) -> the ``latent`` packing's table of each learned compressor,
        #: registered so that a body naming it decodes (ble_protocol/latent.py)
        self.latent_tables: dict[tuple[str, int], Any] = {}
        for comp in bundle.compressors():
            if comp.kind == "learned" and comp.priors:
                self.latent_tables[(comp.candidate, comp.gamma)] = register_latent(bundle, comp)

    def _session(self, file: str) -> Any:
        with self._lock:
            sess = self._sessions.get(file)
        if sess is None:
            sess = open_slice(self.bundle.path(file), self.sess_options)
            with self._lock:
                self._sessions[file] = sess
        return sess

    def open_encoder(self, comp: Compressor) -> None:
        """Open ``comp``'s encoder session now (once per runner), so that a timed
        :meth:`encode` is the frame's work and not the one-time model load."""
        self._session(comp.encoder)

    def encode(self, comp: Compressor, tensors: Mapping[str, np.ndarray]
               ) -> dict[str, np.ndarray]:
        """The cut's crossing tensors -> ``{"code": ...}``."""
        sess = self._session(comp.encoder)
        (code,) = sess.run([CODE], {i.name: tensors[i.name] for i in sess.get_inputs()})
        return {CODE: code}

    def decode(self, comp: Compressor, feeds: Mapping[str, np.ndarray]
               ) -> dict[str, np.ndarray]:
        """``{"code": ...}`` (checked) -> the cut's crossing tensors."""
        code = check_code(comp, feeds)
        sess = self._session(comp.decoder)
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(names, {CODE: code}), strict=True))


__all__ = ["CODE", "CodecRunner", "CompressorSet", "SetEntry", "attach", "check_code",
           "code_spec", "load_set", "register_latent"]
