"""Real calibration inputs for the pretrained models (:mod:`models.pretrained`), from packages.

Images are the sample photos that ship inside the scikit-image and scikit-learn wheels (read from
the installed files with Pillow: nothing is fetched), varied by seeded random crops, flips and
colour shifts, then put through the model's own preprocessing. Audio is speech synthesised by
espeak-ng when it is installed, otherwise a clearly labelled synthetic set of harmonic glides
(:func:`harmonic_set`). The same seed gives the same arrays.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import tempfile
import wave
from pathlib import Path
from typing import Any

import numpy as np
from coinf.models.pretrained import require_package, spec_for

from coinf.errors import InputError, MissingDependency
from coinf.files import write_atomically

#: colour photographs inside the scikit-image wheel (skimage/data/), never the pooch downloads
SKIMAGE_PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg",
                  "motorcycle_left.png", "motorcycle_right.png", "hubble_deep_field.jpg",
                  "retina.jpg", "ihc.png")
#: scikit-learn's ``load_sample_images()`` (sklearn/datasets/images/)
SKLEARN_PHOTOS = ("china.jpg", "flower.jpg")

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "A wearable camera sends its frames to the phone in your pocket.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "She sells sea shells by the sea shore.",
    "The rainbow is a division of white light into many beautiful colours.",
    "How much wood would a woodchuck chuck if a woodchuck could chuck wood?",
    "We will meet at the station at half past seven tomorrow morning.",
    "Every good boy deserves fudge, and every girl deserves a song.",
    "The battery is low, so the watch keeps the heavy work on the laptop.",
    "Bluetooth low energy sends small packets every few milliseconds.",
    "I never said she stole my money.",
    "Open the window and let the cool evening air into the room.",
    "Seven silly swans swam silently seaward.",
    "Can you hear the difference between a high voice and a low one?",
    "The music started slowly and then grew louder and louder.",
    "My grandmother sang old songs while she baked bread on Sundays.",
    "Turn left at the old oak tree and follow the river to the bridge.",
    "A stitch in time saves nine.",
    "The children laughed as the kite rose high above the hill.",
    "Numbers like one, two, three and four are easy to say.",
    "Where did you put the keys to the blue car?",
    "The meeting has been moved to Thursday afternoon.",
    "Rain fell softly on the roof all through the night.",
    "Hello, how are you doing today?",
    "This sentence is spoken by a robot with a changing pitch.",
    "Fresh coffee smells wonderful early in the morning.",
    "The little cat slept in a warm patch of sunlight.",
    "Measure twice and cut once.",
    "Good evening, ladies and gentlemen, welcome aboard.",
    "Whistling in the dark does not make the night any shorter.",
)  # fmt: skip
ESPEAK_VOICES = ("en-us", "en", "en-us+f3", "en+m3", "en-us+f4")
ESPEAK_RATE = 22050


def _package_dir(module: str, what: str) -> Path:
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        pkg = {"skimage": "scikit-image", "sklearn": "scikit-learn"}.get(module, module)
        raise MissingDependency(f"{what} needs {pkg!r}, which is not installed: pip install {pkg}")
    return Path(next(iter(found.submodule_search_locations)))


def photos() -> list[tuple[str, np.ndarray]]:
    """(name, RGB uint8 HxWx3) of every sample photo the installed wheels carry, in a fixed
    order; :class:`MissingDependency` when scikit-image is missing."""
    from PIL import Image

    found = []
    sk = _package_dir("skimage", "real image data") / "data"
    folders: list[tuple[Path, tuple[str, ...]]] = [(sk, SKIMAGE_PHOTOS)]
    if importlib.util.find_spec("sklearn") is not None:
        folders.append((_package_dir("sklearn", "real image data") / "datasets" / "images",
                        SKLEARN_PHOTOS))
    for folder, names in folders:
        for name in names:
            if (folder / name).is_file():
                with Image.open(folder / name) as img:
                    found.append((name, np.asarray(img.convert("RGB"))))
    if not found:
        raise MissingDependency("real image data: the installed scikit-image has none of its "
                                "sample photos: pip install --force-reinstall scikit-image")
    return found


def augment(rgb: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random crop (side 0.35-1.0 of the shorter side, aspect 3/4-4/3), a horizontal flip
    half the time, and brightness, contrast and per-channel colour shifts; uint8 HxWx3."""
    h, w = rgb.shape[:2]
    short = min(h, w)
    side = short * rng.uniform(0.35, 1.0)
    aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
    cw = int(min(w, max(16, round(side * np.sqrt(aspect)))))
    ch = int(min(h, max(16, round(side / np.sqrt(aspect)))))
    top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    x = rgb[top:top + ch, left:left + cw].astype(np.float32)
    if rng.random() < 0.5:
        x = x[:, ::-1]
    mean = x.mean()
    x = (x - mean) * rng.uniform(0.7, 1.3) + mean * rng.uniform(0.7, 1.3)
    x = x * rng.uniform(0.9, 1.1, size=3).astype(np.float32)
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def image_set(model_name: str, n: int, seed: int = 0) -> np.ndarray:
    """``n`` real images for an image model: float32 ``[n, 3, H, W]`` after its preprocessing.
    Photo ``i % len(photos)`` is varied by a seeded :func:`augment`."""
    spec = spec_for(model_name)
    if spec.preprocess is None:
        raise InputError(f"{model_name!r} does not take images (task {spec.task})")
    if n < 1:
        raise InputError(f"n {n}: expected at least 1 sample")
    pics = photos()
    rng = np.random.default_rng(seed)
    out = [spec.preprocess(augment(pics[i % len(pics)][1], rng))[0] for i in range(n)]
    return np.stack(out).astype(np.float32)


