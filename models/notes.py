"""Labelled pitch data: one-second clips of recorded instrument notes and the pitch of each.

The recordings and their pitch come from a SoundFont (:mod:`coinf.models.soundfont`; Debian's
``fluid-soundfont-gm``, FluidR3 GM, MIT). A font's root key is what its author tuned the
instrument to, and a few fonts deliberately map a recording an octave away (FluidR3's piccolo
and drawbar organs) or detune synthetic waves for chorus; so a note is kept only when an
independent estimate of its recording (:func:`yin`, de Cheveigné and Kawahara 2002) agrees
with the font's pitch within :data:`AGREE_CENTS`. Each clip is the recording from its start,
its loop repeated to fill one second, resampled to the model's rate, optionally shifted by a
few semitones (the label shifts exactly with it), at a seeded level.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from coinf.models import soundfont

from coinf.errors import InputError

#: where Debian's fluid-soundfont-gm installs its font; ``COINF_SOUNDFONT`` names another
DEFAULT_FONT = Path("/usr/share/sounds/sf2/FluidR3_GM.sf2")
#: the font's pitch and the independent estimate must agree this closely (cents)
AGREE_CENTS = 50.0
#: repeats of a note are shifted by up to this many semitones either way
MAX_SHIFT = 2.0


def font_path() -> Path | None:
    """The SoundFont to read labelled notes from, or None when there is none."""
    env = os.environ.get("COINF_SOUNDFONT")
    if env:
        if not Path(env).is_file():
            raise InputError(f"COINF_SOUNDFONT={env}: no such file (expected a .sf2 SoundFont, "
                             f"e.g. {DEFAULT_FONT} from Debian's fluid-soundfont-gm)")
        return Path(env)
    return DEFAULT_FONT if DEFAULT_FONT.is_file() else None


def yin(x: np.ndarray, sr: int, fmin: float = 40.0, fmax: float = 2200.0,
        threshold: float = 0.15) -> float | None:
    """The pitch (Hz) of ``x`` by YIN's cumulative-mean-normalised difference over a 50 ms
    window, or None when ``x`` is too short for ``fmin``."""
    x = np.asarray(x, np.float64)
    x = x - x.mean()
    w = min(len(x) // 2, int(sr * 0.05))
    lo, hi = int(sr / fmax), min(int(sr / fmin), len(x) - w - 1)
    if hi <= lo + 2:
        return None
    diff = np.array([np.sum((x[:w] - x[t:t + w]) ** 2) for t in range(hi + 1)])
    cmnd = np.ones_like(diff)
    cmnd[1:] = diff[1:] * np.arange(1, hi + 1) / np.maximum(np.cumsum(diff[1:]), 1e-12)
    below = np.flatnonzero(cmnd[lo:] < threshold)
    if below.size:
        t = lo + int(below[0])
        while t + 1 <= hi and cmnd[t + 1] < cmnd[t]:
            t += 1
    else:
        t = lo + int(np.argmin(cmnd[lo:]))
    shift = 0.0
    if 1 <= t < hi:
        a, b, c = cmnd[t - 1], cmnd[t], cmnd[t + 1]
        den = a - 2 * b + c
        shift = 0.5 * (a - c) / den if den else 0.0
    return float(sr / (t + shift))


def checked(font: Path, fmin: float, fmax: float) -> list[soundfont.Note]:
    """The font's melodic recordings with a pitch in [fmin, fmax] that :func:`yin` confirms."""
    out = []
    for note in soundfont.notes(font):
        if not fmin <= note.f0 <= fmax:
            continue
        after = note.data[min(len(note.data) // 4, note.loop[0]):]
        got = yin(after[:int(note.rate * 0.2)], note.rate)
        if got is not None and abs(1200 * np.log2(got / note.f0)) <= AGREE_CENTS:
            out.append(note)
    return out


def clip(note: soundfont.Note, sr: int, seconds: float, semitones: float) -> np.ndarray:
    """``note`` from its start, its loop repeated, as ``seconds`` at ``sr`` Hz, sounding
    ``semitones`` higher (played faster), float32 peak 1."""
    from scipy.signal import resample

    ratio = 2.0 ** (semitones / 12)
    need = int(np.ceil(seconds * note.rate * ratio)) + 1
    head = note.data[:note.loop[1]].astype(np.float32)
    loop = note.data[note.loop[0]:note.loop[1]].astype(np.float32)
    if len(head) < need and len(loop) == 0:
        raise InputError(f"note {note.name!r} is {len(head)} samples with no loop")
    reps = 0 if len(head) >= need else int(np.ceil((need - len(head)) / len(loop)))
    raw = np.concatenate([head, *([loop] * reps)])[:need]
    out = resample(raw, round(len(raw) * sr / (note.rate * ratio)))[:int(sr * seconds)]
    peak = float(np.abs(out).max()) or 1.0
    return (out / peak).astype(np.float32)


def note_set(n: int, seed: int, sr: int, fmin: float, fmax: float,
             font: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """``n`` one-second clips ``[n, sr]``, their pitch in Hz ``[n]`` (float32) and how many
    recordings they come from: every checked note once in a seeded order, then again shifted
    by up to :data:`MAX_SHIFT` semitones (kept within [fmin, fmax]), each at a seeded level."""
    pool = checked(font, fmin, fmax)
    if not pool:
        raise InputError(f"{font}: no melodic recording with a pitch in [{fmin:g}, {fmax:g}] "
                         f"Hz that an independent estimate confirms")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(pool))
    xs, labels = [], []
    for i in range(n):
        note = pool[int(order[i % len(pool)])]
        shift = 0.0
        if i >= len(pool):
            lo = max(-MAX_SHIFT, 12 * np.log2(fmin / note.f0))
            hi = min(MAX_SHIFT, 12 * np.log2(fmax / note.f0))
            shift = float(rng.uniform(lo, hi))
        xs.append(clip(note, sr, 1.0, shift) * np.float32(rng.uniform(0.1, 0.9)))
        labels.append(note.f0 * 2.0 ** (shift / 12))
    return np.stack(xs), np.asarray(labels, np.float32), min(n, len(pool))


__all__ = ["DEFAULT_FONT", "checked", "clip", "font_path", "note_set", "yin"]
