"""The model zoo registry: what each model is, where its committed ONNX lives, how to rebuild it.

Importing this module needs only numpy and onnx; torch is imported by :func:`build` alone, so the
wearable and ``coinf models list`` work without it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from coinf.models.digits import DigitsSplit
from coinf.models.digits import digits_data as _digits_data
from coinf.models.inputs import InputSpec

from coinf.deps import require_full
from coinf.errors import UserError

if TYPE_CHECKING:
    from torch import nn

ONNX_DIR = Path(__file__).resolve().parent / "onnx"
SEED = 0
"""Seed of the torch RNG before a model is constructed (weights) and trained (shuffles)."""

Built = tuple["nn.Module", dict[str, Any] | None]


@dataclass(frozen=True)
class ModelSpec:
    """A zoo entry. ``builder(large)`` returns (module in eval mode, metadata or None)."""

    name: str
    family: str
    papers: tuple[str, ...]
    description: str
    inputs: tuple[InputSpec, ...]
    large_inputs: tuple[InputSpec, ...]
    builder: Callable[[bool], Built] = field(repr=False)
    outputs: tuple[str, ...] = ("logits",)
    trained: bool = False
    keep_batchnorm: bool = False

    def input_specs(self, large: bool = False) -> tuple[InputSpec, ...]:
        return self.large_inputs if large else self.inputs

    def file_name(self, large: bool = False) -> str:
        return f"{self.name}_large.onnx" if large else f"{self.name}.onnx"


def _arch(
    factory: str, *, batchnorm: bool = False, embeddings: bool = False
) -> Callable[[bool], Built]:
    """Builder for a seeded random-weight model made by ``<factory>(large)``: ``make_x`` of
    :mod:`models.architectures` (images) or ``sequence.make_x`` of :mod:`models.sequence`
    (audio and text); ``embeddings`` re-scales a text model's embeddings."""

    def builder(large: bool) -> Built:
        from coinf.models import architectures as arch
        from coinf.models import sequence

        module, _, name = factory.rpartition(".")
        model = getattr(sequence if module == "sequence" else arch, name)(large)
        if batchnorm:
            arch.randomize_norm_stats(model)
        if embeddings:
            sequence.init_scaled(model)
        return model.eval(), None

    return builder


def _trained_lenet(large: bool) -> Built:
    from coinf.models import architectures as arch
    from coinf.models.training import train_digits

    model = arch.make_lenet(large)
    metrics, seconds = train_digits(model, SEED)
    _progress(f"  trained in {seconds:.1f} s, test accuracy {metrics['test_accuracy']:.4f}")
    return model, metrics


def _trained_digitnet(large: bool) -> Built:
    from coinf.models.digitnet import train_digitnet

    model, metrics, seconds = train_digitnet(SEED)
    _progress(f"  trained in {seconds:.1f} s, test accuracy {metrics['test_accuracy']:.4f}")
    return model, metrics


def _img(size: int) -> tuple[InputSpec, ...]:
    return (InputSpec("image", (1, 3, size, size)),)


def _tokens(length: int, vocab: int) -> tuple[InputSpec, ...]:
    return (InputSpec("tokens", (1, length), "int64", vocab),)


