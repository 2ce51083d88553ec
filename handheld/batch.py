"""Many REQUESTs for the same tail, one onnxruntime run: the compute step of the fleet service.

:class:`BatchRunner` takes a list of REQUEST payloads (from any number of wearables) and
returns one outcome per payload, in order: a RESULT payload, or the error code and text that
payload alone earns. Every payload gets the checks a :class:`~handheld.daemon.HandheldDaemon`
gives it (header, tensors against the manifest, compressor codes; nothing trusted); then the
frames that ask for the same tail are stacked along the batch axis and run together.

Bundle slices have batch 1 and static shapes. A tail is batched when its inputs and outputs
all lead with a batch dimension of 1: its graph is loaded once more with that dimension made
symbolic, and the batched session is trusted only after two random rows, run together, give
each row's batch-1 outputs (within float tolerance). A tail that fails that check (a Reshape
that bakes in batch 1, say) runs frame by frame, still in one call. Frames with a compressor
code (``gamma``) run frame by frame too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from coinf.ble_protocol.messages import ErrorCode, ProtocolError
from coinf.ble_protocol.request import Kind, Request
from coinf.device.emulation import DeviceEmulation
from coinf.handheld.daemon import HandheldDaemon

from coinf.bundle import Bundle, Candidate
from coinf.errors import CoinfError

log = logging.getLogger(__name__)

#: relative and absolute tolerance of the batched-vs-single check (SIMD kernels differ with M)
RTOL, ATOL = 1e-3, 1e-4


class Outcome(NamedTuple):
    """One payload's answer: ``payload`` (a RESULT payload) or ``code``/``text`` (an ERROR)."""

    payload: bytes | None
    code: int = 0
    text: str = ""

    @classmethod
    def error(cls, exc: BaseException) -> Outcome:
        if isinstance(exc, ProtocolError):
            return cls(None, int(exc.code), exc.text or str(exc))
        return cls(None, int(ErrorCode.TAIL_FAILED), f"{type(exc).__name__}: {exc}"[:200])


