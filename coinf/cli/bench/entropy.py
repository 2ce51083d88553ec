"""``coinf bench entropy``: ``ansN`` (levels + rANS, calibrated priors) against ``qN`` (bit
planes + LZ4) and ``qzN`` (levels + zstd) at the same bits, per cut: bytes and pack/unpack ms.

The three decode to the very same values (the same ISQuant levels), so only bytes and time
differ. Priors are fitted as calibration fits them (:mod:`convert.entropy_cal`): per channel,
cross-fitted, so input ``i`` is coded with the table fitted on the other half of the inputs.
Times are medians over the inputs of one ``pack`` and one ``unpack`` of every crossing tensor,
the three packings interleaved input by input (one core of this machine).

Models: ``--zoo NAME`` (a committed zoo model split here; ``lenet_digits`` and ``digitnet`` on
the digits validation split, others on seeded standard-normal inputs: synthetic), ``--model
NAME`` (a pretrained model of ``coinf models list`` and its real inputs, as ``bench rate``), or
``--bundle DIR --data SRC``. ``--markdown`` adds the table docs/PACKING.md shows.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from coinf.cli import argtypes
from coinf.cli.bench import emit, median, options, progress
from coinf.errors import InputError

DIGITS_MODELS = ("lenet_digits", "digitnet")


def register(parser: argparse.ArgumentParser) -> None:
    options.add_json(parser)
    parser.add_argument("--zoo", action="append", default=[], metavar="NAME",
                        help="a committed zoo model (repeatable; default lenet_digits)")
    parser.add_argument("--model", default=None, help="a pretrained model (coinf models list)")
    parser.add_argument("--bundle", default=None, help="any bundle (with --data)")
    options.add_data(parser)
    parser.add_argument("--samples", type=argtypes.positive_int, default=64,
                        help="with --model: real inputs to make; --zoo: synthetic inputs")
    options.add_limit(parser)
    parser.add_argument("--cuts", type=argtypes.positive_int, default=4,
                        help="split cuts per model: the N with the fewest crossing bytes")
    parser.add_argument("--candidates", default=None, help="comma-separated ids instead")
    parser.add_argument("--bits", default="2,4,8", help="widths compared (1..8)")
    parser.add_argument("--work", default=None, metavar="DIR",
                        help="with --model: where the model and bundle are built")
    parser.add_argument("--markdown", action="store_true", help="add a markdown table")
    parser.set_defaults(func=run)


def _bits(text: str) -> list[int]:
    try:
        out = sorted({int(b) for b in text.split(",") if b.strip()})
    except ValueError:
        raise InputError(f"--bits: comma-separated integers, got {text!r}") from None
    if not out or not all(1 <= b <= 8 for b in out):
        raise InputError(f"--bits must lie in 1..8, got {text!r}")
    return out


def run(args: argparse.Namespace) -> int:
    bits = _bits(args.bits)
    if args.bundle is not None and args.data is None:
        raise InputError("--bundle needs --data ('digits' or an .npz of its inputs)")
    models = []
    with tempfile.TemporaryDirectory(prefix="coinf-entropy-") as tmp:
        for name, bundle, data in _sources(args, Path(tmp)):
            progress(f"{name}: {len(data)} inputs ({data.name})")
            cuts = [measure_cut(bundle, cand, data, bits) for cand in _cands(bundle, args)]
            models.append({"model": name, "data": data.name, "inputs": len(data), "cuts": cuts})
    result: dict[str, Any] = {
        "bench": "entropy", "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()} {platform.processor() or platform.system()}, "
                   f"numpy {np.__version__}, one core", "bits": bits, "models": models}
    if args.markdown:
        result["markdown"] = markdown(models, bits)
    emit(result)
    return 0


def _sources(args: argparse.Namespace, tmp: Path) -> Any:
    from coinf.bundle import Bundle
    from coinf.convert import calibrate as cal

    if args.bundle is not None:
        bundle = Bundle.load(args.bundle)
        yield bundle.root.name, bundle, cal.load_dataset(args.data, bundle, args.limit)
    if args.model is not None:
        from coinf.cli.bench.rate import _prepare_model

        args.metric, args.metric_output = None, []
        work = Path(args.work) if args.work else tmp
        bundle, data_path, _, _ = _prepare_model(args, work)
        yield args.model, bundle, cal.load_dataset(data_path, bundle, args.limit)
    zoo = args.zoo or ([] if args.bundle or args.model else ["lenet_digits"])
    for name in zoo:
        from coinf.convert.split import split_model
        from coinf.models.zoo import committed_path

        progress(f"splitting the zoo's {name} ...")
        bundle = split_model(committed_path(name), tmp / name)
        if name in DIGITS_MODELS:
            yield name, bundle, _digits(bundle, tmp / f"{name}.npz", args.limit)
        else:
            yield name, bundle, _synthetic(bundle, tmp / f"{name}.npz", args.limit or args.samples)


def _digits(bundle: Any, path: Path, limit: int | None) -> Any:
    """The digits validation split at the model's input size (28 or 32 px)."""
    from coinf.convert import calibrate as cal
    from coinf.models.digits import digits_data

    spec = bundle.inputs[0]
    split = digits_data(size=spec.shape[-1])
    arrays = {spec.name: np.asarray(split.x_val, np.float32).reshape((-1, *spec.shape)),
              "labels": np.asarray(split.y_val)}
    _savez(path, arrays)
    data = cal.load_dataset(str(path), bundle, limit, "labels")
    data.name = f"digits validation split ({len(data)}, {spec.shape[-1]} px)"
    return data


