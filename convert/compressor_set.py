"""Compressor sets: Table-I autoencoders at the cuts of ``digitnet``, fine-tuned *jointly* with
one shared backbone and with quantization-aware codes, exported as a directory (imports torch).

Joint fine-tuning: every compressor (cut, gamma) is inserted into the same backbone, and each
step's loss is the sum of the cross entropies of the plain network and of every compressed
path, so one set of backbone weights serves the plain cut and every gamma; a device switches
gamma at run time by swapping only the small encoder/decoder (paper 002, Algorithm 2).

Quantization-aware codes: on the compressed paths the code goes through :func:`fake_quant`,
the QUANT codec's own arithmetic (``ble_protocol.packing``: per-tensor min/max of each image,
``2**bits - 1`` levels) with a straight-through gradient; the bit width cycles through
:data:`QAT_BITS` batch by batch, so q8/q4/q2 codes keep their accuracy.

The set directory (docs/PIPELINE.md "Compressor sets")::

    backbone.onnx            image -> logits; the crossing tensors are named after the cuts
    <cut>-g<N>.enc.onnx      <cut> (the crossing tensor) -> "code"
    <cut>-g<N>.dec.onnx      "code" -> <cut>
    index.json               format 1: shapes, FLOPs and onnxruntime accuracies per packing
"""

from __future__ import annotations

import copy
import io
import json
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from coinf.models.compressors import GAMMAS, conv_flops, make_autoencoder
from coinf.models.digitnet import CUTS, IMAGE_SIZE, DigitNet, load_digitnet_onnx
from torch import nn

FORMAT = 1
FINETUNE_EPOCHS = 20
LEARNING_RATE = 3e-4  # the trained backbone
AE_LEARNING_RATE = 3e-3  # the new encoders and decoders
BATCH = 64
#: epochs at the start during which only the compressors learn (the backbone's rate is 0), so
#: the fresh, random autoencoders do not drag the trained backbone off
WARMUP_EPOCHS = 3
#: weight of the distillation term (KL from the model before fine-tuning) per compressed path
DISTILL = 1.0
#: bit widths of the simulated quantization, one per batch in turn (0: the float code)
QAT_BITS = (0, 4, 2, 2)
PACKINGS = ("raw", "q8", "q4", "q2", "qz4", "qz2")
TEST_SET = ("sklearn.datasets.load_digits test split (seed 0, {n} images) upsampled to 32x32 "
            "(models.digits)")

Progress = Callable[[str], None]


def fake_quant(x: torch.Tensor, bits: int) -> torch.Tensor:
    """``unpack(pack(x, f"q{bits}"))`` for each image of a batch, as torch ops, with a
    straight-through gradient (identity). ``bits`` 0 returns ``x``."""
    if bits == 0:
        return x
    dims = tuple(range(1, x.dim()))
    with torch.no_grad():
        lo = x.amin(dim=dims, keepdim=True)
        span = x.amax(dim=dims, keepdim=True) - lo
        levels = float((1 << bits) - 1)
        safe = torch.where(span > 0, span, torch.ones_like(span))
        q = torch.clamp(torch.floor((x - lo) * (levels / safe) + 0.5), max=levels)
        deq = torch.where(span > 0, lo + q * (safe / levels), lo.expand_as(x))
    return x + (deq - x).detach()


def key(cut: str, gamma: int) -> str:
    """File stem of a compressor: ``pool1-g4``."""
    return f"{cut}-g{gamma}"


