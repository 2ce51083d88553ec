"""Training data for the in-context slice predictor (:mod:`.slicetrain`) from real models: each
model's in-context node times (:mod:`coinf.device.incontext`) and its bundle's measured slice
times, cached as JSON per model; the synthetic networks' labels; and the leave-one-model-out
score of the zoo with the measurement's own repeatability (:func:`repeatability`) beside it.

Everything here runs at ``ORT_ENABLE_ALL`` with one intra-op thread -- what a Session runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import onnx
from coinf.device.features import LINEAR_FEATURES, TREE_FEATURES, NodeFeatures
from coinf.device.incontext import model_features, profile_in_context
from coinf.device.slicepred import group_of
from coinf.device.sweep import SLICE_STAT, summarize
from coinf.research.slicetrain import NodeSample, Relabel, SliceSample, train_slice_predictor

CACHE_FORMAT = "coinf-context-timings"
#: 2: trimmed-mean node times, optimized-graph kernels per slice; 3: rounds; 4: each round
#: runs a slice for at least ``sweep.SLICE_MIN_S``; 5: a round's time and a slice's are the
#: fastest run (``sweep.SLICE_STAT``)
CACHE_VERSION = 5
SYNTHETIC_FORMAT = "coinf-synthetic-timings-1"
#: 2: each part timed for SLICE_MIN_S; 3: its fastest run (SLICE_STAT); 4: the passes it holds
PARTS_FORMAT = "coinf-synthetic-parts-4"
#: the prior weight of :func:`~coinf.research.partlabels.decompose`, for the zoo's slices and
#: the synthetic networks' parts alike (0.03 and 0.1 for the parts scored lower:
#: git history of docs/BENCHMARKS.md, `bench predict`)
PRIOR_WEIGHT = 0.3
#: networks of the other families (:func:`~coinf.research.context_sweep.network`) trained on
#: next to the mixed ones: without ``small`` LeNet and SENNA were predicted 21-47 % high, without
#: ``gated`` and ``mobile`` WaveNet's and MobileNetV2's slices 6-10 % low (docs/BENCHMARKS.md
#: git history of docs/BENCHMARKS.md, `bench predict`)
FAMILY_NETWORKS: Mapping[str, int] = {"small": 100, "gated": 60, "mobile": 30}
Features = dict[str, tuple[NodeFeatures, str]]
T = TypeVar("T")


def slice_time_of(times: Sequence[float]) -> float:
    """One slice's time over several rounds or passes of
    :func:`~coinf.device.sweep.time_slice`: their :data:`~coinf.device.sweep.SLICE_STAT`."""
    return summarize(times, SLICE_STAT)


def _slice_from_json(model: str, d: Mapping[str, Any]) -> SliceSample:
    return SliceSample(model, str(d["slice"]), tuple(str(n) for n in d["nodes"]),
                       int(d["kernels"]), float(d["boundary_mbytes"]), float(d["ms"]),
                       int(d["reorders"]), float(d["reorder_melems"]))


def _slice_json(s: SliceSample) -> dict[str, Any]:
    return {"model": s.model, "slice": s.slice, "nodes": list(s.nodes), "kernels": s.kernels,
            "boundary_mbytes": s.boundary_melems, "ms": s.ms, "reorders": s.reorders,
            "reorder_melems": s.reorder_melems}


def boundary_mbytes(bundle: Any, cand: Any, side: str) -> float:
    """MB entering and leaving one side of a cut (the layout reorders scale with it)."""
    crossing = sum(t.nbytes for t in cand.crossing)
    if side == "head":
        return (sum(t.nbytes for t in bundle.inputs) + crossing) / 1e6
    return (crossing + sum(t.nbytes for t in bundle.outputs)) / 1e6


@dataclass
class ModelTimings:
    """One model's cached timings."""

    model: str
    sha256: str
    nodes: dict[str, float]
    slices: list[dict[str, Any]]
    run_ms: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"format": CACHE_FORMAT, "version": CACHE_VERSION, "model": self.model,
                "sha256": self.sha256, "nodes": self.nodes, "slices": self.slices,
                "run_ms": self.run_ms}

    def slice_samples(self) -> list[SliceSample]:
        """Every timed slice with its optimized-graph counts."""
        return [_slice_from_json(self.model, s) for s in self.slices]

    @classmethod
    def from_json(cls, obj: Any) -> ModelTimings:
        if not isinstance(obj, dict) or obj.get("format") != CACHE_FORMAT or \
                obj.get("version") != CACHE_VERSION:
            raise ValueError("not a coinf context-timings cache")
        return cls(str(obj["model"]), str(obj["sha256"]),
                   {str(k): float(v) for k, v in obj["nodes"].items()},
                   list(obj["slices"]), float(obj.get("run_ms", 0.0)))


