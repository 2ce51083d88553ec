"""Make this machine behave like a slower wearable (e.g. a Pi Zero 2 W).

After each head run the wearable waits ``(slowdown - 1) x`` the measured compute time, so an
``K x`` slower device is emulated with the real model, the real data and the real outputs.
With ``rates`` (a device profile's per-op-type rates, e.g. the built-in Pi Zero 2 W's) each
model slice instead takes the time those rates predict for it, so the emulated device spends
its time across layers as that device does, not as this machine's CPU does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import onnxruntime as ort
from coinf.device.cancel import CancelToken
from coinf.device.ort_options import quiet_workers

T = TypeVar("T")


@dataclass(frozen=True)
class DeviceEmulation:
    """How one side runs: a slowdown factor (>= 1), the onnxruntime thread count (0 = ORT's)
    and, optionally, op ``rates`` (:class:`~coinf.device.defaults.OpRates`) that time each model
    slice (:meth:`slice_seconds`)."""

    slowdown: float = 1.0
    threads: int = 0
    rates: Any = None
    _targets: dict[str, float] = field(default_factory=dict, compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.slowdown >= 1.0:
            raise ValueError(f"slowdown must be >= 1 (1 = this machine), got {self.slowdown}")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0 (0 = onnxruntime default), got {self.threads}")

    def session_options(self) -> ort.SessionOptions:
        opts = ort.SessionOptions()
        if self.threads:
            opts.intra_op_num_threads = self.threads
            opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        return quiet_workers(opts)

    def stretch(self, compute_s: float, cpu_s: float | None = None,
                cancel: CancelToken | None = None) -> float:
        """Sleep so that a step that took ``compute_s`` appears to take ``slowdown x`` as long.

        With one onnxruntime thread the step runs on the calling thread, and ``cpu_s`` (that
        thread's CPU time for the step) is the better base: other work on a shared machine
        delays the step's wall time, and the slowdown would multiply that noise K times.
        Returns the emulated duration in seconds. A set ``cancel`` cuts the sleep short and
        raises :class:`~coinf.device.cancel.Cancelled`.
        """
        base = cpu_s if (cpu_s is not None and self.threads == 1) else compute_s
        extra = (self.slowdown - 1.0) * base
        _sleep(extra, cancel)
        return compute_s + extra

    def timed(self, fn: Callable[[], T], cancel: CancelToken | None = None,
              target_s: float | None = None) -> tuple[T, float]:
        """Run ``fn`` as an emulated step; returns (its result, emulated seconds). With
        ``target_s`` the step lasts that long (or as long as ``fn`` took, if longer) instead of
        being stretched."""
        t0, c0 = time.perf_counter(), time.thread_time()
        result = fn()
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        if target_s is None:
            return result, self.stretch(wall, cpu, cancel)
        _sleep(target_s - wall, cancel)
        return result, max(wall, target_s)

    def slice_seconds(self, path: str) -> float | None:
        """How long the model slice in ``path`` takes on the emulated device by ``rates`` (None
        without rates: the slice is stretched ``slowdown`` x instead). Computed once per file."""
        if self.rates is None:
            return None
        with self._lock:
            got = self._targets.get(path)
        if got is None:
            import onnx
            from coinf.device.features import node_features

            got = float(self.rates.model_ms(node_features(
                onnx.load(path, load_external_data=False)))) / 1e3
            with self._lock:
                self._targets[path] = got
        return got


def compute_rates(name: str | None) -> Any:
    """The op rates of the built-in profile ``name`` (``pi-zero-2w``) that time an emulated
    wearable's slices, None for none (slices stretched ``slowdown`` x)."""
    if name is None:
        return None
    from coinf.device.profile import DeviceProfile

    if name != "pi-zero-2w":
        raise ValueError(f"no built-in wearable profile {name!r}; expected pi-zero-2w")
    return DeviceProfile.pi_zero_2w().rates


def _sleep(seconds: float, cancel: CancelToken | None) -> None:
    if seconds <= 0:
        return
    if cancel is None:
        time.sleep(seconds)
    elif cancel.wait(seconds):
        cancel.check()


def profile_slowdown(model_path: str, profile: object, threads: int = 1,
                     repeats: int = 15) -> tuple[float, float, float]:
    """How much slower ``profile`` (a :class:`~coinf.device.profile.DeviceProfile` with op
    rates, e.g. the built-in Pi Zero 2 W) runs ``model_path`` than this machine: (slowdown >= 1,
    the profile's predicted ms, this machine's ms on one thread).

    This machine's time is the median *CPU* time of the running thread, the same base
    :meth:`DeviceEmulation.stretch` multiplies with one thread, so a shared, busy machine
    neither shrinks nor inflates the factor."""
    import statistics

    import onnx
    from coinf.device.features import node_features
    from coinf.device.sweep import make_session, random_feeds

    rates = getattr(profile, "rates", None)
    if rates is None:
        raise ValueError("the profile has no op rates to compare with this machine")
    predicted = float(rates.model_ms(node_features(onnx.load(model_path,
                                                             load_external_data=False))))
    sess = make_session(model_path, threads)
    feeds = random_feeds(sess)
    cpu = []
    for i in range(3 + repeats):
        c0 = time.thread_time()
        sess.run(None, feeds)  # type: ignore[attr-defined]
        if i >= 3:
            cpu.append((time.thread_time() - c0) * 1e3)
    here = max(statistics.median(cpu), 1e-3)
    return max(1.0, predicted / here), predicted, here
