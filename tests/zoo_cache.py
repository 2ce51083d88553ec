"""Zoo models rebuilt from their builders, cached across test runs.

Training ``digitnet`` takes about 45 s and ``lenet_digits`` a few: the rebuild tests
(tests/test_models.py) reuse what an earlier run built, from a directory keyed by a hash of
everything a build reads (the builders' source, the CLI command, the versions of torch, numpy,
onnx, onnxruntime and scikit-learn, whose digits the models train on, the Python version and the
machine). Any change there rebuilds. ``COINF_TEST_CACHE`` (default ``~/.cache/coinf-tests``)
moves it; ``COINF_TEST_CACHE=off`` builds in a temporary directory every run.

A cold cache must not make one test slow either: when a session collects the rebuild tests, the
conftest starts building the trained models in a background process (one torch thread, as every
build) and the fixture then waits for that build, which on an idle machine has finished by the
time the tests get there (they come about halfway through the suite). A per-model file lock
keeps the two from building the same model twice.

    python -m tests.zoo_cache NAME...    build NAME... into the cache (what the conftest starts)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = "COINF_TEST_CACHE"
#: the distributions whose versions can change a build
PACKAGES = ("torch", "numpy", "onnx", "onnxruntime", "scikit-learn")


def enabled() -> bool:
    """Not switched off, and the cache directory can be made (a read-only home: no cache)."""
    if os.environ.get(ENV, "").lower() in ("off", "0", "no"):
        return False
    try:
        zoo_dir()
    except OSError:
        return False
    return True


def inputs_key() -> str:
    """A hash of everything ``coinf models build`` reads."""
    h = hashlib.sha256()
    sources = sorted(p for p in (ROOT / "models").rglob("*.py") if "onnx" not in p.parts)
    sources.append(ROOT / "coinf" / "cli" / "commands" / "models.py")
    for path in sources:
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    for dist in PACKAGES:
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = "-"
        h.update(f"{dist}={version}\0".encode())
    h.update(f"{sys.version}\0{platform.machine()}\0".encode())
    return h.hexdigest()[:20]


def zoo_dir() -> Path:
    """This key's cache directory (created)."""
    root = Path(os.environ.get(ENV) or Path.home() / ".cache" / "coinf-tests")
    d = root / f"zoo-{inputs_key()}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def built(d: Path, name: str) -> bool:
    """``NAME.onnx`` is moved in last: its presence means the build finished."""
    return (d / f"{name}.onnx").is_file()


@contextlib.contextmanager
def _locked(d: Path, name: str) -> Iterator[None]:
    with open(d / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # waits for a build of the same model under way
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def build(name: str, d: Path | None = None) -> Path:
    """``NAME.onnx`` (and ``NAME.json`` for a trained model) in ``d`` (default: the cache),
    built with ``coinf models build`` unless already there; returns the directory."""
    from coinf.cli import main

    d = zoo_dir() if d is None else d
    if built(d, name):
        return d
    with _locked(d, name):
        if built(d, name):
            return d
        with tempfile.TemporaryDirectory(dir=d, prefix=f".{name}-") as tmp:
            assert main(["models", "build", name, "--out", tmp]) == 0, name
            files = sorted(Path(tmp).iterdir(), key=lambda p: p.suffix == ".onnx")
            for f in files:  # the .onnx last
                os.replace(f, d / f.name)
    return d


def prebuild_in_background(names: list[str]) -> subprocess.Popen[bytes] | None:
    """Start building the ``names`` missing from the cache in another process (one torch
    thread, as every build: on a machine with two cores it trains beside the tests)."""
    if not enabled():
        return None
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    d = zoo_dir()
    missing = [n for n in names if not built(d, n)]
    if not missing:
        return None
    log = open(d / ".prebuild.log", "wb")  # noqa: SIM115 (the child writes it)
    with log:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.zoo_cache", *missing], cwd=ROOT,
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    """End a prebuild still running when the session ends (nothing waits for it)."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    import signal

    # terminated (the session ended first): unwind, so the temporary build directory goes
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    for model in sys.argv[1:]:
        build(model)