#: zoo slices are timed in this many rounds over every slice of every model being measured (a
#: fresh session each); a slice keeps the fastest of its rounds (``sweep.SLICE_STAT``) and every
#: round's time. The
#: machine here is shared: a burst of contention slowed four successive LSTM slices by 12-16 %
#: in one round of three, and its speed drifts by 3-40 % over tens of minutes, so models timed
#: one after another saw different machines (git history of docs/BENCHMARKS.md, `bench predict`).
SLICE_ROUNDS = 6


def _slice_specs(bundle: Any, threads: int) -> list[dict[str, Any]]:
    """Every head and tail slice of ``bundle`` with its optimized-graph counts and file."""
    from coinf.research.ortkernels import kernels

    specs = []
    for cand in bundle.candidates:
        for side, part in (("head", cand.head), ("tail", cand.tail)):
            if part.file is None or not part.nodes:
                continue
            path = str(bundle.path(part.file))
            k = kernels(path, threads)
            specs.append({"slice": f"{cand.id}.{side}", "nodes": list(part.nodes),
                          "boundary_mbytes": boundary_mbytes(bundle, cand, side),
                          "path": path, "kernels": k.count, "reorders": k.reorders,
                          "reorder_melems": k.reorder_melems})
    return specs


def interleaved(per_model: Sequence[Sequence[T]], rounds: int) -> list[list[T]]:
    """The timing order of each round: the models' slices taken in turn (first slice of each
    model, then the second, ...), forwards in even rounds and backwards in odd ones, so every
    model sees the same stretches of the machine and a drift within a round cancels between
    rounds."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    longest = max((len(s) for s in per_model), default=0)
    order = [s[i] for i in range(longest) for s in per_model if i < len(s)]
    return [order if r % 2 == 0 else order[::-1] for r in range(rounds)]


def measure_models(bundles: Mapping[str, Any], repeats: int = 25, threads: int = 1,
                   progress: Callable[[str], None] | None = None,
                   sha256: Mapping[str, str] | None = None,
                   rounds: int = SLICE_ROUNDS) -> dict[str, ModelTimings]:
    """Profile each bundle's whole model in context, then time every head and tail slice of
    every bundle together (per round, the :data:`~coinf.device.sweep.SLICE_STAT` of at least
    ``repeats`` runs filling :data:`~coinf.device.sweep.SLICE_MIN_S`; ``rounds`` rounds in the
    order of :func:`interleaved`). A slice keeps the same statistic over its rounds (``ms``)
    and each round's time (``rounds_ms``, what :func:`repeatability` reads)."""
    from coinf.device.sweep import make_session, random_feeds, time_slice

    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    profiles = {n: profile_in_context(b.model_path, "all", threads, 3, repeats)
                for n, b in bundles.items()}
    specs = {n: _slice_specs(b, threads) for n, b in bundles.items()}
    times: dict[int, list[float]] = {id(s): [] for ss in specs.values() for s in ss}
    for r, order in enumerate(interleaved(list(specs.values()), rounds)):
        for s in order:
            sess = make_session(str(s["path"]), threads)
            times[id(s)].append(time_slice(sess, random_feeds(sess), 3, repeats, 2.0))
        if progress and len(bundles) > 1:
            progress(f"slices of {len(bundles)} models timed: round {r + 1}/{rounds}")
    out = {}
    for n, ss in specs.items():
        for s in ss:
            got = times[id(s)]
            del s["path"]
            s["ms"], s["rounds_ms"] = slice_time_of(got), got
        if progress:
            progress(f"{n}: {len(profiles[n].nodes)} anchors profiled in context, "
                     f"{len(ss)} slices timed in {rounds} rounds")
        out[n] = ModelTimings(n, (sha256 or {}).get(n) or bundles[n].model_sha256,
                              profiles[n].nodes, ss, profiles[n].run_ms)
    return out


