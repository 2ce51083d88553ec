"""PyTorch definitions of the zoo's image architectures, written from the papers' descriptions
(the audio and text ones are in :mod:`models.sequence`).

This module imports torch: only :mod:`models.zoo` builders import it, lazily, when building.
Each ``make_*`` function takes ``large`` and returns an ``nn.Module`` whose weights come from the
global torch RNG (seeded by the caller). Sub-modules carry descriptive attribute names because the
TorchScript exporter turns them into ONNX node names (``/features/conv1/Conv``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn


def _flat_features(module: nn.Module, shape: tuple[int, ...]) -> int:
    """Number of features ``module`` produces for one input of ``shape`` (no RNG used)."""
    with torch.no_grad():
        return int(module(torch.zeros(shape)).numel())


def randomize_norm_stats(model: nn.Module) -> None:
    """Give every BatchNorm non-trivial affine weights and running statistics (seeded RNG).

    Freshly built BatchNorm layers are identities in eval mode (mean 0, var 1, weight 1, bias 0);
    random statistics make split/compose tests meaningful.
    """
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, nn.BatchNorm1d | nn.BatchNorm2d):
                n = mod.num_features
                mod.weight.copy_(torch.empty(n).uniform_(0.5, 1.5))
                mod.bias.copy_(torch.empty(n).normal_(0.0, 0.1))
                assert mod.running_mean is not None and mod.running_var is not None
                mod.running_mean.copy_(torch.empty(n).normal_(0.0, 0.1))
                mod.running_var.copy_(torch.empty(n).uniform_(0.5, 1.5))


# --------------------------------------------------------------------------------------------
# LeNet (digits): MeDNN / Neurosurgeon "DIG" / CoINF "MNIST"


class LeNet(nn.Module):
    """LeNet-5 with ReLU and max pooling on 1x28x28 digits."""

    def __init__(self, c1: int = 6, c2: int = 16, f1: int = 120, f2: int = 84, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, c1, 5)  # 28 -> 24
        self.pool1 = nn.MaxPool2d(2)  # -> 12
        self.conv2 = nn.Conv2d(c1, c2, 5)  # -> 8
        self.pool2 = nn.MaxPool2d(2)  # -> 4
        self.fc1 = nn.Linear(c2 * 16, f1)
        self.fc2 = nn.Linear(f1, f2)
        self.fc3 = nn.Linear(f2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(F.relu(self.conv1(x)))
        x = self.pool2(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def make_lenet(large: bool) -> nn.Module:
    return LeNet(32, 64, 512, 256) if large else LeNet()


# --------------------------------------------------------------------------------------------
# AlexNet (Neurosurgeon, MeDNN)


class _LRNFunction(torch.autograd.Function):
    """Local response normalisation exported as one ONNX ``LRN`` node.

    ``nn.LocalResponseNorm`` traces into ~40 nodes including two ``If`` sub-graphs; ONNX has the
    operator natively with the same definition (alpha divided by size, symmetric window).
    """

    @staticmethod
    def forward(
        ctx: object, x: torch.Tensor, size: int, alpha: float, beta: float, k: float
    ) -> torch.Tensor:
        return F.local_response_norm(x, size, alpha, beta, k)

    @staticmethod
    def symbolic(g: Any, x: Any, size: int, alpha: float, beta: float, k: float) -> Any:
        return g.op("LRN", x, size_i=size, alpha_f=alpha, beta_f=beta, bias_f=k)


class LRN(nn.Module):
    def __init__(self, size: int = 5, alpha: float = 1e-4, beta: float = 0.75, k: float = 2.0):
        super().__init__()
        self.size, self.alpha, self.beta, self.k = size, alpha, beta, k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _LRNFunction.apply(x, self.size, self.alpha, self.beta, self.k)


class AlexNet(nn.Module):
    """Five convolutions with local response normalisation, three fully connected layers."""

    def __init__(
        self,
        image: int,
        widths: tuple[int, int, int, int, int],
        fc: int,
        classes: int,
        first_kernel: int,
        first_stride: int,
    ):
        super().__init__()
        c1, c2, c3, c4, c5 = widths
        self.features = nn.Sequential(
            nn.Conv2d(3, c1, first_kernel, stride=first_stride, padding=2),
            nn.ReLU(),
            LRN(),
            nn.MaxPool2d(3, 2),
            nn.Conv2d(c1, c2, 5, padding=2),
            nn.ReLU(),
            LRN(),
            nn.MaxPool2d(3, 2),
            nn.Conv2d(c2, c3, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(c3, c4, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(c4, c5, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(3, 2),
        )
        flat = _flat_features(self.features, (1, 3, image, image))
        self.classifier = nn.Sequential(
            nn.Dropout(0.5),
            nn.Linear(flat, fc),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(fc, fc),
            nn.ReLU(),
            nn.Linear(fc, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def make_alexnet(large: bool) -> nn.Module:
    if large:
        return AlexNet(224, (64, 192, 384, 256, 256), 4096, 1000, 11, 4)
    return AlexNet(64, (16, 48, 96, 64, 64), 256, 100, 5, 2)


# --------------------------------------------------------------------------------------------
# VGG-16 (Neurosurgeon, MeDNN, DynO)

VGG16_LARGE: list[int | str] = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M",
                                512, 512, 512, "M", 512, 512, 512, "M"]  # fmt: skip
VGG16_SMALL: list[int | str] = [16, 16, "M", 32, 32, "M", 64, 64, 64, "M",
                                64, 64, 64, "M", 64, 64, 64, "M"]  # fmt: skip


class VGG(nn.Module):
    """3x3 convolution stacks separated by max pooling, then three fully connected layers."""

    def __init__(self, image: int, cfg: list[int | str], fc: int, classes: int):
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for item in cfg:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                assert isinstance(item, int)
                layers += [nn.Conv2d(cin, item, 3, padding=1), nn.ReLU()]
                cin = item
        self.features = nn.Sequential(*layers)
        flat = _flat_features(self.features, (1, 3, image, image))
        self.classifier = nn.Sequential(
            nn.Linear(flat, fc),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(fc, fc),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(fc, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def make_vgg(large: bool) -> nn.Module:
    return VGG(224, VGG16_LARGE, 4096, 1000) if large else VGG(64, VGG16_SMALL, 128, 100)


# --------------------------------------------------------------------------------------------
# MobileNetV2 (CoINF "MobileNet", streaming-CNN paper, DynO)


def _divisible(value: float, divisor: int = 8) -> int:
    """Round channel counts as the MobileNet reference does (multiple of 8, at most 10% down)."""
    new = max(divisor, int(value + divisor / 2) // divisor * divisor)
    if new < 0.9 * value:
        new += divisor
    return new


class ConvBNReLU6(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1):
        super().__init__(
            nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU6(),
        )


class InvertedResidual(nn.Module):
    """Expand (1x1) -> depthwise 3x3 -> linear project (1x1); residual add when shapes match."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        self.use_residual = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(ConvBNReLU6(cin, hidden, 1))
        layers += [
            ConvBNReLU6(hidden, hidden, 3, stride, groups=hidden),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_residual else self.conv(x)


class MobileNetV2(nn.Module):
    # (expansion t, channels c, repeats n, first stride s) from the MobileNetV2 paper
    SETTINGS: ClassVar[list[tuple[int, int, int, int]]] = [
        (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
        (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1),
    ]  # fmt: skip

    def __init__(self, width: float, classes: int):
        super().__init__()
        cin = _divisible(32 * width)
        last = _divisible(1280 * max(1.0, width))
        layers: list[nn.Module] = [ConvBNReLU6(3, cin, 3, 2)]
        for t, c, n, s in self.SETTINGS:
            cout = _divisible(c * width)
            for i in range(n):
                layers.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        layers.append(ConvBNReLU6(cin, last, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.classifier(x)


def make_mobilenetv2(large: bool) -> nn.Module:
    return MobileNetV2(1.0, 1000) if large else MobileNetV2(0.5, 100)


# --------------------------------------------------------------------------------------------
# Inception-v3 style (CoINF "Inception", DynO)


class BasicConv(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel: int | tuple[int, int], **kw: object):
        super().__init__(
            nn.Conv2d(cin, cout, kernel, bias=False, **kw),  # type: ignore[arg-type]
            nn.BatchNorm2d(cout, eps=1e-3),
            nn.ReLU(),
        )


class InceptionA(nn.Module):
    """1x1 | 1x1->5x5 | 1x1->3x3->3x3 | avgpool->1x1, concatenated."""

    def __init__(self, cin: int, pool_features: int, w: _Width):
        super().__init__()
        self.branch1x1 = BasicConv(cin, w(64), 1)
        self.branch5x5 = nn.Sequential(
            BasicConv(cin, w(48), 1), BasicConv(w(48), w(64), 5, padding=2)
        )
        self.branch3x3dbl = nn.Sequential(
            BasicConv(cin, w(64), 1),
            BasicConv(w(64), w(96), 3, padding=1),
            BasicConv(w(96), w(96), 3, padding=1),
        )
        self.branch_pool = BasicConv(cin, pool_features, 1)
        self.out_channels = w(64) + w(64) + w(96) + pool_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool = self.branch_pool(F.avg_pool2d(x, 3, 1, 1))
        parts = [self.branch1x1(x), self.branch5x5(x), self.branch3x3dbl(x), pool]
        return torch.cat(parts, 1)


class InceptionB(nn.Module):
    """Grid reduction: 3x3/2 | 1x1->3x3->3x3/2 | maxpool/2."""

    def __init__(self, cin: int, w: _Width):
        super().__init__()
        self.branch3x3 = BasicConv(cin, w(384), 3, stride=2)
        self.branch3x3dbl = nn.Sequential(
            BasicConv(cin, w(64), 1),
            BasicConv(w(64), w(96), 3, padding=1),
            BasicConv(w(96), w(96), 3, stride=2),
        )
        self.out_channels = w(384) + w(96) + cin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch3x3(x), self.branch3x3dbl(x), F.max_pool2d(x, 3, 2)], 1)


class InceptionC(nn.Module):
    """Factorised 7x7: 1x1 | 1x7->7x1 | (7x1->1x7)x2 | avgpool->1x1."""

    def __init__(self, cin: int, c7: int, w: _Width):
        super().__init__()
        self.branch1x1 = BasicConv(cin, w(192), 1)
        self.branch7x7 = nn.Sequential(
            BasicConv(cin, c7, 1),
            BasicConv(c7, c7, (1, 7), padding=(0, 3)),
            BasicConv(c7, w(192), (7, 1), padding=(3, 0)),
        )
        self.branch7x7dbl = nn.Sequential(
            BasicConv(cin, c7, 1),
            BasicConv(c7, c7, (7, 1), padding=(3, 0)),
            BasicConv(c7, c7, (1, 7), padding=(0, 3)),
            BasicConv(c7, c7, (7, 1), padding=(3, 0)),
            BasicConv(c7, w(192), (1, 7), padding=(0, 3)),
        )
        self.branch_pool = BasicConv(cin, w(192), 1)
        self.out_channels = 4 * w(192)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool = self.branch_pool(F.avg_pool2d(x, 3, 1, 1))
        parts = [self.branch1x1(x), self.branch7x7(x), self.branch7x7dbl(x), pool]
        return torch.cat(parts, 1)


class InceptionD(nn.Module):
    """Grid reduction: 1x1->3x3/2 | 1x1->1x7->7x1->3x3/2 | maxpool/2."""

    def __init__(self, cin: int, w: _Width):
        super().__init__()
        self.branch3x3 = nn.Sequential(
            BasicConv(cin, w(192), 1), BasicConv(w(192), w(320), 3, stride=2)
        )
        self.branch7x7x3 = nn.Sequential(
            BasicConv(cin, w(192), 1),
            BasicConv(w(192), w(192), (1, 7), padding=(0, 3)),
            BasicConv(w(192), w(192), (7, 1), padding=(3, 0)),
            BasicConv(w(192), w(192), 3, stride=2),
        )
        self.out_channels = w(320) + w(192) + cin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch3x3(x), self.branch7x7x3(x), F.max_pool2d(x, 3, 2)], 1)


