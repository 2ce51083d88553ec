"""``coinf bench walk``: the path of one frame through coinf's modules, traced.

One split frame (``Session.run``, the handheld in-process, the zoo's LeNet cut in the middle) and
one 3-device pipeline frame (``AsyncSession.run`` through two helper daemons in this process)
run once to warm up, then once under a profiler hook on every thread. Every invocation of a
function of a ``coinf`` module is counted once (a coroutine resuming is the same invocation),
with the nearest ``coinf`` function below it on its stack as its caller:

* ``calls``: invocations; ``cross_module``: those whose caller is in another module (or that
  an event loop or a thread pool started: ``roots``); ``package_crossings``: those whose caller
  is in another top-level package (``coinf.wearable`` -> ``coinf.ble_protocol``...);
* ``reentries``: calls into a module that is already on the stack below a different module
  (an upcall: the frame re-enters a module it left);
* ``threads``: threads that ran coinf code for the frame; ``modules``: the modules entered, in
  order of first entry.

The counts follow the code, so the same command on two commits compares their designs; threads
and roots also follow one timing choice (a head that ran under 1 ms runs on the event loop, not
the head thread), and so may differ by a few between runs. Everything stays in this process:
the links are in-process or loopback TCP.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np


def register(parser: argparse.ArgumentParser) -> None:
    from coinf.cli.bench import options

    options.add_json(parser)
    parser.add_argument("--list", action="store_true",
                        help="also list every cross-module call (caller -> callee), in order")
    options.add_png(parser, "the package each cross-module call enters, in order")
    parser.set_defaults(func=run)


class Tracer:
    """Counts the invocations of ``coinf`` functions while it is installed (module docstring)."""

    def __init__(self) -> None:
        #: counting only while set (installed before the session starts its threads, which
        #: inherit the hook; the warm-up frame runs with it off)
        self.active = False
        self.files: dict[str, str | None] = {}
        self._known = 0
        self._refresh()
        self.seen: set[int] = set()
        self.keep: list[FrameType] = []  # alive until the end: ids of frames are not reused
        self.events: list[tuple[int, str | None, str, bool]] = []

    def _refresh(self) -> None:
        """Learn the ``coinf`` modules imported since (a session imports the in-process
        handheld's only when it connects)."""
        if len(sys.modules) == self._known:
            return
        self._known = len(sys.modules)
        for name, m in list(sys.modules.items()):
            if name.startswith("coinf") and (path := getattr(m, "__file__", None)):
                self.files.setdefault(str(Path(path).resolve()), name)

    def module(self, frame: FrameType | None) -> str | None:
        if frame is None:
            return None
        file = frame.f_code.co_filename
        if file not in self.files:
            self._refresh()
            self.files[file] = self.files.get(str(Path(file).resolve()))
        return self.files[file]

    def hook(self, frame: FrameType, event: str, _arg: Any) -> None:
        if not self.active or event != "call" or id(frame) in self.seen:
            return
        callee = self.module(frame)
        if callee is None:
            return
        self.seen.add(id(frame))
        self.keep.append(frame)
        below: list[str] = []
        f = frame.f_back
        while f is not None:
            m = self.module(f)
            if m is not None:
                below.append(m)
            f = f.f_back
        caller = below[0] if below else None
        upcall = caller is not None and caller != callee and callee in below[1:]
        self.events.append((threading.get_ident(), caller, callee, upcall))

    def __enter__(self) -> Tracer:
        threading.setprofile(self.hook)
        sys.setprofile(self.hook)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)
        threading.setprofile(None)

    def summary(self, listing: bool) -> dict[str, Any]:
        def pkg(m: str | None) -> str | None:
            return None if m is None else ".".join(m.split(".")[:2])

        cross = [(a, b) for _, a, b, _ in self.events if a != b]
        order = list(dict.fromkeys(b for _, _, b, _ in self.events))
        out: dict[str, Any] = {
            "calls": len(self.events), "cross_module": len(cross),
            "roots": sum(a is None for a, _ in cross),
            "package_crossings": sum(a is not None and pkg(a) != pkg(b) for a, b in cross),
            "reentries": sum(up for *_, up in self.events),
            "threads": len({t for t, *_ in self.events}),
            "modules": order}
        if listing:
            out["cross_module_calls"] = [f"{a} -> {b}" for a, b in cross]
        return out


