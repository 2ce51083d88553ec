"""The wearable core as a Cortex-A53 (qemu user mode) against this x86 host: same head outputs,
packing that crosses architectures unchanged, a Session over a socket to an x86 handheld, and an
import of every module a ``coinf[wearable]`` install of the Pi wheel (``make wheel-pi``) ships
(issue 16; ``make test-arm``)."""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from coinf.ble_protocol.packing import pack, unpack
from coinf.convert.split import split_model
from coinf.models import committed_path

from coinf.bundle import Bundle
from coinf.deps import EXTRA_OF, PI_LEFT_OUT, left_out
from tests.arm.conftest import ArmGuest
from tests.procs import handheld_daemon

SPECS = ("f32", "f16", "q8", "q4")
RTOL = 1e-5


def _feeds(bundle: Bundle, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.shape).astype(t.dtype) for t in bundle.inputs}


def _pick(bundle: Bundle, n: int) -> list[str]:
    """``n`` candidates with a head spread over the model, the last being wearable-only."""
    heads = [c.id for c in bundle.candidates if c.head.file is not None]
    step = max(1, len(heads) // n)
    return sorted({*heads[step - 1::step][: n - 1], heads[-1]})


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Bundle]:
    root = tmp_path_factory.mktemp("arm")
    return {name: split_model(committed_path(name), root / name)
            for name in ("lenet_digits", "mobilenetv2")}


def _assert_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, what
    scale = max(float(np.abs(want).max()), 1e-6)
    err = float(np.abs(got.astype(np.float64) - want).max()) / scale
    assert err <= RTOL, f"{what}: max error {err:.2e} of the largest value > {RTOL:g}"


@pytest.mark.parametrize("model", ["lenet_digits", "mobilenetv2"])
def test_heads_match_x86(arm: ArmGuest, bundles: dict[str, Bundle], model: str,
                         tmp_path: Path) -> None:
    bundle = bundles[model]
    cids = _pick(bundle, 4)
    feeds = _feeds(bundle)
    np.savez(tmp_path / "in.npz", **feeds)
    arm.run("heads", str(bundle.root), str(tmp_path / "in.npz"), str(tmp_path / "out.npz"),
            *cids)
    got = dict(np.load(tmp_path / "out.npz"))
    by_id = {c.id: c for c in bundle.candidates}
    for cid in cids:
        file = by_id[cid].head.file
        assert file is not None
        sess = ort.InferenceSession(str(bundle.path(file)), providers=["CPUExecutionProvider"])
        ins = {i.name: feeds[i.name] for i in sess.get_inputs()}
        names = [o.name for o in sess.get_outputs()]
        for name, want in zip(names, sess.run(names, ins), strict=True):
            _assert_close(got[f"{cid}/{name}"], want, f"{model} {cid} {name}")


