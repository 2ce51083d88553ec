"""SMCD: structured pruning by group lasso (MeDNN §VI), for chains of conv and linear layers.

Training adds, for every unit that one weighted layer produces and the next consumes, two group
lasso terms: the unit's filter in the producer (filter-wise, its weights and bias) and its column
block in the consumer (channel-wise). Groups whose contribution falls to near zero are then
**removed**: the producer loses the filter, the consumer the input channel, and the model is
rebuilt dense and smaller (no masks, no sparse kernels), so every other part of coinf (splitting,
planning, packing) takes it like any other ONNX model. A removed unit whose filter is zero still
outputs a constant (its activated bias); that constant is folded into the consumer's bias. The
smaller model is then fine-tuned without the penalty, the removed connections staying removed.

Supported chains: ``Conv2d`` (groups=1) and ``Linear`` layers, with element-wise activations,
pooling, ``Flatten`` and ``Dropout`` between them (LeNet, VGG-style stacks). Imports torch: used
only when building models.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from coinf.errors import ModelError

_PASSTHROUGH = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.Tanh, nn.Sigmoid, nn.MaxPool2d, nn.AvgPool2d,
                nn.Flatten, nn.Dropout, nn.Identity)
Progress = Callable[[str], None]


@dataclass(frozen=True)
class PruneConfig:
    """Settings of one SMCD run.

    ``strength`` is the group lasso weight (lambda_g); ``threshold`` the relative contribution
    below which a unit is removed (its filter norm times its consumer-column norm, divided by the
    largest such product at that boundary).
    """

    strength: float = 1e-3
    threshold: float = 0.05
    sparsify_epochs: int = 30
    finetune_epochs: int = 20
    batch: int = 32
    lr: float = 2e-3
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.strength < 10:
            raise ModelError(f"prune strength must be in [0, 10), got {self.strength}")
        if not 0 <= self.threshold < 1:
            raise ModelError(f"prune threshold must be in [0, 1), got {self.threshold}")
        if self.sparsify_epochs < 0 or self.finetune_epochs < 0 or self.batch < 1:
            raise ModelError("prune epochs must be >= 0 and batch >= 1")


@dataclass
class PruneResult:
    """The pruned (dense, smaller) chain and what happened to it."""

    chain: nn.Sequential
    widths_before: list[int]
    widths_after: list[int]
    seconds: float
    history: list[dict[str, float]] = field(default_factory=list)


# -- chains -------------------------------------------------------------------------------------
def weighted(chain: nn.Sequential) -> list[int]:
    """Indices of the Conv2d / Linear layers of ``chain``."""
    return [i for i, m in enumerate(chain) if isinstance(m, (nn.Conv2d, nn.Linear))]


def check_chain(chain: nn.Sequential) -> None:
    """Raise :class:`ModelError` naming the first module SMCD cannot prune through."""
    for i, m in enumerate(chain):
        if isinstance(m, nn.Conv2d):
            if m.groups != 1:
                raise ModelError(f"layer {i}: grouped convolution (groups={m.groups}) is not "
                                 f"supported; expected groups=1")
        elif not isinstance(m, (nn.Linear, *_PASSTHROUGH)):
            raise ModelError(f"layer {i}: {type(m).__name__} is not supported by SMCD; expected "
                             f"Conv2d, Linear, activations, pooling, Flatten or Dropout")
    if len(weighted(chain)) < 2:
        raise ModelError("SMCD needs at least two conv/linear layers (a unit to remove must have "
                         "a producer and a consumer)")


def out_units(m: Any) -> int:
    return int(m.out_channels if isinstance(m, nn.Conv2d) else m.out_features)


def _in_units(m: Any) -> int:
    return int(m.in_channels if isinstance(m, nn.Conv2d) else m.in_features)


def _consumer_span(producer: Any, consumer: Any) -> int:
    """How many consumer input columns one producer unit feeds (spatial size across a Flatten)."""
    units, cols = out_units(producer), _in_units(consumer)
    if cols % units:
        raise ModelError(f"{type(consumer).__name__} takes {cols} inputs, not a multiple of the "
                         f"{units} units before it")
    return cols // units


def _consumer_weight(consumer: Any, span: int) -> torch.Tensor:
    """Consumer weight viewed as (out, units, rest): the columns of one producer unit together."""
    w = consumer.weight
    if isinstance(consumer, nn.Conv2d):
        return w.reshape(w.shape[0], w.shape[1], -1)
    return w.reshape(w.shape[0], w.shape[1] // span, span)


def _filter_sq(m: Any) -> torch.Tensor:
    sq = m.weight.pow(2).reshape(m.weight.shape[0], -1).sum(1)
    return sq + m.bias.pow(2) if m.bias is not None else sq


def group_lasso(chain: nn.Sequential) -> torch.Tensor:
    """Sum of filter-wise and channel-wise group norms, each scaled by sqrt(group size)."""
    idx = weighted(chain)
    total = torch.zeros(())
    for a, b in itertools.pairwise(idx):
        prod: Any = chain[a]
        cons: Any = chain[b]
        f = _filter_sq(prod)
        per_filter = prod.weight[0].numel() + (1 if prod.bias is not None else 0)
        total = total + math.sqrt(per_filter) * torch.sqrt(f + 1e-12).sum()
        cw = _consumer_weight(cons, _consumer_span(prod, cons))
        c = cw.pow(2).sum((0, 2))
        total = total + math.sqrt(cw.shape[0] * cw.shape[2]) * torch.sqrt(c + 1e-12).sum()
    return total


def unit_scores(chain: nn.Sequential) -> list[np.ndarray]:
    """Per boundary, each unit's relative contribution in [0, 1] (1 = the strongest unit)."""
    idx = weighted(chain)
    out = []
    with torch.no_grad():
        for a, b in itertools.pairwise(idx):
            prod: Any = chain[a]
            cons: Any = chain[b]
            f = torch.sqrt(prod.weight.pow(2).reshape(prod.weight.shape[0], -1).sum(1))
            # a zero filter with a bias feeds a constant, which removal folds into the consumer
            c = torch.sqrt(_consumer_weight(cons, _consumer_span(prod, cons)).pow(2).sum((0, 2)))
            s = (f * c).numpy().astype(np.float64)
            out.append(s / s.max() if s.max() > 0 else np.ones_like(s))
    return out