class JointCompressed(nn.Module):
    """One backbone and the compressors (cut, gamma) inserted at its cuts.

    ``forward_all(x, bits)`` gives the logits of the plain network and of every compressed
    path (in :attr:`keys` order), computing each cut's activation once."""

    def __init__(self, backbone: DigitNet, cuts: Sequence[str], gammas: Sequence[int],
                 seed: int = 0) -> None:
        super().__init__()
        bad = [c for c in cuts if c not in CUTS] + [str(g) for g in gammas if g not in GAMMAS]
        if bad or not cuts or not gammas:
            raise ValueError(f"unknown or missing cuts/gammas {bad}: cuts are {sorted(CUTS)}, "
                             f"gammas {list(GAMMAS)}")
        self.backbone = backbone
        self.cuts = sorted(dict.fromkeys(cuts), key=CUTS.__getitem__)
        self.keys = [(c, g) for c in self.cuts for g in dict.fromkeys(gammas)]
        self.encoders = nn.ModuleDict()
        self.decoders = nn.ModuleDict()
        self.activation_shape: dict[str, tuple[int, ...]] = {}
        self.code_shape: dict[str, tuple[int, ...]] = {}
        torch.manual_seed(seed)
        probe = torch.zeros(1, 1, IMAGE_SIZE, IMAGE_SIZE)
        backbone.eval()
        with torch.no_grad():
            for cut in self.cuts:
                act = backbone.forward_to(CUTS[cut], probe)
                self.activation_shape[cut] = tuple(act.shape)
                for c, gamma in self.keys:
                    if c != cut:
                        continue
                    enc, dec = make_autoencoder(act.shape[1], gamma)
                    k = key(cut, gamma)
                    self.encoders[k], self.decoders[k] = enc.eval(), dec.eval()
                    self.code_shape[k] = tuple(enc(act).shape)

    def flops(self, cut: str, gamma: int) -> int:
        """Encoder + decoder FLOPs (2 x MACs of their convolutions) at batch 1."""
        k = key(cut, gamma)
        act = torch.zeros(self.activation_shape[cut])
        code = torch.zeros(self.code_shape[k])
        return conv_flops(self.encoders[k], act) + conv_flops(self.decoders[k], code)

    def forward_key(self, x: torch.Tensor, cut: str, gamma: int, bits: int = 0) -> torch.Tensor:
        """Logits of the path through compressor (cut, gamma), the code quantized to ``bits``."""
        k, n = key(cut, gamma), CUTS[cut]
        act = self.backbone.forward_to(n, x)
        code = fake_quant(self.encoders[k](act), bits)
        out: torch.Tensor = self.backbone.forward_from(n, self.decoders[k](code))
        return out

    def forward_all(self, x: torch.Tensor, bits: int = 0) -> list[torch.Tensor]:
        outs: list[torch.Tensor] = []
        acts: dict[int, torch.Tensor] = {}
        a = x
        for n, block in enumerate(self.backbone.blocks, 1):
            a = block(a)
            acts[n] = a
        outs.append(a)
        for cut, gamma in self.keys:
            k, n = key(cut, gamma), CUTS[cut]
            code = fake_quant(self.encoders[k](acts[n]), bits)
            outs.append(self.backbone.forward_from(n, self.decoders[k](code)))
        return outs


def model_flops(backbone: nn.Module) -> int:
    """2 x MACs of the backbone's convolutions and linear layers for one image."""
    total = conv_flops(backbone, torch.zeros(1, 1, IMAGE_SIZE, IMAGE_SIZE))
    return total + sum(2 * m.in_features * m.out_features for m in backbone.modules()
                       if isinstance(m, nn.Linear))


