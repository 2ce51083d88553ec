"""``coinf policy show|set|profiles``: the end-user policy file."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from coinf.cli.paths import writable_file
from coinf.errors import UserError


def _not_finite(text: str) -> bool:
    try:
        return not math.isfinite(float(text))
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    from coinf.wearable.policy import PROFILES, load_policy, set_policy

    if args.action == "profiles":
        for name, p in PROFILES.items():
            print(f"{name:<14} {p.notes}")
        return 0
    if args.file is not None and Path(args.file).is_dir():
        raise UserError(f"--file {args.file}: is a folder; give the name of a policy file")
    if args.action == "set":
        if not args.settings:
            raise UserError("policy set needs KEY=VALUE pairs, e.g. `coinf policy set "
                             "profile=save-wearable latency_budget_ms=200`")
        settings = {}
        for item in args.settings:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise UserError(f"bad setting {item!r}; expected KEY=VALUE")
            settings[key.strip()] = value.strip()
            if _not_finite(value):
                raise UserError(f"bad setting {item!r}: expected a finite number")
        if args.file is not None:
            writable_file(args.file, "--file")
        policy, path = set_policy(settings, args.file)
        print(f"wrote {path}")
    else:
        policy, path, exists = load_policy(args.file)
        print(f"# {path}" + ("" if exists else " (not present: built-in default)"))
    print(json.dumps(policy.to_json(), indent=1))
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("show", "set", "profiles"), nargs="?", default="show")
    parser.add_argument("settings", nargs="*", metavar="KEY=VALUE")
    parser.add_argument("--file", help="policy file (default $COINF_CONFIG or "
                                       "~/.config/coinf/policy.json)")
    parser.set_defaults(func=run)