def _bundle(tmp: Path) -> Any:
    import coinf.models
    from coinf.convert.split import split_model

    lenet = Path(str(coinf.models.__file__)).parent / "onnx" / "lenet_digits.onnx"
    return split_model(lenet, tmp / "lenet")


def _feed(bundle: Any) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {t.name: rng.standard_normal(t.shape).astype(t.dtype) for t in bundle.inputs}


def split_walk(bundle: Any, listing: bool) -> dict[str, Any]:
    from coinf import LinkOptions, PlacementOptions, Session, SessionOptions

    cut = bundle.candidates[len(bundle.candidates) // 2].id
    feed = _feed(bundle)
    opts = SessionOptions(placement=PlacementOptions(split=cut),
                          link=LinkOptions(transport="inprocess"))
    with Tracer() as tracer, Session(bundle, opts) as sess:
        sess.run(None, feed)  # opens the slices on both sides
        tracer.active = True
        sess.run(None, feed)
        tracer.active = False
    return {"candidate": cut, **tracer.summary(listing)}


async def _pipeline(bundle: Any, listing: bool) -> dict[str, Any]:
    from coinf import AsyncSession, LinkOptions, PlacementOptions, SessionOptions
    from coinf.handheld.pipeline_host import local_helpers
    from coinf.wearable.pipeline_config import HelperConfig
    from coinf.wearable.plan import Plan, Stage

    ids = [c.id for c in bundle.candidates]
    a, b = ids[len(ids) // 3], ids[2 * len(ids) // 3]
    plan = Plan.build(bundle, [Stage("wearable", ids[0], a), Stage("h1", a, b),
                               Stage("h2", b, ids[-1])])
    feed = _feed(bundle)
    with Tracer() as tracer:
        async with local_helpers(bundle, ["h1", "h2"]) as hosts:
            helpers = [HelperConfig(h.name, h.address) for h in hosts]
            opts = SessionOptions(placement=PlacementOptions(plan=plan.to_json(),
                                                             helpers=helpers),
                                  link=LinkOptions(timeout=10.0))
            async with AsyncSession(bundle, opts) as sess:
                await sess.run(None, feed)
                tracer.active = True
                await sess.run(None, feed)
                tracer.active = False
    return {"plan": str(plan), **tracer.summary(listing)}


def measure(listing: bool, progress: Callable[[str], None]) -> dict[str, Any]:
    """Both walks on the zoo's LeNet, split into a temporary bundle."""
    with tempfile.TemporaryDirectory(prefix="coinf-walk-") as tmp:
        bundle = _bundle(Path(tmp))
        progress("walk: one split frame")
        split = split_walk(bundle, listing)
        progress("walk: one 3-device pipeline frame")
        pipeline = asyncio.run(_pipeline(bundle, listing))
    return {"model": "lenet_digits", "split": split, "pipeline": pipeline}


def run(args: argparse.Namespace) -> int:
    from coinf.cli.bench import emit, options, progress
    options.check_png(args.png)
    result = measure(args.list or bool(args.png), progress)
    if args.png:
        from coinf.cli.bench.walk_chart import plot_walk

        plot_walk(result, args.png)
        result["png"] = args.png
        if not args.list:  # drawn, not asked for
            for name in ("split", "pipeline"):
                result[name].pop("cross_module_calls", None)
    emit(result)
    return 0


if __name__ == "__main__":  # the same walk on another commit's installed coinf
    import json

    print(json.dumps(measure("--list" in sys.argv, lambda m: print(m, file=sys.stderr)),
                     indent=1))
