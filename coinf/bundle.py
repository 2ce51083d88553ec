"""The split bundle: a directory holding a model, its head/tail slices and ``manifest.json``.

This module only reads and writes the format (docs/BUNDLE.md); :mod:`coinf.convert.split` makes
bundles. The wearable and handheld load bundles with :meth:`Bundle.load` and open their slices
with :func:`open_slice`. It sits at rank 0 (tests/test_layering.py): the standard library and
:mod:`coinf.errors` only, onnx/onnxruntime imported when a slice is opened, so the Pi wheel
(``make wheel-pi``) and the offline ``coinf.convert`` share one reader.

Layout::

    BUNDLE/
      manifest.json
      model.onnx              # the whole model, shapes resolved
      c001/head.onnx          # one folder per candidate that has a head and/or a tail
      c001/tail.onnx
      weights.bin             # only with shared weights (then slices are c001.head.onnx, ...)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coinf.errors import BundleError

if TYPE_CHECKING:
    from onnx import GraphProto, ModelProto, TensorProto

FORMAT = "coinf-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
HANDHELD_ONLY = "handheld-only"
WEARABLE_ONLY = "wearable-only"
#: the manifest entry of a bundle calibrated with entropy priors (``ansN``, docs/PACKING.md)
ENTROPY_PRIORS = "entropy_priors"
#: folders of the bundles this process loaded that have entropy priors: where
#: ``ble_protocol.priors.lookup`` finds a table a packed body names
PRIOR_ROOTS: list[Path] = []


@dataclass(frozen=True)
class TensorSpec:
    """A tensor's name, static shape, numpy dtype name and size in bytes."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> TensorSpec:
        return cls(str(obj["name"]), tuple(int(d) for d in obj["shape"]), str(obj["dtype"]),
                   int(obj["nbytes"]))

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return d


@dataclass(frozen=True)
class Part:
    """One side of a cut: the ONNX file (``None`` when the side is empty) and its costs."""

    file: str | None
    flops: int
    param_bytes: int
    nodes: tuple[str, ...]
    #: the SHA-256 of ``file`` as ``coinf split`` wrote it (None in bundles made before it was
    #: recorded): part of the bundle identity, checked when the slice is opened
    sha256: str | None = None

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Part:
        file, digest = obj.get("file"), obj.get("sha256")
        if file is not None and not isinstance(file, str):
            raise TypeError(f"a part's file must be a path string or null, got {file!r}")
        if digest is not None and not (isinstance(digest, str) and len(digest) == 64):
            raise TypeError(f"a part's sha256 must be 64 hex digits, got {digest!r}")
        return cls(file, int(obj["flops"]), int(obj["param_bytes"]), tuple(obj["nodes"]),
                   digest)

    def to_json(self) -> dict[str, Any]:
        out = {"file": self.file, "flops": self.flops, "param_bytes": self.param_bytes,
               "nodes": list(self.nodes)}
        if self.sha256 is not None:
            out["sha256"] = self.sha256
        return out


@dataclass(frozen=True)
class Candidate:
    """A cut: the head runs on the wearable, ``crossing`` travels, the tail runs on the handheld.

    The tail takes the crossing tensors as inputs and produces every graph output. For
    ``wearable-only`` the crossing set is the graph outputs and nothing travels.
    """

    id: str
    label: str
    crossing: tuple[TensorSpec, ...]
    head: Part
    tail: Part
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def crossing_bytes(self) -> int:
        return sum(t.nbytes for t in self.crossing)

    @property
    def is_wearable_only(self) -> bool:
        return self.tail.file is None

    @property
    def is_handheld_only(self) -> bool:
        return self.head.file is None

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Candidate:
        known = {"id", "label", "crossing", "crossing_bytes", "head", "tail"}
        return cls(
            id=str(obj["id"]),
            label=str(obj.get("label", obj["id"])),
            crossing=tuple(TensorSpec.from_json(t) for t in obj["crossing"]),
            head=Part.from_json(obj["head"]),
            tail=Part.from_json(obj["tail"]),
            extra={k: v for k, v in obj.items() if k not in known},
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "label": self.label,
            "crossing": [t.to_json() for t in self.crossing],
            "crossing_bytes": self.crossing_bytes,
            "head": self.head.to_json(),
            "tail": self.tail.to_json(),
            **self.extra,
        }


