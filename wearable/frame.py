"""What one inference takes and gives: feed and output checks, result validation, timings.

Everything here is pure (no I/O): the per-frame function in :mod:`coinf.wearable.core` calls it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from coinf.ble_protocol.messages import result_bound as _result_bound
from coinf.convert.freeze import META_KEY as FROZEN
from coinf.convert.freeze import without_frozen

from coinf.bundle import Bundle, TensorSpec
from coinf.errors import InputError, PeerResultError

_ORT_TYPES = {
    "float32": "tensor(float)",
    "float16": "tensor(float16)",
    "float64": "tensor(double)",
    "int8": "tensor(int8)",
    "uint8": "tensor(uint8)",
    "int16": "tensor(int16)",
    "uint16": "tensor(uint16)",
    "int32": "tensor(int32)",
    "uint32": "tensor(uint32)",
    "int64": "tensor(int64)",
    "uint64": "tensor(uint64)",
    "bool": "tensor(bool)",
}


@dataclass(frozen=True)
class NodeArg:
    """Same fields as ``onnxruntime.NodeArg``: name, shape, type (e.g. ``tensor(float)``)."""

    name: str
    shape: list[int]
    type: str

    @classmethod
    def of(cls, spec: TensorSpec) -> NodeArg:
        return cls(spec.name, list(spec.shape),
                   _ORT_TYPES.get(spec.dtype, f"tensor({spec.dtype})"))


@dataclass(frozen=True)
class ModelMetadata:
    """Same fields as ``onnxruntime.ModelMetadata``, read from the bundle's model."""

    producer_name: str
    graph_name: str
    domain: str
    description: str
    graph_description: str
    version: int
    custom_metadata_map: dict[str, str]

    @classmethod
    def of(cls, bundle: Bundle) -> ModelMetadata:
        """The metadata of ``bundle``'s whole model (its weights are not read)."""
        import onnx

        m = onnx.load(str(bundle.model_path), load_external_data=False)
        return cls(producer_name=m.producer_name, graph_name=m.graph.name, domain=m.domain,
                   description=m.doc_string, graph_description=m.graph.doc_string,
                   version=m.model_version,
                   custom_metadata_map={p.key: p.value for p in m.metadata_props})


@dataclass
class RunStats:
    """Timings (ms) and bytes of one inference."""

    candidate: str
    packing: str = "raw"
    head_ms: float = 0.0
    pack_ms: float = 0.0
    transfer_ms: float = 0.0
    tail_ms: float = 0.0
    return_ms: float = 0.0
    total_ms: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    local: bool = False
    fallback: str | None = None  # why an offloaded inference was completed on the wearable
    tag: str = ""
    #: the runtime of each stage (head, tail): a tail finished here has this wearable's runtime;
    #: an offloaded one the handheld's as configured (``handheld_runtime``)
    runtimes: tuple[str, ...] = ()
    #: the compressor whose code was sent (1: none; docs/PIPELINE.md, run-time selection)
    gamma: int = 1
    #: the plan's strategy: local, split or pipeline
    strategy: str = "split"
    #: the plan this frame ran (``str(Plan)``: every stage, device and slice)
    plan: str = ""
    #: with helpers (re-planning): the plan's version in ``Session.strategies["history"]``
    plan_version: int = 0
    #: the devices of the plan's stages, in order (the wearable first)
    devices: tuple[str, ...] = ()
    #: the plan's cuts, one per link, and how each link carried its cut (``raw``, ``q8``,
    #: ``g4``, ``g4+q8``), in order
    cuts: tuple[str, ...] = ()
    packings: tuple[str, ...] = ()
    #: with helpers: ms the link into the next device took to carry the request (from when
    #: it could start until the link took it: queueing behind earlier frames excluded)
    send_ms: float = 0.0
    #: per remote stage, in order: ``device``, ``compute_ms`` (its decoder included),
    #: ``send_ms`` (handing its tensors to the next device) and ``bytes`` (their size)
    hops: list[dict[str, Any]] = field(default_factory=list)
    #: the offloaded request's nonce (its RESULT must echo it)
    nonce: int = 0
    #: why a tensor went in another packing than planned (the handheld does not decode it:
    #: ``"qz4 sent as q4: the handheld cannot decode zstd ..."``), else None
    packing_fallback: str | None = None
    #: the link to the handheld that carried the request (its name: ``ble``, ``wifi``, an
    #: alternate's; to a helper: the spec it was reached by, ``ble:...`` or ``tcp:...``;
    #: None: nothing was sent, or the frame finished on the wearable)
    link: str | None = None
    #: the link this frame was first sent on and why it left it (``"wifi: disconnected:
    #: ..."``), when it was re-sent on ``link`` or finished here
    failover: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FrameResult:
    """One frame of a stream: its index, outputs (or error) and timings."""

    index: int
    outputs: list[np.ndarray] | None
    error: BaseException | None
    stats: RunStats | None

    def value(self) -> list[np.ndarray]:
        """The outputs, or raise this frame's error."""
        if self.error is not None:
            raise self.error
        assert self.outputs is not None
        return self.outputs


