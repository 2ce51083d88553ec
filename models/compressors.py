"""Autoencoder compressors at a cut of the digit CNN (paper 002, §IV-C, Table I; imports torch).

An encoder of inverted-residual blocks (depthwise-separable convolutions) shrinks the activation
at a cut by a compression ratio gamma = 2, 4 or 8; a decoder of the same blocks with depthwise
*transposed* convolutions restores its shape on the next device. The compressor is inserted into
the trained LeNet and the whole network is fine-tuned end to end with cross entropy (the
original layers learn to live with the reconstruction error). Exported as two ONNX models: the
head with the encoder appended (``image -> code``) and the decoder prepended to the tail
(``code -> logits``).

Table I, per gamma: (output channels as a multiple of the input's C, expansion, stride) per
layer::

    gamma 2: encoder (2C, 1, 2)               decoder (1C, 0.5, 2)
    gamma 4: encoder (1C, 1, 1) -> (1C, 1, 2)  decoder (1C, 1, 2) -> (1C, 1, 1)
    gamma 8: encoder (2C, 1, 2) -> (2C, 1, 2)  decoder (1C, 0.5, 2) -> (1C, 1, 2)
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

GAMMAS = (2, 4, 8)
#: gamma -> ((encoder layers), (decoder layers)), each (channels x C, expansion, stride)
TABLE_I: dict[int, tuple[tuple[tuple[float, float, int], ...],
                         tuple[tuple[float, float, int], ...]]] = {
    2: (((2, 1, 2),), ((1, 0.5, 2),)),
    4: (((1, 1, 1), (1, 1, 2)), ((1, 1, 2), (1, 1, 1))),
    8: (((2, 1, 2), (2, 1, 2)), ((1, 0.5, 2), (1, 1, 2))),
}
#: cuts of LeNet (models/architectures.py) by the layer they follow -> index in lenet_layers
LENET_CUTS = {"pool1": 3, "relu2": 5}
FINETUNE_EPOCHS = 20
LEARNING_RATE = 3e-4
AE_LEARNING_RATE = 3e-3
BATCH = 32


class InvertedResidual(nn.Module):
    """1x1 expansion (unless the ratio is 1), 3x3 depthwise (transposed in a decoder) with the
    stride, linear 1x1 projection; a residual connection when shape is kept."""

    def __init__(self, cin: int, cout: int, expansion: float, stride: int,
                 transposed: bool = False) -> None:
        super().__init__()
        hidden = max(1, round(cin * expansion))
        layers: list[nn.Module] = []
        if hidden != cin:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()]
        if transposed and stride > 1:
            layers.append(nn.ConvTranspose2d(hidden, hidden, 3, stride, padding=1,
                                             output_padding=stride - 1, groups=hidden,
                                             bias=False))
        else:
            layers.append(nn.Conv2d(hidden, hidden, 3, stride, padding=1, groups=hidden,
                                    bias=False))
        layers += [nn.BatchNorm2d(hidden), nn.ReLU6(), nn.Conv2d(hidden, cout, 1, bias=False),
                   nn.BatchNorm2d(cout)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


def make_autoencoder(channels: int, gamma: int) -> tuple[nn.Sequential, nn.Sequential]:
    """(encoder, decoder) of Table I for an activation with ``channels`` channels."""
    if gamma not in TABLE_I:
        raise ValueError(f"gamma must be one of {GAMMAS}, got {gamma}")
    enc_spec, dec_spec = TABLE_I[gamma]
    enc, c = [], channels
    for mult, exp, stride in enc_spec:
        out = round(channels * mult)
        enc.append(InvertedResidual(c, out, exp, stride))
        c = out
    dec = []
    for mult, exp, stride in dec_spec:
        out = round(channels * mult)
        dec.append(InvertedResidual(c, out, exp, stride, transposed=True))
        c = out
    return nn.Sequential(*enc), nn.Sequential(*dec)


def lenet_layers(model: Any) -> list[nn.Module]:
    """LeNet's forward as a flat list of modules (so it can be cut anywhere)."""
    return [model.conv1, nn.ReLU(), model.pool1, model.conv2, nn.ReLU(), model.pool2,
            nn.Flatten(1), model.fc1, nn.ReLU(), model.fc2, nn.ReLU(), model.fc3]


def load_lenet_onnx(path: str | Path) -> nn.Module:
    """The trained LeNet with the weights of the committed ONNX file (same parameter names)."""
    import onnx
    from coinf.models.architectures import make_lenet
    from onnx import numpy_helper

    model = make_lenet(False)
    weights = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy())
               for t in onnx.load(str(path)).graph.initializer}
    model.load_state_dict(weights)
    return model.eval()


@dataclass
class Compressed:
    """A LeNet cut with an autoencoder inserted: head+encoder and decoder+tail modules."""

    cut: str
    gamma: int
    head: nn.Sequential  # image -> code (the encoder appended)
    tail: nn.Sequential  # code -> logits (the decoder prepended)
    encoder: nn.Sequential
    decoder: nn.Sequential
    activation_shape: tuple[int, ...]
    code_shape: tuple[int, ...]
    encoder_flops: int
    decoder_flops: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.tail(self.head(x))
        return out