def measure_model(name: str, bundle: Any, repeats: int = 25, threads: int = 1,
                  progress: Callable[[str], None] | None = None, sha256: str = "",
                  rounds: int = SLICE_ROUNDS) -> ModelTimings:
    """:func:`measure_models` of one bundle."""
    return measure_models({name: bundle}, repeats, threads, progress,
                          {name: sha256} if sha256 else None, rounds)[name]


def half_rounds(t: ModelTimings) -> list[tuple[str, float, float]] | None:
    """Per slice: its even rounds and its odd rounds, each summarized as a slice's rounds are
    (:data:`~coinf.device.sweep.SLICE_STAT`): two independent measurements of it; None for a
    cache without two rounds per slice."""
    out = []
    for s in t.slices:
        got = [float(v) for v in s.get("rounds_ms") or []]
        if len(got) < 2:
            return None
        out.append((str(s["slice"]), slice_time_of(got[0::2]), slice_time_of(got[1::2])))
    return out


def repeatability(t: ModelTimings, tol: float = 0.10) -> float | None:
    """How often the two halves of a slice's rounds (:func:`half_rounds`) agree within
    ``tol``: how well this machine repeats the measurement the model's slices are scored
    against (a ceiling for any predictor's within-10 % score; conservative, as each half has
    half the rounds). None for a cache without two rounds per slice."""
    halves = half_rounds(t)
    ok = [abs(a / b - 1.0) <= tol for _, a, b in halves or [] if b > 0]
    return sum(ok) / len(ok) if ok else None


def samples(timings: Mapping[str, ModelTimings], models: Mapping[str, onnx.ModelProto],
            ) -> tuple[list[NodeSample], list[SliceSample], dict[str, Features]]:
    """Node and slice samples of every model, and each model's anchor features."""
    feats = {m: model_features(models[m]) for m in timings}
    nodes: list[NodeSample] = []
    slices: list[SliceSample] = []
    for m, t in timings.items():
        fm = feats[m]
        nodes += [NodeSample(m, fm[n][0], fm[n][1], ms) for n, ms in t.nodes.items() if n in fm]
        slices += t.slice_samples()
    return nodes, slices, feats


def load_or_measure(names: Iterable[str], cache_dir: Path, repeats: int = 25,
                    progress: Callable[[str], None] | None = None) -> dict[str, ModelTimings]:
    """Timings of the zoo models ``names``: each read from ``cache_dir`` if it matches the
    model's file; the others split (into ``cache_dir/<name>``) and measured together
    (:func:`measure_models`: their slices interleaved round by round)."""
    from coinf.convert.split import split_model
    from coinf.models import zoo

    from coinf.bundle import MANIFEST, Bundle, sha256_file

    out: dict[str, ModelTimings] = {}
    todo: dict[str, Any] = {}
    shas: dict[str, str] = {}
    for name in names:
        model_path = zoo.committed_path(name)
        shas[name] = sha = sha256_file(model_path)
        cache = cache_dir / f"{name}.timings.json"
        if cache.is_file():
            try:
                t = ModelTimings.from_json(json.loads(cache.read_text()))
                if t.sha256 == sha:
                    out[name] = t
                    continue
            except (ValueError, KeyError, TypeError):
                pass
        folder = cache_dir / name
        bundle = None
        if (folder / MANIFEST).is_file():
            b = Bundle.load(folder)
            if b.meta.get("source", {}).get("sha256") == sha:
                bundle = b
        todo[name] = bundle or split_model(model_path, folder, force=True)
    if todo:
        measured = measure_models(todo, repeats, progress=progress, sha256=shas)
        cache_dir.mkdir(parents=True, exist_ok=True)
        for name, t in measured.items():
            (cache_dir / f"{name}.timings.json").write_text(json.dumps(t.to_json()) + "\n")
        out.update(measured)
    return {n: out[n] for n in names}


def _node_json(s: NodeSample) -> dict[str, Any]:
    f = s.features
    return {"name": f.name, "op_type": f.op_type, "kind": f.kind, "tree": list(f.tree),
            "linear": list(f.linear), "flops": f.flops, "group": s.group, "ms": s.ms}


def _node_from_json(model: str, d: Mapping[str, Any]) -> NodeSample:
    f = NodeFeatures(str(d["name"]), str(d["op_type"]), str(d["kind"]),
                     tuple(float(v) for v in d["tree"]), tuple(float(v) for v in d["linear"]),
                     float(d["flops"]))
    if len(f.tree) != len(TREE_FEATURES) or len(f.linear) != len(LINEAR_FEATURES):
        raise ValueError("cached node features of the wrong length")
    return NodeSample(model, f, str(d.get("group") or group_of(f)), float(d["ms"]))


