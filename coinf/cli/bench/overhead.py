"""``coinf bench overhead``: cost of splitting, head+tail in-process vs the whole model, and
(``--session``) of the frame loop: a Session's executor vs plain onnxruntime on the same slices.

Both sides use the same onnxruntime settings; runs are interleaved (whole, split, whole, ...)
so machine noise hits both equally; medians are reported.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from coinf.cli import argtypes
from coinf.cli.bench import emit, median, options, progress


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="ONNX model file")
    options.add_split(parser, default_text="the middle candidate")
    parser.add_argument("--bundle", help="reuse this bundle of MODEL instead of splitting anew")
    parser.add_argument("--runs", type=argtypes.positive_int, default=200,
                        help="interleaved pairs (median)")
    options.add_warmup(parser, 10)
    options.add_threads(parser)
    parser.add_argument("--session", action="store_true",
                        help="also time Session.run over the in-process link")
    options.add_png(parser, "the medians as bars")
    options.add_json(parser)
    parser.set_defaults(func=run)


def _bundle_and_candidate(args: argparse.Namespace, model: Path
                          ) -> tuple[Any, Any, tempfile.TemporaryDirectory[str] | None]:
    """The bundle (``--bundle``, else ``model`` split into a temporary folder, returned too)
    and the candidate to time (``--split``, else the middle one)."""
    from coinf.bundle import Bundle
    from coinf.errors import UserError

    tmp = None
    if args.bundle:
        bundle = Bundle.load(args.bundle)
    else:
        from coinf.convert.split import split_model

        tmp = tempfile.TemporaryDirectory(prefix="coinf-bench-")
        progress(f"splitting {model} ...")
        bundle = split_model(model, Path(tmp.name) / "bundle")
    if args.split:
        cand = bundle.candidate(args.split)
    else:
        cand = bundle.candidates[len(bundle.candidates) // 2]
    if cand.head.file is None or cand.tail.file is None:
        raise UserError(f"candidate {cand.id} is an extreme; pick one with a head and a tail")
    return bundle, cand, tmp


def _ort_session(path: Path, threads: int) -> Any:
    """An onnxruntime CPU session as a Session's slices get them: ``threads`` intra-op threads
    (one inter-op), workers sleeping between runs."""
    import onnxruntime as ort

    from coinf.device.emulation import DeviceEmulation

    opts = DeviceEmulation(threads=threads).session_options()
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _time_interleaved(run_whole: Callable[[], object], run_split: Callable[[], object],
                      run_session: Callable[[], object] | None, runs: int
                      ) -> tuple[list[float], list[float], list[float]]:
    """ms per run of the whole model, the split and (if given) the Session, interleaved:
    whole then split on even runs, split then whole on odd ones, the Session last."""
    full_ms: list[float] = []
    split_ms: list[float] = []
    session_ms: list[float] = []
    for i in range(runs):
        order = (run_whole, run_split) if i % 2 == 0 else (run_split, run_whole)
        for fn in order:
            t0 = time.perf_counter()
            fn()
            (full_ms if fn is run_whole else split_ms).append((time.perf_counter() - t0) * 1e3)
        if run_session is not None:
            t0 = time.perf_counter()
            run_session()
            session_ms.append((time.perf_counter() - t0) * 1e3)
    return full_ms, split_ms, session_ms


def run(args: argparse.Namespace) -> int:
    from coinf.cli.sample import bundle_feeds
    from coinf.errors import UserError

    if args.runs < 1:
        raise UserError("--runs must be >= 1")
    model = Path(args.model)
    if not model.is_file():  # before the "splitting" line: the error alone
        raise UserError(f"MODEL {model}: no such file (expected an .onnx file)")
    options.check_png(args.png)
    bundle, cand, tmp = _bundle_and_candidate(args, model)
    whole = _ort_session(bundle.model_path, args.threads)
    head = _ort_session(bundle.path(cand.head.file), args.threads)
    tail = _ort_session(bundle.path(cand.tail.file), args.threads)
    feeds = bundle_feeds(bundle)
    head_in = {i.name: feeds[i.name] for i in head.get_inputs()}
    head_out = [o.name for o in head.get_outputs()]
    tail_in_names = [i.name for i in tail.get_inputs()]

    def run_split() -> None:
        produced = dict(zip(head_out, head.run(head_out, head_in), strict=True))
        tail.run(None, {n: produced[n] if n in produced else feeds[n] for n in tail_in_names})

    def run_whole() -> None:
        whole.run(None, feeds)

    sess = None
    if args.session:
        from coinf.wearable.options import EmulationOptions, PlacementOptions, SessionOptions
        from coinf.wearable.session import Session

        sess = Session(bundle, SessionOptions(
            placement=PlacementOptions(split=cand.id),
            emulation=EmulationOptions(threads=args.threads, handheld_threads=args.threads)))
    run_session = None if sess is None else partial(sess.run, None, feeds)

    for _ in range(args.warmup):
        run_whole()
        run_split()
        if run_session is not None:
            run_session()
    progress(f"timing {args.runs} interleaved runs of {model.name} at {cand.id} ...")
    full_ms, split_ms, session_ms = _time_interleaved(run_whole, run_split, run_session,
                                                      args.runs)
    result = {
        "model": model.name,
        "split": cand.id,
        "runs": args.runs,
        "threads": args.threads,
        "full_ms": round(median(full_ms), 4),
        "split_ms": round(median(split_ms), 4),
        "ratio": round(median(split_ms) / median(full_ms), 4),
    }
    if sess is not None:
        result["session_ms"] = round(median(session_ms), 4)
        result["session_ratio"] = round(median(session_ms) / median(full_ms), 4)
        # the frame loop's own cost: the executor (checks, request, in-process link, result
        # validation) over plain onnxruntime running the same two slices
        result["session_vs_split"] = round(median(session_ms) / median(split_ms), 4)
        # the same as a fixed cost a frame: it does not grow with the model
        result["frame_loop_ms"] = round(median(session_ms) - median(split_ms), 4)
        sess.close()
    if args.png:
        _plot(result, args.png)
        result["png"] = args.png
    emit(result)
    if tmp is not None:
        tmp.cleanup()
    return 0


def _plot(result: dict[str, Any], path: str) -> None:
    """The medians as horizontal bars, the frame loop's share of the Session apart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [("whole model, onnxruntime", result["full_ms"], 0.0),
            (f"head + tail at {result['split']}, onnxruntime", result["split_ms"], 0.0)]
    if "session_ms" in result:
        rows.append(("coinf Session: head, request, daemon, tail, result", result["split_ms"],
                     result["frame_loop_ms"]))
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(rows) + 1.4))
    names = [r[0] for r in rows][::-1]
    ax.barh(names, [r[1] for r in rows][::-1], color="#9ecae1", label="onnxruntime runs")
    ax.barh(names, [r[2] for r in rows][::-1], left=[r[1] for r in rows][::-1],
            color="#fc9272", label="the frame loop's fixed cost")
    for i, r in enumerate(rows[::-1]):
        ax.text(r[1] + r[2], i, f" {r[1] + r[2]:.2f} ms", va="center", fontsize=8)
    ax.set_xlim(0, max(r[1] + r[2] for r in rows) * 1.35)
    ax.set_xlabel(f"median ms a frame ({result['runs']} interleaved runs, "
                  f"{result['threads']} thread)")
    ax.set_title(f"{result['model']}: ratio {result['ratio']:.3f}"
                 + (f", session_vs_split {result['session_vs_split']:.2f}"
                    if "session_vs_split" in result else ""), fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
