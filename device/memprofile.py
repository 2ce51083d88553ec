"""Peak resident memory (RSS) of running one slice, measured in a fresh process.

Peak RSS only grows within a process, so every slice is measured in its own child Python
(``python -m coinf.device.memprofile SLICE THREADS RUNS``): it imports onnxruntime and numpy,
opens the slice as the wearable does, runs it ``RUNS`` times on random inputs and reports its
``ru_maxrss``. The figure therefore includes the runtime (interpreter, numpy, onnxruntime), the
weights as onnxruntime holds them and the peak activations: what the wearable's process needs to
run that head. ``runtime_baseline_mb`` measures the same child with an empty model.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: a slice whose child runs longer than this is reported as a failure, not awaited forever
CHILD_TIMEOUT_S = 300.0


def _maxrss_mb() -> float:
    """This process's peak RSS. Linux: ``VmHWM`` (``ru_maxrss`` would include the parent's RSS
    at fork time, which survives ``execve``); elsewhere ``ru_maxrss``."""
    import resource

    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, else kB


def slice_peak_rss_mb(path: str | Path, threads: int = 1, runs: int = 2,
                      timeout_s: float = CHILD_TIMEOUT_S) -> float:
    """Peak RSS (MB = 2**20 bytes) of a fresh process that opens ``path`` with onnxruntime and
    runs it ``runs`` times; the child is killed after ``timeout_s``."""
    from coinf.device.profile import ProfileError

    cmd = [sys.executable, "-m", "coinf.device.memprofile", str(path), str(threads), str(runs)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired:
        raise ProfileError(f"measuring the memory of {path} took over {timeout_s:g} s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ProfileError(f"measuring the memory of {path} failed (exit {proc.returncode}): "
                           f"{last[:200]}")
    try:
        return float(json.loads(proc.stdout.strip().splitlines()[-1])["peak_rss_mb"])
    except (ValueError, KeyError, IndexError) as exc:
        raise ProfileError(f"memory probe for {path} printed no result: {exc}") from None


def _empty_model(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "empty",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


def runtime_baseline_mb(threads: int = 1) -> float:
    """Peak RSS of the same child running an empty (Identity) model: the runtime's share."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "empty.onnx"
        _empty_model(path)
        return slice_peak_rss_mb(path, threads, runs=1)


def measure_heads(bundle: Any, threads: int = 1, runs: int = 2,
                  progress: Callable[[str], None] | None = None) -> dict[str, float]:
    """Peak RSS (MB) of every candidate's head, by candidate id (candidates without a head are
    left out: the wearable runs nothing for them)."""
    out: dict[str, float] = {}
    heads = [c for c in bundle.candidates if c.head.file is not None]
    for i, cand in enumerate(heads):
        out[cand.id] = slice_peak_rss_mb(bundle.path(cand.head.file), threads, runs)
        if progress:
            progress(f"memory {i + 1}/{len(heads)} {cand.id}: head peak RSS "
                     f"{out[cand.id]:.1f} MB")
    return out


def _child(argv: list[str]) -> None:
    """The measured process: open the slice, run it, print the peak RSS as JSON."""
    import numpy as np
    import onnxruntime as ort

    path, threads, runs = argv[0], int(argv[1]), int(argv[2])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    types = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32,
             "tensor(float16)": np.float16, "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in i.shape]
        dtype = types.get(i.type, np.float32)
        feeds[i.name] = (rng.standard_normal(shape) if dtype in (np.float32, np.float16)
                         else np.zeros(shape)).astype(dtype)
    for _ in range(max(1, runs)):
        sess.run(None, feeds)
    print(json.dumps({"peak_rss_mb": round(_maxrss_mb(), 2)}))


if __name__ == "__main__":
    _child(sys.argv[1:])