def sweep_samples(cache_dir: Path, scale: float = 0.2, seed: int = 0, threads: int = 1,
                  progress: Callable[[str], None] | None = None) -> list[NodeSample]:
    """The single-layer sweep (:mod:`coinf.device.sweep`) as out-of-context node samples, cached."""
    from coinf.device.sweep import run_sweep

    cache = cache_dir / f"sweep-{scale:g}-{seed}-{threads}.json"
    if cache.is_file():
        try:
            obj = json.loads(cache.read_text())
            return [_node_from_json("sweep", d) for d in obj["samples"]]
        except (ValueError, KeyError, TypeError):
            pass
    found, _ = run_sweep(scale, seed, threads, 5, progress)
    out = [NodeSample("sweep", s.features, group_of(s.features), s.ms) for s in found]
    cache_dir.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"samples": [_node_json(s) for s in out]}) + "\n")
    return out


def _cache_obj(path: Path, fmt: str, digest: str) -> dict[str, Any] | None:
    """A cache file of format ``fmt`` made from the networks of ``digest``, else None."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(obj, dict) and obj.get("format") == fmt and obj.get("networks") == digest
    return obj if ok else None


def _cache_rows(obj: dict[str, Any] | None, key: str,
                parse: Callable[[Mapping[str, Any]], T]) -> list[T] | None:
    """The rows under ``key`` of a cache file read by :func:`_cache_obj`, each read by
    ``parse``; None if there is no file or it holds a malformed row."""
    try:
        return [parse(d) for d in obj[key]] if obj is not None else None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _write_cache(path: Path, fmt: str, digest: str, key: str, rows: list[Any],
                 **extra: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": fmt, "networks": digest, key: rows, **extra}) + "\n")


def _networks_digest(count: int, seed: int, family: str = "mixed") -> str:
    """sha256 of the first synthetic networks' bytes: a change to the generators shows."""
    import hashlib

    from coinf.research.context_sweep import network

    return hashlib.sha256(b"".join(network(i, seed, family).SerializeToString()
                                   for i in range(min(count, 4)))).hexdigest()


def _cache_stem(family: str) -> str:
    return "synthetic" if family == "mixed" else f"synthetic-{family}"


def synthetic_samples(cache_dir: Path, count: int, seed: int = 0, threads: int = 1,
                      repeats: int = 10, fresh: bool = False,
                      progress: Callable[[str], None] | None = None,
                      family: str = "mixed") -> list[NodeSample]:
    """:func:`~coinf.research.context_sweep.run_context_sweep` of ``count`` synthetic networks
    of ``family``, cached in ``cache_dir`` so that runs on one cache train on the same labels
    (profiling them again moves a held-out model's score by up to 0.7, git history of
    docs/BENCHMARKS.md). The cache is keyed by the arguments and by the first networks' bytes (a
    change to the generators invalidates it); ``fresh`` profiles them again and replaces it."""
    from coinf.research.context_sweep import run_context_sweep

    if count <= 0:
        return []
    digest = _networks_digest(count, seed, family)
    cache = cache_dir / f"{_cache_stem(family)}-{count}-{seed}-{threads}-{repeats}.json"
    got = None if fresh else _cache_rows(_cache_obj(cache, SYNTHETIC_FORMAT, digest), "samples",
                                         lambda d: _node_from_json(str(d["model"]), d))
    if got is not None:
        return _featured(got, count, seed, family)
    out = run_context_sweep(count, seed, threads, repeats, progress, family)
    _write_cache(cache, SYNTHETIC_FORMAT, digest, "samples",
                 [{"model": s.model, **_node_json(s)} for s in out])
    return out


def _featured(rows: list[NodeSample], count: int, seed: int, family: str) -> list[NodeSample]:
    """Cached samples with their features and groups computed anew from the regenerated
    networks (the cache keeps measurements; features follow the code that reads them, e.g. a
    residual Add now known to run inside its convolution). A row whose node is no longer an
    anchor is dropped."""
    from coinf.research.context_sweep import model_name, network

    feats = {model_name(i, family): model_features(network(i, seed, family))
             for i in range(count)}
    return [NodeSample(s.model, *feats[s.model][s.features.name], s.ms) for s in rows
            if s.features.name in feats.get(s.model, {})]


