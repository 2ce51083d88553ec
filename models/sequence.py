"""PyTorch definitions of the zoo's audio and text architectures, written from the papers'
descriptions (the image ones are in :mod:`models.architectures`).

Imports torch, like :mod:`models.architectures`: only :mod:`models.zoo` builders import it,
lazily. Each ``make_*`` function takes ``large`` and returns an ``nn.Module`` whose weights come
from the global torch RNG (seeded by the caller); attribute names become ONNX node names.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# --------------------------------------------------------------------------------------------
# WaveNet (CoINF): dilated causal convolutions over MFCC frames, per-frame character logits


class WaveNetLayer(nn.Module):
    """Gated dilated causal conv: tanh(filter) * sigmoid(gate) -> 1x1 residual and 1x1 skip."""

    def __init__(self, channels: int, skip: int, dilation: int):
        super().__init__()
        # Kernel 2 padded by `dilation` on both sides; dropping the last `dilation` outputs keeps
        # frame t depending on frames t and t - dilation only (causal).
        self.filter = nn.Conv1d(channels, channels, 2, dilation=dilation, padding=dilation)
        self.gate = nn.Conv1d(channels, channels, 2, dilation=dilation, padding=dilation)
        self.residual = nn.Conv1d(channels, channels, 1)
        self.skip = nn.Conv1d(channels, skip, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        frames = x.shape[2]
        f = self.filter(x)[:, :, :frames]
        g = self.gate(x)[:, :, :frames]
        z = torch.tanh(f) * torch.sigmoid(g)
        return x + self.residual(z), self.skip(z)


class WaveNet(nn.Module):
    def __init__(self, mfcc: int, channels: int, skip: int, stacks: int, depth: int, classes: int):
        super().__init__()
        self.input_conv = nn.Conv1d(mfcc, channels, 1)
        self.layers = nn.ModuleList(
            WaveNetLayer(channels, skip, 2**d) for _ in range(stacks) for d in range(depth)
        )
        self.post1 = nn.Conv1d(skip, skip, 1)
        self.post2 = nn.Conv1d(skip, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.input_conv(x))
        total: torch.Tensor | None = None
        for layer in self.layers:
            x, s = layer(x)
            total = s if total is None else total + s
        assert total is not None
        return self.post2(F.relu(self.post1(F.relu(total))))


def make_wavenet(large: bool) -> nn.Module:
    if large:
        return WaveNet(20, 128, 256, 3, 8, 29)
    return WaveNet(20, 32, 32, 2, 5, 29)


# --------------------------------------------------------------------------------------------
# Text models: LSTM language model, TextCNN, GRU classifier (CoINF "TextRNN"), SENNA window MLP


class LSTMLanguageModel(nn.Module):
    """Embedding -> stacked LSTM -> per-token next-word logits."""

    def __init__(self, vocab: int, embed: int, hidden: int, layers: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, layers, batch_first=True)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embedding(tokens))
        return self.decoder(out)


def make_lstm_lm(large: bool) -> nn.Module:
    return LSTMLanguageModel(10000, 650, 650, 2) if large else LSTMLanguageModel(1000, 64, 128, 2)


class TextCNN(nn.Module):
    """Embedding -> parallel 1-D convolutions (several widths) -> max over time -> concat -> FC."""

    def __init__(
        self, vocab: int, embed: int, kernels: tuple[int, ...], filters: int, classes: int
    ):
        super().__init__()
        self.embedding = nn.Embedding(vocab, embed)
        self.convs = nn.ModuleList(nn.Conv1d(embed, filters, k) for k in kernels)
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(filters * len(kernels), classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens).transpose(1, 2)  # (N, embed, T)
        pooled = [torch.amax(F.relu(conv(x)), dim=2) for conv in self.convs]
        return self.fc(self.dropout(torch.cat(pooled, 1)))


def make_textcnn(large: bool) -> nn.Module:
    return TextCNN(20000, 300, (3, 4, 5), 100, 2) if large else TextCNN(2000, 64, (3, 4, 5), 64, 5)


class GRUClassifier(nn.Module):
    """Embedding -> bidirectional GRU -> final states of both directions -> FC."""

    def __init__(self, vocab: int, embed: int, hidden: int, layers: int, classes: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab, embed)
        self.gru = nn.GRU(embed, hidden, layers, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        _, h = self.gru(self.embedding(tokens))  # h: (layers*2, N, hidden)
        return self.fc(torch.cat([h[-2], h[-1]], 1))


def make_gru_text(large: bool) -> nn.Module:
    return GRUClassifier(30000, 300, 256, 2, 5) if large else GRUClassifier(2000, 64, 64, 1, 5)


class SennaMLP(nn.Module):
    """SENNA window approach: word + caps embeddings of a window -> HardTanh MLP -> tag scores."""

    def __init__(self, vocab: int, embed: int, caps: int, window: int, hidden: int, tags: int):
        super().__init__()
        self.words = nn.Embedding(vocab, embed)
        self.caps = nn.Embedding(5, caps)
        self.hidden = nn.Linear(window * (embed + caps), hidden)
        self.output = nn.Linear(hidden, tags)

    def forward(self, words: torch.Tensor, caps: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.words(words), self.caps(caps)], 2)  # (N, window, embed + caps)
        x = F.hardtanh(self.hidden(torch.flatten(x, 1)))
        return self.output(x)


def make_senna_mlp(large: bool) -> nn.Module:
    return SennaMLP(130000, 50, 5, 5, 300, 45) if large else SennaMLP(3000, 50, 5, 5, 300, 45)


def init_scaled(model: nn.Module) -> None:
    """Re-initialise embeddings ~N(0, 1/sqrt(dim)) so random text models have sane activations."""
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, nn.Embedding):
                mod.weight.normal_(0.0, 1.0 / math.sqrt(mod.embedding_dim))
