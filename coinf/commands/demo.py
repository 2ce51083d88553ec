"""``coinf demo``: the main job on one machine.

Splits a zoo model into a bundle (reused when up to date), starts a handheld daemon process and a
wearable process (``coinf run``) talking over a local socket, runs every candidate (an evenly
spread subset on big models) and prints the per-candidate table. Exits 1 on any output mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from coinf.bench import progress


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="mobilenetv2", help="zoo model (default %(default)s)")
    parser.add_argument("--out", default="out/demo", help="where bundles are kept")
    parser.add_argument("--max", type=int, default=12, help="candidates to run (evenly spread)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per candidate (median)")
    parser.add_argument("--slowdown", type=float, default=1.0, help="emulate a K x slower wearable")
    parser.set_defaults(func=run)


def ensure_bundle(model: Path, out: Path) -> Path:
    """Split ``model`` into ``out`` unless a bundle of the same model file is already there."""
    from convert.bundle import MANIFEST, Bundle, sha256_file
    from convert.split import split_model

    if (out / MANIFEST).is_file():
        try:
            source = Bundle.load(out).meta.get("source", {})
            if source.get("sha256") == sha256_file(model):
                progress(f"reusing bundle {out}")
                return out
        except Exception as exc:
            progress(f"rebuilding bundle {out} ({exc})")
    progress(f"splitting {model} into {out} ...")
    t0 = time.perf_counter()
    split_model(model, out, verify=True)
    progress(f"split + verify took {time.perf_counter() - t0:.1f} s")
    return out


def run(args: argparse.Namespace) -> int:
    from coinf.commands.run import format_table
    from coinf.errors import CoinfError
    from models import zoo

    if args.model not in zoo.ZOO:
        raise CoinfError(f"unknown model {args.model!r}; choose from {', '.join(zoo.ZOO)}")
    bundle_dir = ensure_bundle(zoo.committed_path(args.model), Path(args.out) / args.model)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with tempfile.TemporaryDirectory(prefix="coinf-demo-") as tmp:
        address = f"unix:{tmp}/handheld.sock"
        handheld = subprocess.Popen(
            [sys.executable, "-m", "coinf", "handheld", "--bundle", str(bundle_dir),
             "--listen", address],
            stdout=subprocess.PIPE, text=True, env=env,
        )
        try:
            assert handheld.stdout is not None
            ready = handheld.stdout.readline()
            if "serving" not in ready:
                raise CoinfError("the handheld daemon did not start (see its error above)")
            progress(f"handheld process {handheld.pid}: {ready.strip()}")
            progress(f"wearable process: running up to {args.max} candidates ...")
            wearable = subprocess.run(
                [sys.executable, "-m", "coinf", "run", str(bundle_dir), "--all",
                 "--max", str(args.max), "--repeat", str(args.repeat),
                 "--slowdown", str(args.slowdown), "--transport", "socket",
                 "--handheld", address, "--json"],
                stdout=subprocess.PIPE, text=True, env=env, check=False,
            )
        finally:
            handheld.terminate()
            handheld.wait(10)
    if wearable.returncode not in (0, 1) or not wearable.stdout.strip():
        raise CoinfError(f"the wearable process failed (exit {wearable.returncode})")
    rows = json.loads(wearable.stdout)["rows"]
    print(f"\n{args.model}: {len(rows)} candidates, wearable and handheld in separate processes "
          f"over a local socket (transfer is socket time, not radio time)\n")
    print(format_table(rows))
    bad = [r["candidate"] for r in rows if not r["match"]]
    if bad:
        print(f"\nMISMATCH against the whole model at: {', '.join(bad)}")
        return 1
    print(f"\nall {len(rows)} candidates match the whole model (rtol 1e-4, atol 1e-5)")
    return 0
