"""``coinf bench prune``: SMCD (MeDNN's group-lasso pruning) on the trained digit model.

For each group lasso strength the model is sparsified, its near-zero filters and channels removed
and the smaller dense model fine-tuned (:mod:`coinf.models.pruning`). Every pruned file is then
taken like any other model: FLOPs and parameters from coinf's cost model, accuracy in
onnxruntime, a verified split, and the bytes that cross its cuts compared with the original's
(cuts matched by label; the two extremes, which send the raw input or nothing, are left out).
The headline row is the one with the largest FLOPs reduction whose **validation** drop is within
``--tolerance``; its **test** drop is reported, so the choice is not made on the figures shown.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from coinf.cli import argtypes
from coinf.cli.bench import emit, median, options, progress
from coinf.cli.paths import writable_dir
from coinf.errors import InputError, UserError


def register(parser: argparse.ArgumentParser) -> None:
    options.add_json(parser)
    parser.add_argument("--model", default=None,
                        help="a coinf LeNet ONNX file (default: the zoo's trained lenet_digits)")
    parser.add_argument("--strengths", default="3e-4,1e-3,3e-3",
                        help="group lasso strengths to try, comma-separated")
    parser.add_argument("--threshold", type=argtypes.number(0, 1, hi_open=True), default=0.05,
                        help="relative unit contribution below which a unit is removed")
    parser.add_argument("--epochs", type=argtypes.count, default=30, help="sparsifying epochs")
    parser.add_argument("--finetune-epochs", type=argtypes.count, default=20,
                        help="fine-tuning epochs")
    options.add_tolerance(parser)
    options.add_repeats(parser, 200)
    parser.add_argument("--out", type=Path, default=None,
                        help="keep the pruned models here (default: a temporary directory)")
    options.add_png(parser, "each strength's FLOPs reduction against its accuracy drop")
    parser.set_defaults(func=run)


def _strengths(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"--strengths: expected numbers separated by commas, got {text!r}") \
            from None
    if not values or any(not 0 < v < 10 for v in values):
        raise InputError(f"--strengths: expected values in (0, 10), got {text!r}")
    return values


def model_costs(path: Path) -> tuple[int, int]:
    """(FLOPs, parameter count) of an ONNX file by coinf's cost model."""
    import onnx

    from coinf.convert.cost import all_costs
    from coinf.convert.graph import load_graph

    g = load_graph(path)
    flops = sum(c.flops for c in all_costs(g))
    inits = onnx.load(str(path)).graph.initializer
    params = sum(int(np.prod(t.dims, dtype=np.int64)) for t in inits)
    return flops, params


def crossing_by_label(bundle: Any) -> dict[str, int]:
    return {c.label: c.crossing_bytes for c in bundle.candidates
            if not (c.is_wearable_only or c.is_handheld_only)}


