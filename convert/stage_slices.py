"""Slices between two cuts, for pipelines over more than two devices (docs/PIPELINE.md).

A bundle holds, per candidate cut, a head (graph inputs -> cut) and a tail (cut -> graph
outputs). A pipeline over n devices runs n slices: the head of cut s1, the *middle* slices
s1 -> s2, ..., s(n-2) -> s(n-1), and the tail of s(n-1). A middle slice between cuts ``a`` and
``b`` exists when ``a``'s head is contained in ``b``'s head (the cuts are nested); it runs the
dynamic nodes of ``b``'s head that ``a``'s head lacks, takes ``a``'s crossing tensors and
produces ``b``'s (a tensor of both sets passes through).

Slices that the bundle already has are used as they are: ``first -> b`` is ``b``'s head and
``a -> last`` is ``a``'s tail. Middle slices are built on demand from the bundle's model and
cached as files under ``<bundle>/stages/<identity>/a-b.onnx`` (the identity keeps a re-split
bundle from reusing stale files); each is verified once when built:
``middle(head_a(x)) == head_b(x)`` on a seeded random input.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
from coinf.convert.graph import Graph, load_graph, ort_session, random_feed
from coinf.convert.slicer import build_slice
from coinf.convert.verify import mismatch
from onnx import ModelProto

from coinf.bundle import Bundle, Candidate
from coinf.errors import BundleError
from coinf.files import write_atomically

STAGES_DIR = "stages"
SEP = ".."


def slice_name(a: str, b: str) -> str:
    """The name of the slice from cut ``a`` to cut ``b`` (``c003..c010``)."""
    return f"{a}{SEP}{b}"


def parse_slice_name(name: str) -> tuple[str, str]:
    a, sep, b = name.partition(SEP)
    if not sep or not a or not b:
        raise BundleError(f"slice {name!r} is not FROM{SEP}TO (e.g. c003{SEP}c010)")
    return a, b


def nested(a: Candidate, b: Candidate) -> bool:
    """True when cut ``a`` lies strictly before cut ``b`` (``a``'s head inside ``b``'s)."""
    ha, hb = set(a.head.nodes), set(b.head.nodes)
    return ha < hb


class StageSlices:
    """Finds (or builds, verifies and caches) the ONNX file of any slice ``a -> b``.

    Thread-safe; a file is written to a temporary name and renamed, so helper processes that
    share a bundle directory can build the same slice at once.
    """

    def __init__(self, bundle: Bundle, cache_dir: str | Path | None = None,
                 verify: bool = True) -> None:
        self.bundle = bundle
        self.first = bundle.candidates[0]
        self.last = bundle.candidates[-1]
        root = Path(cache_dir) if cache_dir is not None else bundle.root / STAGES_DIR
        self.cache = root / bundle.identity
        self.verify = verify
        self._graph: Graph | None = None
        self._lock = threading.Lock()

    def pair(self, a: str, b: str) -> tuple[Candidate, Candidate]:
        """The two cuts of slice ``a -> b``; :class:`BundleError` unless ``a`` is before ``b``."""
        ca, cb = self.bundle.candidate(a), self.bundle.candidate(b)
        if ca is self.last or cb is self.first or ca.id == cb.id:
            raise BundleError(f"slice {slice_name(ca.id, cb.id)} is empty")
        if not (ca is self.first or cb is self.last or nested(ca, cb)):
            raise BundleError(f"no slice {slice_name(ca.id, cb.id)}: cut {ca.id} is not "
                              f"before cut {cb.id} (their heads are not nested)")
        return ca, cb

    def path(self, a: str, b: str) -> Path:
        """The file computing cut ``b``'s crossing tensors from cut ``a``'s."""
        ca, cb = self.pair(a, b)
        if ca is self.first and cb.head.file is not None:
            return self.bundle.path(cb.head.file)
        if cb is self.last and ca.tail.file is not None:
            return self.bundle.path(ca.tail.file)
        target = self.cache / f"{ca.id}-{cb.id}.onnx"
        if target.is_file():
            return target
        with self._lock:
            if not target.is_file():
                self._build(ca, cb, target)
        return target

    def graph(self) -> Graph:
        if self._graph is None:
            dims = self.bundle.meta.get("dims") or {}
            self._graph = load_graph(self.bundle.model_path, dims if isinstance(dims, dict)
                                     else {})
        return self._graph

    def _build(self, a: Candidate, b: Candidate, target: Path) -> None:
        g = self.graph()
        index = {n.name: n.index for n in g.nodes}
        missing = [n for n in b.head.nodes if n not in index]
        if missing:
            raise BundleError(f"bundle {self.bundle.root}: cut {b.id} names nodes "
                              f"{missing[:3]} that its model lacks")
        before = set(a.head.nodes)
        nodes = [index[n] for n in b.head.nodes if n not in before]
        model = build_slice(g, nodes, [t.name for t in a.crossing],
                            [t.name for t in b.crossing], f"{a.id}_{b.id}")
        data = model.SerializeToString()
        if self.verify:
            try:
                problem = self._check(a, b, data)
            except Exception as exc:  # onnxruntime refuses the slice: a verification failure
                problem = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
            if problem:
                raise BundleError(f"slice {slice_name(a.id, b.id)} does not compose: {problem}")
        write_atomically(target, data)

    def _check(self, a: Candidate, b: Candidate, data: bytes) -> str | None:
        """``middle(head_a(x))`` against ``head_b(x)`` (the bundle's own slices, onnxruntime
        optimisations off) on a seeded random input."""
        import onnx

        g = self.graph()
        x = random_feed(g.model, g.types, g.inputs, seed=0)
        sent = self._run(onnx.load(str(self.bundle.path(a.head.file))), x) if a.head.file else x
        sent = {**x, **sent}
        ref = self._run(onnx.load(str(self.bundle.path(b.head.file))), x) if b.head.file else x
        got = self._run(onnx.load_from_string(data), sent)
        for spec in b.crossing:
            why = mismatch(np.asarray(got[spec.name]), np.asarray(ref[spec.name]))
            if why:
                return f"tensor {spec.name!r}: {why}"
        return None

    @staticmethod
    def _run(model: ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        sess = ort_session(model)
        names = [o.name for o in sess.get_outputs()]
        values = sess.run(names, {i.name: feeds[i.name] for i in sess.get_inputs()})
        return dict(zip(names, values, strict=True))


__all__ = ["SEP", "StageSlices", "nested", "parse_slice_name", "slice_name"]