def harmonic_set(n: int, seed: int = 0, sr: int = 16000, seconds: float = 1.0) -> np.ndarray:
    """SYNTHETIC pitched audio: float32 ``[n, samples]``. Each clip is a harmonic tone (6-12
    partials with a random spectral slope) whose pitch glides log-linearly between two values in
    80-800 Hz, with 4-7 Hz vibrato of up to 50 cents, a random amplitude envelope with a short
    pause, and white noise 20-40 dB below it; peak 0.1-0.9."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(sr * seconds)) / sr
    out = np.empty((n, t.size), np.float32)
    for i in range(n):
        f0, f1 = np.exp(rng.uniform(np.log(80), np.log(800), size=2))
        vib = rng.uniform(0, 50) * np.sin(2 * np.pi * rng.uniform(4, 7) * t + rng.uniform(0, 6.3))
        f = np.exp(np.log(f0) + (np.log(f1) - np.log(f0)) * t / seconds) * 2 ** (vib / 1200)
        phase = 2 * np.pi * np.cumsum(f) / sr
        slope = rng.uniform(0.5, 1.5)
        x = np.zeros_like(t)
        for k in range(1, int(rng.integers(6, 13)) + 1):
            partial = k * f
            x += np.where(partial < sr / 2 - 200, np.sin(k * phase + rng.uniform(0, 6.3)), 0.0) \
                / k ** slope
        env = np.clip(np.minimum(t, seconds - t) / 0.03, 0, 1)
        gap = rng.uniform(0.2, 0.8)
        env *= np.where(np.abs(t - gap) < rng.uniform(0, 0.08), 0.05, 1.0)
        x = x * env / max(np.abs(x).max(), 1e-9)
        x += rng.standard_normal(t.size) * 10 ** (-rng.uniform(20, 40) / 20)
        out[i] = (x / np.abs(x).max() * rng.uniform(0.1, 0.9)).astype(np.float32)
    return out


def _espeak(text: str, voice: str, speed: int, pitch: int, exe: str) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "s.wav"
        subprocess.run([exe, "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", str(wav),
                        text], check=True, capture_output=True, timeout=60)
        with wave.open(str(wav), "rb") as w:
            if w.getsampwidth() != 2 or w.getnchannels() != 1:
                raise InputError(f"espeak-ng wrote an unexpected WAV ({w.getparams()})")
            rate = w.getframerate()
            a = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
    if rate != ESPEAK_RATE:
        raise InputError(f"espeak-ng wrote {rate} Hz, expected {ESPEAK_RATE}")
    return a


def speech_set(n: int, seed: int = 0, sr: int = 16000) -> tuple[np.ndarray, str]:
    """``n`` one-second clips, float32 ``[n, sr]``, and where they came from: ``"espeak-ng"``
    (the fixed sentences with a few voices, speeds and pitches, resampled 22050 -> ``sr``) when
    ``espeak-ng`` is on PATH, else ``"synthetic harmonic glides (espeak-ng not installed)"``
    from :func:`harmonic_set`."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        return harmonic_set(n, seed, sr), "synthetic harmonic glides (espeak-ng not installed)"
    from math import gcd

    from scipy.signal import resample_poly

    rng = np.random.default_rng(seed)
    g = gcd(sr, ESPEAK_RATE)
    clips: list[np.ndarray] = []
    k = 0
    while len(clips) < n:
        voice = ESPEAK_VOICES[k % len(ESPEAK_VOICES)]
        text = SENTENCES[k % len(SENTENCES)]
        speed, pitch = int(rng.integers(120, 200)), int(rng.integers(20, 80))
        a = resample_poly(_espeak(text, voice, speed, pitch, exe), sr // g, ESPEAK_RATE // g)
        for start in range(0, len(a) - sr + 1, sr // 2):
            if len(clips) < n and np.abs(a[start:start + sr]).max() > 1e-3:
                clips.append(a[start:start + sr].astype(np.float32))
        k += 1
        if k > 50 * max(n, 1):
            raise InputError("espeak-ng produced no usable speech")
    return np.stack(clips), "espeak-ng"


#: swift-f0's pitch range (its fmin/fmax folded into the model): labelled notes stay within
PITCH_RANGE = (46.875, 2093.75)
#: per task, bumped whenever what :func:`dataset` makes for it changes (inputs, labels, their
#: layout): caches of it (``coinf demo``'s ``--out``, ``bench rate --work``) name their files
#: with :func:`data_version` (text recognition: 2 since its labels became id rows; text
#: detection: 2 since its pages carry line boxes)
DATA_VERSIONS = {"text recognition": 2, "text detection": 2}


def data_version(model_name: str) -> int:
    """The version of the data :func:`dataset` makes for ``model_name`` (1 unless bumped;
    pitch: 2 when a SoundFont gives labelled notes, :func:`coinf.models.notes.font_path`)."""
    task = spec_for(model_name).task
    if task == "pitch":
        from coinf.models import notes

        return 1 if notes.font_path() is None else 2
    return DATA_VERSIONS.get(task, 1)


def data_file(model_name: str, n: int) -> str:
    """The file name a cache keeps ``n`` feeds of ``model_name`` under (with its version)."""
    version = data_version(model_name)
    return f"{model_name}-{n}.npz" if version == 1 else f"{model_name}-{n}-d{version}.npz"


def dataset(model_name: str, n: int, seed: int = 0) -> tuple[dict[str, np.ndarray], str]:
    """Calibration arrays for ``model_name`` and their source: one per model input, the N feeds
    stacked along its batch axis (``(N, 3, H, W)`` for an image input ``[1, 3, H, W]``)."""
    spec = spec_for(model_name)
    if n < 1:
        raise InputError(f"n {n}: expected at least 1 sample")
    inp = spec.inputs[0]
    if spec.task == "pitch":
        from coinf.models import notes

        font = notes.font_path()
        if font is not None:  # labelled: recorded notes of known pitch
            audio, f0, k = notes.note_set(n, seed, 16000, *PITCH_RANGE, font)
            return {inp.name: audio.reshape(n, *inp.shape[1:]), "labels": f0}, \
                f"{k} recorded instrument notes of {font.name} (label: each note's pitch, " \
                f"the font's and an independent estimate's within 50 cents)"
        audio, source = speech_set(n, seed, sr=16000)
        return {inp.name: audio.reshape(n, *inp.shape[1:])}, source
    if spec.task in ("text recognition", "text detection"):
        from coinf.models import ocr

        pics = [p for _, p in photos()]
        where = "the scikit-image/scikit-learn sample photos"
        if spec.task == "text recognition":
            import onnx

            chars = ocr.characters(onnx.load(str(require_package(spec)), load_external_data=False))
            x, labels = ocr.word_set(n, pics, chars, seed)
            return {inp.name: x, "labels": labels}, \
                f"{len(ocr.WORDS)} words rendered on crops of {where} (label: the word's " \
                "character ids)"
        rng = np.random.default_rng(seed)
        backgrounds = [augment(pics[i % len(pics)], rng) for i in range(n)]
        pages, boxes = ocr.page_set(backgrounds, seed)
        return {inp.name: pages, "labels": boxes}, \
            f"lines of {len(ocr.WORDS)} words rendered on crops of {where} (label: each " \
            "line's box)"
    names = ", ".join(p for p, _ in photos())
    return {inp.name: image_set(model_name, n, seed).reshape(n, *inp.shape[1:])}, \
        f"photos from the scikit-image/scikit-learn wheels ({names}), augmented"


def write_npz(model_name: str, path: str | Path, n: int = 300, seed: int = 0) -> str:
    """Write ``n`` calibration feeds for ``model_name`` as an ``.npz`` that ``coinf calibrate
    --data`` accepts (one array per model input, stacked along its batch axis); returns the
    source (:func:`dataset`)."""
    import io

    arrays, source = dataset(model_name, n, seed)
    buf = io.BytesIO()
    savez: Any = np.savez  # numpy < 2 has no allow_pickle keyword: every keyword is an array
    savez(buf, **arrays)
    write_atomically(path, buf.getvalue())
    return source


__all__ = ["dataset", "harmonic_set", "image_set", "photos", "speech_set", "write_npz"]
