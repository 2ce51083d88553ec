"""Stopping work that runs in a thread: an onnxruntime run, an emulated device's sleep.

A :class:`CancelToken` is a ``threading.Event`` that, when set, also sets ``terminate`` on every
onnxruntime ``RunOptions`` currently running under it (onnxruntime then aborts the run between
kernels) and wakes an emulated device's stretch sleep. Work stopped this way raises
:class:`Cancelled`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import onnxruntime as ort


class Cancelled(Exception):
    """The work was stopped by its :class:`CancelToken`."""


class CancelToken(threading.Event):
    """Set from any thread to stop the slice runs and emulated sleeps that watch it."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._running: set[ort.RunOptions] = set()

    def set(self) -> None:
        with self._lock:
            super().set()
            for ro in self._running:
                ro.terminate = True

    def check(self) -> None:
        """Raise :class:`Cancelled` if set."""
        if self.is_set():
            raise Cancelled("cancelled")

    @contextmanager
    def run_options(self) -> Iterator[ort.RunOptions]:
        """``RunOptions`` for one onnxruntime run that :meth:`set` terminates."""
        ro = ort.RunOptions()
        with self._lock:
            ro.terminate = self.is_set()
            self._running.add(ro)
        try:
            yield ro
        finally:
            with self._lock:
                self._running.discard(ro)