_SPECS = [
    ModelSpec(
        "lenet_digits", "LeNet", ("CoINF", "Neurosurgeon", "MeDNN"),
        "LeNet-5 (ReLU, max pool) trained on sklearn digits upsampled to 28x28; 10 classes",
        (InputSpec("image", (1, 1, 28, 28)),), (InputSpec("image", (1, 1, 28, 28)),),
        _trained_lenet, trained=True,
    ),
    ModelSpec(
        "alexnet", "AlexNet", ("Neurosurgeon", "MeDNN"),
        "5 conv + LRN + 3 FC; small: 64x64, reduced widths, 100 classes; large: original 224x224",
        _img(64), _img(224), _arch("make_alexnet"),
    ),
    ModelSpec(
        "vgg", "VGG", ("Neurosurgeon", "MeDNN", "streaming-CNN", "DynO"),
        "VGG-16 layout (13 conv 3x3, 3 FC); small: 64x64, widths 16-64; large: VGG-16 at 224x224",
        _img(64), _img(224), _arch("make_vgg"),
    ),
    ModelSpec(
        "mobilenetv2", "MobileNetV2", ("CoINF", "streaming-CNN", "DynO"),
        "inverted residuals, depthwise conv, ReLU6, BN kept; small: width 0.5 at 96x96",
        _img(96), _img(224), _arch("make_mobilenetv2", batchnorm=True), keep_batchnorm=True,
    ),
    ModelSpec(
        "inception", "Inception", ("CoINF", "DynO"),
        "Inception-v3 blocks A/B/C/D/E (parallel branches + concat), BN kept; small: width 1/8",
        _img(128), _img(299), _arch("make_inception", batchnorm=True), keep_batchnorm=True,
    ),
    ModelSpec(
        "resnet", "ResNet", ("DynO",),
        "ResNet-18 layout (basic blocks, skip adds), BN kept; small: widths 12-96 at 64x64",
        _img(64), _img(224), _arch("make_resnet", batchnorm=True), keep_batchnorm=True,
    ),
    ModelSpec(
        "wearcam", "ResNet", ("CoINF",),
        "96x96 RGB camera-frame classifier: stride-2 stem, 1-channel bottleneck, ResNet trunk at "
        "48x48 (64 channels); the demo's model, where splitting pays on a Pi Zero 2 W",
        _img(96), _img(96), _arch("make_wearcam", batchnorm=True), keep_batchnorm=True,
    ),
    ModelSpec(
        "wavenet", "WaveNet", ("CoINF",),
        "gated dilated causal conv stacks with residual+skip sums over 20 MFCCs; 29 symbols/frame",
        (InputSpec("mfcc", (1, 20, 100)),), (InputSpec("mfcc", (1, 20, 400)),),
        _arch("sequence.make_wavenet"),
    ),
    ModelSpec(
        "lstm_lm", "LSTM", ("CoINF",),
        "word-level LSTM language model, 2 layers; small: vocab 1000, hidden 128; next-word logits",
        _tokens(32, 1000), _tokens(35, 10000), _arch("sequence.make_lstm_lm", embeddings=True),
    ),
    ModelSpec(
        "textcnn", "TextCNN", ("CoINF",),
        "Kim-style CNN: embedding, conv widths 3/4/5 in parallel, max over time, concat, FC",
        _tokens(64, 2000), _tokens(256, 20000), _arch("sequence.make_textcnn", embeddings=True),
    ),
    ModelSpec(
        "gru_text", "GRU", ("CoINF",),
        "bidirectional GRU document classifier (CoINF's TextRNN role); final states -> FC",
        _tokens(64, 2000), _tokens(256, 30000), _arch("sequence.make_gru_text", embeddings=True),
    ),
    ModelSpec(
        "senna_mlp", "SENNA", ("CoINF", "Neurosurgeon"),
        "SENNA window MLP: 5 words + caps features -> embeddings -> HardTanh(300) -> 45 tags",
        (InputSpec("words", (1, 5), "int64", 3000), InputSpec("caps", (1, 5), "int64", 5)),
        (InputSpec("words", (1, 5), "int64", 130000), InputSpec("caps", (1, 5), "int64", 5)),
        _arch("sequence.make_senna_mlp", embeddings=True),
    ),
    ModelSpec(
        "digitnet", "VGG", ("streaming-CNN",),
        "VGG-like CNN (8 conv) trained on sklearn digits upsampled to 32x32 outside the model; "
        "cuts at its pools (32x16x16, 64x8x8) take the compressors of models/compressor_set.py",
        (InputSpec("image", (1, 1, 32, 32)),), (InputSpec("image", (1, 1, 32, 32)),),
        _trained_digitnet, trained=True,
    ),
]  # fmt: skip

ZOO: dict[str, ModelSpec] = {spec.name: spec for spec in _SPECS}


def spec_for(name: str) -> ModelSpec:
    """The registry entry ``name``, or a one-line CoinfError listing the valid names."""
    try:
        return ZOO[name]
    except KeyError:
        raise UserError(f"unknown model {name!r}; expected one of: {', '.join(ZOO)}") from None


def committed_path(name: str) -> Path:
    """The committed (small-variant) ONNX file of ``name`` in ``models/onnx/``."""
    return ONNX_DIR / spec_for(name).file_name()


def metadata_path(name: str) -> Path:
    """The committed JSON metadata of a trained model (e.g. test accuracy)."""
    return committed_path(name).with_suffix(".json")