def insert(model: nn.Module, cut: str, gamma: int, seed: int = 0) -> Compressed:
    """Insert a gamma compressor after ``cut`` (a copy of ``model``'s weights is used)."""
    import copy

    if cut not in LENET_CUTS:
        raise ValueError(f"cut must be one of {sorted(LENET_CUTS)}, got {cut!r}")
    torch.manual_seed(seed)
    layers = lenet_layers(copy.deepcopy(model))
    k = LENET_CUTS[cut]
    head, tail = nn.Sequential(*layers[:k]), nn.Sequential(*layers[k:])
    with torch.no_grad():
        act = head(torch.zeros(1, 1, 28, 28))
    enc, dec = make_autoencoder(act.shape[1], gamma)
    enc.eval()
    with torch.no_grad():
        code = enc(act)
    return Compressed(cut, gamma, nn.Sequential(*head, *enc), nn.Sequential(*dec, *tail), enc, dec,
                      tuple(act.shape), tuple(code.shape), conv_flops(enc, act),
                      conv_flops(dec, code))


def conv_flops(module: nn.Module, x: torch.Tensor) -> int:
    """2 x MACs of every (transposed) convolution in ``module`` on input ``x``."""
    total = 0

    def hook(m: nn.Module, inputs: Any, out: torch.Tensor) -> None:
        nonlocal total
        w: torch.Tensor = m.weight  # type: ignore[assignment]
        kernel = int(w.shape[1] * w.shape[2] * w.shape[3])
        if isinstance(m, nn.ConvTranspose2d):  # weight (cin, cout/groups, kh, kw): per input
            total += 2 * kernel * int(inputs[0][0].numel())
        else:  # weight (cout, cin/groups, kh, kw): per output element
            total += 2 * kernel * int(out[0].numel())

    handles = [m.register_forward_hook(hook) for m in module.modules()
               if isinstance(m, nn.Conv2d | nn.ConvTranspose2d)]
    try:
        with torch.no_grad():
            module(x)
    finally:
        for h in handles:
            h.remove()
    return total


def finetune(comp: Compressed, x: np.ndarray, y: np.ndarray, epochs: int = FINETUNE_EPOCHS,
             seed: int = 0) -> None:
    """End-to-end fine-tuning (cross entropy, Adam, cosine schedule) of the whole network."""
    new = {id(p) for m in (comp.encoder, comp.decoder) for p in m.parameters()}
    params = [*comp.head.parameters(), *comp.tail.parameters()]
    opt = torch.optim.Adam([  # the new layers learn faster than the trained ones are tuned
        {"params": [p for p in params if id(p) in new], "lr": AE_LEARNING_RATE},
        {"params": [p for p in params if id(p) not in new], "lr": LEARNING_RATE}])
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    gen = torch.Generator().manual_seed(seed)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(epochs):
        comp.head.train()
        comp.tail.train()
        order = torch.randperm(len(yt), generator=gen)
        for i in range(0, len(order), BATCH):
            batch = order[i:i + BATCH]
            opt.zero_grad()
            loss = F.cross_entropy(comp.forward(xt[batch]), yt[batch])
            loss.backward()
            opt.step()
        sched.step()
    comp.head.eval()
    comp.tail.eval()


def export(comp: Compressed) -> tuple[bytes, bytes]:
    """ONNX (opset 17, batch 1) of head+encoder (``image -> code``) and decoder+tail
    (``code -> logits``), each checked by ``onnx.checker``."""
    import onnx

    def one(module: nn.Module, sample: torch.Tensor, inp: str, out: str) -> bytes:
        buf = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module.eval(), (sample,), buf,  # type: ignore[arg-type]
                              opset_version=17, dynamo=False,
                              input_names=[inp], output_names=[out],
                              training=torch.onnx.TrainingMode.EVAL)
        proto = onnx.load_from_string(buf.getvalue())
        onnx.checker.check_model(proto, full_check=True)
        return proto.SerializeToString()

    head = one(comp.head, torch.zeros(1, 1, 28, 28), "image", "code")
    tail = one(comp.tail, torch.zeros(comp.code_shape), "code", "logits")
    return head, tail


def export_fused(comp: Compressed) -> bytes:
    """ONNX of the whole fine-tuned network with the compressor inside (``image -> logits``,
    the paper's A'): ``coinf split`` makes an ordinary bundle of it, whose cuts include the
    one that sends only the code."""
    import onnx

    class Fused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head, self.tail = comp.head, comp.tail

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.tail(self.head(x))
            return out

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Fused().eval(), (torch.zeros(1, 1, 28, 28),),
                          buf,  # type: ignore[arg-type]
                          opset_version=17, dynamo=False, input_names=["image"],
                          output_names=["logits"], training=torch.onnx.TrainingMode.EVAL)
    proto = onnx.load_from_string(buf.getvalue())
    # name the code: the output of the last node of the encoder's last block (module paths
    # name the nodes: /head/head.J/...)
    last = len(comp.head) - 1
    nodes = [n for n in proto.graph.node if n.name.startswith(f"/head/head.{last}/")]
    if not nodes:
        raise RuntimeError("the exported graph has no node of the encoder's last block")
    old = nodes[-1].output[0]
    for n in proto.graph.node:
        n.input[:] = ["code" if t == old else t for t in n.input]
        n.output[:] = ["code" if t == old else t for t in n.output]
    onnx.checker.check_model(proto, full_check=True)
    return proto.SerializeToString()


__all__ = ["GAMMAS", "LENET_CUTS", "TABLE_I", "Compressed", "InvertedResidual", "conv_flops",
           "export", "export_fused", "finetune", "insert", "load_lenet_onnx", "make_autoencoder"]
