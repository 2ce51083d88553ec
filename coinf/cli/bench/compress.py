"""``coinf bench compress``: autoencoder compressors at cuts of a trained digit CNN.

``--model digitnet`` (default): the compressors for every cut and gamma are fine-tuned
*jointly* with one backbone and quantization-aware codes (``convert.compressor_set``; a compressor
set is written to ``--out`` or a temporary directory) and measured in onnxruntime through the
real packing codec; ``accuracy_drop_pp`` is against the zoo's trained ``digitnet``, gamma 1
rows are the plain cut of the fine-tuned backbone. ``--separate`` also fine-tunes each
(cut, gamma) alone with its own backbone copy, for comparison (``separate_rows``). ``targets``
lists the rows that meet issue 13's targets.

``--model lenet``: for each cut and gamma (paper 002, Table I) the compressor is inserted into
the trained LeNet, fine-tuned end to end on the digits training split (torch, CPU, one thread,
seeded), exported as two ONNX models (head+encoder, decoder+tail) and evaluated with onnxruntime
on the test split, with the code sent through the real packing codec (``ble_protocol.packing``:
pack, then unpack, per image). gamma 1 rows are the plain cut (no compressor, no fine-tuning)
with the same packings. ``bytes`` is the mean packed size per image, ``ratio_vs_float32`` the
float32 activation's bytes over it, ``accuracy_drop_pp`` the test accuracy lost against the
trained model (percentage points; one test image is 0.28 pp), ``overhead_flops_pct`` the
encoder's and decoder's FLOPs over the model's. ``max_onnx_error`` checks the exported pair
against torch.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from coinf.cli import argtypes
from coinf.cli.bench import emit, progress

PACKINGS = ("raw", "q8", "q4", "q2")


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=("digitnet", "lenet"), default="digitnet",
                        help="digit CNN (default %(default)s)")
    parser.add_argument("--cuts", default=None,
                        help="cuts (comma-separated; default digitnet pool1,pool2, lenet "
                        "pool1,relu2)")
    parser.add_argument("--gammas", default="2,4,8", help="compression ratios (default "
                        "%(default)s)")
    parser.add_argument("--packings", default=None,
                        help="packings of the code (default digitnet raw,q8,q4,q2,qz4,qz2; "
                        "lenet raw,q8,q4,q2)")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="digitnet: keep the compressor set in DIR")
    parser.add_argument("--separate", action="store_true",
                        help="digitnet: also fine-tune each compressor alone (slow)")
    parser.add_argument("--freeze-backbone", action="store_true",
                        help="digitnet: train the compressors only (the backbone stays the "
                        "zoo model)")
    parser.add_argument("--fps", type=argtypes.number(0, 1e6, lo_open=True), default=30.0,
                        help="pipeline compute bound and input rate for the bandwidth "
                        "thresholds (frames/s, default %(default)s)")
    parser.add_argument("--epochs", type=argtypes.count, default=0,
                        help="fine-tuning epochs (default: models.compressors' default)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from coinf.errors import InputError
    from coinf.models.zoo import require_torch

    if args.model == "digitnet":
        return _run_set(args)
    if args.out is not None or args.separate or args.freeze_backbone:
        raise InputError("--out, --separate and --freeze-backbone apply to --model digitnet "
                         "only")
    require_torch()
    from coinf.models.compressors import FINETUNE_EPOCHS, GAMMAS, LENET_CUTS

    cuts = [c.strip() for c in (args.cuts or "pool1,relu2").split(",") if c.strip()]
    try:
        gammas = [int(g) for g in args.gammas.split(",") if g.strip()]
    except ValueError:
        raise InputError(f"--gammas must be integers from {GAMMAS}, got {args.gammas!r}") \
            from None
    bad = [c for c in cuts if c not in LENET_CUTS] + [str(g) for g in gammas if g not in GAMMAS]
    if bad or not cuts:
        raise InputError(f"unknown cut or gamma {bad}: cuts are {sorted(LENET_CUTS)}, gammas "
                         f"{list(GAMMAS)}")
    packings = [p.strip() for p in (args.packings or ",".join(PACKINGS)).split(",")
                if p.strip()]
    from coinf.ble_protocol.packing import PackSpec

    for p in packings:
        try:
            PackSpec.parse(p)
        except ValueError as exc:
            raise InputError(f"--packings: {exc}") from None
    if args.epochs < 0:
        raise InputError("--epochs must be >= 0")
    if not args.fps > 0:
        raise InputError("--fps must be > 0")
    result = measure(cuts, gammas, packings, args.epochs or FINETUNE_EPOCHS)
    result["thresholds"] = threshold_table(result, args.fps)
    emit(result)
    return 0


def _run_set(args: argparse.Namespace) -> int:
    import tempfile

    from coinf.cli.commands.models import parse_set_args
    from coinf.errors import InputError
    from coinf.models.zoo import require_torch

    cuts, gammas, packings = parse_set_args(args.cuts or "pool1,pool2", args.gammas,
                                            args.packings)
    if args.epochs < 0:
        raise InputError("--epochs must be >= 0")
    if not args.fps > 0:
        raise InputError("--fps must be > 0")
    if args.out is not None:
        from coinf.cli.paths import writable_dir

        writable_dir(args.out, "--out")  # refused now, not after the fine-tuning
    require_torch()
    from coinf.convert.compressor_set import FINETUNE_EPOCHS, PACKINGS, export_set

    epochs = args.epochs or FINETUNE_EPOCHS
    packs = packings or list(PACKINGS)
    with tempfile.TemporaryDirectory(prefix="coinf-set-") as tmp:
        t0 = time.perf_counter()
        index = export_set(args.out or Path(tmp), cuts=cuts, gammas=gammas, epochs=epochs,
                           packings=packs, freeze_backbone=args.freeze_backbone,
                           progress=progress)
        result: dict[str, Any] = {
            "model": "digitnet", "test_images": index["test_images"],
            "base_accuracy": index["original_accuracy"],
            "backbone_accuracy": index["base_accuracy"]["raw"], "fine_tune_epochs": epochs,
            "fine_tuning": "joint, quantization-aware" + (
                ", backbone frozen" if args.freeze_backbone else ""),
            "model_flops": index["compressors"][0]["model_flops"],
            "seconds": round(time.perf_counter() - t0, 1), "rows": set_rows(index, packs)}
        if args.separate:
            rows = []
            for cut in cuts:
                for gamma in gammas:
                    progress(f"separate fine-tuning of {cut} gamma {gamma}")
                    one = export_set(Path(tmp) / f"{cut}-g{gamma}", cuts=[cut], gammas=[gamma],
                                     epochs=epochs, packings=packs, progress=progress,
                                     freeze_backbone=args.freeze_backbone)
                    rows += [r for r in set_rows(one, packs) if r["gamma"] != 1]
            result["separate_rows"] = rows
    result["targets"] = targets(result["rows"])
    result["thresholds"] = threshold_table(result, args.fps)
    emit(result)
    return 0


def set_rows(index: dict[str, Any], packings: list[str]) -> list[dict[str, Any]]:
    """Bench rows of a compressor set's index (gamma 1: the plain cut of its backbone)."""
    import numpy as np

    base = index["original_accuracy"]
    rows = []
    entries = [(cut, 1, plain, 0) for cut, plain in index["cuts"].items()]
    entries += [(c["crossing"][0], c["gamma"], c, c["flops"]) for c in index["compressors"]]
    entries.sort(key=lambda e: (e[0], e[1]))
    for cut, gamma, entry, flops in entries:
        act_bytes = 4 * int(np.prod(index["cuts"][cut]["shape"]))
        model_flops = index["compressors"][0]["model_flops"]
        for packing in packings:
            rows.append({
                "cut": cut, "gamma": gamma, "packing": packing,
                "bytes": entry["bytes"][packing],
                "ratio_vs_float32": round(act_bytes / entry["bytes"][packing], 2),
                "accuracy_drop_pp": round((base - entry["accuracy"][packing]) * 100, 2),
                "overhead_flops_pct": round(100 * flops / model_flops, 2)})
    return rows


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 13's targets and the rows meeting them."""
    g4 = [r for r in rows if r["gamma"] == 4 and r["packing"] == "raw"]
    hit = [r for r in rows if r["gamma"] > 1 and r["ratio_vs_float32"] >= 60
           and r["accuracy_drop_pp"] <= 1.0]
    return {
        "gamma4_drop_le_2pp": all(r["accuracy_drop_pp"] <= 2.0 for r in g4) and bool(g4),
        "ratio_ge_60x_within_1pp": [f"{r['cut']} g{r['gamma']} {r['packing']}: "
                                    f"{r['ratio_vs_float32']}x, {r['accuracy_drop_pp']} pp"
                                    for r in hit],
        "overhead_le_2pct": all(r["overhead_flops_pct"] <= 2.0 for r in rows),
    }