def finetune_joint(joint: JointCompressed, x: np.ndarray, y: np.ndarray,
                   epochs: int = FINETUNE_EPOCHS, seed: int = 0,
                   qat_bits: Sequence[int] = QAT_BITS, progress: Progress | None = None,
                   warmup: int = WARMUP_EPOCHS, teacher: nn.Module | None = None,
                   distill: float = DISTILL) -> None:
    """End-to-end fine-tuning of the backbone and every compressor at once: the loss is the sum
    of the cross entropies of the plain path and of each compressed path (Adam, cosine
    schedule, seeded shuffle; the code quantized to ``qat_bits[step % len]``). For the first
    ``warmup`` epochs (at most half of them) the backbone's learning rate is 0. With a
    ``teacher`` (the model before fine-tuning, frozen), each compressed path also pays
    ``distill`` x the KL divergence from the teacher's predictions (meant to keep the small
    training set from being memorised through the new layers)."""
    if epochs < 0 or not qat_bits or any(not 0 <= b <= 16 for b in qat_bits):
        raise ValueError("epochs must be >= 0 and qat_bits a non-empty list of 0..16")
    new = {id(p) for m in (joint.encoders, joint.decoders) for p in m.parameters()}
    params = list(joint.parameters())
    opt = torch.optim.Adam([
        {"params": [p for p in params if id(p) in new], "lr": AE_LEARNING_RATE},
        {"params": [p for p in params if id(p) not in new], "lr": LEARNING_RATE}])
    warm = min(warmup, epochs // 2)

    def cosine(e: int, start: int = 0) -> float:
        if e < start:
            return 0.0
        return 0.5 * (1 + float(np.cos(np.pi * (e - start) / max(epochs - start, 1))))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, [cosine, lambda e: cosine(e, warm)])
    gen = torch.Generator().manual_seed(seed)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    step = 0
    for epoch in range(epochs):
        joint.train()
        t0, total = time.perf_counter(), 0.0
        order = torch.randperm(len(yt), generator=gen)
        for i in range(0, len(order), BATCH):
            batch = order[i:i + BATCH]
            opt.zero_grad()
            outs = joint.forward_all(xt[batch], qat_bits[step % len(qat_bits)])
            loss = sum((F.cross_entropy(o, yt[batch]) for o in outs), torch.zeros(()))
            if teacher is not None and distill > 0:
                with torch.no_grad():
                    soft = F.log_softmax(teacher(xt[batch]), 1)
                loss = loss + distill * sum(
                    (F.kl_div(F.log_softmax(o, 1), soft, log_target=True, reduction="batchmean")
                     for o in outs[1:]), torch.zeros(()))
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(batch)
            step += 1
        sched.step()
        if progress is not None:
            progress(f"epoch {epoch + 1}/{epochs}: summed loss {total / len(yt):.4f} "
                     f"({time.perf_counter() - t0:.1f} s)")
    joint.eval()


# --- ONNX -----------------------------------------------------------------------------------


def _to_onnx(module: nn.Module, shape: tuple[int, ...], inp: str, out: str) -> bytes:
    import onnx

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (torch.zeros(shape),), buf,  # type: ignore[arg-type]
                          opset_version=17, dynamo=False, input_names=[inp],
                          output_names=[out], training=torch.onnx.TrainingMode.EVAL)
    proto = onnx.load_from_string(buf.getvalue())
    onnx.checker.check_model(proto, full_check=True)
    return proto.SerializeToString()


def backbone_onnx(backbone: DigitNet, cuts: Sequence[str] = tuple(CUTS)) -> bytes:
    """``image -> logits`` with each cut's crossing tensor (the output of block k's last node)
    renamed to the cut's name (``pool1``, ``pool2``)."""
    import onnx

    proto = onnx.load_from_string(_to_onnx(backbone, (1, 1, IMAGE_SIZE, IMAGE_SIZE), "image",
                                           "logits"))
    rename = {}
    for cut in cuts:
        nodes = [n for n in proto.graph.node if n.name.startswith(f"/block{CUTS[cut]}/")]
        if not nodes:
            raise RuntimeError(f"the exported backbone has no node of block {CUTS[cut]}")
        rename[nodes[-1].output[0]] = cut
    for n in proto.graph.node:
        n.input[:] = [rename.get(t, t) for t in n.input]
        n.output[:] = [rename.get(t, t) for t in n.output]
    proto.doc_string = "coinf digitnet backbone, jointly fine-tuned with its compressor set"
    onnx.checker.check_model(proto, full_check=True)
    return proto.SerializeToString()


