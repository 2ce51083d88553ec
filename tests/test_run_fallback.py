"""``coinf run`` falls back like a Session (issue 11): an unreachable handheld means the
inferences finish on the wearable, the rows say so, and ``--no-fallback`` makes it an error."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.bundles import make_tiny_bundle


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "coinf", "run", *args], capture_output=True,
                          text=True, timeout=120)


def test_run_finishes_on_the_wearable_when_the_handheld_is_gone(tmp_path) -> None:
    bundle = make_tiny_bundle(tmp_path / "tiny")
    nowhere = f"unix:{tmp_path / 'nobody-listens.sock'}"
    done = run(str(bundle.root), "--split", "c001", "--transport", "socket", "--handheld",
               nowhere, "--json", "--repeat", "2")
    assert done.returncode == 0, done.stderr
    assert "handheld unreachable" in done.stderr and "Traceback" not in done.stderr
    (row,) = json.loads(done.stdout)["rows"]
    assert row["match"] and row["fallbacks"] == 2
    strict = run(str(bundle.root), "--split", "c001", "--transport", "socket", "--handheld",
                 nowhere, "--json", "--no-fallback")
    assert strict.returncode == 3  # a link failure, not the user's mistake
    assert strict.stderr.count("\n") == 1 and "error" in strict.stderr
