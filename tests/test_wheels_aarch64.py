"""The wearable extra installs on a Pi Zero 2 W (aarch64, CPython 3.11): every version its
requirements resolve to has an aarch64 cp311 wheel, and the known-bad runtimes are excluded
(issue 16).

Resolving asks the package index: that test runs only with ``COINF_TEST_NETWORK=1``
(tests/network.py; ``make test-arm`` sets it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from coinf.device.runtimes import KNOWN_BAD
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".ci" / "arm"))
from requirements import wearable_requirements  # noqa: E402

from tests.network import ENV, needs_network  # noqa: E402

#: what a Pi Zero 2 W with Raspberry Pi OS bookworm (glibc 2.36) can install
TAGS = ["--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
        "--abi", "cp311", "--abi", "abi3", "--abi", "none",
        "--platform", "manylinux2014_aarch64",
        *[a for n in range(17, 37) for a in ("--platform", f"manylinux_2_{n}_aarch64")]]


def _resolve(reqs: list[str], tmp: Path, *extra: str) -> dict[str, str]:
    """pip's resolver with the Pi's tags (binary wheels only): name -> chosen version."""
    tmp.mkdir(parents=True, exist_ok=True)
    report = tmp / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--disable-pip-version-check", "--target", str(tmp / "t"), "--report", str(report),
         *TAGS, *extra, *reqs],
        capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        offline = ("NewConnectionError", "Temporary failure in name resolution",
                   "Network is unreachable")
        if any(o in proc.stderr for o in offline):  # asked for with ENV=1: fail, not skip
            pytest.fail(f"{ENV}=1 but the package index cannot be reached: "
                        f"{proc.stderr[-300:]}")
        pytest.fail(f"pip could not resolve with the Pi's tags:\n{proc.stderr[-2000:]}")
    items = json.loads(report.read_text())["install"]
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in items}


def test_known_bad_runtimes_are_excluded_by_setup_cfg() -> None:
    reqs = {Requirement(r).name.lower(): Requirement(r)
            for r in wearable_requirements(ROOT / "setup.cfg")}
    for (dist, version), why in KNOWN_BAD.items():
        assert dist in reqs, dist
        assert not reqs[dist].specifier.contains(version, prereleases=True), (dist, version, why)
    assert reqs["onnxruntime"].specifier.contains("1.21.1")  # only the bad one, not a range


@needs_network("resolving the wearable extra on the package index")
def test_wearable_extra_resolves_to_aarch64_cp311_wheels(tmp_path: Path) -> None:
    reqs = wearable_requirements(ROOT / "setup.cfg")
    newest = _resolve(reqs, tmp_path / "new")
    for r in reqs:
        assert Requirement(r).name.lower() in newest, r
    for (dist, version), _ in KNOWN_BAD.items():
        assert newest.get(dist) != version
    # and the oldest versions the specifiers allow have such wheels too: a resolver that
    # backtracks (or a pinned older dependency) must not land on a source-only release
    lowest = []
    for r in map(Requirement, reqs):
        floor = next((s.version for s in r.specifier if s.operator == ">="), None)
        if floor is not None:  # the floor's release series: 1.24 -> 1.24.*, 0.0.200 exactly
            lowest.append(f"{r.name}=={floor}.*" if floor.count(".") == 1 else
                          f"{r.name}=={floor}")
    oldest = _resolve(lowest, tmp_path / "old", "--no-deps")
    assert len(oldest) == len(lowest), (lowest, oldest)


@needs_network("resolving the discovery extra on the package index")
def test_discovery_extra_resolves_to_aarch64_cp311_wheels(tmp_path: Path) -> None:
    """``coinf[discovery]`` (``coinf run --discover`` on the Pi): zeroconf's newest release and
    the floor setup.cfg allows both have aarch64 cp311 wheels (and ifaddr a pure one)."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    reqs = [x.strip() for x in cfg["options.extras_require"]["discovery"].splitlines()
            if x.strip() and not x.strip().startswith("#")]
    newest = _resolve(reqs, tmp_path / "new")
    assert {"zeroconf", "ifaddr"} <= set(newest), newest
    floor = next(s.version for s in Requirement(reqs[0]).specifier if s.operator == ">=")
    assert _resolve([f"zeroconf=={floor}.*"], tmp_path / "old", "--no-deps")
