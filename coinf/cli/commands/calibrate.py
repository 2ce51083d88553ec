"""``coinf calibrate BUNDLE --data digits|FILE.npz``: packing accuracy/size table per candidate."""

from __future__ import annotations

import argparse
import json
import sys

from coinf.errors import InputError


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", help="split bundle directory (made by `coinf split`)")
    parser.add_argument("--data", required=True,
                        help="'digits' (the zoo's validation split) or an .npz with one array "
                             "per model input (first axis = samples) and optional 'labels'")
    parser.add_argument("--bits", default=None,
                        help="comma-separated packings to calibrate, e.g. 2,3,4,8,f16 "
                             "(default: 2..8,10,12,16,f16,f32)")
    parser.add_argument("--candidates", default=None,
                        help="comma-separated candidate ids (default: all that send something)")
    parser.add_argument("--limit", type=int, default=None, help="use the first N samples only")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the tables as JSON but do not write the manifest")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from coinf.convert import calibrate as cal
    from coinf.convert.bundle import Bundle

    if args.limit is not None and args.limit < 1:
        raise InputError(f"--limit must be >= 1, got {args.limit}")
    bundle = Bundle.load(args.bundle)
    specs = cal.DEFAULT_SPECS
    if args.bits:
        parts = args.bits.replace(" ", "").split(",")
        specs = tuple(f"q{s}" if s.isdigit() else s for s in parts)
    ids = args.candidates.split(",") if args.candidates else None
    data = cal.load_dataset(args.data, bundle, args.limit)
    progress = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    results = cal.calibrate(bundle, data, specs, ids, progress)
    if args.dry_run:
        json.dump(results, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    path = cal.store(bundle, results, data)
    tol = _tolerance()
    n = len(data)
    print(f"calibrated {len(results)} candidates on {n} inputs of {data.name}: {path}")
    need = cal.samples_needed(tol)
    if n < need:
        print(f"warning: {n} samples cannot establish a {tol:g} pp tolerance: even with no "
              f"disagreement the {cal.CONFIDENCE:.0%} upper bound is "
              f"{100 * cal.upper_bound(0, n):.1f} pp; lossy packings whose bound exceeds "
              f"{tol:g} pp are not used by the planner. Calibrate on >= {need} samples.",
              file=sys.stderr)
    print(f"  accuracy drop in pp, measured [{cal.CONFIDENCE:.0%} upper bound], per packing; "
          f"tolerance {tol:g} pp")
    for cid, rows in results.items():
        cells = " ".join(
            f"{r['spec']}:{r['accuracy_drop_pp']:.2f}[{r['accuracy_drop_upper_pp']:.1f}]"
            for r in rows if r["codec"] != "f32")
        best = cal.best_row(rows, tol)
        text = (f"{best['spec']} x{best['ratio']:.1f} ({best['accuracy_drop_pp']:+.2f} pp, "
                f"bound {best['accuracy_drop_upper_pp']:.2f} pp)" if best
                else f"none established within {tol:g} pp (raw is used)")
        print(f"  {cid}: best: {text}")
        print(f"    {cells}")
    return 0


def _tolerance() -> float:
    """The policy's accuracy tolerance (what the planner will apply), 1 pp by default."""
    from coinf.convert.calibrate import DEFAULT_TOLERANCE_PP

    try:
        from coinf.wearable.policy import load_policy

        return float(load_policy(None)[0].accuracy_tolerance_pp)
    except Exception:  # a broken policy file is `coinf policy`'s to report, not ours
        return DEFAULT_TOLERANCE_PP
