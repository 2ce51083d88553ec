"""Learned bottlenecks at a cut, the torch-free half (issue 42; docs/BOTTLENECK.md).

``coinf compress BUNDLE --cut CUT --data FILE_OR_DIR`` trains, for a frozen model's cut, an
encoder that runs after the head on the wearable, an integer latent with a factorized entropy
model, and a decoder before the tail on the handheld (:mod:`coinf.convert.bottleneck_train`,
torch). This module holds what needs no torch, so the runtime and the tests can read it:

* :func:`load_data`: the training/evaluation feeds, checked against the bundle's inputs (exact
  dtype, shape ``(N, *input_shape[1:])``, finite, enough of them) before any training;
* :class:`Priors`: the per-channel integer pmfs of the latent symbols, written as a JSON file
  (format ``coinf-pmf``; never pickled) that an ANS coder reads, and the rate they give;
* :func:`distill_model`: the tail whose outputs the bottleneck is trained to reproduce (a tail
  ending in the ``topk`` post-processing is distilled on the logits before TopK);
* :func:`register`: copies the encoder, decoder and pmf file into ``BUNDLE/compressors/`` and
  records them as ``kind: "learned"`` entries of the manifest's ``compressors`` section.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from coinf.convert.feeds import read_npz, stack

from coinf.bundle import COMPRESSORS_DIR, Bundle, Candidate, Compressor, TensorSpec, open_slice
from coinf.errors import BundleError, InputError

if TYPE_CHECKING:
    from onnx import ModelProto

#: fewest feeds to train on, and to evaluate on (held out)
MIN_TRAIN = 32
MIN_TEST = 8
PMF_FORMAT = "coinf-pmf"
PMF_VERSION = 1
#: the pmfs are integer frequencies summing to 2**PRECISION
PRECISION = 16
#: bytes an ANS stream adds to a frame beyond its symbols' information (its final state)
ANS_OVERHEAD = 4
MAX_SYMBOLS = 4096
CODE = "code"
Progress = Callable[[str, int, int], None]


# -- data ---------------------------------------------------------------------------------------
def _files(path: Path, flag: str) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".npz" and p.is_file())
        if not files:
            raise InputError(f"{flag} {path}: the folder holds no .npz file")
        return files
    if not path.is_file():
        raise InputError(f"{flag} {path}: no such file or folder")
    return [path]


def load_data(bundle: Bundle, source: str | Path, flag: str = "--data",
              minimum: int = 1) -> dict[str, np.ndarray]:
    """The feeds of an ``.npz`` (or every ``.npz`` of a folder, concatenated) as ``(N,
    *input_shape)`` per model input: the file's arrays are that or stacked along the input's
    batch axis, of exactly the input's dtype, finite. :class:`InputError`, one line, for
    anything else or fewer than ``minimum`` feeds."""
    out: dict[str, list[np.ndarray]] = {s.name: [] for s in bundle.inputs}
    for file in _files(Path(source), flag):
        arrays = read_npz(file, flag)
        if len(bundle.inputs) == 1 and len(arrays) == 1 and bundle.inputs[0].name not in arrays:
            arrays = {bundle.inputs[0].name: next(iter(arrays.values()))}
        for spec in bundle.inputs:
            if spec.name not in arrays:
                raise InputError(f"{flag} {file.name}: no array {spec.name!r} for model input "
                                 f"{spec.name} {spec.dtype}{list(spec.shape)}; it has "
                                 f"{sorted(arrays)[:8]}")
            arr = arrays[spec.name]
            if arr.dtype != np.dtype(spec.dtype):
                raise InputError(f"{flag} {file.name}: array {spec.name!r} is {arr.dtype}; model "
                                 f"input {spec.name!r} is {spec.dtype}{list(spec.shape)} (cast it "
                                 f"with .astype({spec.dtype!r}))")
            stacked = stack(spec.name, arr, spec, f"{flag} {file.name}")
            stacked = arr[None] if stacked is None else stacked
            if stacked.dtype.kind == "f" and not np.all(np.isfinite(stacked)):
                raise InputError(f"{flag} {file.name}: array {spec.name!r} holds NaN or inf")
            out[spec.name].append(stacked)
    feeds = {k: np.concatenate(v) for k, v in out.items()}
    counts = {len(v) for v in feeds.values()}
    if len(counts) != 1:
        raise InputError(f"{flag}: inputs hold different numbers of feeds "
                         f"{ {k: len(v) for k, v in feeds.items()} }")
    n = counts.pop()
    if n < minimum:
        raise InputError(f"{flag} {source}: {n} feed(s); a bottleneck needs at least {minimum}")
    return feeds


def split_data(feeds: Mapping[str, np.ndarray], test: Mapping[str, np.ndarray] | None,
               flag: str = "--data", tolerance_pp: float | None = None
               ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(train, test): ``test`` when given, else the last eighth of ``feeds`` held out (at least
    :data:`MIN_TEST`, and at least the inputs a ``tolerance_pp`` bound needs). One-line
    :class:`InputError` when too few feeds are left to train on or held out for the bound."""
    from coinf.convert.metrics import samples_for_bound

    need = MIN_TEST if tolerance_pp is None else max(MIN_TEST, samples_for_bound(tolerance_pp))
    why = ("to evaluate" if tolerance_pp is None else
           f"to bound the loss within {tolerance_pp:g} pp at 95 % (--tolerance)")
    n = len(next(iter(feeds.values())))
    if test is None:
        held = max(need, n // 8)
        if n - held < MIN_TRAIN:
            raise InputError(f"{flag}: {n} feeds; a bottleneck needs at least "
                             f"{MIN_TRAIN + need} ({MIN_TRAIN} to train, {need} held out "
                             f"{why}), or --test with {need} of its own")
        return ({k: v[:n - held] for k, v in feeds.items()},
                {k: v[n - held:] for k, v in feeds.items()})
    if n < MIN_TRAIN:
        raise InputError(f"{flag}: {n} feeds; a bottleneck needs at least {MIN_TRAIN} to train")
    n_test = len(next(iter(test.values())))
    if n_test < need:
        raise InputError(f"--test: {n_test} held-out feeds; a bottleneck needs at least {need} "
                         f"{why}")
    return dict(feeds), dict(test)


# -- the cut and the distillation targets -------------------------------------------------------
def check_cut(bundle: Bundle, cid: str) -> tuple[Candidate, TensorSpec]:
    """The candidate and its one crossing tensor; :class:`InputError` when a bottleneck cannot
    go there (an end of the model, several tensors, not an (N, C, L) / (N, C, H, W) float)."""
    cand = bundle.candidate(cid)
    if cand.is_handheld_only or cand.is_wearable_only:
        raise InputError(f"--cut {cid}: a bottleneck goes between a head and a tail; "
                         f"{cand.id} is {cand.label}")
    if len(cand.crossing) != 1:
        raise InputError(f"--cut {cid}: {len(cand.crossing)} tensors cross it "
                         f"({', '.join(t.name for t in cand.crossing)}); a learned bottleneck "
                         f"takes a cut with one tensor")
    t = cand.crossing[0]
    if np.dtype(t.dtype).kind != "f" or len(t.shape) not in (3, 4) or t.shape[0] != 1:
        raise InputError(f"--cut {cid}: tensor {t.name} is {t.dtype}{list(t.shape)}; a learned "
                         f"bottleneck takes a float (1, C, L) or (1, C, H, W) tensor")
    return cand, t


def pick_cuts(bundle: Bundle, n: int, max_head_share: float = 0.5) -> list[Candidate]:
    """The ``n`` cuts most worth a learned bottleneck: those :func:`check_cut` accepts whose
    head runs at most ``max_head_share`` of the model's FLOPs (the wearable's part stays
    cheap), fewest crossing bytes first (what the code must beat), then the cheaper head.
    :class:`InputError` naming why when there is none."""
    total = max(bundle.candidates[-1].head.flops, 1)
    fits, cheap = [], 0
    for cand in bundle.candidates:
        try:
            check_cut(bundle, cand.id)
        except InputError:
            continue
        if cand.head.flops <= max_head_share * total:
            cheap += 1
            fits.append(cand)
    if not fits:
        raise InputError(f"no cut takes a learned bottleneck with at most "
                         f"{100 * max_head_share:g} % of the FLOPs on the wearable: none crosses "
                         f"one float (1, C, L) or (1, C, H, W) tensor there; name one with --cut")
    fits.sort(key=lambda c: (c.crossing_bytes, c.head.flops))
    return fits[:n]


#: operators that turn a float tensor into a decision (ids, a mask): a target is read before them
DECISION_OPS = frozenset({"ArgMax", "ArgMin", "TopK", "Cast", "Greater", "GreaterOrEqual", "Less",
                          "LessOrEqual", "Equal", "Not"})


def distill_model(bundle: Bundle, cand: Candidate) -> tuple[ModelProto, list[str]]:
    """The tail as an ONNX model whose outputs are the float targets to distil, and their
    names: every output the app consumes, each read where it is still a float the decision is
    made from. An output of ``--post`` processing (convert/post.py: ``argmax``, ``topk:K``,
    ``mask:K``, ``boxes:K``) is replaced by the model output it processed (the logits, the
    probability map, the detector's raw anchors); any other integer output by the float tensor
    its decision operators (:data:`DECISION_OPS`) read; outputs with no float source are
    dropped."""
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    assert cand.tail.file is not None
    model = onnx.load(str(bundle.path(cand.tail.file)))
    made_by = {o: n for n in model.graph.node for o in n.output}
    typed = onnx.shape_inference.infer_shapes(model).graph  # the intermediates' types
    types = {v.name: v.type.tensor_type.elem_type for v in
             [*typed.value_info, *typed.output, *typed.input]}
    post = bundle.meta.get("post")
    processed = post.get("output") if isinstance(post, dict) else None

    def is_float(name: str, default: int) -> bool:
        return np.dtype(tensor_dtype_to_np_dtype(types.get(name, default))).kind == "f"

    targets: list[str] = []
    for out in model.graph.output:
        name = out.name
        if isinstance(processed, str) and name.startswith(f"{processed}_") \
                and processed in made_by:
            name = processed
        node = made_by.get(name)
        for _ in range(8):  # walk back over a short decision chain to its float input
            if node is None or node.op_type not in DECISION_OPS or (
                    node.op_type != "TopK" and is_float(name, out.type.tensor_type.elem_type)):
                break
            name = node.input[0]
            node = made_by.get(name)
        elem = types.get(name, out.type.tensor_type.elem_type)
        if name not in targets and np.dtype(tensor_dtype_to_np_dtype(elem)).kind == "f":
            targets.append(name)
    if not targets:
        raise InputError(f"cut {cand.id}: the tail has no float output to distil")
    inputs = [i.name for i in model.graph.input
              if i.name not in {t.name for t in model.graph.initializer}]
    sub = onnx.utils.Extractor(model).extract_model(inputs, targets)
    return sub, targets


#: what makes the scores of K classes (a 2-D target from one of these, over reshapes, is
#: distilled as a classifier's)
CLASSIFIER_OPS = frozenset({"Gemm", "MatMul", "Add", "Softmax", "LogSoftmax"})
_RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Identity", "Cast"})


def target_kinds(arrays: Sequence[np.ndarray], model: ModelProto | None = None) -> list[str]:
    """``kl`` for a (N, K) classifier output with K > 1 (distilled with a KL divergence and
    scored by top-1 agreement), ``mse`` otherwise. With the targets' ``model`` (outputs in the
    order of ``arrays``) a classifier's must also come from :data:`CLASSIFIER_OPS`: a (N, K)
    series such as a pitch track over K frames (``Exp``, ``Where``) is ``mse``."""
    made = {} if model is None else {o: n for n in model.graph.node for o in n.output}
    names = [] if model is None else [o.name for o in model.graph.output]

    def scores(k: int) -> bool:
        if model is None:
            return True
        node = made.get(names[k]) if k < len(names) else None
        while node is not None and node.op_type in _RESHAPES and node.input:
            node = made.get(node.input[0])
        return node is not None and node.op_type in CLASSIFIER_OPS
    return ["kl" if a.ndim == 2 and a.shape[1] > 1 and scores(k) else "mse"
            for k, a in enumerate(arrays)]


def run_slices(bundle: Bundle, cand: Candidate, tail: ModelProto, feeds: Mapping[str, np.ndarray],
               progress: Progress | None = None, stage: str = "features"
               ) -> tuple[np.ndarray, list[np.ndarray]]:
    """The crossing tensor ``(N, C, ...)`` (the head in onnxruntime) and the distillation
    targets (the original model's: ``tail`` on the head's output), one feed at a time."""
    import onnxruntime as ort

    assert cand.head.file is not None
    head = open_slice(bundle.path(cand.head.file))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3  # a re-targeted tail leaves unused initializers: no warnings
    tsess = ort.InferenceSession(tail.SerializeToString(), opts,
                                 providers=["CPUExecutionProvider"])
    name = cand.crossing[0].name
    head_in = [i.name for i in head.get_inputs()]
    n = len(next(iter(feeds.values())))
    crossing, outs = [], []
    for i in range(n):
        (x,) = head.run([name], {k: feeds[k][i] for k in head_in})
        crossing.append(x)
        outs.append(tsess.run(None, {name: x}))
        if progress is not None:
            progress(stage, i + 1, n)
    return np.concatenate(crossing), [np.concatenate(o) for o in zip(*outs, strict=True)]


def onnx_flops(path: Path) -> int:
    """FLOPs of an ONNX model by the bundle's own cost model (convert/cost.py), so an
    encoder's figure adds to its head's."""
    from coinf.convert.cost import all_costs
    from coinf.convert.graph import load_graph

    return sum(c.flops for c in all_costs(load_graph(path)))


def score(outs: Sequence[np.ndarray], refs: Sequence[np.ndarray],
          model: ModelProto | None = None) -> float:
    """Agreement with the original model in [0, 1]: top-1 agreement of the first classifier
    target (``kl`` kind), else 1 - the mean normalised squared error of the targets (>= 0)."""
    kinds = target_kinds(refs, model)
    for out, ref, kind in zip(outs, refs, kinds, strict=True):
        if kind == "kl":
            return float(np.mean(np.argmax(out, -1) == np.argmax(ref, -1)))
    nmse = [float(np.mean((o - r) ** 2) / max(float(np.var(r)), 1e-12))
            for o, r in zip(outs, refs, strict=True)]
    return max(0.0, 1.0 - float(np.mean(nmse)))


# -- the entropy model's tables -----------------------------------------------------------------
@dataclass(frozen=True)
class Priors:
    """Per latent channel c, integer frequencies of the symbols ``offsets[c] ..
    offsets[c] + len(freqs[c]) - 1``, each >= 1, summing to ``2**precision``."""

    offsets: tuple[int, ...]
    freqs: tuple[tuple[int, ...], ...]
    precision: int = PRECISION

    @classmethod
    def from_pmf(cls, pmf: Sequence[np.ndarray] | np.ndarray, offsets: Sequence[int],
                 precision: int = PRECISION) -> Priors:
        """Quantise probabilities (C rows, each over its channel's range; the tails beyond the
        range fold into its end symbols) to frequencies: every symbol keeps at least 1."""
        total = 1 << precision
        out = []
        for row in pmf:
            p = np.asarray(row, np.float64)
            p = np.maximum(p, 0) / max(float(p.sum()), 1e-300)
            f = np.maximum(1, np.floor(p * (total - len(p))).astype(np.int64) + 1)
            f[int(np.argmax(f))] += total - int(f.sum())  # exact sum; the mode absorbs it
            if f.min() < 1:
                raise ValueError("a pmf too wide for the precision")
            out.append(tuple(int(v) for v in f))
        return cls(tuple(int(o) for o in offsets), tuple(out), precision)

    @property
    def lo(self) -> np.ndarray:
        return np.asarray(self.offsets, np.int64)

    @property
    def hi(self) -> np.ndarray:
        return np.asarray([o + len(f) - 1 for o, f in zip(self.offsets, self.freqs,
                                                          strict=True)], np.int64)

    def bits(self, symbols: np.ndarray) -> np.ndarray:
        """Information in bits of each sample of integer symbols ``(N, C, ...)`` (clipped to
        the tables' ranges, as the encoder clips): what an ANS coder spends, within ~1 %."""
        sym = np.rint(symbols).astype(np.int64)
        n, c = sym.shape[:2]
        if c != len(self.offsets):
            raise InputError(f"symbols have {c} channels; the priors {len(self.offsets)}")
        total = np.zeros(n)
        for ch in range(c):
            logf = np.log2(np.asarray(self.freqs[ch], np.float64))
            idx = np.clip(sym[:, ch], self.lo[ch], self.hi[ch]) - self.offsets[ch]
            total += (self.precision - logf[idx]).reshape(n, -1).sum(1)
        return total

    def frame_bytes(self, symbols: np.ndarray) -> np.ndarray:
        """Estimated entropy-coded bytes per sample (bits / 8 plus the ANS state)."""
        return np.ceil(self.bits(symbols) / 8) + ANS_OVERHEAD

    def to_json(self, shape: Sequence[int]) -> dict[str, Any]:
        return {"format": PMF_FORMAT, "version": PMF_VERSION, "tensor": CODE,
                "shape": [int(d) for d in shape], "channel_axis": 1,
                "precision": self.precision,
                "channels": [{"offset": o, "freq": list(f)}
                             for o, f in zip(self.offsets, self.freqs, strict=True)]}

    @classmethod
    def from_json(cls, obj: Any, where: str = "pmf") -> Priors:
        """Validate every field; :class:`BundleError` naming the bad one."""
        if not isinstance(obj, dict) or obj.get("format") != PMF_FORMAT:
            raise BundleError(f"{where}: not a {PMF_FORMAT} file")
        if obj.get("version") != PMF_VERSION:
            raise BundleError(f"{where}: version {obj.get('version')!r}, expected {PMF_VERSION}")
        prec = obj.get("precision")
        if not isinstance(prec, int) or isinstance(prec, bool) or not 8 <= prec <= 24:
            raise BundleError(f"{where}: precision must be an integer in 8..24, got {prec!r}")
        chans = obj.get("channels")
        if not isinstance(chans, list) or not chans:
            raise BundleError(f"{where}: channels must be a non-empty list")
        offsets, freqs = [], []
        for i, ch in enumerate(chans):
            off, f = (ch.get("offset"), ch.get("freq")) if isinstance(ch, dict) else (None, None)
            if (not isinstance(off, int) or isinstance(off, bool) or not isinstance(f, list)
                    or not 1 <= len(f) <= MAX_SYMBOLS
                    or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                               for v in f) or sum(f) != 1 << prec):
                raise BundleError(f"{where}: channels[{i}] must have an integer offset and 1.."
                                  f"{MAX_SYMBOLS} frequencies >= 1 summing to 2**{prec}")
            offsets.append(off)
            freqs.append(tuple(f))
        return cls(tuple(offsets), tuple(freqs), prec)

    @classmethod
    def read(cls, path: str | Path) -> Priors:
        try:
            obj = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BundleError(f"{path}: not a readable {PMF_FORMAT} file: {exc}") from None
        return cls.from_json(obj, str(path))


