"""``digitnet``: a VGG-like digit classifier large enough for compressors at its cuts (imports
torch; used when building and fine-tuning).

Input ``image`` (1, 1, 32, 32): a scikit-learn 8x8 digit scaled to [0, 1] and bilinearly
upsampled to 32x32 *outside* the model (``models.digits.digits_data(size=32)``, the same
interpolation matrix at training, test and inference), so the ONNX graph starts at the 32x32
image. Three blocks of 3x3 convolutions (batch norm, ReLU), each but the last ending in a 2x2
max pool; the cuts are the pools' outputs::

    block1  4 conv  1->32->32->32->32 at 32x32, max pool   -> cut "pool1": 32x16x16
    block2  3 conv  32->64->64->64    at 16x16, max pool   -> cut "pool2": 64x8x8
    block3  1 conv  64->64            at 8x8, global average pool, linear 64 -> 10 "logits"

About 108 MFLOPs (2 x MACs of the convolutions and the linear layer), 150 k parameters: a
Table-I compressor at a cut costs under 2 % of the model (paper 002 §IV-C), and trains on one
CPU thread in about a minute.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

#: cut name -> number of blocks before it (the crossing tensor is block k's output)
CUTS = {"pool1": 1, "pool2": 2}
IMAGE_SIZE = 32
EPOCHS = 12
BATCH = 64
LEARNING_RATE = 2e-3


class DigitNet(nn.Module):
    """The three blocks; ``forward_from(k, a)`` runs blocks k.. on block k-1's output.

    ``batchnorm=False`` gives the inference form (convolutions with biases, batch norm folded
    in), which :func:`load_digitnet_onnx` fills from the committed ONNX file."""

    def __init__(self, classes: int = 10, batchnorm: bool = True) -> None:
        super().__init__()

        def conv(cin: int, cout: int) -> list[nn.Module]:
            if not batchnorm:
                return [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU()]
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                    nn.ReLU()]

        self.block1 = nn.Sequential(*conv(1, 32), *conv(32, 32), *conv(32, 32), *conv(32, 32),
                                    nn.MaxPool2d(2))
        self.block2 = nn.Sequential(*conv(32, 64), *conv(64, 64), *conv(64, 64), nn.MaxPool2d(2))
        self.block3 = nn.Sequential(*conv(64, 64), nn.AdaptiveAvgPool2d(1), nn.Flatten(1),
                                    nn.Linear(64, classes))

    @property
    def blocks(self) -> list[nn.Module]:
        return [self.block1, self.block2, self.block3]

    def forward_to(self, k: int, x: torch.Tensor) -> torch.Tensor:
        """Blocks 0..k-1 (the activation at the cut after k blocks)."""
        for block in self.blocks[:k]:
            x = block(x)
        return x

    def forward_from(self, k: int, a: torch.Tensor) -> torch.Tensor:
        """Blocks k.. on the activation at the cut after k blocks."""
        for block in self.blocks[k:]:
            a = block(a)
        return a

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_from(0, x)


def make_digitnet(large: bool = False) -> DigitNet:
    """A fresh (seeded by the caller) DigitNet; there is no large variant."""
    return DigitNet()


def load_digitnet_onnx(path: str | Path) -> DigitNet:
    """The inference-form DigitNet with the weights of an exported one (the zoo's committed
    ``digitnet.onnx`` or a compressor set's ``backbone.onnx``): its Conv nodes, in graph order,
    fill the convolutions, its Gemm the linear layer."""
    import onnx
    from onnx import numpy_helper

    proto = onnx.load(str(path))
    init = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    layers = [m for m in DigitNet(batchnorm=False).modules()
              if isinstance(m, nn.Conv2d | nn.Linear)]
    nodes = [n for n in proto.graph.node if n.op_type in ("Conv", "Gemm")]
    if [n.op_type for n in nodes] != ["Conv" if isinstance(m, nn.Conv2d) else "Gemm"
                                      for m in layers]:
        raise ValueError(f"{path}: not a digitnet graph (its Conv/Gemm nodes do not match)")
    model = DigitNet(batchnorm=False)
    layers = [m for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    with torch.no_grad():
        for node, layer in zip(nodes, layers, strict=True):
            weight, bias = (init.get(name) for name in node.input[1:3])
            if weight is None or bias is None or tuple(weight.shape) != tuple(layer.weight.shape):
                raise ValueError(f"{path}: node {node.name} has no weights of the digitnet shape")
            layer.weight.copy_(torch.from_numpy(weight.copy()))
            assert layer.bias is not None
            layer.bias.copy_(torch.from_numpy(bias.copy()))
    return model.eval()


def train_digitnet(seed: int) -> tuple[DigitNet, dict[str, object], float]:
    """A DigitNet trained on the digits split at 32x32: (model in eval mode, metrics, seconds)."""
    from coinf.models.training import train_digits

    model = make_digitnet()
    metrics, seconds = train_digits(model, seed, size=IMAGE_SIZE, epochs=EPOCHS, batch=BATCH,
                                    lr=LEARNING_RATE)
    return model.eval(), metrics, seconds


__all__ = ["BATCH", "CUTS", "EPOCHS", "IMAGE_SIZE", "DigitNet", "load_digitnet_onnx",
           "make_digitnet",
           "train_digitnet"]
