"""A stand-in reference bundle for ``coinf bench pack`` when no zoo bundle is given.

Trains a LeNet-5 (ReLU, max pooling) on scikit-learn's digits, upsampled to 1x28x28, exports it to
ONNX and slices it after every ReLU and pooling layer with ``onnx.utils.extract_model``. It is a
real trained CNN, so its activations have realistic ranges and sparsity, but it is not the zoo's
``lenet_digits``: pass ``--bundle`` to measure a bundle made by ``coinf split``.
Needs torch (bench machines only; the wearable never imports this).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from convert.bundle import Bundle, Candidate, Part, TensorSpec


def digits_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_val, y_val): float32 (N,1,28,28) in [0,1], int64 labels; 60/20 %."""
    from scipy.ndimage import zoom
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    imgs = zoom(d.images / 16.0, (1, 28 / 8, 28 / 8), order=1).astype(np.float32)
    x = np.clip(imgs, 0, 1)[:, None]
    y = d.target.astype(np.int64)
    idx = np.arange(len(y))
    tr, rest = train_test_split(idx, train_size=0.6, random_state=seed, stratify=y)
    va, _ = train_test_split(rest, test_size=0.5, random_state=seed, stratify=y[rest])
    return x[tr], y[tr], x[va], y[va]


def _train_lenet(x: np.ndarray, y: np.ndarray, epochs: int = 25, seed: int = 0) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(256, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10),
    )
    opt = torch.optim.Adam(net.parameters(), lr=2e-3)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(len(xt), generator=gen)
        for i in range(0, len(xt), 32):
            b = perm[i : i + 32]
            opt.zero_grad()
            nn.functional.cross_entropy(net(xt[b]), yt[b]).backward()
            opt.step()
    return net.eval()


def _spec(vi: object) -> TensorSpec:
    from onnx import helper

    t = vi.type.tensor_type  # type: ignore[attr-defined]
    shape = tuple(int(d.dim_value) for d in t.shape.dim)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
    return TensorSpec(vi.name, shape, dtype.name, int(np.prod(shape)) * dtype.itemsize)  # type: ignore[attr-defined]


def build(root: Path) -> tuple[Bundle, np.ndarray, np.ndarray]:
    """Train, export and slice into ``root``; returns (bundle, x_val, y_val)."""
    import onnx
    import onnx.utils
    import torch

    torch.set_num_threads(1)
    x_tr, y_tr, x_va, y_va = digits_split()
    net = _train_lenet(x_tr, y_tr)
    root.mkdir(parents=True, exist_ok=True)
    model_path = root / "model.onnx"
    torch.onnx.export(net, (torch.zeros(1, 1, 28, 28),), str(model_path), input_names=["image"],
                      output_names=["logits"], opset_version=17, dynamo=False)
    model = onnx.shape_inference.infer_shapes(onnx.load(str(model_path)))
    onnx.save(model, str(model_path))
    infos = {vi.name: vi for vi in [*model.graph.input, *model.graph.value_info,
                                    *model.graph.output]}
    inp, out = _spec(infos["image"]), _spec(infos["logits"])
    nodes = list(model.graph.node)
    cands = [Candidate("c000", "handheld-only", (inp,), Part(None, 0, 0, ()),
                       Part("model.onnx", 0, 0, tuple(n.name for n in nodes)))]
    for k, node in enumerate(nodes):
        if node.op_type not in ("Relu", "MaxPool") or k == len(nodes) - 1:
            continue
        cid = f"c{len(cands):03d}"
        (root / cid).mkdir(exist_ok=True)
        cut = node.output[0]
        onnx.utils.extract_model(str(model_path), str(root / cid / "head.onnx"), ["image"], [cut])
        onnx.utils.extract_model(str(model_path), str(root / cid / "tail.onnx"), [cut], ["logits"])
        label = f"{node.op_type.lower()}{sum(n.op_type == node.op_type for n in nodes[:k + 1])}"
        head = Part(f"{cid}/head.onnx", 0, 0, tuple(n.name for n in nodes[: k + 1]))
        tail = Part(f"{cid}/tail.onnx", 0, 0, tuple(n.name for n in nodes[k + 1 :]))
        cands.append(Candidate(cid, label, (_spec(infos[cut]),), head, tail))
    cands.append(Candidate(f"c{len(cands):03d}", "wearable-only", (out,),
                           Part("model.onnx", 0, 0, tuple(n.name for n in nodes)),
                           Part(None, 0, 0, ())))
    sha = hashlib.sha256(model_path.read_bytes()).hexdigest()
    bundle = Bundle(root, "model.onnx", sha, (inp,), (out,), tuple(cands),
                    meta={"reference": "coinf.bench.pack_reference LeNet-5 on sklearn digits"})
    bundle.save()
    return Bundle.load(root), x_va, y_va