#: passes over every synthetic family's parts (a part keeps its fastest) and runs per pass. A
#: tiny part's speed here moves by tens of per cent over minutes; the fastest of 1, 2 and 4-5
#: passes taken hours apart scored within_10pct 0.58-0.63, 0.67-0.68 and 0.73-0.78
#: (git history of docs/BENCHMARKS.md, `bench predict`).
PART_PASSES, PART_REPEATS = 2, 25


def _parts_cache(cache_dir: Path, family: str, *key: int) -> Path:
    return cache_dir / f"{_cache_stem(family)}-parts-{'-'.join(map(str, key))}.json"


def _cached_parts(path: Path, digest: str) -> tuple[list[SliceSample], int]:
    """A parts cache's rows and how many passes they hold ([], 0 if none is usable)."""
    obj = _cache_obj(path, PARTS_FORMAT, digest)
    rows = _cache_rows(obj, "parts", lambda d: _slice_from_json(str(d["model"]), d))
    passes = obj.get("passes") if obj is not None else None
    return (rows, passes) if rows and isinstance(passes, int) and passes >= 1 else ([], 0)


def synthetic_parts_of(cache_dir: Path, wanted: Mapping[str, int], seed: int = 0,
                       threads: int = 1, repeats: int = PART_REPEATS,
                       passes: int = PART_PASSES, fresh: bool = False,
                       progress: Callable[[str], None] | None = None,
                       ) -> dict[str, list[SliceSample]]:
    """Every part of the synthetic networks of each family in ``wanted`` (family -> count;
    :func:`~coinf.research.partlabels.time_parts`) in at least ``passes`` passes, each family
    cached in ``cache_dir`` with the passes it holds (``fresh``: none). Only the missing passes
    are timed, pass by pass: one over every family, then the next, so a part's passes lie
    minutes apart; a part keeps the :data:`~coinf.device.sweep.SLICE_STAT` of its passes,
    cached ones included. Progress says how long is left."""
    import time

    from coinf.research.context_sweep import FAMILIES, model_name, network
    from coinf.research.partlabels import time_parts

    if passes < 1:
        raise ValueError(f"passes must be >= 1, got {passes}")
    for family, n in wanted.items():
        if family not in FAMILIES:
            raise ValueError(f"unknown network family {family!r}; expected one of {FAMILIES}")
        if n < 0:
            raise ValueError(f"the {family} family needs a count >= 0, got {n}")
    files = {f: (_parts_cache(cache_dir, f, n, seed, threads, repeats),
                 _networks_digest(n, seed, f)) for f, n in wanted.items() if n}
    have = {f: ([], 0) if fresh or f not in files else _cached_parts(*files[f]) for f in wanted}
    runs = {f: [rows] if k else [] for f, (rows, k) in have.items()}
    held = {f: k for f, (_, k) in have.items()}  # passes behind runs[f]
    left_passes = {f: passes - k for f, (_, k) in have.items() if wanted[f] and k < passes}
    total, done, start = sum(wanted[f] * k for f, k in left_passes.items()), 0, time.monotonic()
    for p in range(max(left_passes.values(), default=0)):
        for family in (f for f, k in left_passes.items() if p < k):
            n, got = wanted[family], []
            for i in range(n):
                got += time_parts(model_name(i, family), network(i, seed, family), threads,
                                  repeats)
                done += 1
                if progress and (i % 25 == 0 or i == n - 1):
                    left = (time.monotonic() - start) / done * (total - done)
                    progress(f"synthetic parts, pass {held[family] + 1}/{passes}, "
                             f"{family}: network {i + 1}/{n}, {len(got)} parts timed, about "
                             f"{left / 60:.0f} min left")
            if runs[family] and [(s.model, s.slice) for s in got] != [
                    (s.model, s.slice) for s in runs[family][0]]:
                runs[family], held[family] = [], 0  # cached: not these networks' parts
            runs[family].append(got)
            held[family] += 1
    out: dict[str, list[SliceSample]] = {}
    for family in wanted:
        first = runs[family][0] if runs[family] else []
        out[family] = [replace(s, ms=slice_time_of([r[j].ms for r in runs[family]]))
                       for j, s in enumerate(first)]
        if family in left_passes:
            _write_cache(files[family][0], PARTS_FORMAT, files[family][1], "parts",
                         [_slice_json(s) for s in out[family]], passes=held[family])
    return out


