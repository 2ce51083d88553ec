"""Issue 41 (part 6): a user's bad input ends in one line and the right exit code.

Every case below used to end in a traceback, a wrong exit code (often 0), an error over several
lines (argparse's usage block), an error about something else, or a process that ran until
killed. Each runs ``coinf`` in a subprocess with a timeout (so the old "serves anyway"
behaviour fails instead of hanging the suite) and uses values refused before any work.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bundles import make_tiny_bundle

TIMEOUT_S = 60


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("bad")
    bundle = make_tiny_bundle(root / "bundle")
    (root / "folder").mkdir()
    (root / "junk.txt").write_text("not json, not onnx {")
    (root / "bundles").mkdir()
    make_tiny_bundle(root / "bundles" / "tiny")
    return {"B": str(bundle.root), "MODEL": str(bundle.model_path), "MISSING": str(root / "nope"),
            "DIR": str(root / "folder"), "JUNK": str(root / "junk.txt"),
            "BUNDLES": str(root / "bundles"), "OUT": str(root / "out"),
            "CFG": str(root / "cfg")}


def coinf(args: list[str], cfg: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COINF_CONFIG": f"{cfg}/policy.json", "XDG_CONFIG_HOME": cfg,
           "COINF_CONTROL": f"{cfg}/no.sock"}
    try:
        return subprocess.run([sys.executable, "-m", "coinf", *args], capture_output=True,
                              text=True, timeout=TIMEOUT_S, env=env, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"coinf {' '.join(args)} ran for {TIMEOUT_S} s (bad input not refused)")


# (argv with {B}, {MISSING}... placeholders, exit code, words the one error line must hold)
CASES = [
    # handheld: numbers, ports, a profile that is missing or a folder (it used to serve anyway)
    ("handheld --bundle {B} --slowdown inf", 2, "--slowdown"),
    ("handheld --bundle {B} --listen tcp:127.0.0.1:99999", 2, "--listen"),
    ("handheld --bundle {B} --lru 0", 2, "--lru"),
    ("handheld --bundle {B} --passkey 1000000", 2, "--passkey-file"),
    ("handheld --bundle {B} --passkey 123456", 2, "--passkey-file"),  # never in argv
    ("run {B} --transport ble --hci tcp-client:127.0.0.1:1 --passkey 123456", 2,
     "--passkey-stdin"),
    ("wearable pair --hci tcp-client:127.0.0.1:1 --passkey 123456", 2, "--passkey-file"),
    ("handheld pair --passkey 123456", 2, "--passkey-file"),
    ("handheld --bundle {B} --profile {MISSING}", 2, "--profile"),
    ("handheld --bundle {B} --profile {DIR}", 2, "--profile"),
    ("handheld --bundle {B} --listen unix:{JUNK}/sock", 2, "--listen"),
    ("handheld pair --hci tcp-client:127.0.0.1:1 --timeout 0", 2, "--timeout"),
    # handheld: the socket listener's limits (issue 41, part 3)
    ("handheld --bundle {B} --max-links 0", 2, "--max-links"),
    ("handheld --bundle {B} --max-links-per-peer -1", 2, "--max-links-per-peer"),
    ("handheld --bundle {B} --hello-timeout nan", 2, "--hello-timeout"),
    ("handheld --bundle {B} --idle-timeout 0", 2, "--idle-timeout"),
    ("handheld --bundle {B} --listen ble:tcp-client:127.0.0.1:1 --idle-timeout 5", 2,
     "--idle-timeout"),
    # run
    ("run {B} --seed -1", 2, "--seed"),
    ("run {B} --all --max 0", 2, "--max"),
    ("run {B} --all --max -1", 2, "--max"),
    ("run {B} --slowdown inf", 2, "--slowdown"),
    ("run {B} --compute-profile pi-5", 2, "--compute-profile"),
    ("bench map --wearable-compute fast", 2, "--wearable-compute"),
    ("run {B} --stream -1", 2, "--stream"),
    ("run {B} --repeat abc", 2, "--repeat"),
    ("run {B} --transport socket --handheld tcp:127.0.0.1:99999", 2, "--handheld"),
    ("run {B} --no-such-option", 2, "unrecognized"),
    # run: a second link to the handheld (issue 49)
    ("run {B} --wifi tcp:127.0.0.1:7878", 2, "second link beside --transport ble"),
    ("run {B} --transport socket --handheld tcp:127.0.0.1:7878 --wifi tcp:127.0.0.1:7879", 2,
     "the handheld's address there is --handheld"),
    ("run {B} --transport ble --hci tcp-client:127.0.0.1:1 --wifi unix:/tmp/w", 2,
     "expected tcp:HOST:PORT (TLS"),
    ("run {B} --transport ble --hci tcp-client:127.0.0.1:1 --wifi tcp:127.0.0.1:0", 2,
     "--wifi 'tcp:127.0.0.1:0'"),
    ("run {B} --wifi-emulate pi-zero-2w-wifi", 2, "shapes the --wifi link"),
    ("run {B} --transport ble --hci tcp-client:127.0.0.1:1 --wifi tcp:127.0.0.1:7878 "
     "--wifi-emulate lte", 2, "unknown Wi-Fi preset 'lte'"),
    # plan: files given and missing are refused, numbers finite and in range
    ("plan {B} --policy {MISSING}", 2, "--policy"),
    ("plan {B} --wearable-profile {DIR}", 2, "--wearable-profile"),
    ("plan {B} --budget-ms nan", 2, "--budget-ms"),
    ("plan {B} --bandwidth-kbps inf", 2, "--bandwidth-kbps"),
    ("plan {B} --rtt-ms inf", 2, "--rtt-ms"),
    ("plan {B} --wearable-battery 101", 2, "--wearable-battery"),
    ("plan {B} --bandwidth 1e400kB/s", 2, "--bandwidth"),
    # profile, policy, radio, wearable, doctor
    ("profile --train --out {OUT}/p.json --scale nan", 2, "--scale"),
    ("policy show --file {DIR}", 2, "--file"),
    ("policy set latency_budget_ms=inf --file {OUT}/policy.json", 2, "latency_budget_ms"),
    ("radio --listen 127.0.0.1:99999", 2, "--listen"),
    ("radio --listen 127.0.0.1:65535", 2, "--listen"),
    ("wearable --bundle {B} --hci tcp-client:127.0.0.1:1 --probes 0", 2, "--probes"),
    ("wearable pair --hci tcp-client:127.0.0.1:1 --window-s inf", 2, "--window-s"),
    ("doctor --hci-dump {JUNK} --timeout inf", 2, "--timeout"),
    ("models prune {JUNK} --out {OUT}/p.onnx", 2, "not a readable ONNX model"),
    # benchmarks
    ("bench faults --bundle {B} --split c001 --chunk-fault-rate 2", 2, "--chunk-fault-rate"),
    ("bench faults --bundle {B} --split c001 --period-ms 0", 2, "--period-ms"),
    ("bench faults --bundle {B} --split c001 --scenarios nothing", 2, "--scenarios"),
    ("bench mincut --repeats 0", 2, "--repeats"),
    ("bench mincut --bandwidth-bps nan", 2, "--bandwidth-bps"),
    ("bench fuzz --inputs 0", 2, "--inputs"),
    ("bench fuzz --seed -1", 2, "--seed"),
    ("bench overhead {MODEL} --threads 0", 2, "--threads"),
    ("bench split {MODEL} --tmp {MISSING}", 2, "--tmp"),
    ("bench stream --bundle {B} --wearable-slowdown 0.5", 2, "--wearable-slowdown"),
    ("bench stream --bundle {B} --bandwidth-kbps 0", 2, "--bandwidth-kbps"),
    ("bench plan-sweep --bundles {BUNDLES} --slowdowns 0", 2, "--slowdowns"),
    ("bench pipeline --bundle {B} --latency-ms -1", 2, "--latency-ms"),
    ("bench spatial --slowdown inf", 2, "--slowdown"),
    ("bench predict --bundle {B} --threads 0", 2, "--threads"),
    ("bench plan --bundle {B} --wearable-slowdown inf", 2, "--wearable-slowdown"),
]


@pytest.mark.parametrize("line,code,needle", CASES, ids=[c[0].split(" {")[0] + " " +
                                                          c[0].split()[-1] for c in CASES])
def test_bad_input_is_one_line(files: dict[str, str], line: str, code: int,
                               needle: str) -> None:
    args = [word.format(**files) for word in line.split()]
    proc = coinf(args, files["CFG"])
    err = proc.stderr.strip()
    assert "Traceback" not in err, err
    assert proc.returncode == code, (proc.returncode, err)
    assert len(err.splitlines()) == 1, err
    assert err.startswith("coinf ") and ": error: " in err and needle in err, err


def test_push_refuses_symlinks_that_leave_the_bundle(tmp_path: Path) -> None:
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "key").write_text("private")
    for kind in ("folder", "file"):
        bundle = make_tiny_bundle(tmp_path / kind).root
        link = bundle / "ext" if kind == "folder" else bundle / "c001" / "key"
        link.symlink_to(outside if kind == "folder" else outside / "key")
        proc = coinf(["push", str(bundle), "pi@wearable", "--dry-run"], str(tmp_path / "cfg"))
        err = proc.stderr.strip()
        assert proc.returncode == 2 and len(err.splitlines()) == 1, err
        assert str(link) in err and "outside the bundle" in err, err
        assert not proc.stdout  # nothing planned, nothing sent


def test_push_follows_symlinks_inside_the_bundle(tmp_path: Path) -> None:
    from coinf.cli.commands.push import bundle_files, local_digests

    bundle = make_tiny_bundle(tmp_path / "b").root
    (bundle / "alias").symlink_to(bundle / "c001")
    digests = local_digests(bundle)
    assert "./alias/head.onnx" in digests
    assert digests["./alias/head.onnx"] == digests["./c001/head.onnx"]
    assert all(p.is_file() for p in bundle_files(bundle))


def test_control_socket_refuses_deep_json_and_keeps_serving(tmp_path: Path) -> None:
    from coinf.wearable.control import BundleHolder, start_control

    holder = BundleHolder(make_tiny_bundle(tmp_path / "b").root)

    async def ask(sock: Path, line: bytes) -> bytes:
        reader, writer = await asyncio.open_unix_connection(str(sock))
        writer.write(line)
        await writer.drain()
        reply = await asyncio.wait_for(reader.readline(), 10)
        writer.close()
        return reply

    async def main() -> tuple[bytes, bytes, bytes]:
        sock = tmp_path / "c.sock"
        server = await start_control(holder, sock)
        try:
            deep = await ask(sock, b"[" * 4000 + b"\n")  # raised RecursionError in json.loads
            nested = await ask(sock, b'{"op": ' + b"[" * 100 + b"]" * 100 + b"}\n")
            ok = await ask(sock, b'{"op": "status"}\n')
        finally:
            server.close()
        return deep, nested, ok

    deep, nested, ok = asyncio.run(main())
    assert b'"ok": false' in deep and b"nested" in deep
    assert b'"ok": false' in nested
    assert b'"ok": true' in ok and holder.identity.encode() in ok


@pytest.mark.parametrize("where", ["model", "head"])
def test_a_manifest_file_field_that_is_not_a_path_is_one_line(tmp_path: Path,
                                                               where: str) -> None:
    import json

    from tests.bundles import make_tiny_bundle

    b = make_tiny_bundle(tmp_path / "b")
    path = b.root / "manifest.json"
    obj = json.loads(path.read_text())
    if where == "model":
        obj["model"]["file"] = 7
    else:
        obj["candidates"][1]["head"]["file"] = ["x"]
    path.write_text(json.dumps(obj))
    r = coinf(["plan", str(b.root)], str(tmp_path / "cfg"))
    assert r.returncode == 2, r.stderr
    assert "malformed" in r.stderr and "path string" in r.stderr
    assert "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0
