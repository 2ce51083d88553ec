"""ImageNet-size models for the split benchmark (issue 17), built with torch, never downloaded.

* ``vgg19``: VGG-19 (16 conv 3x3 + 3 FC of 4096/4096/1000 at 224x224; 143.7 M parameters,
  ~575 MB of float32 weights, 548 MiB).
* ``alexnet``: the zoo's AlexNet ``--large`` (61 M parameters, ~244 MB, 233 MiB).

Random weights, seeded like the zoo; exported with the zoo's exporter (opset 17, static shapes).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from coinf.models.inputs import InputSpec

from coinf.errors import UserError

VGG19_CFG: list[int | str] = [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M",
                              512, 512, 512, 512, "M", 512, 512, 512, 512, "M"]  # fmt: skip
LARGE_MODELS = ("vgg19", "alexnet")
IMAGE = (InputSpec("image", (1, 3, 224, 224)),)


def large_file(name: str) -> str:
    return f"{name}_imagenet.onnx"


def build_large(name: str, out_dir: str | Path,
                progress: Callable[[str], None] | None = None) -> Path:
    """Write ``NAME_imagenet.onnx`` into ``out_dir`` (kept if already there) and return it."""
    if name not in LARGE_MODELS:
        raise UserError(f"unknown large model {name!r}; expected one of {', '.join(LARGE_MODELS)}")
    path = Path(out_dir) / large_file(name)
    if path.is_file():
        return path
    from coinf.models import architectures as arch
    from coinf.models.export import export_onnx
    from coinf.models.zoo import deterministic_torch

    if progress:
        progress(f"building {path.name} with torch (random weights, a minute or so) ...")
    with deterministic_torch():
        model = (arch.VGG(224, VGG19_CFG, 4096, 1000) if name == "vgg19"
                 else arch.make_alexnet(True))
        model.eval()
        data = export_onnx(model, IMAGE, ("logits",), keep_batchnorm=False,
                           doc=f"coinf split benchmark: {name} at ImageNet size",
                           metadata={"coinf.large.name": name})
    del model
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.rename(path)
    return path