def measure(cuts: list[str], gammas: list[int], packings: list[str], epochs: int
            ) -> dict[str, Any]:
    import numpy as np
    import onnxruntime as ort
    import torch
    from torch import nn

    from coinf.models.compressors import export, finetune, insert, lenet_layers, load_lenet_onnx
    from coinf.models.digits import digits_data
    from coinf.models.zoo import committed_path, deterministic_torch

    data = digits_data()
    rows: list[dict[str, Any]] = []
    with deterministic_torch():
        model = load_lenet_onnx(committed_path("lenet_digits"))
        with torch.no_grad():
            logits = model(torch.from_numpy(data.x_test)).numpy()
        base = float((logits.argmax(1) == data.y_test).mean())
        model_flops = _model_flops()
        for cut in cuts:
            from coinf.models.compressors import LENET_CUTS

            k = LENET_CUTS[cut]
            layers = lenet_layers(model)
            head, tail = nn.Sequential(*layers[:k]), nn.Sequential(*layers[k:])
            with torch.no_grad():
                act = head(torch.from_numpy(data.x_test)).numpy()

            def plain_tail(codes: np.ndarray, tail: nn.Module = tail) -> np.ndarray:
                with torch.no_grad():
                    out: np.ndarray = tail(torch.from_numpy(codes)).numpy()
                    return out

            act_bytes = int(act[0].nbytes)
            rows += _rows(cut, 1, act, plain_tail, packings, data.y_test, base, act_bytes, 0.0,
                          None)
            for gamma in gammas:
                t0 = time.perf_counter()
                comp = insert(model, cut, gamma)
                finetune(comp, data.x_train, data.y_train, epochs)
                head_onnx, tail_onnx = export(comp)
                opts = ort.SessionOptions()
                opts.intra_op_num_threads = 1
                he = ort.InferenceSession(head_onnx, opts, providers=["CPUExecutionProvider"])
                dt = ort.InferenceSession(tail_onnx, opts, providers=["CPUExecutionProvider"])
                codes = np.concatenate([he.run(None, {"image": x[None]})[0]
                                        for x in data.x_test])

                def ae_tail(c: np.ndarray, dt: Any = dt) -> np.ndarray:
                    return np.concatenate([dt.run(None, {"code": x[None]})[0] for x in c])

                with torch.no_grad():
                    ref = comp.forward(torch.from_numpy(data.x_test)).numpy()
                err = float(np.abs(ae_tail(codes) - ref).max())
                overhead = 100.0 * (comp.encoder_flops + comp.decoder_flops) / model_flops
                rows += _rows(cut, gamma, codes, ae_tail, packings, data.y_test, base,
                              act_bytes, overhead, err)
                progress(f"{cut} gamma {gamma}: fine-tuned and measured in "
                         f"{time.perf_counter() - t0:.1f} s (code {list(comp.code_shape)}, "
                         f"raw drop {rows[-len(packings)]['accuracy_drop_pp']} pp)")
    return {"model": "lenet_digits", "test_images": len(data.y_test),
            "base_accuracy": round(base, 6), "fine_tune_epochs": epochs, "rows": rows}