# -- removal ------------------------------------------------------------------------------------
def _between(chain: nn.Sequential, a: int, b: int) -> nn.Sequential:
    return nn.Sequential(*[chain[i] for i in range(a + 1, b)])


def prune_chain(chain: nn.Sequential, sample: torch.Tensor, threshold: float
                ) -> tuple[nn.Sequential, list[list[int]]]:
    """A new dense chain without the units scored below ``threshold``; and the kept units.

    A removed unit's output is treated as the constant its activated bias gives (exact when its
    filter is zero) and folded into the consumer's bias; at least one unit per boundary stays.
    """
    check_chain(chain)
    idx = weighted(chain)
    scores = unit_scores(chain)
    keep = [sorted(np.flatnonzero(s >= threshold).tolist()) or [int(np.argmax(s))]
            for s in scores]
    shapes: dict[int, tuple[int, ...]] = {}
    hooks = [chain[i].register_forward_hook(
        lambda _m, _i, o, i=i: shapes.__setitem__(i, tuple(o.shape))) for i in idx]
    try:
        with torch.no_grad():
            chain.eval()(sample)
    finally:
        for h in hooks:
            h.remove()
    new = [*chain]
    with torch.no_grad():
        for k, (a, b) in enumerate(itertools.pairwise(idx)):
            prod: Any = new[a]  # inputs already pruned, outputs not yet
            cons: Any = chain[b]
            kept = keep[k]
            dropped = sorted(set(range(out_units(prod))) - set(kept))
            span = _consumer_span(prod, cons)
            fold = torch.zeros(out_units(cons))
            if dropped and prod.bias is not None:
                base = prod.bias.reshape(1, -1, *([1] * (len(shapes[a]) - 2))).expand(shapes[a])
                const = _const_after(chain, a, b, base.contiguous())
                fold = (_consumer_weight(cons, span)[:, dropped, :].sum(2) * const[dropped]).sum(1)
            new[a] = _take(prod, out_keep=kept)
            new[b] = _take(cons, in_keep=kept, span=span, extra_bias=fold)
    return nn.Sequential(*new), keep


