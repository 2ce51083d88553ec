"""A candidate's head and tail run on onnxruntime straight from the bundle files, one thread
each (calibration, retiming and the entropy bench)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from coinf.bundle import Bundle, Candidate, open_slice
from coinf.errors import BundleError, InputError


class Runner:
    """A candidate's head and tail from the bundle files; the tail gives every graph output."""

    def __init__(self, bundle: Bundle, cand: Candidate) -> None:
        if cand.is_wearable_only:
            raise BundleError(f"candidate {cand.id} is wearable-only: nothing crosses the link")
        self.cid = cand.id
        self.head = None if cand.head.file is None else session(bundle.path(cand.head.file))
        assert cand.tail.file is not None
        self.tail = session(bundle.path(cand.tail.file))
        self.crossing = [t.name for t in cand.crossing]
        self.head_inputs = [] if self.head is None else [i.name for i in self.head.get_inputs()]
        self.tail_inputs = [i.name for i in self.tail.get_inputs()]
        self.outputs = [o.name for o in self.tail.get_outputs()]
        unknown = [n for n in self.tail_inputs if n not in self.crossing]
        if unknown:
            raise BundleError(f"candidate {cand.id}: tail needs {unknown}, not in its crossing")

    def run_head(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.head is None:
            return {n: feed[n] for n in self.crossing}
        outs = self._run(self.head, "head", self.crossing,
                         {n: feed[n] for n in self.head_inputs})
        return dict(zip(self.crossing, outs, strict=True))

    def run_tail(self, crossing: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        outs = self._run(self.tail, "tail", self.outputs,
                         {n: crossing[n] for n in self.tail_inputs})
        return dict(zip(self.outputs, (np.asarray(o) for o in outs), strict=True))

    def _run(self, sess: Any, part: str, names: list[str], feed: dict[str, np.ndarray]) -> Any:
        try:
            return sess.run(names, feed)
        except Exception as exc:  # onnxruntime's own error types: the data does not fit
            text = str(exc).strip().splitlines()
            raise InputError(f"candidate {self.cid}: onnxruntime failed running the {part} on "
                             f"this data: {text[0] if text else type(exc).__name__}") from None


def session(path: Any) -> Any:
    """A one-thread CPU onnxruntime session of a bundle file (calibration is single-core)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return open_slice(path, opts)
