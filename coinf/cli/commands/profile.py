"""``coinf profile``: measure this device and write its device profile.

* ``--bundle B``: per-node latency (onnxruntime profiler) and directly measured head/tail slice
  latency of every candidate, stored under the bundle's identity;
* ``--train``: run the synthetic single-layer sweep and store the layer predictors (prints the
  held-out R² per layer kind), then, unless ``--no-context``, train the in-context slice
  predictor (``coinf.research.context_data.train_on_zoo``) and store it beside them;
* neither: print the profile.

The role is detected (a Raspberry Pi is the wearable, a PC the handheld) or given with
``--role``. The profile records the machine it was measured on; an existing profile of another
machine (or of the other role) is not overwritten without ``--force``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from coinf.cli import argtypes
from coinf.cli.paths import writable_dir, writable_file
from coinf.deps import require_full
from coinf.errors import UserError


def resolve_role(given: str | None) -> str:
    from coinf.device.profile import describe_host, detect_role, this_host

    if given:
        return given
    role = detect_role()
    if role is None:
        raise UserError(f"cannot tell whether this machine ({describe_host(this_host())}) is the "
                        f"wearable or the handheld; pass --role wearable or --role handheld")
    return role


def starting_profile(role: str, out: Path, writes: bool, force: bool) -> Any:
    """The profile to update: the one at ``out`` when it is this role's and this machine's, else
    the built-in default; refuses (without ``force``) to replace another machine's profile."""
    from coinf.device.profile import DeviceProfile, describe_host, same_host, this_host

    if not out.is_file():
        return DeviceProfile.default(role)
    existing = DeviceProfile.load(out)
    here = this_host()
    if writes and existing.role != role:
        if not force:
            raise UserError(f"{out} is the {existing.role} profile (measured on "
                            f"{describe_host(existing.host)}); this run profiles this machine "
                            f"as the {role}: pass --role {existing.role}, another --out, or "
                            f"--force to replace it")
        return DeviceProfile.default(role)
    if existing.role != role:
        raise UserError(f"{out} is a {existing.role} profile; expected {role} (pass --role "
                        f"{existing.role})")
    if writes and existing.host and not same_host(existing.host, here):
        if not force:
            raise UserError(f"{out} holds the {role} profile measured on "
                            f"{describe_host(existing.host)}, not on this machine "
                            f"({describe_host(here)}): copy it rather than re-measure, or pass "
                            f"--force to replace it with this machine's timings")
        return DeviceProfile.default(role)
    return existing


#: passes over the synthetic networks' parts that --train times unless told: each takes about
#: 15 minutes here, and a --context-cache is topped up by a later run with more
#: (git history of docs/BENCHMARKS.md, `bench predict`)
PROFILE_PASSES = 1

#: the other synthetic families' sizes under --quick
QUICK_FAMILIES = {"small": 5, "gated": 3, "mobile": 2}


def train_context(predictor: Any, args: argparse.Namespace) -> list[str]:
    """Train the in-context slice predictor on the zoo measured here (docs/PLANNER.md section
    4) and store it in the sweep predictor; returns the models it was trained on."""
    import tempfile

    from coinf.research.context_data import FAMILY_NETWORKS, train_on_zoo

    def note(message: str) -> None:
        print(message, file=sys.stderr)

    families = QUICK_FAMILIES if args.quick else FAMILY_NETWORKS
    if args.context_cache:
        ctx, names = train_on_zoo(Path(args.context_cache), progress=note,
                                  synthetic=15 if args.quick else 300, passes=args.passes,
                                  families=families)
    else:
        with tempfile.TemporaryDirectory(prefix="coinf-context-") as tmp:
            ctx, names = train_on_zoo(Path(tmp), progress=note,
                                      synthetic=15 if args.quick else 300, passes=args.passes,
                                      families=families)
    predictor.meta["slice_model"] = ctx.to_json()
    return list(names)


