"""``coinf calibrate BUNDLE --data digits|FILE.npz``: packing accuracy/size table per candidate."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from coinf.cli import argtypes
from coinf.errors import InputError


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", help="split bundle directory (made by `coinf split`)")
    parser.add_argument("--data", required=True,
                        help="'digits' (the zoo's validation split) or an .npz of N complete "
                             "feeds: per model input (N, *shape) or N along a batch axis of "
                             "size 1; other arrays are ignored (docs/PACKING.md)")
    parser.add_argument("--labels", default=None, metavar="KEY",
                        help="the .npz array holding integer labels (default: 'labels' if "
                             "present)")
    parser.add_argument("--metric", default=None,
                        help="accuracy metric: top1 (default), topK, iou@T, decision@T, "
                             "maxrel, meanrel, cosine or MODULE:FUNCTION")
    parser.add_argument("--metric-output", action="append", default=[], metavar="NAME",
                        help="model output(s) the metric reads (default: the first; "
                             "repeatable)")
    parser.add_argument("--tensor-packing", action="append", default=[], metavar="NAME=SPEC",
                        help="pack this crossing tensor with SPEC in every row (repeatable)")
    parser.add_argument("--pack-state", action="store_true",
                        help="pack state-like tensors like the others (default: lossless)")
    parser.add_argument("--sequence-length", type=argtypes.positive_int, default=None, metavar="L",
                        help="stateful models: feeds form sequences of L steps (default: "
                             "all feeds, one sequence)")
    parser.add_argument("--bits", default=None,
                        help="comma-separated packings to calibrate, e.g. 2,3,4,8,f16 "
                             "(default: 2..8,10,12,16,f16,f32)")
    parser.add_argument("--candidates", default=None,
                        help="comma-separated candidate ids (default: all that send something)")
    parser.add_argument("--limit", type=argtypes.positive_int, default=None,
                        help="use the first N samples only")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the tables as JSON but do not write the manifest")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from coinf.bundle import Bundle
    from coinf.convert import calibrate as cal

    if args.limit is not None and args.limit < 1:
        raise InputError(f"--limit must be >= 1, got {args.limit}")
    bundle = Bundle.load(args.bundle)
    specs = cal.DEFAULT_SPECS
    if args.bits:
        parts = args.bits.replace(" ", "").split(",")
        specs = tuple(f"q{s}" if s.isdigit() else s for s in parts)
    ids = args.candidates.split(",") if args.candidates else None
    data = cal.load_dataset(args.data, bundle, args.limit, args.labels)
    options = _options(args, bundle)
    progress = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    results = cal.calibrate(bundle, data, specs, ids, progress, options)
    if args.dry_run:
        json.dump(results, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    path = cal.store(bundle, results, data, options)
    tol = options.tolerance_pp
    n = len(data)
    print(f"calibrated {len(results)} candidates on {n} inputs of {data.name}: {path}")
    need = cal.samples_needed(tol)
    judged = int(bundle.meta.get(cal.META_KEY, {}).get("judged", n))
    if judged < need:
        some = f"{judged} of {n}" if judged < n else f"{n}"
        print(f"warning: {some} samples cannot establish a {tol:g} pp tolerance: even with no "
              f"disagreement the {cal.CONFIDENCE:.0%} upper bound is "
              f"{100 * cal.upper_bound(0, judged):.1f} pp; lossy packings whose bound exceeds "
              f"{tol:g} pp are not used by the planner (exact ones are). Calibrate on >= "
              f"{need} samples.", file=sys.stderr)
    metric = bundle.meta.get(cal.META_KEY, {}).get("metric", options.metric.name)
    line = cal.criterion_line(bundle.meta)
    if line:
        print(f"  {line}")
    print(f"  metric {metric}: accuracy drop in pp, measured [{cal.CONFIDENCE:.0%} upper "
          f"bound, or 'exact' when every input came back bit for bit], per packing; "
          f"tolerance {tol:g} pp")
    for cid, rows in results.items():
        cells = " ".join(
            f"{r['spec']}:{r['accuracy_drop_pp']:.2f}"
            + ("[exact]" if r.get("exact") else f"[{r['accuracy_drop_upper_pp']:.1f}]")
            for r in rows if r["codec"] != "f32")
        best = cal.best_row(rows, tol)
        text = (f"{best['spec']} x{best['ratio']:.1f} ({best['accuracy_drop_pp']:+.2f} pp, "
                + ("exact)" if best.get("exact") else
                   f"bound {best['accuracy_drop_upper_pp']:.2f} pp)") if best
                else f"none established within {tol:g} pp (raw is used)")
        print(f"  {cid}: best: {text}  (metric {rows[0].get('metric', metric)})")
        print(f"    {cells}")
        mixed = [f"{r['spec']}: {r['tensors']}" for r in rows if r.get("tensors")]
        if mixed:
            print(f"    per-tensor packing: {mixed[0]}" + (f" (+{len(mixed) - 1} rows)"
                                                          if len(mixed) > 1 else ""))
        drift = [f"{r['spec']}:{r['drift_rel_l2']:.3g}" for r in rows if "drift_rel_l2" in r]
        if drift:
            print(f"    state drift after {rows[0]['steps']} steps (rel L2): {' '.join(drift)}")
    return 0


def _options(args: argparse.Namespace, bundle: Any) -> Any:
    from coinf.convert.metrics import parse_metric
    from coinf.convert.packcal import Options

    if args.sequence_length is not None and args.sequence_length < 1:
        raise InputError(f"--sequence-length must be >= 1, got {args.sequence_length}")
    overrides: dict[str, str] = {}
    for item in args.tensor_packing:
        name, sep, spec = item.partition("=")
        if not sep or not name or not spec:
            raise InputError(f"--tensor-packing {item!r}: expected NAME=SPEC (e.g. h=f32)")
        overrides[name.strip()] = spec.strip()
    metric = parse_metric(args.metric, args.metric_output, [t.name for t in bundle.outputs])
    return Options(metric=metric, tolerance_pp=_tolerance(), pack_state=args.pack_state,
                   tensor_packing=overrides, sequence_length=args.sequence_length)


def _tolerance() -> float:
    """The policy's accuracy tolerance (what the planner will apply), 1 pp by default."""
    from coinf.convert.calibrate import DEFAULT_TOLERANCE_PP

    try:
        from coinf.wearable.policy import load_policy

        return float(load_policy(None)[0].accuracy_tolerance_pp)
    except Exception:  # a broken policy file is `coinf policy`'s to report, not ours
        return DEFAULT_TOLERANCE_PP