COMPRESSORS_DIR = "compressors"


@dataclass(frozen=True)
class Compressor:
    """An autoencoder attached to a cut (docs/BUNDLE.md, "Compressors"): the encoder maps the
    cut's crossing tensors to one tensor ``code``, the decoder maps it back. ``accuracy`` is the
    model's test accuracy with it, per packing of the code; ``code_bytes`` what the code takes
    on the wire per packing (measured when attached); ``base_accuracy`` the model's own."""

    candidate: str
    gamma: int
    encoder: str
    decoder: str
    code: TensorSpec
    flops: int
    accuracy: dict[str, float]
    code_bytes: dict[str, int]
    base_accuracy: float
    sha256: str
    #: ``autoencoder`` (a set of ``coinf convert compressors``) or ``learned`` (``coinf
    #: compress``: an integer code with an entropy model; docs/BOTTLENECK.md)
    kind: str = "autoencoder"
    #: learned only: the rate weight it was trained with, its pmf file (format ``coinf-pmf``),
    #: the estimated entropy-coded bytes per frame and how many held-out feeds measured it
    lam: float | None = None
    priors: str | None = None
    rate_bytes: float | None = None
    test_feeds: int | None = None
    #: packing of the code -> (encode ms, decode ms) per frame on the machine that measured it
    #: (``latent``: the entropy coder's time, beyond the encoder and decoder themselves)
    code_ms: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """``g4 at c002``: how messages name it (a request carries cut and gamma as fields)."""
        return f"g{self.gamma} at {self.candidate}"

    def relative_accuracy(self, packing: str) -> float:
        """Accuracy with this packing relative to the uncompressed model's (<= 1)."""
        if self.base_accuracy <= 0:
            return 0.0
        return min(self.accuracy[packing] / self.base_accuracy, 1.0)

    @classmethod
    def from_json(cls, obj: dict[str, Any], base_accuracy: float) -> Compressor:
        kind = str(obj.get("kind", "autoencoder"))
        if kind not in ("autoencoder", "learned"):
            raise ValueError(f"compressor kind {kind[:40]!r}: expected autoencoder or learned")
        learned = kind == "learned"
        return cls(str(obj["candidate"]), int(obj["gamma"]), str(obj["encoder"]),
                   str(obj["decoder"]), TensorSpec.from_json(obj["code"]), int(obj["flops"]),
                   {str(k): float(v) for k, v in obj["accuracy"].items()},
                   {str(k): int(v) for k, v in obj["code_bytes"].items()},
                   # a learned entry's accuracy is agreement with the original model
                   float(obj.get("base_accuracy", base_accuracy)), str(obj["sha256"]), kind,
                   float(obj["lambda"]) if learned else None,
                   _path_field(obj["priors"]) if learned else None,
                   float(obj["rate_bytes"]) if learned else None,
                   int(obj["test_feeds"]) if learned else None,
                   {str(k): (float(v[0]), float(v[1]))
                    for k, v in (obj.get("code_ms") or {}).items()})

    def to_json(self) -> dict[str, Any]:
        out = {"candidate": self.candidate, "gamma": self.gamma, "encoder": self.encoder,
               "decoder": self.decoder, "code": self.code.to_json(), "flops": self.flops,
               "accuracy": dict(self.accuracy), "code_bytes": dict(self.code_bytes),
               "sha256": self.sha256}
        if self.kind == "learned":
            out.update(kind=self.kind, base_accuracy=self.base_accuracy, priors=self.priors,
                       rate_bytes=self.rate_bytes, test_feeds=self.test_feeds)
            out["lambda"] = self.lam
        if self.code_ms:
            out["code_ms"] = {k: [round(a, 3), round(b, 3)] for k, (a, b) in self.code_ms.items()}
        return out