def run(args: argparse.Namespace) -> int:
    from coinf.device.profile import default_profile_path, this_host

    role = resolve_role(args.role)
    out = Path(args.out) if args.out else default_profile_path(role)
    writes = bool(args.train or args.bundle or args.threads is not None
                  or args.slowdown is not None or args.name or args.memory_budget is not None)
    if writes:  # refused now, not after a sweep of tens of minutes
        writable_file(out, "--out")
        if args.train and not args.no_context and args.context_cache:
            writable_dir(args.context_cache, "--context-cache")
    prof = starting_profile(role, out, writes, args.force)
    apply_flags(prof, args)
    changed = (args.threads is not None or args.slowdown is not None or bool(args.name)
               or args.memory_budget is not None)
    report: dict[str, object] = {"profile": str(out), "name": prof.name, "role": prof.role,
                                 "role_from": "--role" if args.role else "detected"}
    bundle = None
    if args.bundle:  # loaded (and checked) before the sweep
        from coinf.bundle import Bundle

        bundle = Bundle.load(args.bundle)
    if args.train:
        report.update(train_predictors(prof, args))
        changed = True
    if bundle is not None:
        report.update(profile_model(prof, bundle, args, role))
        changed = True
    if changed:
        prof.host = this_host()
        prof.save(out)
        print(json.dumps(report, indent=1))
    else:
        print(json.dumps(profile_summary(prof, out), indent=1))
    return 0


def apply_flags(prof: Any, args: argparse.Namespace) -> None:
    """Check the numeric flags and set ``--name``, ``--threads``, ``--slowdown`` and
    ``--memory-budget`` on the profile."""
    if args.name:
        prof.name = args.name
    if args.threads is not None:
        if not 1 <= args.threads <= 256:
            raise UserError(f"--threads must be in [1, 256], got {args.threads}")
        prof.threads = args.threads
    if args.slowdown is not None:
        if not 0 < args.slowdown < 1e4:
            raise UserError(f"--slowdown must be in (0, 10000), got {args.slowdown}")
        prof.slowdown = args.slowdown
    if args.repeats < 1 or args.warmup < 0:
        raise UserError("--repeats must be >= 1 and --warmup >= 0")
    if args.passes < 1:
        raise UserError(f"--passes must be >= 1, got {args.passes}")
    if args.memory_budget is not None:
        if not 0 < args.memory_budget < 1e7:
            raise UserError(f"--memory-budget must be in (0, 1e7) MB, got {args.memory_budget}")
        prof.memory_budget_mb = args.memory_budget


def train_predictors(prof: Any, args: argparse.Namespace) -> dict[str, object]:
    """``--train``: the synthetic layer sweep's predictors (and, unless ``--no-context``, the
    in-context slice predictor) stored in the profile; returns the report's entries."""
    from coinf.device.predict import Predictor, require_training_deps

    require_training_deps()  # before the sweep, not after it
    if not args.no_context:
        require_full("coinf.research")  # the Pi wheel has no in-context training
    from coinf.device.sweep import run_sweep

    scale = 0.1 if args.quick else args.scale
    samples, overhead = run_sweep(scale, args.seed, prof.threads, args.repeats,
                                  progress=lambda m: print(m, file=sys.stderr))
    prof.predictor = Predictor.train(samples, device=prof.name, threads=prof.threads,
                                     run_overhead_ms=overhead)
    report: dict[str, object] = {"samples": len(samples), "r2": prof.predictor.r2_table()}
    if not args.no_context:
        report["incontext_trained_on"] = train_context(prof.predictor, args)
    return report


