"""Run candidate tails with onnxruntime, keeping a small LRU of loaded sessions."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np
import onnxruntime as ort
from coinf.ble_protocol.messages import ErrorCode, ProtocolError
from coinf.convert.bundle import Bundle, Candidate
from coinf.device.emulation import DeviceEmulation


class TailRunner:
    """Loads tail slices on demand (at most ``capacity`` kept) and runs them."""

    def __init__(
        self, bundle: Bundle, emulation: DeviceEmulation | None = None, capacity: int = 4
    ) -> None:
        if capacity < 1:
            raise ValueError("LRU capacity must be >= 1")
        self.bundle = bundle
        self.emulation = emulation or DeviceEmulation()
        self.capacity = capacity
        self._sessions: OrderedDict[str, ort.InferenceSession] = OrderedDict()
        self._lock = threading.Lock()

    def session(self, cand: Candidate) -> ort.InferenceSession:
        if cand.tail.file is None:
            raise ProtocolError(
                ErrorCode.UNKNOWN_CANDIDATE, f"candidate {cand.id} has no tail (wearable-only)"
            )
        with self._lock:
            sess = self._sessions.get(cand.id)
            if sess is not None:
                self._sessions.move_to_end(cand.id)
                return sess
        path = str(self.bundle.path(cand.tail.file))
        sess = ort.InferenceSession(
            path, self.emulation.session_options(), providers=["CPUExecutionProvider"]
        )
        with self._lock:
            self._sessions[cand.id] = sess
            while len(self._sessions) > self.capacity:
                self._sessions.popitem(last=False)
        return sess

    @property
    def loaded(self) -> list[str]:
        with self._lock:
            return list(self._sessions)

    def candidate(self, cid: str) -> Candidate:
        for cand in self.bundle.candidates:
            if cand.id == cid:
                return cand
        raise ProtocolError(ErrorCode.UNKNOWN_CANDIDATE, f"no candidate {cid!r} in this bundle")

    def check_feeds(self, cand: Candidate, feeds: Mapping[str, np.ndarray]) -> None:
        """The wire is untrusted: crossing tensors must match the manifest exactly."""
        expected = {t.name: t for t in cand.crossing}
        if set(feeds) != set(expected):
            missing = sorted(set(expected) - set(feeds))
            extra = sorted(set(feeds) - set(expected))
            raise ProtocolError(
                ErrorCode.MALFORMED,
                f"candidate {cand.id}: missing tensors {missing}, unexpected tensors {extra}",
            )
        for name, arr in feeds.items():
            spec = expected[name]
            if tuple(arr.shape) != spec.shape or arr.dtype != np.dtype(spec.dtype):
                raise ProtocolError(
                    ErrorCode.MALFORMED,
                    f"tensor {name!r} is {arr.dtype}{list(arr.shape)}, "
                    f"candidate {cand.id} expects {spec.dtype}{list(spec.shape)}",
                )

    def run(self, cid: str, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        """Run candidate ``cid``'s tail; returns (outputs by name, emulated compute seconds)."""
        cand = self.candidate(cid)
        self.check_feeds(cand, feeds)
        sess = self.session(cand)
        wanted = {i.name for i in sess.get_inputs()}
        tail_in = {k: v for k, v in feeds.items() if k in wanted}
        values, elapsed = self.emulation.timed(lambda: sess.run(None, tail_in))
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, values, strict=True)), elapsed