def test_packing_crosses_architectures(arm: ArmGuest, bundles: dict[str, Bundle],
                                       tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    arrays = {"act": np.maximum(rng.standard_normal((1, 32, 14, 14)), 0).astype(np.float32),
              "wide": (rng.standard_normal((3, 257)) * 1e3).astype(np.float32),
              "half": rng.standard_normal((5, 7)).astype(np.float16)}
    np.savez(tmp_path / "arrays.npz", **arrays)
    for name, arr in arrays.items():  # packed here, unpacked there
        for spec in SPECS:
            (tmp_path / f"{name}.{spec}.x86.bin").write_bytes(pack(arr, spec))
    arm.run("pack", str(tmp_path / "arrays.npz"), str(tmp_path), *SPECS)
    on_arm = dict(np.load(tmp_path / "arm.npz"))
    for name, arr in arrays.items():
        for spec in SPECS:
            arm_bytes = (tmp_path / f"{name}.{spec}.arm.bin").read_bytes()
            x86_bytes = (tmp_path / f"{name}.{spec}.x86.bin").read_bytes()
            assert arm_bytes == x86_bytes, f"{name} {spec}: packed differently on ARM"
            # unpacked on x86 (ARM's bytes) and on ARM (x86's bytes): the same array, bit for bit
            here = unpack(arm_bytes)
            there = on_arm[f"{name}.{spec}.x86"]
            assert here.dtype == there.dtype and here.tobytes() == there.tobytes(), (name, spec)
            assert on_arm[f"{name}.{spec}.arm"].tobytes() == here.tobytes()
            if spec == "f32" and arr.dtype == np.float32:
                assert here.tobytes() == arr.tobytes()  # lossless really is


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_session_over_socket_to_an_x86_handheld(arm: ArmGuest, bundles: dict[str, Bundle],
                                                tmp_path: Path) -> None:
    bundle = bundles["lenet_digits"]
    mid = _pick(bundle, 3)[0]
    feeds = _feeds(bundle, seed=5)
    np.savez(tmp_path / "in.npz", **feeds)
    address = f"tcp:127.0.0.1:{_free_port()}"
    with handheld_daemon(bundle.root, address) as proc:
        done = arm.run("session", str(bundle.root), address, str(tmp_path / "in.npz"),
                       str(tmp_path / "out.npz"), mid, "c000")
        assert proc.poll() is None
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    got = dict(np.load(tmp_path / "out.npz"))
    sess = ort.InferenceSession(str(bundle.model_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    want = dict(zip(names, sess.run(names, feeds), strict=True))
    for cid in (mid, "c000"):
        assert stats[cid]["local"] is False and stats[cid]["fallback"] is None, stats[cid]
        assert stats[cid]["bytes_up"] > 0 and stats[cid]["bytes_down"] > 0
        for name in names:
            _assert_close(got[f"{cid}/{name}"], want[name], f"session {cid} {name}")


def test_every_shipped_module_imports_on_the_wearable(arm: ArmGuest, tmp_path: Path) -> None:
    arm.run("imports", str(tmp_path / "imports.json"))
    report = json.loads((tmp_path / "imports.json").read_text())
    from coinf.device.runtimes import KNOWN_BAD

    assert report["machine"] == "aarch64" and report["python"].startswith("3.11.")
    assert ("onnxruntime", report["onnxruntime"]) not in KNOWN_BAD
    # coinf came from the installed wheel, not from this checkout
    assert report["file"] == str(Path(os.environ["COINF_ARM_COINF"]) / "coinf" / "__init__.py")
    mods = report["modules"]
    assert len(mods) > 60  # the whole package, not a stub
    for must in ("coinf.wearable.session", "coinf.ble_protocol.peripheral",
                 "coinf.device.runtime", "coinf.ble_protocol.packing", "coinf.cli"):
        assert mods.get(must) == "ok", (must, mods.get(must))
    # the Pi wheel (`make wheel-pi`): no benchmarks, research, torch builders or zoo files
    for gone in PI_LEFT_OUT:
        assert not any(m == gone or m.startswith(gone + ".") for m in mods), gone
    assert not (Path(report["file"]).parent / "models" / "onnx").exists()
    for name, state in mods.items():
        if state.startswith("missing:"):
            missing = state.split(":", 1)[1]
            if left_out(missing):  # coinf bench/demo: one line naming a full install
                continue
            top = missing.split(".")[0]
            # only a module of another extra may be absent, and the CLI says which to install
            assert EXTRA_OF.get(top) not in (None, "wearable"), (name, state)
        else:
            assert state == "ok", f"{name}: {state}"


def test_the_emulation_catches_a_runtime_that_crashes_on_the_a53(arm: ArmGuest) -> None:
    """Negative control: onnxruntime 1.21.0, excluded in setup.cfg, dies on the A53 here."""
    from coinf.device.runtimes import KNOWN_BAD

    bad = os.environ.get("COINF_ARM_BAD_SITE")
    if not bad:
        pytest.skip("no COINF_ARM_BAD_SITE (set up by .ci/arm/setup.sh)")
    assert ("onnxruntime", "1.21.0") in KNOWN_BAD
    code = "import onnxruntime; print(onnxruntime.__version__)"
    site = os.environ["COINF_ARM_SITE"]
    proc = arm.python_run("-c", code, path=f"{bad}:{site}")
    assert proc.returncode == -signal.SIGILL, (proc.returncode, proc.stderr[-500:])
    good = arm.python_run("-c", code, path=site)  # the version setup.cfg resolves to
    assert good.returncode == 0 and good.stdout.strip() != "1.21.0", good.stderr[-500:]