def profile_model(prof: Any, bundle: Any, args: argparse.Namespace,
                  role: str) -> dict[str, object]:
    """``--bundle``: its nodes' and candidates' times (and, on the wearable, each head's peak
    RSS) stored in the profile under the bundle's identity; returns the report's entries."""
    from coinf.device.profile import profile_bundle

    report: dict[str, object] = {}
    mp = profile_bundle(bundle, prof.threads, args.warmup, args.repeats,
                        slices=not args.no_slices,
                        progress=lambda m: print(m, file=sys.stderr))
    if not args.no_memory and role == "wearable":
        from coinf.device.memprofile import measure_heads

        for cid, mb in measure_heads(bundle, prof.threads,
                                     progress=lambda m: print(m, file=sys.stderr)).items():
            mp.candidates.setdefault(cid, {})["head_peak_rss_mb"] = mb
        report["head_peak_rss_mb"] = {cid: e["head_peak_rss_mb"] for cid, e in
                                      mp.candidates.items() if "head_peak_rss_mb" in e}
    prof.models[bundle.identity] = mp
    errs = [abs(v) for v in mp.node_sum_error.values()]
    report.update({"bundle": str(bundle.root), "identity": bundle.identity,
                   "nodes": len(mp.nodes), "candidates": len(mp.candidates),
                   "median_abs_node_sum_error": sorted(errs)[len(errs) // 2] if errs else None})
    return report


def profile_summary(prof: Any, out: Path) -> dict[str, Any]:
    """The profile as printed without changes: its JSON with the predictor and the models
    summarised, and the file it came from."""
    obj: dict[str, Any] = prof.to_json()
    if obj.get("predictor"):
        obj["predictor"] = {"kinds": sorted(obj["predictor"]["kinds"]),
                            "r2": prof.predictor.r2_table() if prof.predictor else {}}
    obj["models"] = {k: {"nodes": len(v["nodes"]), "candidates": len(v["candidates"])}
                     for k, v in obj["models"].items()}
    obj["file"] = str(out) if out.is_file() else "(built-in default; not saved)"
    return obj


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bundle", help="profile this bundle's nodes and candidate slices")
    parser.add_argument("--train", action="store_true",
                        help="run the synthetic layer sweep and train the latency predictors")
    parser.add_argument("--quick", action="store_true", help="tiny sweep (CI-size)")
    parser.add_argument("--no-context", action="store_true",
                        help="with --train: skip the in-context slice predictor (which times "
                        "every zoo model, and 490 synthetic networks whole and in parts: "
                        "most of the 20 min --train took on one x86 core here)")
    parser.add_argument("--context-cache", metavar="DIR",
                        help="keep the zoo bundles and timings and the synthetic networks' "
                        "profiles and part timings of --train here, to be read back by the "
                        "next --train on this device (default: a temporary folder)")
    parser.add_argument("--passes", type=argtypes.positive_int, default=PROFILE_PASSES,
                        help="with --train: passes over the synthetic networks' parts, each "
                        f"part keeping its fastest (default {PROFILE_PASSES}, about 15 min "
                        "each here); run again on the same --context-cache with more to add "
                        "the missing passes only")
    parser.add_argument("--scale", type=argtypes.number(0, 100, lo_open=True), default=1.0,
                        help="sweep size multiplier (default 1: ~640 layers)")
    parser.add_argument("--seed", type=argtypes.seed, default=0)
    parser.add_argument("--role", choices=("wearable", "handheld"), default=None,
                        help="which device this machine is (default: detected; a Raspberry Pi "
                        "is the wearable, a PC the handheld)")
    parser.add_argument("--force", action="store_true",
                        help="replace a profile measured on another machine or for the other "
                        "role")
    parser.add_argument("--name", help="device name stored in the profile")
    parser.add_argument("--out", help="profile file (default: <config dir>/<role>-profile.json)")
    parser.add_argument("--threads", type=argtypes.threads, help="onnxruntime intra-op threads")
    parser.add_argument("--slowdown", type=argtypes.number(0, 1e4, lo_open=True, hi_open=True),
                        help="multiply every time (emulate a slower device)")
    parser.add_argument("--repeats", type=argtypes.positive_int, default=5,
                        help="timed runs (median)")
    parser.add_argument("--warmup", type=argtypes.count, default=2, help="untimed runs first")
    parser.add_argument("--no-slices", action="store_true",
                        help="per-node times only; skip measuring each candidate's slices")
    parser.add_argument("--no-memory", action="store_true",
                        help="skip measuring each head's peak RSS (wearable role only)")
    parser.add_argument("--memory-budget", type=argtypes.number(0, 1e7, lo_open=True,
                        hi_open=True), metavar="MB",
                        help="the wearable's memory budget for a head, a hard planner "
                             "constraint (see `coinf doctor` for free memory)")
    parser.set_defaults(func=run)
