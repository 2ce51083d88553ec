"""The learned bottleneck's networks (torch; laptop only, like :mod:`bottleneck_train`).

:class:`Bottleneck`: encoder (wearable) -> integer latent -> decoder (handheld), starting as a
transform coder (principal components, a gain). :class:`EntropyBottleneck`: the factorized prior
of Balle et al. 2018 (appendix 6.1): per latent channel a monotone cumulative c(y) =
sigmoid(f(y)), f a small MLP (1-3-3-3-1) with softplus-positive matrices; the likelihood of an
integer symbol k is c(k + 1/2) - c(k - 1/2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

LIKELIHOOD_FLOOR = 1e-9


class EntropyBottleneck(nn.Module):
    """Non-parametric per-channel density over the latents (module docstring)."""

    def __init__(self, channels: int, filters: Sequence[int] = (3, 3, 3),
                 init_scale: float = 10.0) -> None:
        super().__init__()
        dims = (1, *filters, 1)
        scale = init_scale ** (1 / (len(filters) + 1))
        self.matrices = nn.ParameterList()
        self.biases = nn.ParameterList()
        self.factors = nn.ParameterList()
        for i in range(len(filters) + 1):
            init = math.log(math.expm1(1 / scale / dims[i + 1]))
            self.matrices.append(nn.Parameter(torch.full((channels, dims[i + 1], dims[i]), init)))
            self.biases.append(nn.Parameter(torch.rand(channels, dims[i + 1], 1) - 0.5))
            if i < len(filters):
                self.factors.append(nn.Parameter(torch.zeros(channels, dims[i + 1], 1)))

    def logits_cdf(self, x: torch.Tensor) -> torch.Tensor:
        """f(x) for x of shape (C, 1, N)."""
        for i, matrix in enumerate(self.matrices):
            x = torch.matmul(F.softplus(matrix), x) + self.biases[i]
            if i < len(self.factors):
                x = x + torch.tanh(self.factors[i]) * torch.tanh(x)
        return x

    def likelihood(self, y: torch.Tensor) -> torch.Tensor:
        """P(symbol) of each value of ``y`` (N, C, ...): c(y + 1/2) - c(y - 1/2), floored."""
        c = y.shape[1]
        flat = y.transpose(0, 1).reshape(c, 1, -1)
        lower = self.logits_cdf(flat - 0.5)
        upper = self.logits_cdf(flat + 0.5)
        sign = -torch.sign(lower + upper).detach()  # stay in the sigmoid's accurate tail
        p = torch.abs(torch.sigmoid(sign * upper) - torch.sigmoid(sign * lower))
        p = p.clamp_min(LIKELIHOOD_FLOOR)
        return p.reshape(c, y.shape[0], *y.shape[2:]).transpose(0, 1)

    @torch.no_grad()
    def pmf(self, lo: int, hi: int) -> np.ndarray:
        """(C, hi - lo + 1) probabilities of the integer symbols lo..hi per channel."""
        c = self.matrices[0].shape[0]
        k = torch.arange(lo, hi + 1, dtype=torch.float32)
        y = k.reshape(1, 1, -1).expand(1, c, -1).contiguous()
        return self.likelihood(y)[0].numpy().astype(np.float64)


class Bottleneck(nn.Module):
    """Encoder (wearable) -> integer latent -> decoder (handheld), for an (N, C, ...) tensor of
    one or two spatial axes. ``mean``/``std`` normalise the cut's tensor per channel (fixed
    buffers, measured on the training data) so that one lambda means the same for every model.

    Each side is a linear map plus a small non-linear branch. The linear maps (a ``stride``-sized
    patch to ``latent`` values and back) start as the data's principal components
    (:meth:`init_pca`) and the branches' last layers at zero, so training starts from a
    transform coder that already reconstructs; a per-channel gain sets the quantisation step.
    """

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, shape: Sequence[int], latent: int, hidden: int, stride: int,
                 mean: np.ndarray, std: np.ndarray, gain: float = 4.0) -> None:
        super().__init__()
        if len(shape) not in (3, 4):
            raise ValueError(f"a learned bottleneck needs an (N, C, L) or (N, C, H, W) tensor, "
                             f"got shape {list(shape)}")
        self.shape = tuple(int(d) for d in shape)
        self.latent, self.stride = latent, stride
        conv = nn.Conv1d if len(shape) == 3 else nn.Conv2d
        up = nn.ConvTranspose1d if len(shape) == 3 else nn.ConvTranspose2d
        ch = self.shape[1]
        view = (1, ch) + (1,) * (len(shape) - 2)
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).reshape(view))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).reshape(view))
        self.log_gain = nn.Parameter(torch.full((1, latent) + (1,) * (len(shape) - 2),
                                                math.log(gain)))
        k = 3 if stride > 1 else 1  # a 1x1 encoder at full resolution: cheap on the wearable
        self.enc_linear = conv(ch, latent, stride, stride)
        self.encoder = nn.Sequential(
            conv(ch, hidden, k, stride, k // 2), nn.ReLU(), conv(hidden, latent, 1))
        self.dec_linear = up(latent, ch, stride, stride)
        layers: list[nn.Module] = [conv(latent, hidden, 1), nn.ReLU(),
                                   conv(hidden, hidden, 3, 1, 1), nn.ReLU()]
        if stride > 1:
            layers += [up(hidden, hidden, 2 * stride, stride, stride // 2), nn.ReLU()]
        layers += [conv(hidden, ch, 3, 1, 1)]
        self.decoder = nn.Sequential(*layers)
        for last in (self.encoder[-1], self.decoder[-1]):
            assert isinstance(last, nn.Conv1d | nn.Conv2d)
            nn.init.zeros_(last.weight)
            nn.init.zeros_(last.bias)  # type: ignore[arg-type]
        self.prior = EntropyBottleneck(latent)

    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        pads: list[int] = []
        for d in reversed(self.shape[2:]):
            pads += [0, -d % self.stride]
        return F.pad(x, pads) if any(pads) else x

    @torch.no_grad()
    def init_pca(self, sample: np.ndarray) -> None:
        """Set the linear maps to the top ``latent`` principal components of the normalised
        ``stride``-sized patches of ``sample`` (N, C, ...)."""
        xn = self._pad((torch.from_numpy(sample) - self.mean) / self.std)
        s, ch = self.stride, self.shape[1]
        if xn.ndim == 4:
            patches = F.unfold(xn, s, stride=s)  # (N, C*s*s, P): channel-major, like a weight
        else:
            n, _, length = xn.shape
            patches = xn.reshape(n, ch, length // s, s).permute(0, 1, 3, 2).reshape(
                n, ch * s, length // s)
        flat = patches.permute(0, 2, 1).reshape(-1, patches.shape[1]).double()
        cov = flat.T @ flat / max(len(flat), 1)
        _, vecs = torch.linalg.eigh(cov)  # ascending
        top = vecs.flip(1)[:, :self.latent].T.float()  # (<= latent, C*s^d)
        weight = torch.zeros(self.latent, top.shape[1])
        weight[:len(top)] = top
        self.enc_linear.weight.copy_(weight.reshape(self.enc_linear.weight.shape))
        self.dec_linear.weight.copy_(weight.reshape(self.dec_linear.weight.shape))
        for lin in (self.enc_linear, self.dec_linear):
            nn.init.zeros_(lin.bias)  # type: ignore[arg-type]

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The continuous latent (before noise or rounding)."""
        xn = (x - self.mean) / self.std
        return (self.enc_linear(self._pad(xn)) + self.encoder(xn)) * torch.exp(self.log_gain)

    def decode(self, y: torch.Tensor) -> torch.Tensor:
        z = y * torch.exp(-self.log_gain)
        out = self.dec_linear(z) + self.decoder(z)
        return out[(..., *(slice(0, d) for d in self.shape[2:]))] * self.std + self.mean

    def forward(self, x: torch.Tensor, noisy: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(restored tensor, bits per sample, latent used) with uniform noise or rounding."""
        y = self.encode(x)
        if noisy:
            yq = y + torch.empty_like(y).uniform_(-0.5, 0.5)
        else:
            yq = y + (torch.round(y) - y).detach()  # straight-through rounding
        bits = -torch.log2(self.prior.likelihood(yq)).flatten(1).sum(1)
        return self.decode(yq), bits, yq


__all__ = ["LIKELIHOOD_FLOOR", "Bottleneck", "EntropyBottleneck"]
