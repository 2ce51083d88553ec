"""Training a learned bottleneck at a cut of a frozen model (imports torch).

The laptop-only half of :mod:`coinf.convert.bottleneck` (docs/BOTTLENECK.md): the bundle's tail
converted to torch with onnx2torch after :mod:`coinf.convert.torchable` normalised it (frozen:
gradients flow through it to the decoder, its weights never change), the training loop
(distortion of the tail's outputs against the original model's, or of the crossing tensor
itself in feature space, plus lambda times the entropy model's bits), the tables, the ONNX
export and the command's per-cut driver (:func:`compress`). The networks are in
:mod:`coinf.convert.bottleneck_nets`, the rate points in :mod:`coinf.convert.bottleneck_rate`.
The Pi wheel leaves the torch modules out (setup.py ``PI_DROP_MODULES``); torch and onnx2torch
come with the ``compress`` extra. Training adds uniform noise in [-1/2, 1/2) to the latents (a
differentiable stand-in for rounding); evaluation and export round.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from coinf.convert import torchable
from coinf.convert.bottleneck import (
    CODE,
    MAX_SYMBOLS,
    Priors,
    Trained,
    check_cut,
    distill_model,
    evaluate,
    measure_latent,
    onnx_flops,
    point_stem,
    register,
    run_slices,
    target_kinds,
)
from coinf.convert.bottleneck_nets import Bottleneck
from torch import nn

from coinf.bundle import Bundle, Candidate
from coinf.errors import ModelError

if TYPE_CHECKING:
    from coinf.convert import bottleneck_rate as br

#: fewer steps through the tail than this in a point's share of the time limit: feature space
MIN_TAIL_STEPS = 300
#: Adam steps fitting the entropy model to the starting latents before training
PRIOR_STEPS = 200
#: latent values (about) the prior is fitted to before training: up to 64 frames, fewer for a
#: large cut (a detector's 32x160x160 would otherwise hold 52 M values in every step)
PRIOR_VALUES = 4_000_000
#: with a time limit, the schedule is fitted to it after this many steps of a fresh run
FIT_AFTER = 5
#: lambda of the points trained through the tail when none is named (the step sets the rate)
TAIL_LAMBDA = 1e-8
Progress = Callable[[str, int, int], None]


# -- the frozen tail in torch -------------------------------------------------------------------
class FrozenTail(nn.Module):
    """The tail ONNX model (``onnx.ModelProto``) as a torch module with frozen weights; returns
    the outputs as a list in graph order. Batch sizes other than 1 work when the tail does not
    bake the batch into a Reshape (checked by :func:`check_batch`)."""

    def __init__(self, model: Any, where: str = "tail") -> None:
        super().__init__()
        self.where = where  # how errors name the tail: "--cut c013: tail node 'x' (Op): ..."
        try:  # normalised first (convert/torchable.py): SAME pads, Resize modes, opset 18+...
            net, self.normalised = torchable.to_torch(model)
        except ModelError as exc:
            raise ModelError(f"{where} {exc}") from None
        self.net = net.eval()
        for p in self.net.parameters():
            p.requires_grad_(False)
        self.verified = False
        self.per_sample = False

    def _run(self, x: torch.Tensor) -> list[torch.Tensor]:
        with warnings.catch_warnings():  # onnx2torch's Slice indexes with a list (torch 2.9+
            warnings.filterwarnings("ignore", message="Using a non-tuple sequence")  # warns)
            out = self.net(x)
        return list(out) if isinstance(out, list | tuple) else [out]

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        if not self.per_sample:
            return self._run(x)
        rows = [self._run(x[i:i + 1]) for i in range(len(x))]
        return [torch.cat(col) for col in zip(*rows, strict=True)]

    @torch.no_grad()
    def check_batch(self, x: torch.Tensor) -> None:
        """Check once that torch gives onnxruntime's outputs on ``x[:1]`` (else
        :class:`ModelError` naming the first node that differs), and run batches one sample at
        a time when the tail bakes batch 1 into its shapes (a Reshape to [1, -1]): then a batch
        gives other shapes or other values."""
        if not self.verified:
            try:
                torchable.verify(self.net, self.normalised, x[:1].numpy())
            except ModelError as exc:
                raise ModelError(f"{self.where} {exc}") from None
            self.verified = True
        self.per_sample = True
        ref = self.forward(x)
        try:
            got = self._run(x)
            self.per_sample = len(got) != len(ref) or not all(
                g.shape == r.shape and torch.allclose(g, r, rtol=1e-4, atol=1e-5)
                for g, r in zip(got, ref, strict=True))
        except Exception:
            self.per_sample = True

    def train(self, mode: bool = True) -> FrozenTail:  # never leaves eval mode
        return super().train(False)


# -- loss ---------------------------------------------------------------------------------------
def distortion(outs: Sequence[torch.Tensor], refs: Sequence[torch.Tensor],
               kinds: Sequence[str], scales: Sequence[float]) -> torch.Tensor:
    """Mean over the batch of the sum over targets: ``kl`` KL(softmax ref || softmax out) on the
    last axis (nats), ``mse`` mean squared error over ``scale`` (the target's variance)."""
    total = torch.zeros(())
    for out, ref, kind, scale in zip(outs, refs, kinds, scales, strict=True):
        if kind == "kl":
            logp, logq = F.log_softmax(ref, -1), F.log_softmax(out, -1)
            total = total + (logp.exp() * (logp - logq)).sum(-1).mean()
        else:
            total = total + F.mse_loss(out, ref) / scale
    return total


# -- training -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """One operating point's hyper-parameters (a checkpoint resumes only with the same)."""

    lam: float
    latent: int = 16
    hidden: int = 48
    stride: int = 2
    steps: int = 1500
    batch: int = 16
    lr: float = 1e-3
    feature_weight: float = 0.1
    seed: int = 0
    #: "tail": distil the tail's outputs through it in torch; "features": match the crossing
    #: tensor itself (per channel, normalised), for a tail torch cannot take: no tail per step
    space: str = "tail"
    #: the latent's initial scale: 1 / the quantisation step in units of the principal
    #: components' values (learned from there; high starts at a high rate, lambda lowers it)
    gain: float = 16.0

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


@dataclass
class Outcome:
    model: Bottleneck
    steps_done: int
    finished: bool
    #: distortion + lambda x rate of each step this run trained (not those before a resume)
    history: list[float]
    #: the steps the schedule ran to: ``cfg.steps``, or fewer fitted to the time limit
    planned: int = 0


def _save(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def initial_model(cfg: Config, crossing: np.ndarray) -> Bottleneck:
    """A bottleneck at step 0 for ``crossing`` (N, C, ...): normalised per channel by the data,
    its linear maps the data's principal components, ``cfg.gain`` its quantisation scale."""
    torch.manual_seed(cfg.seed)
    axes = (0, *range(2, crossing.ndim))
    mean = crossing.mean(axes)
    std = crossing.std(axes) + 1e-6 * max(float(crossing.std()), 1e-6)
    model = Bottleneck(crossing.shape, cfg.latent, cfg.hidden, cfg.stride, mean, std, cfg.gain)
    model.init_pca(np.ascontiguousarray(crossing[::max(1, len(crossing) // 256)], np.float32))
    return model


def learning_rate(peak: float, step: int, planned: int) -> float:
    """One cycle over ``planned`` steps: a linear warm-up from peak / 25 over 5 % of them, then
    a cosine down to peak / 10^4."""
    warm = max(1, round(0.05 * planned))
    if step < warm:
        return peak * (0.04 + 0.96 * step / warm)
    done = min(1.0, (step - warm) / max(1, planned - warm))
    return max(peak * 0.5 * (1 + math.cos(math.pi * done)), peak * 1e-4)


def prior_sample(cfg: Config, x: torch.Tensor) -> torch.Tensor:
    """Frames of ``x`` (N, C, ...) spread over it to fit the prior to: up to 64, and about
    :data:`PRIOR_VALUES` latent values at most."""
    per_frame = max(1, cfg.latent * int(np.prod(x.shape[2:])) // cfg.stride ** (x.ndim - 2))
    frames = max(1, min(64, PRIOR_VALUES // per_frame))
    return x[::max(1, len(x) // frames)][:frames]


def fit_prior(model: Bottleneck, x: torch.Tensor, seed: int, steps: int = PRIOR_STEPS) -> None:
    """Fit the entropy model alone to the starting latents of ``x`` (with training's uniform
    noise): from step 0 the rate term then prices the latents as their tables will, where an
    unfitted, broad prior would barely push back on the rate."""
    with torch.no_grad():
        y = torch.cat([model.encode(x[i:i + 16]) for i in range(0, len(x), 16)])
    opt = torch.optim.Adam(model.prior.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        noisy = y + torch.rand(y.shape, generator=gen) - 0.5
        loss = -torch.log2(model.prior.likelihood(noisy)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def train_point(cfg: Config, crossing: np.ndarray, targets: Sequence[np.ndarray],
                kinds: Sequence[str], tail: Any, checkpoint: Path | None = None,
                resume: bool = False, time_limit: float | None = None,
                progress: Progress | None = None, every: int = 50,
                frozen: FrozenTail | None = None) -> Outcome:
    """Train one bottleneck on ``crossing`` (N, C, ...) to reproduce ``targets`` through the
    frozen ``tail`` (an ONNX model of the distillation targets; ``frozen``: it in torch, when
    already converted), or with ``cfg.space`` "features" to reproduce the crossing tensor
    itself (no tail needed). Stops after ``cfg.steps`` or ``time_limit`` seconds,
    checkpointing every ``every`` steps; with ``resume`` a checkpoint of the same config
    continues where it stopped."""
    model = initial_model(cfg, crossing)
    in_features = cfg.space == "features"
    if not in_features:
        frozen = frozen or FrozenTail(tail)
        frozen.check_batch(torch.from_numpy(np.ascontiguousarray(crossing[:2], np.float32)))
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    # planned: the schedule's length, fitted to the time limit after a few steps
    start, planned, history = 0, cfg.steps, []
    if resume and checkpoint is not None and checkpoint.is_file():
        start, planned = _resume(checkpoint, cfg, model, opt)
    x_all = torch.from_numpy(np.ascontiguousarray(crossing, np.float32))
    if start == 0:
        fit_prior(model, prior_sample(cfg, x_all), cfg.seed)
    refs = [torch.from_numpy(np.ascontiguousarray(t, np.float32)) for t in targets]
    scales = [max(float(np.var(t)), 1e-12) for t in targets]
    fvar = max(float(crossing.var()), 1e-12)
    began, step = time.monotonic(), start
    model.train()
    while step < planned:
        for group in opt.param_groups:
            group["lr"] = learning_rate(cfg.lr, step, planned)
        rng = np.random.default_rng([cfg.seed, step])  # batch and noise drawn per step, so
        torch.manual_seed(int(rng.integers(2**62)))    # a resumed run repeats them exactly
        idx = torch.from_numpy(rng.choice(len(x_all), min(cfg.batch, len(x_all)),
                                          replace=False))
        x = x_all[idx]
        restored, bits, yq = model(x, noisy=True)
        if in_features:  # every channel's error in its own units: what the tail reads
            dist = (((restored - x) / model.std) ** 2).mean()
        else:
            assert frozen is not None
            dist = distortion(frozen(restored), [r[idx] for r in refs], kinds, scales)
        # the prior fits the latents whatever lambda is: bits per element of the detached
        # latents train its parameters only; lambda x bits also pushes the encoder
        fit = -torch.log2(model.prior.likelihood(yq.detach())).mean()
        feat = 0.0 if in_features else cfg.feature_weight * F.mse_loss(restored, x) / fvar
        objective = dist + feat + cfg.lam * bits.mean()
        loss = objective + fit
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        history.append(float(objective.detach()))
        if progress is not None:
            progress(f"train lambda {cfg.lam:g}", step, cfg.steps)
        spent = time.monotonic() - began
        out_of_time = time_limit is not None and spent > time_limit
        if time_limit is not None and start == 0 and step == FIT_AFTER < planned:
            # the schedule ends where the time does, so a point stopped by the limit is not
            # left at its peak learning rate
            planned = max(step + 1, min(cfg.steps, int(0.95 * time_limit * step / spent)))
        if checkpoint is not None and (step % every == 0 or step == planned or out_of_time):
            _save(checkpoint, {"key": cfg.key(), "config": asdict(cfg), "step": step,
                               "model": model.state_dict(),
                               "opt": opt.state_dict(), "planned": planned})
        if out_of_time:
            break
    model.eval()
    return Outcome(model, step, step >= planned, history, planned)


def _resume(checkpoint: Path, cfg: Config, model: Bottleneck, opt: torch.optim.Optimizer
            ) -> tuple[int, int]:
    """Load ``checkpoint`` into ``model`` and ``opt`` if saved with ``cfg``: (step to start
    from, planned steps), else (0, ``cfg.steps``). A damaged file is :class:`ModelError`."""
    start, planned = 0, cfg.steps
    try:  # weights only: a checkpoint is data, never code
        state = torch.load(checkpoint, weights_only=True)
        if isinstance(state, dict) and state.get("key") == cfg.key():
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            planned = int(state.get("planned", cfg.steps))
            start = int(state["step"])
            if not 0 <= start <= planned <= cfg.steps:
                raise ValueError(f"step {start} of {planned} is outside 0..{cfg.steps}")
    except Exception as exc:  # torch's own error types: the file is not a checkpoint
        raise ModelError(f"--resume: checkpoint {checkpoint} is damaged ({type(exc).__name__}"
                         f": {str(exc).splitlines()[0] if str(exc) else 'unreadable'}); "
                         "delete it to train this point from the start") from None
    return start, planned


@torch.no_grad()
def objective(model: Bottleneck, crossing: np.ndarray, targets: Sequence[np.ndarray],
              kinds: Sequence[str], tail: Any, lam: float, batch: int = 32) -> float:
    """Distortion + ``lam`` x bits per sample, with rounding, over all of ``crossing``: the
    trained quantity, measured on fixed data (what a training step's batch loss is not)."""
    frozen = FrozenTail(tail)
    frozen.check_batch(torch.from_numpy(np.ascontiguousarray(crossing[:2], np.float32)))
    scales = [max(float(np.var(t)), 1e-12) for t in targets]
    total = 0.0
    for i in range(0, len(crossing), batch):
        x = torch.from_numpy(np.ascontiguousarray(crossing[i:i + batch], np.float32))
        restored, bits, _ = model(x, noisy=False)
        refs = [torch.from_numpy(np.ascontiguousarray(t[i:i + batch], np.float32))
                for t in targets]
        total += len(x) * float(distortion(frozen(restored), refs, kinds, scales)
                                + lam * bits.mean())
    return total / len(crossing)


@torch.no_grad()
def latents(model: Bottleneck, crossing: np.ndarray, batch: int = 32) -> np.ndarray:
    """The rounded latents of ``crossing`` (N, C', ...)."""
    out = [torch.round(model.encode(torch.from_numpy(crossing[i:i + batch]))).numpy()
           for i in range(0, len(crossing), batch)]
    return np.concatenate(out)


def priors_for(model: Bottleneck, train_latents: np.ndarray) -> Priors:
    """Per-channel symbol ranges (what the training latents reach, one more each side) and the
    tables: each channel's histogram of the training latents, smoothed by the entropy model's
    pmf (one frame's worth of symbols), so a table fits the latents as rounded at the end of
    training, however few steps the prior itself had."""
    axes = (0, *range(2, train_latents.ndim))
    lo = np.minimum(train_latents.min(axes), 0).astype(np.int64) - 1
    hi = np.maximum(train_latents.max(axes), 0).astype(np.int64) + 1
    mid = (lo + hi) // 2
    lo = np.maximum(lo, mid - MAX_SYMBOLS // 2 + 1)
    hi = np.minimum(hi, lo + MAX_SYMBOLS - 1)
    pmf = model.prior.pmf(int(lo.min()), int(hi.max()))
    n, c = train_latents.shape[:2]
    sym = np.rint(train_latents).astype(np.int64).reshape(n, c, -1)
    rows = []
    for ch in range(len(lo)):
        counts = np.bincount(np.clip(sym[:, ch].ravel(), lo[ch], hi[ch]) - lo[ch],
                             minlength=int(hi[ch] - lo[ch] + 1)).astype(np.float64)
        prior = pmf[ch, lo[ch] - lo.min():hi[ch] - lo.min() + 1]
        rows.append(counts + sym.shape[2] * prior / max(float(prior.sum()), 1e-300))
    return Priors.from_pmf(rows, [int(v) for v in lo])


class _Encoder(nn.Module):
    lo: torch.Tensor
    hi: torch.Tensor

    def __init__(self, model: Bottleneck, lo: np.ndarray, hi: np.ndarray) -> None:
        super().__init__()
        self.model = model
        view = (1, -1) + (1,) * (len(model.shape) - 2)
        self.register_buffer("lo", torch.tensor(lo, dtype=torch.float32).reshape(view))
        self.register_buffer("hi", torch.tensor(hi, dtype=torch.float32).reshape(view))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.round(self.model.encode(x))
        return torch.maximum(torch.minimum(y, self.hi), self.lo)


class _Decoder(nn.Module):
    def __init__(self, model: Bottleneck) -> None:
        super().__init__()
        self.model = model

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return self.model.decode(y)


def _onnx(module: nn.Module, sample: torch.Tensor, inp: str, out: str, path: Path) -> None:
    import onnx

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (sample,), buf,  # type: ignore[arg-type]
                          opset_version=17, dynamo=False, input_names=[inp],
                          output_names=[out], training=torch.onnx.TrainingMode.EVAL)
    proto = onnx.load_from_string(buf.getvalue())
    onnx.checker.check_model(proto, full_check=True)
    path.write_bytes(proto.SerializeToString())


def export(model: Bottleneck, priors: Priors, tensor: str, out_dir: Path, stem: str
           ) -> tuple[Path, Path, Path, tuple[int, ...]]:
    """``stem.enc.onnx`` (the crossing tensor -> ``code``: rounded, clipped to the priors'
    ranges, float32), ``stem.dec.onnx`` (``code`` -> the crossing tensor) and ``stem.pmf.json``;
    returns their paths and the code's shape."""
    out_dir.mkdir(parents=True, exist_ok=True)
    x = torch.zeros(1, *model.shape[1:])
    enc = _Encoder(model, priors.lo, priors.hi)
    with torch.no_grad():
        code_shape = tuple(int(d) for d in enc(x).shape)
    paths = (out_dir / f"{stem}.enc.onnx", out_dir / f"{stem}.dec.onnx",
             out_dir / f"{stem}.pmf.json")
    _onnx(enc, x, tensor, CODE, paths[0])
    _onnx(_Decoder(model), torch.zeros(code_shape), CODE, tensor, paths[1])
    paths[2].write_text(json.dumps(priors.to_json(code_shape), separators=(",", ":")) + "\n")
    return (*paths, code_shape)


def _tail_step_s(frozen: FrozenTail, crossing: np.ndarray, batch: int) -> float:
    """Seconds of one training step's tail (forward and backward) on ``batch`` feeds: the
    second of two (the first allocates and warms up)."""
    x = torch.from_numpy(np.ascontiguousarray(crossing[:batch], np.float32)).requires_grad_()
    took = []
    for _ in range(2):
        t0 = time.monotonic()
        sum(o.float().sum() for o in frozen(x)).backward()
        took.append(time.monotonic() - t0)
    return max(took[-1], 1e-6)


# -- the command --------------------------------------------------------------------------------
def _usable_tail(frozen: FrozenTail, x_tr: np.ndarray, cid: str, notes: list[str], batch: int,
                 time_limit: float | None, began: float, n_points: int) -> FrozenTail | None:
    """``frozen`` if it gives onnxruntime's answers and, with a time limit (from ``began``),
    fits :data:`MIN_TAIL_STEPS` steps in each of ``n_points``; else None (noted why)."""
    try:
        frozen.check_batch(torch.from_numpy(np.ascontiguousarray(x_tr[:2], np.float32)))
    except (ModelError, NotImplementedError) as exc:
        notes.append(f"{cid}: trained in feature space, without the tail ({exc})")
        return None
    if time_limit is not None:
        per_step = _tail_step_s(frozen, x_tr, batch)
        fits = (time_limit - (time.monotonic() - began)) / n_points / per_step
        if fits < MIN_TAIL_STEPS:
            notes.append(f"{cid}: trained in feature space: a step through the tail takes "
                         f"{per_step:.1f} s, {fits:.0f} steps a point within the time limit "
                         f"(fewer than {MIN_TAIL_STEPS})")
            return None
    return frozen


def _operating_points(base: Config, lams: Sequence[float], gains: Sequence[float],
                      x_tr: np.ndarray) -> list[tuple[float, float]]:
    """(lambda, gain) of every point: each of ``lams`` at each gain, else one per gain
    (:data:`TAIL_LAMBDA` through the tail, the rate-matched lambda in feature space)."""
    from coinf.convert import bottleneck_rate as br

    if lams:
        return [(lam, gain) for gain in gains for lam in lams]
    if base.space == "features":
        model0 = initial_model(base, x_tr)
        return [(br.matched_lambda(model0, x_tr, gain), gain) for gain in gains]
    return [(TAIL_LAMBDA, gain) for gain in gains]


def _no_worse_than_untrained(bundle: Bundle, cand: Candidate, cfg: Config, x_tr: np.ndarray,
                             model: Bottleneck, swept: dict[float, br.Step], what: str,
                             notes: list[str]) -> Bottleneck:
    """``model``, or the untrained coder (noted) if training left it worse than that coder at
    its gain or two coarser ones; ``swept`` (that coder's steps by gain) gets those it lacked."""
    from coinf.convert import bottleneck_rate as br

    gain = cfg.gain
    need = [g for g in (gain / 2, gain / math.sqrt(2), gain)  # this gain, 2 coarser
            if not any(math.isclose(g, have) for have in swept)]
    if need:
        swept.update((s.gain, s) for s in br.sweep(
            bundle, cand, x_tr, br.numpy_coder(initial_model(cfg, x_tr)), need))
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    now = (br.sweep(bundle, cand, x_tr, br.as_trained(model), (gain,))[0] if finite
           else br.Step(gain, math.inf, math.inf, math.inf))
    if not br.worse(now, list(swept.values())):
        return model
    model = initial_model(cfg, x_tr)
    fit_prior(model, prior_sample(cfg, torch.from_numpy(
        np.ascontiguousarray(x_tr, np.float32))), cfg.seed)
    model.eval()
    start = swept.get(gain)
    notes.append(f"{what}: training left it worse than the untrained coder "
                 f"on {br.SWEEP_FEEDS} training feeds ({_judged(now)}, "
                 f"~{now.bytes:,.0f} B" + ("" if start is None else
                                          f"; untrained {_judged(start)}, "
                                          f"~{start.bytes:,.0f} B")
                 + "): the untrained coder is kept")
    return model


def default_work_dir(bundle: Bundle, cid: str) -> Path:
    """Checkpoints and exports before they enter the bundle: the user's cache."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "coinf" / "compress" / f"{bundle.model_sha256[:16]}-{cid}"


def _judged(step: Any) -> str:
    return (f"{step.loss_pp:.1f} pp" if step.loss_pp is not None
            else f"output error {step.rel_l2:.3f}")


def compress(bundle: Bundle, cid: str, train: Mapping[str, np.ndarray],
             test: Mapping[str, np.ndarray], lams: Sequence[float], base: Config,
             work: Path, resume: bool = False, time_limit: float | None = None,
             progress: Progress | None = None, gains: Sequence[float] = (),
             tolerance_pp: float = 1.0, say: Callable[[str], None] | None = None
             ) -> tuple[list[Trained], list[str]]:
    """Train, export and measure one bottleneck per lambda x gain at cut ``cid``, then register
    them in the bundle. Without ``lams``, one per gain: :data:`TAIL_LAMBDA` through the tail, in
    feature space the one that holds the gain's rate (:func:`bottleneck_rate.matched_lambda`).
    Without ``gains`` they come from the cut's statistics
    (:mod:`coinf.convert.bottleneck_rate`: the task loss of the untrained coder within
    ``tolerance_pp``). A tail torch cannot take (or gives other answers than onnxruntime) is
    trained in feature space instead (noted). Returns the points and notes (a point stopped by
    the time limit, the feature-space fallback); ``say`` gets the rate-point line."""
    from coinf.convert import bottleneck_rate as br

    began = time.monotonic()  # the limit counts the features' extraction too
    cand, tensor = check_cut(bundle, cid)
    tail, _ = distill_model(bundle, cand)
    notes: list[str] = []
    frozen: FrozenTail | None = None
    if base.space == "tail":
        try:
            frozen = FrozenTail(tail, f"--cut {cid}: tail")
        except (ModelError, NotImplementedError) as exc:
            notes.append(f"{cid}: trained in feature space, without the tail ({exc})")
    x_tr, t_tr = run_slices(bundle, cand, tail, train, progress, "features (train)")
    if frozen is not None:
        n_points = len(gains or (base.gain,) * 3) * len(lams or (0.0,))
        frozen = _usable_tail(frozen, x_tr, cid, notes, base.batch, time_limit, began, n_points)
    if frozen is None:
        base = replace(base, space="features")
    x_te, t_te = run_slices(bundle, cand, tail, test, progress, "features (test)")
    kinds = target_kinds(t_tr, tail)
    swept: dict[float, br.Step] = {}  # the untrained coder per gain, each point's fallback
    if not gains:
        steps = br.cached_sweep(work / "sweep.json", resume, bundle, cand, x_tr,
                                lambda: br.numpy_coder(initial_model(base, x_tr)),
                                base.key(), progress)
        swept = {s.gain: s for s in steps}
        gains = br.pick_gains(steps, tolerance_pp)
        if say is not None:
            say(f"{cid}: {br.describe(br.reference(cand, tolerance_pp), steps, gains)}")
    work.mkdir(parents=True, exist_ok=True)
    points = []
    todo = _operating_points(base, lams, gains, x_tr)
    refs = br.answers(bundle, cand, x_te)  # the held-out frames' answers, judged by the metric
    measuring = 0.0  # the last point's export and measurement: reserved for each point left
    for k, (lam, gain) in enumerate(todo):
        cfg = replace(base, lam=lam, gain=gain)
        left = None if time_limit is None else max(
            (time_limit - (time.monotonic() - began)) / (len(todo) - k) - measuring, 1.0)
        run = train_point(cfg, x_tr, t_tr, kinds, tail, work / f"lam{lam:g}-{cfg.key()}.pt",
                          resume, left, progress, frozen=frozen)
        what = f"lambda {lam:g}" + (f" gain {gain:g}" if len(gains) > 1 else "")
        if not run.finished:
            notes.append(f"{cid} {what}: stopped by the time limit at step {run.steps_done} of "
                         f"{run.planned}; run again with --resume to finish it")
        elif run.planned < cfg.steps:
            notes.append(f"{cid} {what}: {run.planned} of {cfg.steps} steps fit the time limit; "
                         f"its learning-rate schedule was fitted to them")
        t0 = time.monotonic()
        model = run.model
        if run.steps_done > 0:  # never worse than where training started
            model = _no_worse_than_untrained(bundle, cand, cfg, x_tr, model, swept,
                                             f"{cid} {what}", notes)
        priors = priors_for(model, latents(model, x_tr))
        enc, dec, pmf, shape = export(model, priors, tensor.name, work,
                                      point_stem(lam, gain))
        restored: list[np.ndarray] = []
        agree, mean_bytes, codes = evaluate(enc, dec, tail, priors, x_te, t_te, restored)
        loss = br.task_loss(bundle, cand, refs, np.concatenate(restored))
        latent_bytes, latent_ms = measure_latent(priors, codes)
        points.append(Trained(lam, enc, dec, pmf, shape, onnx_flops(enc), agree, mean_bytes,
                              len(x_te), latent_bytes, latent_ms, gain, loss))
        measuring = time.monotonic() - t0
    register(bundle, cand, points)
    return points, notes