def split_backbone(backbone: bytes, cut: str) -> tuple[bytes, bytes]:
    """(``image -> cut``, ``cut -> logits``) sub-models of a set's ``backbone.onnx``."""
    import onnx
    from onnx.utils import Extractor

    ex = Extractor(onnx.shape_inference.infer_shapes(onnx.load_from_string(backbone)))
    head = ex.extract_model(["image"], [cut])
    tail = ex.extract_model([cut], ["logits"])
    return head.SerializeToString(), tail.SerializeToString()


def _session(blob: bytes) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(blob, opts, providers=["CPUExecutionProvider"])


def _run(sess: Any, name: str, xs: np.ndarray) -> np.ndarray:
    return np.concatenate([sess.run(None, {name: x[None]})[0] for x in xs])


def through_codec(values: np.ndarray, packing: str) -> tuple[np.ndarray, float]:
    """Each image's tensor packed and unpacked by the real codec: (received, mean bytes)."""
    from coinf.ble_protocol.packing import pack, unpack

    if packing == "raw":
        return values, float(values[0].nbytes)
    blobs = [pack(np.ascontiguousarray(v[None]), packing) for v in values]
    return np.concatenate([unpack(b) for b in blobs]), float(np.mean([len(b) for b in blobs]))


def evaluate(backbone: bytes, cut: str, enc: bytes | None, dec: bytes | None, x: np.ndarray,
             y: np.ndarray, packings: Sequence[str]) -> tuple[dict[str, float], dict[str, float]]:
    """Test accuracy and mean packed bytes per packing, all in onnxruntime: the backbone's head
    to ``cut``, the encoder (if any), the codec, the decoder, the backbone's tail."""
    head, tail = split_backbone(backbone, cut)
    sent = _run(_session(head), "image", x)
    if enc is not None:
        sent = _run(_session(enc), cut, sent)
    tail_s, dec_s = _session(tail), None if dec is None else _session(dec)
    acc, size = {}, {}
    for packing in packings:
        received, size[packing] = through_codec(sent, packing)
        if dec_s is not None:
            received = _run(dec_s, "code", received)
        logits = _run(tail_s, cut, received)
        acc[packing] = round(float((logits.argmax(1) == y).mean()), 6)
    return acc, {k: round(v, 1) for k, v in size.items()}


# --- the set --------------------------------------------------------------------------------


