"""Run a bundle's ``.tflite`` slice with LiteRT behind onnxruntime's surface.

:class:`LiteRTSlice` has what :class:`~coinf.device.runtime.SliceRunner` uses of an
``onnxruntime.InferenceSession``: ``get_inputs()``, ``get_outputs()`` and ``run(names, feeds)``,
with the slice's ONNX tensor names, shapes and dtypes. The converter (:mod:`convert.tflite`)
flattened every crossing tensor to ``[1, numel]`` in ONNX order, so feeding is a reshape; raw
model inputs of a head keep their ONNX layout. Tensors a slice passes straight through (an
input that is also an output) are copied here, not by the interpreter.

Stateful ops (LSTM/GRU variables) keep state between ``invoke`` calls: every run resets them
first, so a slice is a pure function like its ONNX twin. One interpreter is not thread-safe:
runs are serialised by a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from coinf.deps import litert_interpreter
from coinf.errors import BundleError


@dataclass(frozen=True)
class SliceArg:
    """Like ``onnxruntime.NodeArg``: name, shape and numpy dtype name of a slice's tensor."""

    name: str
    shape: tuple[int, ...]
    dtype: str


def _args(items: Sequence[Mapping[str, Any]]) -> list[SliceArg]:
    return [SliceArg(str(t["name"]), tuple(int(d) for d in t["shape"]), str(t["dtype"]))
            for t in items]


class LiteRTSlice:
    """One converted slice. ``entry`` is its manifest record (docs/BUNDLE.md, ``tflite``):
    ``inputs`` / ``outputs`` (ONNX name, shape, dtype; TFLite tensors ``in<i>`` / ``out<j>``
    in that order), ``passthrough`` (names copied from the feeds) and ``xnnpack`` (false: run
    with LiteRT's builtin kernels only, the XNNPACK delegate failed to prepare this slice)."""

    def __init__(self, path: str | Path | None, entry: Mapping[str, Any], threads: int = 0,
                 ) -> None:
        self.inputs = _args(entry.get("inputs", []))
        self.outputs = _args(entry.get("outputs", []))
        self.passthrough = [str(n) for n in entry.get("passthrough", [])]
        self.path = path
        self._lock = threading.Lock()
        self._interp: Any = None
        self._in: list[dict[str, Any]] = []
        self._out: list[dict[str, Any]] = []
        if path is None:
            if self.outputs:
                raise BundleError("a TFLite slice with outputs needs its .tflite file")
            return
        interpreter = litert_interpreter()
        options: dict[str, Any] = {}
        if entry.get("xnnpack", True) is False:  # the converter found XNNPACK cannot prepare it
            import sys

            resolver = sys.modules[interpreter.__module__].OpResolverType
            options["experimental_op_resolver_type"] = resolver.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        try:
            self._interp = interpreter(model_path=str(path), num_threads=threads or None,
                                       **options)
            self._interp.allocate_tensors()
        except Exception as exc:  # LiteRT raises ValueError/RuntimeError with C++ text
            if not Path(path).is_file():
                raise BundleError(f"bundle file {path} is missing") from None
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise BundleError(f"LiteRT cannot load {Path(path).name}: {first[:200]}") from None
        by_name_in = {d["name"]: d for d in self._interp.get_input_details()}
        by_name_out = {d["name"]: d for d in self._interp.get_output_details()}
        try:
            self._in = [by_name_in[f"in{i}"] for i in range(len(self.inputs))]
            self._out = [by_name_out[f"out{j}"] for j in range(len(self.outputs))]
        except KeyError as exc:
            raise BundleError(f"{path} has no tensor {exc}; re-run `coinf convert tflite`") \
                from None

    def get_inputs(self) -> list[SliceArg]:
        """Every tensor the slice reads (computed inputs, then pass-through ones)."""
        names = {a.name for a in self.inputs}
        return self.inputs + [SliceArg(n, (), "") for n in self.passthrough if n not in names]

    def get_outputs(self) -> list[SliceArg]:
        return self.outputs + [SliceArg(n, (), "") for n in self.passthrough]

    def run(self, names: Sequence[str] | None, feeds: Mapping[str, np.ndarray],
            run_options: Any = None) -> list[np.ndarray]:
        """Outputs ``names`` (all when None) for ``feeds``, with ONNX shapes and dtypes."""
        result: dict[str, np.ndarray] = {n: np.asarray(feeds[n]) for n in self.passthrough}
        if self._interp is not None:
            with self._lock:
                for arg, det in zip(self.inputs, self._in, strict=True):
                    value = np.asarray(feeds[arg.name])
                    want = np.dtype(det["dtype"])
                    if value.dtype.char != want.char:  # also 'q' -> 'l': LiteRT knows only one
                        value = value.astype(want)
                    self._interp.set_tensor(det["index"],
                                            np.ascontiguousarray(value.reshape(det["shape"])))
                self._interp.reset_all_variables()  # RNN state must not leak between runs
                self._interp.invoke()
                for arg, det in zip(self.outputs, self._out, strict=True):
                    raw = self._interp.get_tensor(det["index"])
                    result[arg.name] = raw.reshape(arg.shape).astype(arg.dtype, copy=False)
        wanted = [a.name for a in self.get_outputs()] if not names else list(names)
        return [result[n] for n in wanted]