def synthetic_parts(cache_dir: Path, count: int, seed: int = 0, threads: int = 1,
                    repeats: int = PART_REPEATS, passes: int = PART_PASSES,
                    fresh: bool = False, progress: Callable[[str], None] | None = None,
                    family: str = "mixed") -> list[SliceSample]:
    """:func:`synthetic_parts_of` of one family."""
    return synthetic_parts_of(cache_dir, {family: max(count, 0)}, seed, threads, repeats,
                              passes, fresh, progress)[family]


def synthetic_labels(cache_dir: Path, count: int, seed: int = 0, passes: int = PART_PASSES,
                     fresh: bool = False, progress: Callable[[str], None] | None = None,
                     families: Mapping[str, int] | None = None,
                     repeats: int = PART_REPEATS) -> list[NodeSample]:
    """The node samples (:func:`synthetic_samples`) of ``count`` synthetic networks of the
    ``mixed`` family and as many of each other family as ``families`` says (none by default),
    labelled with unprofiled kernel times decomposed from their parts
    (:func:`synthetic_parts_of`, all families' parts timed pass by pass;
    :func:`~coinf.research.partlabels.relabel` with one set of term costs per family: the small
    networks' tiny parts would otherwise pull the mixed family's costs)."""
    from coinf.research.partlabels import relabel

    wanted = {"mixed": count, **(families or {})}
    parts = synthetic_parts_of(cache_dir, wanted, seed, repeats=repeats, passes=passes,
                               fresh=fresh, progress=progress)
    out: list[NodeSample] = []
    for family, n in wanted.items():
        nodes = synthetic_samples(cache_dir, n, seed, fresh=fresh, progress=progress,
                                  family=family)
        out += relabel(nodes, parts[family], PRIOR_WEIGHT, shared=True)
    return out


def zoo_relabel(synthetic: Sequence[NodeSample]) -> Relabel:
    """The ``relabel`` for :func:`~coinf.research.slicetrain.train_slice_predictor` on zoo
    models: each training model's labels decomposed from its own slices, plus ``synthetic``
    (already unprofiled, :func:`synthetic_labels`)."""
    from coinf.research.partlabels import relabel

    def run(nodes: list[NodeSample], slices: list[SliceSample]) -> list[NodeSample]:
        return relabel(nodes, slices, PRIOR_WEIGHT) + list(synthetic)

    return run


def zoo_samples(cache_dir: Path, names: Iterable[str], repeats: int = 25,
                progress: Callable[[str], None] | None = None,
                ) -> tuple[list[NodeSample], list[SliceSample], dict[str, Features]]:
    """:func:`samples` of the zoo models ``names``, their timings read from ``cache_dir`` (or
    measured into it, :func:`load_or_measure`)."""
    return _cached_samples(cache_dir, load_or_measure(list(names), cache_dir, repeats, progress))


def _cached_samples(cache_dir: Path, timings: Mapping[str, ModelTimings],
                    ) -> tuple[list[NodeSample], list[SliceSample], dict[str, Features]]:
    """:func:`samples` of ``timings``, each model read from its bundle in ``cache_dir``."""
    return samples(timings, {m: onnx.load(str(cache_dir / m / "model.onnx")) for m in timings})


def train_on_zoo(cache_dir: Path, repeats: int = 25, synthetic: int = 300,
                 held_out: str | None = None,
                 progress: Callable[[str], None] | None = None,
                 fresh_synthetic: bool = False, passes: int = PART_PASSES,
                 families: Mapping[str, int] = FAMILY_NETWORKS) -> tuple[Any, list[str]]:
    """A :class:`~coinf.device.slicepred.SlicePredictor` trained on every zoo model but
    ``held_out`` (its timings are neither measured nor read), ``synthetic`` random networks and
    ``families``' networks in context (:func:`synthetic_labels`, parts timed in ``passes``
    passes) and the single-layer
    sweep for groups nothing in context covers; and the models it was trained on. Every node
    label is an unprofiled time (:func:`zoo_relabel`)."""
    from coinf.models import zoo

    names = [n for n in zoo.ZOO if n != held_out]
    nodes, slices, feats = zoo_samples(cache_dir, names, repeats, progress)
    syn = synthetic_labels(cache_dir, synthetic, passes=passes, fresh=fresh_synthetic,
                           progress=progress, families=families)
    extra = sweep_samples(cache_dir, 0.2, progress=progress)
    return (train_slice_predictor(nodes, slices, feats, extra, relabel=zoo_relabel(syn)),
            sorted(names))