def _const_after(chain: nn.Sequential, a: int, b: int, base: torch.Tensor) -> torch.Tensor:
    """Per unit of layer ``a``, the value reaching layer ``b`` when the unit's filter is zero."""
    y = _between(chain, a, b).eval()(base)
    units = base.shape[1]
    return y.reshape(y.shape[0], units, -1)[0, :, 0]


def _take(m: Any, out_keep: list[int] | None = None, in_keep: list[int] | None = None,
          span: int = 1, extra_bias: torch.Tensor | None = None) -> nn.Module:
    """A copy of conv/linear ``m`` with only ``out_keep`` outputs and ``in_keep`` input units."""
    w = m.weight.detach()
    bias = m.bias.detach().clone() if m.bias is not None else None
    if extra_bias is not None and extra_bias.abs().sum() > 0:
        bias = extra_bias.clone() if bias is None else bias + extra_bias
    if in_keep is not None:
        if isinstance(m, nn.Conv2d):
            w = w[:, in_keep]
        else:
            cols = [u * span + s for u in in_keep for s in range(span)]
            w = w[:, cols]
    if out_keep is not None:
        w = w[out_keep]
        bias = bias[out_keep] if bias is not None else None
    if isinstance(m, nn.Conv2d):
        conv: Any = nn.Conv2d  # torch's stubs want 2-tuples; the layer's own values are fine
        new: Any = conv(w.shape[1], w.shape[0], m.kernel_size, m.stride, m.padding, m.dilation,
                        bias=bias is not None, padding_mode=m.padding_mode)
    else:
        new = nn.Linear(w.shape[1], w.shape[0], bias=bias is not None)
    new.weight.data.copy_(w)
    if bias is not None:
        new.bias.data.copy_(bias)
    return new