class InceptionE(nn.Module):
    """Expanded filter bank: branches that fork again into 1x3 and 3x1 convolutions."""

    def __init__(self, cin: int, w: _Width):
        super().__init__()
        self.branch1x1 = BasicConv(cin, w(320), 1)
        self.branch3x3_1 = BasicConv(cin, w(384), 1)
        self.branch3x3_2a = BasicConv(w(384), w(384), (1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv(w(384), w(384), (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv(cin, w(448), 1)
        self.branch3x3dbl_2 = BasicConv(w(448), w(384), 3, padding=1)
        self.branch3x3dbl_3a = BasicConv(w(384), w(384), (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv(w(384), w(384), (3, 1), padding=(1, 0))
        self.branch_pool = BasicConv(cin, w(192), 1)
        self.out_channels = w(320) + 4 * w(384) + w(192)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3_1(x)
        b3 = torch.cat([self.branch3x3_2a(b3), self.branch3x3_2b(b3)], 1)
        bd = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        bd = torch.cat([self.branch3x3dbl_3a(bd), self.branch3x3dbl_3b(bd)], 1)
        pool = self.branch_pool(F.avg_pool2d(x, 3, 1, 1))
        return torch.cat([self.branch1x1(x), b3, bd, pool], 1)


class _Width:
    """Scales a reference channel count by the width multiplier (at least 4 channels)."""

    def __init__(self, mult: float):
        self.mult = mult

    def __call__(self, channels: int) -> int:
        return max(4, round(channels * self.mult))


class InceptionV3(nn.Module):
    """Inception-v3 layout (no auxiliary head) with configurable width and block repeats."""

    def __init__(self, width: float, repeats: tuple[int, int, int], classes: int):
        super().__init__()
        w = _Width(width)
        n_a, n_c, n_e = repeats
        self.stem = nn.Sequential(
            BasicConv(3, w(32), 3, stride=2),
            BasicConv(w(32), w(32), 3),
            BasicConv(w(32), w(64), 3, padding=1),
            nn.MaxPool2d(3, 2),
            BasicConv(w(64), w(80), 1),
            BasicConv(w(80), w(192), 3),
            nn.MaxPool2d(3, 2),
        )
        blocks: list[nn.Module] = []
        cin = w(192)
        for i in range(n_a):
            blocks.append(InceptionA(cin, w(32) if i == 0 else w(64), w))
            cin = blocks[-1].out_channels  # type: ignore[assignment]
        blocks.append(InceptionB(cin, w))
        cin = blocks[-1].out_channels  # type: ignore[assignment]
        c7s = [128, 160, 160, 192]
        for i in range(n_c):
            blocks.append(InceptionC(cin, w(c7s[min(i, 3)]), w))
            cin = blocks[-1].out_channels  # type: ignore[assignment]
        blocks.append(InceptionD(cin, w))
        cin = blocks[-1].out_channels  # type: ignore[assignment]
        for _ in range(n_e):
            blocks.append(InceptionE(cin, w))
            cin = blocks[-1].out_channels  # type: ignore[assignment]
        self.blocks = nn.Sequential(*blocks)
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(self.dropout(x))


def make_inception(large: bool) -> nn.Module:
    return InceptionV3(1.0, (3, 4, 2), 1000) if large else InceptionV3(0.125, (2, 2, 1), 100)


# --------------------------------------------------------------------------------------------
# ResNet (DynO: ResNet-18 / ResNet-152)


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers plus an identity (or 1x1 projection) shortcut, then ReLU."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, widths: tuple[int, int, int, int], blocks: tuple[int, ...], classes: int):
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin = widths[0]
        stages = []
        for i, (width, n) in enumerate(zip(widths, blocks, strict=True)):
            layer = []
            for j in range(n):
                layer.append(BasicBlock(cin, width, 2 if (i > 0 and j == 0) else 1))
                cin = width
            stages.append(nn.Sequential(*layer))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def make_resnet(large: bool) -> nn.Module:
    if large:
        return ResNet((64, 128, 256, 512), (2, 2, 2, 2), 1000)
    return ResNet((12, 24, 48, 96), (2, 2, 2, 2), 100)


class WearCam(nn.Module):
    """A camera-frame classifier shaped for a wearable: a cheap stride-2 stem and an early
    1-channel bottleneck (as split-computing designs insert one), then a ResNet trunk at 48x48."""

    def __init__(self, classes: int = 10, width: int = 64, blocks: int = 3):
        super().__init__()

        def cbr(cin: int, cout: int, k: int, stride: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False),
                                 nn.BatchNorm2d(cout), nn.ReLU())

        self.stem = cbr(3, 16, 3, 2)
        self.bottleneck = cbr(16, 1, 1, 1)
        self.expand = nn.Sequential(cbr(1, 32, 3, 1), cbr(32, width, 3, 1))
        self.trunk = nn.Sequential(*[BasicBlock(width, width, 1) for _ in range(blocks)])
        self.fc = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.trunk(self.expand(self.bottleneck(self.stem(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def make_wearcam(large: bool) -> nn.Module:
    return WearCam(10, 64, 3)
