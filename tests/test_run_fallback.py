"""``coinf run`` falls back like a Session: an unreachable handheld means the inferences finish
on the wearable, the rows say so, the exit code tells a script that nothing was offloaded, and
``--no-fallback`` makes it an error. Its per-cut progress line gives the packed size sent."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from coinf.cli.commands.run import EXIT_NEVER_OFFLOADED
from tests.bundles import make_tiny_bundle


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "coinf", "run", *args], capture_output=True,
                          text=True, timeout=120)


def test_run_finishes_on_the_wearable_when_the_handheld_is_gone(tmp_path) -> None:
    bundle = make_tiny_bundle(tmp_path / "tiny")
    nowhere = f"unix:{tmp_path / 'nobody-listens.sock'}"
    done = run(str(bundle.root), "--split", "c001", "--transport", "socket", "--handheld",
               nowhere, "--json", "--repeat", "2")
    assert done.returncode == EXIT_NEVER_OFFLOADED == 5, done.stderr
    assert "handheld unreachable" in done.stderr and "Traceback" not in done.stderr
    assert "none of the 2 inference(s) meant for the handheld reached it" in done.stderr
    (row,) = json.loads(done.stdout)["rows"]
    assert row["match"] and row["fallbacks"] == 2
    strict = run(str(bundle.root), "--split", "c001", "--transport", "socket", "--handheld",
                 nowhere, "--json", "--no-fallback")
    assert strict.returncode == 3  # a link failure, not the user's mistake
    assert strict.stderr.count("\n") == 1 and "error" in strict.stderr


def test_progress_names_the_packed_size_and_a_reachable_handheld_exits_0(tmp_path) -> None:
    bundle = make_tiny_bundle(tmp_path / "tiny")
    done = run(str(bundle.root), "--split", "c001~q4,c001", "--json", "--repeat", "1")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rows"]
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("[")]
    assert len(lines) == 2 and all(r["fallbacks"] == 0 for r in rows)
    for line, row in zip(lines, rows, strict=True):
        sent = re.search(r"sent (\d+) B as (\S+) \((\d+) B unpacked\)", line)
        assert sent, line
        assert (int(sent[1]), sent[2], int(sent[3])) == (
            round(row["bytes_up"]), row["packing"], row["bytes"])
    assert rows[0]["packing"] == "q4" and rows[0]["bytes_up"] < rows[1]["bytes_up"]