@dataclass
class Bundle:
    """A loaded split bundle. Paths in the manifest are relative to :attr:`root`."""

    root: Path
    model_file: str
    model_sha256: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    candidates: tuple[Candidate, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    # -- lookup ---------------------------------------------------------------------------------
    def candidate(self, cid: str) -> Candidate:
        """Find a candidate by id (``c007``) or alias (``handheld-only``, ``wearable-only``)."""
        if cid == HANDHELD_ONLY:
            return self.candidates[0]
        if cid == WEARABLE_ONLY:
            return self.candidates[-1]
        for cand in self.candidates:
            if cand.id == cid:
                return cand
        ids = ", ".join(c.id for c in self.candidates[:8])
        more = "" if len(self.candidates) <= 8 else f", ... ({len(self.candidates)} in all)"
        raise BundleError(f"unknown candidate id {cid!r}; this bundle has {ids}{more}")

    def path(self, relative: str) -> Path:
        """A file of the bundle; a path that would leave the bundle's folder is refused."""
        return inside(self.root, relative)

    @property
    def model_path(self) -> Path:
        return inside(self.root, self.model_file)

    @property
    def identity(self) -> str:
        """What the handshake compares: the model's hash plus a hash of the candidate cuts.

        Calibration data (entropy priors included: HELLO_ACK's ``priors`` tells the sender
        whether ``ansN`` can be decoded) and other manifest extras do not change it; a
        different model, a different set of cuts or slices, or different attached compressors
        does. With shared weights
        ``model.onnx`` only points into ``weights.bin``, so that file's hash counts too.
        """
        digest = hashlib.sha256(json.dumps(self.identity_cuts(), sort_keys=True).encode())
        return f"{self.model_sha256[:16]}-{digest.hexdigest()[:8]}"

    def identity_cuts(self) -> list[Any]:
        """What :attr:`identity` hashes (docs/PROTOCOL.md §6.8): one entry per candidate, then
        ``weights``, ``compressors`` and ``slices`` when the manifest has them."""
        cuts: list[Any] = [[c.id, [t.name for t in c.crossing], list(c.head.nodes)]
                           for c in self.candidates]
        weights = self.meta.get("weights")
        if isinstance(weights, dict) and weights.get("sha256"):
            cuts.append(["weights", str(weights["sha256"])])
        comps = self.compressors()
        if comps:  # other compressors, other identity: a peer must decode what we encode
            cuts.append(["compressors", sorted([c.candidate, c.gamma, c.sha256] for c in comps)])
        if any(p.sha256 for c in self.candidates for p in (c.head, c.tail)):
            # the slices themselves and what crosses: a changed tail is another bundle
            cuts.append(["slices", [[c.id, [[t.name, t.dtype, list(t.shape)] for t in c.crossing],
                                     c.head.sha256, c.tail.sha256] for c in self.candidates]])
        return cuts

    @property
    def priors_digest(self) -> str | None:
        """The SHA-256 of this bundle's entropy priors index (``ansN`` tables), or None."""
        priors = self.meta.get(ENTROPY_PRIORS)
        digest = priors.get("sha256") if isinstance(priors, dict) else None
        return str(digest) if digest else None

    def compressors(self, cid: str | None = None) -> list[Compressor]:
        """The attached compressors (``coinf convert compressors``), of cut ``cid`` or all."""
        sect = self.meta.get("compressors")
        if not isinstance(sect, dict):
            return []
        base = float(sect.get("base_accuracy", {}).get("raw", 0.0))
        out = [Compressor.from_json(e, base) for e in sect.get("entries", [])]
        return [c for c in out if cid is None or c.candidate == cid]

    def compressor(self, cid: str, gamma: int) -> Compressor:
        """Compressor ``gamma`` of cut ``cid``; :class:`BundleError` naming what exists."""
        found = self.compressors(cid)
        for comp in found:
            if comp.gamma == gamma:
                return comp
        have = ", ".join(f"g{c.gamma}" for c in found) or "none"
        raise BundleError(f"no compressor g{gamma} at cut {cid} (this bundle has {have} there)")

    # -- I/O ------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        meta = {k: v for k, v in self.meta.items() if k != "manifest_sha256"}
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "model": {
                "file": self.model_file,
                "sha256": self.model_sha256,
                "inputs": [t.to_json() for t in self.inputs],
                "outputs": [t.to_json() for t in self.outputs],
            },
            "candidates": [c.to_json() for c in self.candidates],
            **meta,
        }

    def save(self) -> Path:
        """Write ``manifest.json`` (deterministic: sorted keys, fixed indent)."""
        path = self.root / MANIFEST
        text = json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n"
        path.write_text(text)
        self.meta["manifest_sha256"] = hashlib.sha256(text.encode()).hexdigest()
        return path

    @classmethod
    def load(cls, root: str | Path) -> Bundle:
        """Load and validate a bundle directory; raises :class:`BundleError` naming the problem."""
        root = Path(root)
        path = root / MANIFEST
        if not root.is_dir():
            raise BundleError(f"{root} is not a bundle directory (run `coinf split` to make one)")
        if not path.is_file():
            raise BundleError(f"{root} has no {MANIFEST}; is it a bundle made by `coinf split`?")
        raw = path.read_bytes()
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise BundleError(f"{path} is not valid JSON: {exc}") from None
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise BundleError(f"{path} is not a coinf bundle manifest")
        if obj.get("version") != FORMAT_VERSION:
            raise BundleError(
                f"{path} has bundle format version {obj.get('version')}; "
                f"this coinf reads version {FORMAT_VERSION} (re-run `coinf split`)"
            )
        try:
            model = obj["model"]
            meta = {k: v for k, v in obj.items()
                    if k not in {"format", "version", "model", "candidates"}}
            meta["manifest_sha256"] = hashlib.sha256(raw).hexdigest()
            bundle = cls(
                root=root,
                model_file=_path_field(model["file"]),
                model_sha256=str(model["sha256"]),
                inputs=tuple(TensorSpec.from_json(t) for t in model["inputs"]),
                outputs=tuple(TensorSpec.from_json(t) for t in model["outputs"]),
                candidates=tuple(Candidate.from_json(c) for c in obj["candidates"]),
                meta=meta,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(f"{path} is malformed: missing or bad field {exc}") from None
        if len(bundle.candidates) < 2:
            raise BundleError(f"{path} lists {len(bundle.candidates)} candidates; expected >= 2")
        bundle.model_path  # noqa: B018 - validates the path
        weights = bundle.meta.get("weights")
        if isinstance(weights, dict) and not inside(root, str(weights.get("file"))).is_file():
            raise BundleError(f"{path}: shared weights file {weights.get('file')} is missing")
        for cand in bundle.candidates:
            for part in (cand.head, cand.tail):
                if part.file is not None and not inside(root, part.file).is_file():
                    raise BundleError(f"{path}: candidate {cand.id} needs missing {part.file}")
        try:
            comps = bundle.compressors()
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BundleError(f"{path}: malformed compressors section ({exc!r})") from None
        ids = {c.id for c in bundle.candidates}
        for comp in comps:
            if comp.candidate not in ids:
                raise BundleError(f"{path}: compressor {comp.label} names no candidate")
            for file in (comp.encoder, comp.decoder, *([comp.priors] if comp.priors else [])):
                if not inside(root, file).is_file():
                    raise BundleError(f"{path}: compressor {comp.label} needs missing {file}")
        if isinstance(meta.get(ENTROPY_PRIORS), dict) and root.resolve() not in PRIOR_ROOTS:
            PRIOR_ROOTS.append(root.resolve())
        return bundle


def _path_field(value: Any) -> str:
    """A manifest's file name: a string (a number or a list is a malformed manifest)."""
    if not isinstance(value, str):
        raise TypeError(f"a file must be a path string, got {value!r}")
    return value


def inside(root: Path, relative: str) -> Path:
    """``root / relative``, refusing absolute paths and ones that leave ``root`` (``..``,
    symlinks): a manifest names files of its own bundle only."""
    rel = Path(relative)
    target = (root / rel).resolve()
    if rel.is_absolute() or not target.is_relative_to(root.resolve()):
        raise BundleError(f"bundle {root}: file {relative!r} is outside the bundle's folder")
    return root / rel


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def is_external(t: TensorProto) -> bool:
    """Whether the tensor's data lives in an external file (``data_location == EXTERNAL``)."""
    return t.HasField("data_location") and t.data_location == _EXTERNAL


_EXTERNAL = 1  # onnx.TensorProto.EXTERNAL (onnx is not imported until a slice is opened)


def all_tensors(graph: GraphProto) -> Iterator[TensorProto]:
    """Every TensorProto of a graph: initializers, sparse ones, node attributes, sub-graphs."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from all_tensors(attr.g)
            for sub in attr.graphs:
                yield from all_tensors(sub)


def check_locations(model: ModelProto, path: Path) -> None:
    """Refuse a slice whose external data lies outside its own folder.

    A manifest's paths are checked by :func:`inside`; an ONNX file can name its own weight
    files too, so a hostile bundle could make onnxruntime read ``/etc/...`` or ``../other``.
    Only bare or nested relative names inside the slice's folder pass.
    """
    root = path.parent.resolve()
    for t in all_tensors(model.graph):
        if not is_external(t):
            continue
        loc = next((e.value for e in t.external_data if e.key == "location"), "")
        rel = Path(loc)
        if not loc or rel.is_absolute() or not (root / rel).resolve().is_relative_to(root):
            raise BundleError(f"bundle file {path}: tensor {t.name!r} names external data "
                              f"{loc!r} outside the bundle's folder")


_VERIFIED: dict[tuple[str, int, int], str] = {}


def verify_file(path: str | Path, sha256: str | None) -> None:
    """Refuse a bundle file that is not the one ``coinf split`` recorded (``sha256``; None:
    not recorded). Checked once per file version (path, size, mtime)."""
    if sha256 is None:
        return
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        raise BundleError(f"bundle file {p} is missing") from None
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if _VERIFIED.get(key) == sha256:
        return
    got = sha256_file(p)
    if got != sha256:
        raise BundleError(f"bundle file {p} is damaged or not the one this bundle was split "
                          f"with (sha256 {got[:16]}..., the manifest says {sha256[:16]}...); "
                          f"re-create the bundle with `coinf split MODEL -o BUNDLE --force`, or "
                          f"push the whole bundle again")
    _VERIFIED[key] = sha256


def open_slice(path: str | Path, sess_options: Any = None,
               providers: list[str] | tuple[str, ...] = ("CPUExecutionProvider",)) -> Any:
    """``onnxruntime.InferenceSession`` of a bundle file; a file onnxruntime cannot load (truncated,
    overwritten, not ONNX) raises :class:`BundleError` naming it, not onnxruntime's traceback.
    A file whose external data lies outside its folder is refused (:func:`check_locations`)."""
    import onnx
    import onnxruntime as ort

    try:
        check_locations(onnx.load(str(path), load_external_data=False), Path(path))
    except BundleError:
        raise
    except Exception:  # unreadable: onnxruntime below names the damage
        pass
    if sess_options is None:  # a slice may keep initializers it no longer uses: no warnings
        sess_options = ort.SessionOptions()
        sess_options.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), sess_options, providers=list(providers))
    except Exception as exc:  # onnxruntime's InvalidProtobuf, Fail, NoSuchFile, ...
        if not Path(path).is_file():
            raise BundleError(f"bundle file {path} is missing") from None
        text = str(exc).strip()
        if "INVALID_PROTOBUF" in text or "Protobuf parsing failed" in text:
            reason = "not a valid ONNX file: truncated or overwritten?"
        else:
            reason = (text.splitlines()[0] if text else type(exc).__name__)[:160]
        raise BundleError(
            f"bundle file {path} is damaged ({reason}); re-create the bundle with "
            f"`coinf split MODEL -o BUNDLE --force`") from None