def check_feed(bundle: Bundle, feed: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The feed as arrays, exactly the model's inputs in name, dtype and shape."""
    if not isinstance(feed, Mapping):
        raise InputError(f"input_feed must be a mapping of input name to array, got "
                         f"{type(feed).__name__}")
    expected = {t.name: t for t in bundle.inputs}
    if bundle.meta.get(FROZEN):  # inputs made constants by `coinf split --freeze`
        feed = without_frozen(bundle.meta, feed)
    unknown = sorted(set(feed) - set(expected))
    if unknown:
        raise InputError(f"unknown input {unknown[0]!r}; the model's inputs are {sorted(expected)}")
    out: dict[str, np.ndarray] = {}
    for name, spec in expected.items():
        if name not in feed:
            raise InputError(f"missing input {name!r}: expected {spec.dtype}{list(spec.shape)}")
        arr = np.asarray(feed[name])
        if arr.dtype != np.dtype(spec.dtype):
            raise InputError(f"input {name!r} has dtype {arr.dtype}, expected {spec.dtype} "
                             f"with shape {list(spec.shape)}")
        if tuple(arr.shape) != spec.shape:
            raise InputError(f"input {name!r} has shape {list(arr.shape)}, expected "
                             f"{list(spec.shape)} ({spec.dtype})")
        out[name] = arr
    return out


def check_output_names(bundle: Bundle, names: Sequence[str] | None) -> list[str]:
    """onnxruntime's rule: ``None`` or an empty list means every output, in model order."""
    known = [t.name for t in bundle.outputs]
    if not names:
        return known
    if isinstance(names, str):
        raise InputError(f"output_names must be a list of names, got the string {names!r}")
    for n in names:
        if n not in known:
            raise InputError(f"unknown output {n!r}; the model's outputs are {known}")
    return list(names)


def validate_result(bundle: Bundle, outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A peer's result must be exactly the model's outputs: names, dtypes, shapes, and finite
    where a float output of the local model would be. Anything else is a peer error
    (:class:`PeerResultError`), which a Session answers by finishing the inference locally."""
    expected = {t.name: t for t in bundle.outputs}
    if set(outputs) != set(expected):
        missing = sorted(set(expected) - set(outputs))
        extra = sorted(set(outputs) - set(expected))
        raise PeerResultError(f"result has missing outputs {missing}, unexpected outputs {extra}")
    for name, arr in outputs.items():
        spec = expected[name]
        if arr.dtype != np.dtype(spec.dtype) or tuple(arr.shape) != spec.shape:
            raise PeerResultError(f"result {name!r} is {arr.dtype}{list(arr.shape)}, the model's "
                                f"output is {spec.dtype}{list(spec.shape)}")
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise PeerResultError(f"result {name!r} has NaN or infinite values")
    return dict(outputs)


def result_bound(bundle: Bundle, hops: int = 1) -> int:
    """The largest RESULT payload that can be valid for ``bundle``'s request of ``hops`` hops:
    its outputs, RAW, with the headers (docs/PROTOCOL.md §6.13). The wearable accepts no
    larger reply to a REQUEST."""
    return _result_bound(((t.name, len(t.shape), t.nbytes) for t in bundle.outputs), hops)


def nbytes_of(tensors: Mapping[str, np.ndarray]) -> int:
    return sum(int(a.nbytes) for a in tensors.values())