# -- the bundle ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Trained:
    """One operating point, exported (by bottleneck_train) and measured on the held-out feeds."""

    lam: float
    encoder: Path
    decoder: Path
    priors: Path
    code_shape: tuple[int, ...]
    flops: int
    agreement: float
    mean_bytes: float
    test_feeds: int
    #: the ``latent`` packing measured on the held-out codes: mean bytes per frame (header
    #: included) and median (encode ms, decode ms) of the entropy coder on this machine
    latent_bytes: float | None = None
    latent_ms: tuple[float, float] | None = None
    #: the latent's initial scale it was trained from (its files are named for it unless 16)
    gain: float = 16.0
    #: the calibrated task metric's mean loss against the unpacked model on the held-out feeds,
    #: pp (:func:`coinf.convert.bottleneck_rate.task_loss`); None for a bundle never calibrated
    task_loss_pp: float | None = None

    @property
    def stem(self) -> str:
        return point_stem(self.lam, self.gain)


def point_stem(lam: float, gain: float) -> str:
    """A point's name among a cut's: its lambda, and its gain when not the default 16."""
    return f"lam{lam:g}" + ("" if gain == 16.0 else f"-gain{gain:g}")


def _ort(path: Path | bytes) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(path if isinstance(path, bytes) else str(path), opts,
                                providers=["CPUExecutionProvider"])


