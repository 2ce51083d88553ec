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

import torch
from torch import nn

#: cut name -> number of blocks before it (the crossing tensor is block k's output)
CUTS = {"pool1": 1, "pool2": 2}
IMAGE_SIZE = 32
EPOCHS = 12
BATCH = 64
LEARNING_RATE = 2e-3


def _conv(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


class DigitNet(nn.Module):
    """The three blocks; ``forward_from(k, a)`` runs blocks k.. on block k-1's output."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.block1 = nn.Sequential(*_conv(1, 32), *_conv(32, 32), *_conv(32, 32), *_conv(32, 32),
                                    nn.MaxPool2d(2))
        self.block2 = nn.Sequential(*_conv(32, 64), *_conv(64, 64), *_conv(64, 64),
                                    nn.MaxPool2d(2))
        self.block3 = nn.Sequential(*_conv(64, 64), nn.AdaptiveAvgPool2d(1), nn.Flatten(1),
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


def train_digitnet(seed: int) -> tuple[DigitNet, dict[str, object], float]:
    """A DigitNet trained on the digits split at 32x32: (model in eval mode, metrics, seconds)."""
    from coinf.models.training import train_digits

    model = make_digitnet()
    metrics, seconds = train_digits(model, seed, size=IMAGE_SIZE, epochs=EPOCHS, batch=BATCH,
                                    lr=LEARNING_RATE)
    return model.eval(), metrics, seconds


__all__ = ["BATCH", "CUTS", "EPOCHS", "IMAGE_SIZE", "DigitNet", "make_digitnet",
           "train_digitnet"]