def _rows(cut: str, gamma: int, codes: Any, tail: Any, packings: list[str], labels: Any,
          base: float, act_bytes: int, overhead: float, onnx_err: float | None
          ) -> list[dict[str, Any]]:
    import numpy as np

    from coinf.ble_protocol.packing import pack, unpack

    out = []
    for packing in packings:
        if packing == "raw":
            received, sizes = codes, [int(c.nbytes) for c in codes]
        else:
            blobs = [pack(np.ascontiguousarray(c), packing) for c in codes]
            received = np.stack([unpack(b) for b in blobs])
            sizes = [len(b) for b in blobs]
        acc = float((np.asarray(tail(received)).argmax(1) == labels).mean())
        mean_bytes = float(np.mean(sizes))
        row: dict[str, Any] = {
            "cut": cut, "gamma": gamma, "packing": packing, "bytes": round(mean_bytes, 1),
            "ratio_vs_float32": round(act_bytes / mean_bytes, 2),
            "accuracy_drop_pp": round((base - acc) * 100, 2),
            "overhead_flops_pct": round(overhead, 2),
        }
        if onnx_err is not None:
            row["max_onnx_error"] = float(f"{onnx_err:.3g}")
        out.append(row)
    return out


def threshold_table(result: dict[str, Any], fps: float) -> dict[str, Any]:
    """Per cut, the bandwidth regions (S3, Eq. 3) and the option that wins in each, with the
    effective accuracy there, for a pipeline bounded at ``fps`` and fed at ``fps``."""
    from coinf.wearable.planner.compress_select import (
        CompressionOption,
        effective_accuracy,
        thresholds,
    )

    base = result["base_accuracy"]
    out: dict[str, Any] = {"fps": fps, "cuts": {}}
    for cut in dict.fromkeys(r["cut"] for r in result["rows"]):
        options = [CompressionOption(r["gamma"], r["packing"], r["bytes"],
                                     min(max(base - r["accuracy_drop_pp"] / 100, 0.0), 1.0))
                   for r in result["rows"] if r["cut"] == cut]
        regions = []
        for theta, opt in thresholds(options, fps, fps):
            at = max(theta * 1.01, 1.0)
            regions.append({"from_kBps": round(theta / 1e3, 3), "gamma": opt.gamma,
                            "packing": opt.packing,
                            "effective_accuracy_at_from": round(
                                effective_accuracy(opt, at, fps, fps), 4)})
        out["cuts"][cut] = regions
    return out


def _model_flops() -> int:
    from coinf.convert.cost import all_costs
    from coinf.convert.graph import load_graph
    from coinf.models.zoo import committed_path

    g = load_graph(committed_path("lenet_digits"))
    return sum(c.flops for c, n in zip(all_costs(g), g.nodes, strict=True) if n.dynamic)