def evaluate(enc: Path, dec: Path, tail: ModelProto, priors: Priors, crossing: np.ndarray,
             targets: Sequence[np.ndarray], restored: list[np.ndarray] | None = None
             ) -> tuple[float, float, np.ndarray]:
    """(agreement with the original model, mean estimated bytes per frame, codes) of the
    exported encoder and decoder in onnxruntime on held-out crossing tensors; each frame's
    reconstruction is appended to ``restored`` when given."""
    e, d, t = _ort(enc), _ort(dec), _ort(tail.SerializeToString())
    name = e.get_inputs()[0].name
    codes, outs = [], []
    for i in range(len(crossing)):
        (code,) = e.run([CODE], {name: crossing[i:i + 1]})
        (back,) = d.run(None, {CODE: code})
        codes.append(code)
        outs.append(t.run(None, {name: back}))
        if restored is not None:
            restored.append(back)
    code_all = np.concatenate(codes)
    got = [np.concatenate(o) for o in zip(*outs, strict=True)]
    return score(got, targets, tail), float(priors.frame_bytes(code_all).mean()), code_all


def remeasure(bundle: Bundle, cid: str, test: Mapping[str, np.ndarray],
              progress: Progress | None = None) -> list[Trained]:
    """Measure every learned entry at cut ``cid`` again on the held-out feeds ``test`` (no
    training, no torch) and rewrite its agreement, bytes, coder times and ``test_feeds`` in the
    manifest; its files, id (``gamma``) and digest stay. Returns the points as measured."""
    from coinf.convert.bottleneck_rate import answers, task_loss

    cand, _ = check_cut(bundle, cid)
    sect = bundle.meta.get("compressors")
    entries = [e for e in (sect.get("entries", []) if isinstance(sect, dict) else [])
               if e.get("kind") == "learned" and e.get("candidate") == cid]
    if not entries:
        raise InputError(f"--cut {cid}: the bundle has no learned bottleneck there to "
                         f"measure (train one with --data)")
    tail, _ = distill_model(bundle, cand)
    x_te, t_te = run_slices(bundle, cand, tail, test, progress, "features (test)")
    refs = answers(bundle, cand, x_te)
    points = []
    for e in entries:
        enc, dec, pmf = (bundle.path(e["encoder"]), bundle.path(e["decoder"]),
                         bundle.path(e["priors"]))
        priors = Priors.read(pmf)
        restored: list[np.ndarray] = []
        agree, mean_bytes, codes = evaluate(enc, dec, tail, priors, x_te, t_te, restored)
        loss = task_loss(bundle, cand, refs, np.concatenate(restored))
        latent_bytes, latent_ms = measure_latent(priors, codes)
        e["accuracy"] = {"raw": round(agree, 6), "latent": round(agree, 6)}
        e["code_bytes"] = {**e.get("code_bytes", {}), "latent": round(latent_bytes)}
        e["code_ms"] = {"latent": [round(v, 3) for v in latent_ms]}
        e["rate_bytes"] = round(mean_bytes, 1)
        e["test_feeds"] = len(x_te)
        points.append(Trained(float(e["lambda"]), enc, dec, pmf, (1, *codes.shape[1:]),
                              int(e.get("flops", 0)), agree, mean_bytes, len(x_te),
                              latent_bytes, latent_ms, float(e.get("gain", 16.0)), loss))
    bundle.save()
    Bundle.load(bundle.root)  # the rewritten manifest still loads
    return points


