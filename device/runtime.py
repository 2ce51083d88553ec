"""Run a bundle's slices with onnxruntime or LiteRT, keeping a small LRU of loaded sessions.

Both sides use it: the wearable for heads (and for tails when it finishes an inference itself),
the handheld daemon for tails.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort
from coinf.device.cancel import Cancelled, CancelToken
from coinf.device.emulation import DeviceEmulation
from coinf.device.litert import LITERT, ONNXRUNTIME, check_runtime, open_litert, resolve

from coinf.bundle import Bundle, Candidate, open_slice, verify_file
from coinf.errors import ErrorCode, ProtocolError


class SliceRunner:
    """Loads ``(candidate, part)`` slices on demand (at most ``capacity`` kept) and runs them.

    ``part`` is ``"head"`` or ``"tail"``. Thread-safe: sessions may run on several threads.
    ``runtime`` (``onnxruntime``, ``litert``, ``auto``) is resolved per slice by
    :func:`coinf.device.litert.resolve`, ``auto`` from ``profile``'s measured times.
    """

    def __init__(
        self,
        bundle: Bundle,
        emulation: DeviceEmulation | None = None,
        capacity: int = 4,
        providers: Sequence[str] = ("CPUExecutionProvider",),
        runtime: str = ONNXRUNTIME,
        profile: Any = None,
    ) -> None:
        if capacity < 1:
            raise ValueError("LRU capacity must be >= 1")
        self.bundle = bundle
        self.runtime = check_runtime(runtime, bundle)
        self.profile = profile
        self.emulation = emulation or DeviceEmulation()
        self.capacity = capacity
        self.providers = list(providers)
        self._sessions: OrderedDict[tuple[str, str, str], Any] = OrderedDict()
        self._lock = threading.Lock()

    def runtime_of(self, cand: Candidate, part: str) -> str:
        """The runtime that runs ``cand``'s ``part`` here."""
        return resolve(self.runtime, self.bundle, cand, part, self.profile)

    def slice_session(self, cand: Candidate, part: str) -> Any:
        """An ``onnxruntime.InferenceSession``, or a LiteRT slice with the same surface."""
        file = (cand.head if part == "head" else cand.tail).file
        if file is None:
            raise ProtocolError(
                ErrorCode.UNKNOWN_CANDIDATE, f"candidate {cand.id} has no {part} slice"
            )
        runtime = self.runtime_of(cand, part)
        key = (cand.id, part, runtime)
        with self._lock:
            sess = self._sessions.get(key)
            if sess is not None:
                self._sessions.move_to_end(key)
                return sess
        if runtime == LITERT:
            sess = open_litert(self.bundle, cand, part, self.emulation.threads)
        else:
            path = self.bundle.path(file)
            verify_file(path, (cand.head if part == "head" else cand.tail).sha256)
            sess = open_slice(path, self.emulation.session_options(), self.providers)
        with self._lock:
            self._sessions[key] = sess
            while len(self._sessions) > self.capacity:
                self._sessions.popitem(last=False)
        return sess

    def run_slice(
        self, cand: Candidate, part: str, feeds: Mapping[str, np.ndarray],
        cancel: CancelToken | None = None,
    ) -> tuple[dict[str, np.ndarray], float]:
        """Run one slice on the feeds it needs; (outputs by name, emulated compute seconds).
        A set ``cancel`` aborts the run (and an emulated device's sleep): :class:`Cancelled`."""
        sess = self.slice_session(cand, part)
        wanted = [i.name for i in sess.get_inputs()]
        names = [o.name for o in sess.get_outputs()]
        slice_in = {k: feeds[k] for k in wanted}
        file = (cand.head if part == "head" else cand.tail).file
        target = (None if self.emulation.rates is None or file is None
                  else self.emulation.slice_seconds(str(self.bundle.path(file))))
        if cancel is None:
            values, elapsed = self.emulation.timed(lambda: sess.run(names, slice_in),
                                                   target_s=target)
            return dict(zip(names, values, strict=True)), elapsed
        with cancel.run_options() as ro:
            try:
                values, elapsed = self.emulation.timed(lambda: sess.run(names, slice_in, ro),
                                                       cancel, target)
            except Cancelled:
                raise
            except Exception:
                if cancel.is_set():  # onnxruntime's "terminate flag" failure
                    raise Cancelled(f"{part} of {cand.id} cancelled") from None
                raise
        return dict(zip(names, values, strict=True)), elapsed

    @property
    def loaded(self) -> list[str]:
        with self._lock:
            return [cid for cid, _, _ in self._sessions]


class TailRunner(SliceRunner):
    """The handheld's view: tails by candidate id, crossing tensors checked against the
    manifest (the wire is untrusted)."""

    def session(self, cand: Candidate) -> ort.InferenceSession:
        return self.slice_session(cand, "tail")

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

    def run(self, cid: str, feeds: Mapping[str, np.ndarray], cancel: CancelToken | None = None,
            ) -> tuple[dict[str, np.ndarray], float]:
        """Run candidate ``cid``'s tail; returns (outputs by name, emulated compute seconds)."""
        cand = self.candidate(cid)
        self.check_feeds(cand, feeds)
        return self.run_slice(cand, "tail", feeds, cancel)
