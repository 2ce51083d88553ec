"""Deterministic training of the digit CNN (imports torch; used only when building)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from coinf.models.digits import digits_data
from torch import nn

EPOCHS = 30
BATCH = 32
LEARNING_RATE = 2e-3


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Fraction of correct predictions of ``model`` (eval mode) on images ``x``."""
    model.eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(x)).argmax(1).numpy()
    return float((pred == y).mean())


def train_digits(model: nn.Module, seed: int, *, size: int = 28, epochs: int = EPOCHS,
                 batch: int = BATCH, lr: float = LEARNING_RATE) -> tuple[dict[str, Any], float]:
    """Train ``model`` in place on the digits split (images upsampled to ``size``) with Adam;
    return (metrics, seconds taken).

    Single thread, deterministic algorithms and a seeded shuffle make the result repeatable on a
    given machine (see docs/MODELS.md for why other CPUs may differ in the last bits).
    """
    data = digits_data(size=size)
    gen = torch.Generator().manual_seed(seed)
    x_train, y_train = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    start = time.perf_counter()
    for _ in range(epochs):
        model.train()
        order = torch.randperm(len(y_train), generator=gen)
        for i in range(0, len(order), batch):
            part = order[i : i + batch]
            opt.zero_grad()
            loss = F.cross_entropy(model(x_train[part]), y_train[part])
            loss.backward()
            opt.step()
        sched.step()
    seconds = time.perf_counter() - start
    model.eval()
    metrics = {
        "dataset": f"sklearn.datasets.load_digits upsampled to {size}x{size} (models.digits)",
        "split_seed": data.seed,
        "split_sizes": {
            "train": len(data.y_train),
            "val": len(data.y_val),
            "test": len(data.y_test),
        },
        "train_seed": seed,
        "epochs": epochs,
        "batch": batch,
        "optimizer": f"Adam lr={lr} cosine",
        "train_accuracy": round(accuracy(model, data.x_train, data.y_train), 6),
        "val_accuracy": round(accuracy(model, data.x_val, data.y_val), 6),
        "test_accuracy": round(accuracy(model, data.x_test, data.y_test), 6),
    }
    return metrics, seconds