def measure_latent(priors: Priors, codes: np.ndarray) -> tuple[float, tuple[float, float]]:
    """Pack every code ``(N, C, ...)`` with the run-time ``latent`` packing (the rANS coder of
    ``ble_protocol/entropy.py`` under these tables), check it decodes exactly, and return
    (mean packed bytes, (median encode ms, median decode ms))."""
    import time

    from coinf.ble_protocol import latent
    from coinf.ble_protocol.packing import PackSpec, pack, unpack

    table = latent.table(priors.offsets, priors.freqs, priors.precision, "measure")
    latent.register(table)
    spec = PackSpec("latent", priors=table)
    sizes, enc, dec = [], [], []
    for i in range(len(codes)):
        x = np.ascontiguousarray(codes[i:i + 1], np.float32)
        t0 = time.perf_counter()
        body = pack(x, spec)
        t1 = time.perf_counter()
        y = unpack(body, max_bytes=x.nbytes)
        dec.append((time.perf_counter() - t1) * 1e3)
        enc.append((t1 - t0) * 1e3)
        if not np.array_equal(x, y):
            raise RuntimeError("the latent packing did not round-trip a code exactly")
        sizes.append(len(body))
    return float(np.mean(sizes)), (float(np.median(enc)), float(np.median(dec)))