class BatchRunner:
    """Runs lists of REQUEST payloads for one bundle (module docstring). Thread-safe: one batch
    at a time per runner (a replica process holds one)."""

    def __init__(self, bundle: Bundle | str, *, threads: int = 1, lru: int = 8) -> None:
        self.bundle = bundle if isinstance(bundle, Bundle) else Bundle.load(bundle)
        self.emulation = DeviceEmulation(1.0, threads)
        # the daemon's checks, decoders and encoders; its executor and links are never used
        self.daemon = HandheldDaemon(self.bundle, self.emulation, lru=lru)
        self._batched: dict[str, Any] = {}  # cut -> batched session, or None: frame by frame
        self._lock = threading.Lock()
        #: frames run, batches run, frames that ran inside a batch of more than one
        self.frames = self.batches = self.stacked = 0

    def run(self, payloads: Sequence[bytes]) -> list[Outcome]:
        """One :class:`Outcome` per payload, in order."""
        with self._lock:
            return self._run(payloads)

    def _run(self, payloads: Sequence[bytes]) -> list[Outcome]:
        out: list[Outcome | None] = [None] * len(payloads)
        groups: dict[str, list[tuple[int, Request, dict[str, np.ndarray]]]] = {}
        for i, payload in enumerate(payloads):
            try:
                request, blob = self.daemon.admit(payload)
                if request.kind != Kind.STAGES or len(request.hops) != 1:
                    raise ProtocolError(ErrorCode.UNSUPPORTED, "the tail service runs tails "
                                        "(one-hop STAGES requests); tiles and pipelines go to "
                                        "a coinf handheld")
                if request.hops[0].gamma:  # a compressor's code: the daemon's own path
                    out[i] = Outcome(self.daemon.run(request, blob).payload)
                    continue
                feeds = self.daemon.decode(request, blob)
            except (CoinfError, ValueError) as exc:
                out[i] = Outcome.error(exc)
                continue
            groups.setdefault(request.hops[0].start, []).append((i, request, feeds))
        for cut, frames in groups.items():
            for i, outcome in zip([f[0] for f in frames], self._tail(cut, frames), strict=True):
                out[i] = outcome
        self.frames += len(payloads)
        self.batches += 1
        return [o if o is not None else Outcome(None, int(ErrorCode.TAIL_FAILED), "not run")
                for o in out]

    def _tail(self, cut: str, frames: list[tuple[int, Request, dict[str, np.ndarray]]]
              ) -> list[Outcome]:
        cand = self.daemon.tails.candidate(cut)
        sess = self.batched_session(cand) if len(frames) > 1 else None
        if sess is None:  # frame by frame
            results = []
            for _, request, feeds in frames:
                try:
                    outputs, elapsed = self.daemon.tails.run(cut, feeds)
                    results.append(Outcome(self.daemon.encode(outputs, elapsed, request.nonce)))
                except (CoinfError, ValueError, RuntimeError) as exc:
                    results.append(Outcome.error(exc))
            return results
        names = [o.name for o in sess.get_outputs()]
        stacked = {k: np.concatenate([f[2][k] for f in frames]) for k in frames[0][2]}
        t0 = time.perf_counter()
        try:
            values = sess.run(names, stacked)
        except Exception as exc:  # onnxruntime's own errors: every frame of the batch failed
            return [Outcome.error(RuntimeError(str(exc).splitlines()[0] if str(exc) else exc))
                    ] * len(frames)
        elapsed = time.perf_counter() - t0
        self.stacked += len(frames)
        return [Outcome(self.daemon.encode({n: v[j:j + 1] for n, v in zip(names, values,
                                                                      strict=True)},
                                           elapsed, request.nonce))
                for j, (_, request, _f) in enumerate(frames)]

    def batched_session(self, cand: Candidate) -> Any:
        """The batched session of ``cand``'s tail, or None when it cannot batch (checked once)."""
        if cand.id not in self._batched:
            self._batched[cand.id] = self._make_batched(cand)
        return self._batched[cand.id]

    def _make_batched(self, cand: Candidate) -> Any:
        single = self.daemon.tails.session(cand)
        ins, outs = single.get_inputs(), single.get_outputs()
        if not all(len(t.shape) > 0 and t.shape[0] == 1 for t in (*ins, *outs)):
            log.info("tail %s: a tensor without batch dimension 1: frame by frame", cand.id)
            return None
        try:
            sess = open_batched(self.bundle.path(cand.tail.file or ""), self.emulation)
            rng = np.random.default_rng(0)
            rows = [{t.name: _probe(rng, t) for t in ins} for _ in range(2)]
            names = [o.name for o in outs]
            both = sess.run(names, {k: np.concatenate([r[k] for r in rows]) for k in rows[0]})
            for j, row in enumerate(rows):
                for got, want in zip(both, single.run(names, row), strict=True):
                    if got.shape[0] != 2 or not np.allclose(got[j:j + 1], want, RTOL, ATOL):
                        raise ValueError("batched rows differ from single runs")
        except Exception as exc:
            log.info("tail %s does not batch (%s): frame by frame", cand.id,
                     str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__)
            return None
        return sess


def open_batched(path: Any, emulation: DeviceEmulation) -> Any:
    """An onnxruntime session of the slice at ``path`` with the leading dimension of every
    graph input and output made symbolic (``batch``) and the stored intermediate shapes
    dropped, so onnxruntime infers them for any batch."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(path))
    for value in (*model.graph.input, *model.graph.output):
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].ClearField("dim_value")
            dims[0].dim_param = "batch"
    del model.graph.value_info[:]
    opts = emulation.session_options() or ort.SessionOptions()
    opts.log_severity_level = 4  # a tail that cannot batch fails its probe: no error lines
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def _probe(rng: np.random.Generator, info: Any) -> np.ndarray:
    """A random batch-1 tensor for the session input ``info`` (int inputs: 0 or 1)."""
    shape = [1, *[d if isinstance(d, int) and d > 0 else 1 for d in info.shape[1:]]]
    kind = info.type  # e.g. "tensor(float)"
    if "int" in kind:
        return rng.integers(0, 2, size=shape).astype(np.int64 if "int64" in kind else np.int32)
    floats = np.float16 if "float16" in kind else np.float64 if "double" in kind else np.float32
    return rng.standard_normal(shape).astype(floats)


__all__ = ["BatchRunner", "Outcome", "open_batched"]