def latency_ms(paths: list[Path], repeats: int) -> list[float]:
    """Median ms per model, runs interleaved so every model sees the same machine load."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sessions = [ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"])
                for p in paths]
    x = np.random.default_rng(0).random((1, 1, 28, 28), dtype=np.float32)
    times: list[list[float]] = [[] for _ in paths]
    for s in sessions:
        s.run(None, {"image": x})
    for _ in range(repeats):
        for i, s in enumerate(sessions):
            t = time.perf_counter()
            s.run(None, {"image": x})
            times[i].append((time.perf_counter() - t) * 1e3)
    return [median(t) for t in times]


def _pruned_row(strength: float, meta: dict[str, Any], costs: tuple[int, int], bundle: Any,
                base_flops: int, base_params: int, base_cross: dict[str, int]
                ) -> dict[str, Any]:
    """One strength's row: FLOPs, parameters, crossing bytes and accuracy against the source
    (``costs``: the pruned model's FLOPs and parameters)."""
    flops, params = costs
    cross = crossing_by_label(bundle)
    common = sorted(set(cross) & set(base_cross))
    comm = (100 * (1 - sum(cross[k] for k in common) / sum(base_cross[k] for k in common))
            if common else float("nan"))
    return {
        "strength": strength,
        "widths": meta["widths_after"],
        "flops": flops,
        "flops_reduction_pct": round(100 * (1 - flops / base_flops), 2),
        "params_reduction_pct": round(100 * (1 - params / base_params), 2),
        "comm_reduction_pct": round(comm, 2),
        "cuts_compared": len(common),
        "val_drop_pp": round(100 * (meta["val_accuracy_before"] - meta["val_accuracy"]), 2),
        "accuracy_drop_pp": round(
            100 * (meta["test_accuracy_before"] - meta["test_accuracy"]), 2),
        "test_accuracy": meta["test_accuracy"],
        "candidates": len(bundle.candidates),
        "verified": True,
    }


def _summary(src: Path, rows: list[dict[str, Any]], tolerance: float, base_flops: int,
             source_ms: float, before: Any) -> dict[str, Any]:
    """The headline: the largest FLOPs reduction within ``tolerance`` (validation drop)."""
    ok = [r for r in rows if r["val_drop_pp"] <= tolerance]
    best = max(ok, key=lambda r: r["flops_reduction_pct"]) if ok else None
    result: dict[str, Any] = {
        "model": src.stem,
        "selection": f"largest FLOPs reduction with validation drop <= {tolerance} pp; "
                     "accuracy_drop_pp is on the test split",
        "source_flops": base_flops,
        "source_latency_ms": round(source_ms, 4),
        "test_accuracy_before": before,
    }
    if best is not None:
        result.update({k: best[k] for k in ("flops_reduction_pct", "params_reduction_pct",
                                            "accuracy_drop_pp", "comm_reduction_pct",
                                            "strength", "widths", "latency_reduction_pct")})
    else:
        result.update({"flops_reduction_pct": None, "params_reduction_pct": None,
                       "accuracy_drop_pp": None, "comm_reduction_pct": None})
    result["rows"] = rows
    return result


def run(args: argparse.Namespace) -> int:
    strengths = _strengths(args.strengths)
    try:
        from coinf.models.pruning import PruneConfig, prune_lenet_file
    except ImportError:
        raise UserError("bench prune trains with torch: pip install 'coinf[models]'") from None
    from coinf.convert.split import split_model
    from coinf.models.zoo import committed_path

    src = Path(args.model) if args.model else committed_path("lenet_digits")
    if not src.is_file():
        raise InputError(f"--model {src}: no such file")
    if args.repeats < 1:
        raise InputError(f"--repeats must be >= 1, got {args.repeats}")
    options.check_png(args.png)
    configs = [PruneConfig(strength=s, threshold=args.threshold, sparsify_epochs=args.epochs,
                           finetune_epochs=args.finetune_epochs)
               for s in strengths]  # every setting checked before the first training
    if args.out is not None:
        writable_dir(args.out, "--out")
    tmp = tempfile.TemporaryDirectory(prefix="coinf-prune-")
    out = args.out or Path(tmp.name)
    try:
        progress(f"splitting {src.name}")
        base_bundle = split_model(src, Path(tmp.name) / "bundle-source", verify=True)
        base_flops, base_params = model_costs(src)
        base_cross = crossing_by_label(base_bundle)
        rows: list[dict[str, Any]] = []
        before = None
        files: list[Path] = []
        for i, (s, cfg) in enumerate(zip(strengths, configs, strict=True), 1):
            progress(f"[{i}/{len(strengths)}] strength {s:g}")
            path = out / f"{src.stem}_pruned_{s:g}.onnx"
            meta = prune_lenet_file(src, path, cfg, progress=progress)
            costs = model_costs(path)
            bundle = split_model(path, Path(tmp.name) / f"bundle-{i}", verify=True)
            rows.append(_pruned_row(s, meta, costs, bundle, base_flops, base_params, base_cross))
            files.append(path)
            before = meta["test_accuracy_before"]
        progress(f"timing {len(files) + 1} models interleaved, {args.repeats} runs")
        ms = latency_ms([src, *files], args.repeats)
        for row, t in zip(rows, ms[1:], strict=True):
            row["latency_ms"] = round(t, 4)
            row["latency_reduction_pct"] = round(100 * (1 - t / ms[0]), 2)
        result = _summary(src, rows, args.tolerance, base_flops, ms[0], before)
        if args.png:
            _plot(result, args.png, args.tolerance)
            result["png"] = args.png
        emit(result)
        return 0
    finally:
        tmp.cleanup()


def _plot(result: dict[str, Any], path: str, tolerance: float) -> None:
    """Each strength: FLOPs and latency reduction against the test and validation drops."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for key, marker, word in (("accuracy_drop_pp", "o", "test"), ("val_drop_pp", "s",
                                                                    "validation")):
        ax.plot([r["flops_reduction_pct"] for r in rows], [r[key] for r in rows],
                marker=marker, ls="none", label=f"{word} drop")
    for r in rows:
        ax.annotate(f"{r['strength']:g}\n{r.get('latency_reduction_pct', 0):.0f} % faster",
                    (r["flops_reduction_pct"], r["accuracy_drop_pp"]), fontsize=7,
                    textcoords="offset points", xytext=(4, 6))
    ax.axhline(tolerance, color="grey", ls="--", lw=1, label=f"{tolerance:g} pp")
    ax.set_xlabel("FLOPs removed (%)")
    ax.set_ylabel("accuracy drop (pp)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(f"{result['model']}: group-lasso pruning, one point per strength", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