def profiled_constants(cache_dir: Path, models: list[str]) -> tuple[float, ...]:
    """:func:`~coinf.research.slicecheck.profiled_constants` of the cached timings of ``models``:
    the slice constants for a predictor that reproduced the profiler exactly."""
    from coinf.research.slicecheck import profiled_constants as fit

    timings = [ModelTimings.from_json(json.loads((cache_dir / f"{m}.timings.json").read_text()))
               for m in models]
    return fit({t.model: t.nodes for t in timings}, [s for t in timings for s in t.slice_samples()])


def zoo_leave_one_out(cache_dir: Path, repeats: int = 25, synthetic: int = 300,
                      names: tuple[str, ...] | None = None, sweep_scale: float = 0.2,
                      progress: Callable[[str], None] | None = None,
                      fresh_synthetic: bool = False,
                      families: Mapping[str, int] = FAMILY_NETWORKS,
                      passes: int = PART_PASSES) -> dict[str, Any]:
    """Leave-one-model-out over the zoo's cached timings, all models in one run: for each
    model, a predictor trained on every other model (and ``synthetic`` mixed networks plus
    ``families``' networks, their parts in ``passes`` passes: :func:`synthetic_labels`)
    predicts this model's cached slice times. Per model: the fractions within +-10% and
    +-25%, the median of predicted / measured, the profiler's surplus per kernel (µs), the
    repeatability of the cache's own rounds (:func:`repeatability`), the plan regret under
    each condition of :mod:`.planregret` (and with half the rounds predicting the other half),
    and the two reference scores of :mod:`.slicecheck` (``profiled_within_10pct``: its own
    profiled node times; ``additive_within_10pct``: free node times fitted on its own slices).
    ``sweep_scale`` 0 leaves out the single-layer sweep. Quick to iterate on: nothing is
    measured again (``coinf bench predict --bundle`` measures every slice anew)."""
    import statistics

    from coinf.models import zoo
    from coinf.research.planregret import SLOWDOWNS, break_even_kb_s, bundle_cuts, regret_table
    from coinf.research.slicecheck import additive_pairs, profiled_pairs
    from coinf.research.slicetrain import leave_one_model_out, profiler_surplus, within

    from coinf.bundle import Bundle

    names = names or tuple(zoo.ZOO)
    timings = load_or_measure(list(names), cache_dir, repeats, progress)
    nodes, slices, feats = _cached_samples(cache_dir, timings)
    surplus = profiler_surplus(nodes, slices)
    syn = synthetic_labels(cache_dir, synthetic, passes=passes, fresh=fresh_synthetic,
                           progress=progress, families=families)
    extra = sweep_samples(cache_dir, sweep_scale, progress=progress) if sweep_scale > 0 else []
    res = leave_one_model_out(nodes, slices, feats, list(names), extra, zoo_relabel(syn),
                              progress)
    profiled, additive = profiled_pairs(nodes, slices, list(names)), additive_pairs(nodes, slices)
    out: dict[str, Any] = {}
    for m, rows in res.items():
        pairs = [(p, me) for _, p, me in rows]
        cuts = bundle_cuts(Bundle.load(cache_dir / m))
        regret, halves = regret_table(rows, cuts), half_rounds(timings[m])
        out[m] = {"slices": len(rows), "within_10pct": within(pairs),
                  "within_25pct": within(pairs, 0.25),
                  "median_predicted_over_measured": statistics.median(
                      p / me for p, me in pairs if me > 0) if pairs else None,
                  "profiler_surplus_us_per_kernel": surplus[m] * 1e3 if m in surplus else None,
                  "profiled_within_10pct": within(profiled[m]) if m in profiled else None,
                  "additive_within_10pct": within(additive[m]) if m in additive else None,
                  "measurement_repeatability_within_10pct": repeatability(timings[m]),
                  "plan_regret": regret, "max_plan_regret": max(regret.values()),
                  # where the wearable's and the handheld's whole-model runs break even
                  "break_even_kb_s": {f"x{k:g}": break_even_kb_s(
                      {n: (p, me) for n, p, me in rows}, cuts, k) for k in SLOWDOWNS if k > 1},
                  # half the rounds predicting the other half: what the machine's noise costs
                  "measurement_plan_regret": regret_table(halves, cuts) if halves else None}
    return out