def digits_data() -> DigitsSplit:
    """Deterministic train/val/test split of sklearn digits shaped like ``lenet_digits``'s input."""
    return _digits_data()


def random_feed(name: str, seed: int = 0, large: bool = False) -> dict[str, np.ndarray]:
    """A valid random input feed for ``name`` (token ids stay inside the vocabulary)."""
    rng = np.random.default_rng(seed)
    return {s.name: s.sample(rng) for s in spec_for(name).input_specs(large)}


_progress_fn: Callable[[str], None] | None = None


def _progress(message: str) -> None:
    if _progress_fn is not None:
        _progress_fn(message)


def require_torch() -> Any:
    """The torch module, or a CoinfError telling how to install it (or, on the Pi wheel, that the
    builders are not part of it)."""
    require_full("coinf.models.architectures")
    try:
        import torch
    except ImportError:
        raise UserError("building models needs torch: pip install 'coinf[models]'") from None
    return torch


@contextmanager
def deterministic_torch(progress: Callable[[str], None] | None = None) -> Iterator[None]:
    """Seed torch, use one thread and deterministic algorithms; restore the settings afterwards."""
    global _progress_fn
    torch = require_torch()
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    previous, _progress_fn = _progress_fn, progress
    try:
        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True)
        torch.manual_seed(SEED)
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
        _progress_fn = previous


def construct(
    name: str, large: bool = False, progress: Callable[[str], None] | None = None
) -> Built:
    """The seeded (and, for ``lenet_digits``, trained) torch module of ``name`` plus metadata."""
    spec = spec_for(name)
    with deterministic_torch(progress):
        _progress(f"{spec.file_name(large)}: constructing{' and training' if spec.trained else ''}")
        return spec.builder(large)


def build(
    name: str,
    out_dir: str | Path,
    large: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Build ``name`` and write ``NAME.onnx`` (``NAME_large.onnx``) plus ``NAME.json`` if trained.

    Seeds torch, runs single-threaded with deterministic algorithms, exports with opset 17 and
    checks the file against the torch module in onnxruntime. Returns the ONNX path.
    """
    spec = spec_for(name)
    torch = require_torch()
    from coinf.models.export import export_onnx, max_abs_error

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"output {out} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create output directory {out}: {exc.strerror}") from None
    start = time.perf_counter()
    model, meta = construct(name, large, progress)
    inputs = spec.input_specs(large)
    highs = {s.name: s.high for s in inputs if s.high is not None}
    metadata = {
        "coinf.zoo.name": spec.name,
        "coinf.zoo.family": spec.family,
        "coinf.zoo.papers": ",".join(spec.papers),
        "coinf.zoo.variant": "large" if large else "small",
        "coinf.zoo.input_high": json.dumps(highs, sort_keys=True),
    }
    if progress is not None:
        progress(f"{spec.file_name(large)}: exporting and checking in onnxruntime")
    with deterministic_torch():
        data = export_onnx(
            model,
            inputs,
            spec.outputs,
            keep_batchnorm=spec.keep_batchnorm,
            doc=f"coinf zoo {spec.name}: {spec.description}",
            metadata=metadata,
        )
        err = max_abs_error(model, data, inputs)
    path = out / spec.file_name(large)
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}") from None
    if meta is not None:
        meta = {
            "name": spec.name,
            "variant": "large" if large else "small",
            **meta,
            "onnx_file": path.name,
            "onnx_sha256": hashlib.sha256(data).hexdigest(),
            "torch_version": torch.__version__,
        }
        path.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    if progress is not None:
        took = time.perf_counter() - start
        progress(f"{path.name}: {len(data) / 1e6:.2f} MB, max |torch-ort| {err:.1e}, {took:.1f} s")
    return path


@dataclass(frozen=True)
class ModelStats:
    """Facts read from an ONNX file (no torch needed)."""

    nodes: int
    params: int
    size_bytes: int


def model_stats(path: str | Path) -> ModelStats:
    """Node count, parameter count (initializer elements) and file size of an ONNX file."""
    import onnx

    p = Path(path)
    proto = onnx.load(str(p))
    params = sum(int(np.prod(t.dims, dtype=np.int64)) for t in proto.graph.initializer)
    return ModelStats(len(proto.graph.node), params, p.stat().st_size)