def export_set(out_dir: str | Path, *, cuts: Sequence[str] = tuple(CUTS),
               gammas: Sequence[int] = GAMMAS, epochs: int = FINETUNE_EPOCHS,
               packings: Sequence[str] = PACKINGS, qat_bits: Sequence[int] = QAT_BITS,
               train_limit: int | None = None, test_limit: int | None = None,
               backbone_path: str | Path | None = None, seed: int = 0,
               distill: float = DISTILL, freeze_backbone: bool = False,
               progress: Progress | None = None) -> dict[str, Any]:
    """Fine-tune compressors for ``cuts`` x ``gammas`` jointly with the trained ``digitnet``
    (the zoo's committed weights unless ``backbone_path``), write the set to ``out_dir`` and
    return its index. ``*_limit`` take the first images of a split (for quick tests);
    ``freeze_backbone`` trains the compressors only (the backbone stays the zoo model)."""
    from coinf.models.digits import digits_data
    from coinf.models.zoo import committed_path, deterministic_torch

    say = progress or (lambda _m: None)
    data = digits_data(size=IMAGE_SIZE)
    x_tr, y_tr = data.x_train[:train_limit], data.y_train[:train_limit]
    src = Path(backbone_path) if backbone_path else committed_path("digitnet")
    with deterministic_torch():
        teacher = load_digitnet_onnx(src).requires_grad_(False)
        backbone = copy.deepcopy(teacher).requires_grad_(not freeze_backbone)
        joint = JointCompressed(backbone, cuts, gammas, seed)
        say(f"fine-tuning {len(joint.keys)} compressors {[key(*k) for k in joint.keys]} jointly "
            f"with the backbone on {len(y_tr)} images, {epochs} epochs, QAT bits {list(qat_bits)}")
        finetune_joint(joint, x_tr, y_tr, epochs, seed, qat_bits, say, teacher=teacher,
                       distill=distill)
    tuning = {"joint": True, "epochs": epochs, "train_images": len(y_tr),
              "qat_bits": list(qat_bits), "warmup_epochs": min(WARMUP_EPOCHS, epochs // 2),
              "distill": distill, "freeze_backbone": freeze_backbone, "seed": seed}
    return write_set(out_dir, joint, src, packings=packings, test_limit=test_limit,
                     fine_tuning=tuning, progress=progress)


def write_set(out_dir: str | Path, joint: JointCompressed, original: str | Path, *,
              packings: Sequence[str] = PACKINGS, test_limit: int | None = None,
              fine_tuning: dict[str, Any] | None = None,
              progress: Progress | None = None) -> dict[str, Any]:
    """Export ``joint`` as a set in ``out_dir`` and measure its accuracies (onnxruntime, real
    codec) on the digits test split; ``original``: the ONNX file of the model before
    fine-tuning (for ``original_accuracy``). Returns the index written to index.json."""
    from coinf.models.digits import digits_data
    from coinf.models.zoo import deterministic_torch

    say = progress or (lambda _m: None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = digits_data(size=IMAGE_SIZE)
    x_te, y_te = data.x_test[:test_limit], data.y_test[:test_limit]
    src = Path(original)
    joint.eval()
    with deterministic_torch():
        backbone = backbone_onnx(joint.backbone, joint.cuts)
        files = {"backbone.onnx": backbone}
        for cut, gamma in joint.keys:
            k = key(cut, gamma)
            files[f"{k}.enc.onnx"] = _to_onnx(joint.encoders[k], joint.activation_shape[cut],
                                              cut, "code")
            files[f"{k}.dec.onnx"] = _to_onnx(joint.decoders[k], joint.code_shape[k], "code",
                                              cut)
        total = model_flops(joint.backbone)
        flops = {k: joint.flops(*k) for k in joint.keys}
    for name, blob in files.items():
        (out / name).write_bytes(blob)
    say("measuring test accuracies through onnxruntime and the packing codec")
    plain = {}
    for cut in joint.cuts:
        acc, size = evaluate(backbone, cut, None, None, x_te, y_te, packings)
        plain[cut] = {"crossing": [cut], "shape": list(joint.activation_shape[cut]),
                      "dtype": "float32", "accuracy": acc, "bytes": size}
    compressors = []
    for cut, gamma in joint.keys:
        k = key(cut, gamma)
        acc, size = evaluate(backbone, cut, files[f"{k}.enc.onnx"], files[f"{k}.dec.onnx"],
                             x_te, y_te, packings)
        compressors.append({
            "crossing": [cut], "gamma": gamma, "encoder": f"{k}.enc.onnx",
            "decoder": f"{k}.dec.onnx", "code_shape": list(joint.code_shape[k]),
            "code_dtype": "float32", "flops": flops[(cut, gamma)], "model_flops": total,
            "accuracy": acc, "bytes": size})
        say(f"{k}: code {list(joint.code_shape[k])}, accuracy {acc}")
    logits = _run(_session(src.read_bytes()), "image", x_te)
    index = {
        "format": FORMAT, "model": "backbone.onnx",
        "test_set": TEST_SET.format(n=len(y_te)), "test_images": len(y_te),
        "base_accuracy": plain[joint.cuts[0]]["accuracy"],
        "base_cut": joint.cuts[0],
        "cuts": plain,
        "original_model": "digitnet", "original_accuracy": round(
            float((logits.argmax(1) == y_te).mean()), 6),
        "fine_tuning": fine_tuning or {},
        "compressors": compressors,
    }
    (out / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    return index


__all__ = ["FINETUNE_EPOCHS", "PACKINGS", "QAT_BITS", "JointCompressed", "backbone_onnx",
           "evaluate", "export_set", "fake_quant", "finetune_joint", "key", "model_flops",
           "split_backbone", "through_codec"]