def _savez(path: Path, arrays: dict[str, np.ndarray]) -> None:
    savez: Any = np.savez  # numpy < 2 has no allow_pickle keyword: every keyword is an array
    savez(path, **arrays)


def _synthetic(bundle: Any, path: Path, n: int) -> Any:
    from coinf.convert import calibrate as cal

    rng = np.random.default_rng(0)
    arrays = {t.name: rng.standard_normal((n, *t.shape)).astype(t.dtype) for t in bundle.inputs
              if np.dtype(t.dtype).kind == "f"}
    _savez(path, arrays)
    data = cal.load_dataset(str(path), bundle)
    data.name = "seeded standard-normal inputs (synthetic)"
    return data


def _cands(bundle: Any, args: argparse.Namespace) -> list[Any]:
    if args.candidates:
        return [bundle.candidate(c) for c in args.candidates.split(",")]
    splits = [c for c in bundle.candidates if not (c.is_handheld_only or c.is_wearable_only)
              and any(np.dtype(t.dtype).kind == "f" for t in c.crossing)]
    return sorted(splits, key=lambda c: c.crossing_bytes)[: args.cuts]


def measure_cut(bundle: Any, cand: Any, data: Any, bits: list[int]) -> dict[str, Any]:
    """Bytes and times of q/qz/ans at each width for one cut (module docstring)."""
    from coinf.ble_protocol import packing
    from coinf.ble_protocol.packing import PackSpec
    from coinf.convert.entropy_cal import PriorFit
    from coinf.convert.packcal import Runner

    runner = Runner(bundle, cand)
    fit = PriorFit(cand, bits)
    heads = []
    for i in range(len(data)):
        crossing = runner.run_head(data.feed(i))
        fit.add(i, crossing)
        heads.append(crossing)
    fit.fit()
    book = fit.book
    out: dict[str, Any] = {"cut": cand.id, "label": cand.label,
                           "crossing": {t.name: list(t.shape) for t in cand.crossing},
                           "float_bytes": int(cand.crossing_bytes), "bits": {}}
    for b in bits:
        cells: dict[str, dict[str, list[float]]] = {
            k: {"bytes": [], "enc": [], "dec": []} for k in ("q", "qz", "ans")}
        for i, crossing in enumerate(heads):
            for codec in ("q", "qz", "ans"):
                specs = {n: PackSpec(codec, b) for n in crossing}
                specs = fit.specs_for(specs, i)
                t0 = time.perf_counter()
                bodies = [packing.pack(a, specs[n]) for n, a in crossing.items()]
                t1 = time.perf_counter()
                for body in bodies:
                    packing.unpack(body, book=book)
                t2 = time.perf_counter()
                cell = cells[codec]
                cell["bytes"].append(sum(map(len, bodies)))
                cell["enc"].append(t1 - t0)
                cell["dec"].append(t2 - t1)
        out["bits"][str(b)] = {k: {"mean_bytes": round(float(np.mean(v["bytes"])), 1),
                                   "encode_ms": round(1e3 * median(v["enc"]), 3),
                                   "decode_ms": round(1e3 * median(v["dec"]), 3)}
                               for k, v in cells.items()}
        row = out["bits"][str(b)]
        progress(f"  {cand.id} {cand.label} {b} bits: q {row['q']['mean_bytes']:.0f} B, qz "
                 f"{row['qz']['mean_bytes']:.0f} B, ans {row['ans']['mean_bytes']:.0f} B "
                 f"({row['ans']['encode_ms']:.2f} / {row['ans']['decode_ms']:.2f} ms)")
    return out


def markdown(models: list[dict[str, Any]], bits: list[int]) -> list[str]:
    """Rows of the docs table: per model, cut and width, bytes and ans's ms."""
    lines = ["| model, cut (crossing) | bits | q B | qz B | ans B | ans / qz | "
             "q ms | qz ms | ans ms (pack / unpack) |", "|---|---|---|---|---|---|---|---|---|"]
    for m in models:
        for cut in m["cuts"]:
            shapes = ", ".join("x".join(map(str, s[1:] if s and s[0] == 1 else s))
                               for s in cut["crossing"].values())
            for b in bits:
                r = cut["bits"][str(b)]
                q, qz, ans = r["q"], r["qz"], r["ans"]
                lines.append(
                    f"| {m['model']} {cut['cut']} ({shapes}) | {b} | {q['mean_bytes']:,.0f} | "
                    f"{qz['mean_bytes']:,.0f} | {ans['mean_bytes']:,.0f} | "
                    f"{ans['mean_bytes'] / qz['mean_bytes']:.2f} | "
                    f"{q['encode_ms']:.2f} / {q['decode_ms']:.2f} | "
                    f"{qz['encode_ms']:.2f} / {qz['decode_ms']:.2f} | "
                    f"{ans['encode_ms']:.2f} / {ans['decode_ms']:.2f} |")
    return lines