def _sha(*paths: Path) -> str:
    return "".join(hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in paths)[:48]


def _gamma(cand: Candidate, mean_bytes: float, taken: set[int]) -> int:
    """The entry's id at its cut: the compression ratio (crossing bytes over the estimated
    coded bytes), rounded into 2..255 (a request hop's gamma is one byte, docs/PROTOCOL.md
    §6.9) and made unique there."""
    g = min(255, max(2, round(cand.crossing_bytes / max(mean_bytes, 1.0))))
    while g in taken:
        g = g - 1 if g > 2 else max(taken) + 1
    if g > 255:
        raise InputError(f"cut {cand.id}: no free compressor id left")
    return g


def register(bundle: Bundle, cand: Candidate, points: Sequence[Trained]) -> Bundle:
    """Copy each point's files into ``BUNDLE/compressors/`` and record it as a ``learned``
    entry (replacing a learned entry of the same cut, lambda and gain: the same files).
    Returns the reloaded bundle."""
    sect = bundle.meta.get("compressors")
    if not isinstance(sect, dict):
        sect = {"format": 1, "base_accuracy": {"raw": 1.0}, "entries": []}
    encoders = {f"{COMPRESSORS_DIR}/{cand.id}-{p.stem}.enc.onnx" for p in points}
    entries = [e for e in sect.get("entries", []) if not (
        e.get("kind") == "learned" and e.get("candidate") == cand.id
        and e.get("encoder") in encoders)]
    taken = {int(e["gamma"]) for e in entries if e.get("candidate") == cand.id}
    (bundle.root / COMPRESSORS_DIR).mkdir(exist_ok=True)
    for p in points:
        stem = f"{cand.id}-{p.stem}"
        files = {}
        for src, ext in ((p.encoder, "enc.onnx"), (p.decoder, "dec.onnx"), (p.priors, "pmf.json")):
            rel = f"{COMPRESSORS_DIR}/{stem}.{ext}"
            if src.resolve() != (bundle.root / rel).resolve():
                shutil.copyfile(src, bundle.root / rel)
            files[ext] = rel
        gamma = _gamma(cand, p.mean_bytes, taken)
        taken.add(gamma)
        shape = tuple(p.code_shape)
        code = TensorSpec(CODE, shape, "float32", int(np.prod(shape)) * 4)
        accuracy, sizes = {"raw": round(p.agreement, 6)}, {"raw": code.nbytes}
        times = {}
        if p.latent_bytes is not None:  # the code exactly, entropy-coded: the same agreement
            accuracy["latent"], sizes["latent"] = accuracy["raw"], round(p.latent_bytes)
            if p.latent_ms is not None:
                times["latent"] = p.latent_ms
        comp = Compressor(cand.id, gamma, files["enc.onnx"], files["dec.onnx"], code, p.flops,
                          accuracy, sizes, 1.0,
                          _sha(*(bundle.root / f for f in files.values())), kind="learned",
                          lam=p.lam, priors=files["pmf.json"],
                          rate_bytes=round(p.mean_bytes, 1), test_feeds=p.test_feeds,
                          code_ms=times)
        entries.append(comp.to_json())
    entries.sort(key=lambda e: (e["candidate"], e["gamma"]))
    sect["entries"] = entries
    bundle.meta["compressors"] = sect
    bundle.save()
    return Bundle.load(bundle.root)


def lambda_label(lam: float) -> str:
    if not math.isfinite(lam) or lam < 0:
        raise InputError(f"--lambda must be a finite number >= 0, got {lam}")
    return f"{lam:g}"


__all__ = ["ANS_OVERHEAD", "CLASSIFIER_OPS", "CODE", "MIN_TEST", "MIN_TRAIN", "PRECISION",
           "Priors", "Trained", "check_cut", "distill_model", "load_data",
           "measure_latent", "onnx_flops", "pick_cuts", "point_stem", "register", "run_slices",
           "score", "split_data", "target_kinds"]