# -- training -----------------------------------------------------------------------------------
def _epochs(chain: nn.Sequential, x: torch.Tensor, y: torch.Tensor, cfg: PruneConfig,
            epochs: int, strength: float, gen: torch.Generator) -> float:
    if epochs == 0:
        return 0.0
    opt = torch.optim.Adam(chain.parameters(), lr=cfg.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    loss_v = 0.0
    for _ in range(epochs):
        chain.train()
        order = torch.randperm(len(y), generator=gen)
        for i in range(0, len(order), cfg.batch):
            batch = order[i: i + cfg.batch]
            opt.zero_grad()
            loss = F.cross_entropy(chain(x[batch]), y[batch])
            if strength:
                loss = loss + strength * group_lasso(chain)
            loss.backward()
            opt.step()
            loss_v = float(loss.detach())
        sched.step()
    chain.eval()
    return loss_v


def smcd(chain: nn.Sequential, x_train: np.ndarray, y_train: np.ndarray, cfg: PruneConfig,
         progress: Progress | None = None) -> PruneResult:
    """Sparsify ``chain`` (a trained copy is made) with group lasso, remove units, fine-tune."""
    check_chain(chain)
    say = progress or (lambda _m: None)
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    work = nn.Sequential(*[_clone(m) for m in chain])
    x, y = torch.from_numpy(x_train), torch.from_numpy(y_train)
    before = [out_units(work[i]) for i in weighted(work)]
    say(f"  sparsifying: {cfg.sparsify_epochs} epochs, group lasso strength {cfg.strength:g}")
    _epochs(work, x, y, cfg, cfg.sparsify_epochs, cfg.strength, gen)
    pruned, _keep = prune_chain(work, x[:1], cfg.threshold)
    after = [out_units(pruned[i]) for i in weighted(pruned)]
    say(f"  widths {before} -> {after}; fine-tuning {cfg.finetune_epochs} epochs")
    _epochs(pruned, x, y, cfg, cfg.finetune_epochs, 0.0, gen)
    return PruneResult(pruned, before, after, time.perf_counter() - start)


def _clone(m: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(m)


# -- LeNet <-> chain ----------------------------------------------------------------------------
LENET_LAYERS = ("conv1", "conv2", "fc1", "fc2", "fc3")


def lenet_chain(model: Any) -> nn.Sequential:
    """The LeNet of ``coinf.models.architectures`` as an equivalent chain (shared modules)."""
    return nn.Sequential(model.conv1, nn.ReLU(), model.pool1, model.conv2, nn.ReLU(), model.pool2,
                         nn.Flatten(1), model.fc1, nn.ReLU(), model.fc2, nn.ReLU(), model.fc3)


def chain_to_lenet(chain: nn.Sequential) -> nn.Module:
    """A LeNet of the chain's (pruned) widths holding its weights, so node names stay the same."""
    from coinf.models.architectures import LeNet

    layers = [chain[i] for i in weighted(chain)]
    if len(layers) != 5:
        raise ModelError(f"a LeNet chain has 5 conv/linear layers, this one {len(layers)}")
    c1, c2, f1, f2, classes = (out_units(m) for m in layers)
    model = LeNet(c1, c2, f1, f2, classes)
    for name, m in zip(LENET_LAYERS, layers, strict=True):
        getattr(model, name).load_state_dict(m.state_dict())
    return model.eval()


def load_lenet_onnx(path: str, widths: Sequence[int] | None = None) -> nn.Module:
    """A torch LeNet with the weights of a LeNet ONNX file (initializers named like the module)."""
    import onnx
    from coinf.models.architectures import LeNet
    from onnx import numpy_helper

    proto = onnx.load(path)
    init = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    need = [f"{n}.{p}" for n in LENET_LAYERS for p in ("weight", "bias")]
    missing = [k for k in need if k not in init]
    if missing:
        raise ModelError(f"{path} is not a coinf LeNet export: initializers {missing} missing")
    c1, c2, f1, f2, classes = (init[f"{n}.weight"].shape[0] for n in LENET_LAYERS)
    model = LeNet(c1, c2, f1, f2, classes)
    state = {k: torch.from_numpy(np.array(v)) for k, v in init.items() if k in need}
    model.load_state_dict(state)
    return model.eval()


# -- files --------------------------------------------------------------------------------------
def prune_lenet_file(onnx_path: str | Path, out_path: str | Path, cfg: PruneConfig,
                     progress: Progress | None = None) -> dict[str, Any]:
    """Prune the LeNet in ``onnx_path`` with SMCD on the digits training split; write the smaller
    dense ONNX to ``out_path`` (and ``.json`` metadata beside it); return the metadata.

    Accuracies are measured in onnxruntime on the validation and test splits for both files.
    """
    import json

    from coinf.models.digits import digits_data
    from coinf.models.export import export_onnx, max_abs_error
    from coinf.models.inputs import InputSpec
    from coinf.models.zoo import deterministic_torch

    src, out = Path(onnx_path), Path(out_path)
    data = digits_data()
    with deterministic_torch():
        chain = lenet_chain(load_lenet_onnx(str(src)))
        result = smcd(chain, data.x_train, data.y_train, cfg, progress)
        model = chain_to_lenet(result.chain)
        inputs = (InputSpec("image", (1, 1, 28, 28)),)
        body = export_onnx(model, inputs, ("logits",), keep_batchnorm=False,
                           doc=f"coinf SMCD-pruned {src.stem}: widths {result.widths_after}",
                           metadata={"coinf.prune.source": src.name,
                                     "coinf.prune.widths": json.dumps(result.widths_after)})
        err = max_abs_error(model, body, inputs)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(body)
    meta = {
        "source": src.name,
        "method": "SMCD group lasso (filter-wise + channel-wise), unit removal, fine-tuning",
        "strength": cfg.strength,
        "threshold": cfg.threshold,
        "sparsify_epochs": cfg.sparsify_epochs,
        "finetune_epochs": cfg.finetune_epochs,
        "widths_before": result.widths_before,
        "widths_after": result.widths_after,
        "train_seconds": round(result.seconds, 2),
        "max_abs_torch_vs_onnxruntime": err,
        "val_accuracy_before": onnx_accuracy(src, data.x_val, data.y_val),
        "val_accuracy": onnx_accuracy(out, data.x_val, data.y_val),
        "test_accuracy_before": onnx_accuracy(src, data.x_test, data.y_test),
        "test_accuracy": onnx_accuracy(out, data.x_test, data.y_test),
    }
    out.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def onnx_accuracy(path: str | Path, x: np.ndarray, y: np.ndarray) -> float:
    """Top-1 accuracy of a single-input classifier file in onnxruntime, one sample per run."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    hits = sum(int(np.argmax(sess.run(None, {name: x[i: i + 1]})[0]) == y[i])
               for i in range(len(y)))
    return round(hits / len(y), 6)
