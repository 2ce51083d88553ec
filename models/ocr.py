"""PP-OCRv4 text detection and recognition (``rapidocr-onnxruntime``, Apache-2.0): the heavy real
models, and the labelled text they are measured on.

The wheel ships both networks as ONNX (PaddleOCR's ``ch_PP-OCRv4_det_infer`` and
``ch_PP-OCRv4_rec_infer``, the Chinese+English models, which read Latin text). Their symbolic
dims are made static here: the detector at 640 x 640 (4.6 GFLOPs, about 15x MobileNetV2 at
224), the recogniser at 48 x 320 (1.4 GFLOPs). Both normalise RGB as ``(p / 255 - 0.5) / 0.5``.

Their data is text rendered onto the sample photos of the scikit-image/scikit-learn wheels, so
the truth is known exactly: :func:`word_set` gives word crops with the word as the label
(its class ids in the recogniser's own dictionary, :func:`characters`), :func:`page_set`
photos with lines of text on them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from coinf.errors import ModelError

DET_SIDE = 640
REC_SHAPE = (48, 320)
#: the recogniser's time steps at width 320 (its CNN downsamples the width by 8)
REC_STEPS = REC_SHAPE[1] // 8
REC_CLASSES = 6625  # blank + 6,623 characters + space
#: the space's class id: word accuracy ignores it (as PaddleOCR's own recognition metric does)
SPACE = REC_CLASSES - 1
#: a page's label: at most this many line boxes (rows of -1 pad it)
MAX_LINES = 8


def _set_dims(vi: onnx.ValueInfoProto, dims: list[int]) -> None:
    shape = vi.type.tensor_type.shape
    del shape.dim[:]
    for d in dims:
        shape.dim.add().dim_value = d


def _static(model: onnx.ModelProto, inp: list[int], out: list[int]) -> onnx.ModelProto:
    g = model.graph
    if len(g.input) != 1 or len(g.output) != 1:
        raise ModelError(f"PP-OCR model has inputs {[i.name for i in g.input]} and outputs "
                         f"{[o.name for o in g.output]}; expected one of each")
    _set_dims(g.input[0], inp)
    _set_dims(g.output[0], out)
    del g.value_info[:]
    return model


def build_det(spec: Any, data: bytes) -> onnx.ModelProto:
    """The detector at [1, 3, 640, 640] -> a text probability map [1, 1, 640, 640]."""
    return _static(onnx.load_from_string(data), [1, 3, DET_SIDE, DET_SIDE],
                   [1, 1, DET_SIDE, DET_SIDE])


def build_rec(spec: Any, data: bytes) -> onnx.ModelProto:
    """The recogniser at [1, 3, 48, 320] -> per-step character probabilities [1, 40, 6625]."""
    model = onnx.load_from_string(data)
    keep = [p for p in model.metadata_props if p.key != "character"]  # 6,623 characters
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    return _static(model, [1, 3, *REC_SHAPE], [1, REC_STEPS, REC_CLASSES])


def _normalise(rgb: np.ndarray) -> np.ndarray:
    x = np.asarray(rgb, dtype=np.float32)[..., :3] / 255.0
    return ((x - 0.5) / 0.5).transpose(2, 0, 1)[None].astype(np.float32)


def preprocess_det(rgb: np.ndarray) -> np.ndarray:
    """Pad right/bottom to a square (black), resize to 640, normalise: [1, 3, 640, 640]."""
    from PIL import Image

    a = np.asarray(rgb, dtype=np.uint8)[..., :3]
    side = max(a.shape[:2])
    sq = np.zeros((side, side, 3), np.uint8)
    sq[: a.shape[0], : a.shape[1]] = a
    img = Image.fromarray(sq).resize((DET_SIDE, DET_SIDE), Image.Resampling.BILINEAR)
    return _normalise(np.asarray(img))


def preprocess_rec(rgb: np.ndarray) -> np.ndarray:
    """Resize to height 48 keeping the aspect (width at most 320), pad the right with 0 after
    normalising, as rapidocr does: [1, 3, 48, 320]."""
    from PIL import Image

    a = np.asarray(rgb, dtype=np.uint8)[..., :3]
    h, w = REC_SHAPE
    width = int(min(w, max(8, round(a.shape[1] * h / max(a.shape[0], 1)))))
    img = Image.fromarray(a).resize((width, h), Image.Resampling.BILINEAR)
    out = np.zeros((1, 3, h, w), np.float32)
    out[..., :width] = _normalise(np.asarray(img))
    return out


#: the words a crop says (the label is the index); plain English, letters and digits
WORDS = tuple(sorted({w.strip(".,?!").lower() for s in (
    "the quick brown fox jumps over the lazy dog",
    "a wearable camera sends its frames to the phone in your pocket",
    "please call stella and ask her to bring these things from the store",
    "bluetooth low energy sends small packets every few milliseconds",
    "turn left at the old oak tree and follow the river to the bridge",
    "the meeting has been moved to thursday afternoon at half past seven",
    "fresh coffee smells wonderful early in the morning",
    "exit parking station platform office library museum garden kitchen",
    "open closed push pull stop danger warning entrance coffee tea bread",
    "north south east west street avenue road square market bakery",
    "monday tuesday wednesday friday saturday sunday january april june",
    "2024 1999 42 7 365 100 88 12 2 3 9 404 5g 10am 6pm",
) for w in s.split()}))


def _font(size: int) -> Any:
    from PIL import ImageFont

    return ImageFont.load_default(size=size)  # Pillow's scalable built-in font (FreeType)


def _colours(rng: np.random.Generator, bg: np.ndarray) -> tuple[int, int, int]:
    """A text colour that stands out from the background's mean brightness."""
    dark = float(bg.mean()) > 127
    lo, hi = (0, 70) if dark else (185, 256)
    return tuple(int(v) for v in rng.integers(lo, hi, size=3))  # type: ignore[return-value]


def render_word(word: str, background: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``word`` written on a crop of ``background`` (RGB uint8), tight around the text with a
    small margin: what a text detector would hand the recogniser."""
    from PIL import Image, ImageDraw

    size = int(rng.integers(22, 44))
    font = _font(size)
    box = ImageDraw.Draw(Image.new("RGB", (8, 8))).textbbox((0, 0), word, font=font)
    tw, th = int(box[2] - box[0]), int(box[3] - box[1])
    mx, my = int(rng.integers(2, 10)), int(rng.integers(2, 8))
    w, h = tw + 2 * mx, th + 2 * my
    bh, bw = background.shape[:2]
    top = int(rng.integers(0, max(bh - h, 0) + 1))
    left = int(rng.integers(0, max(bw - w, 0) + 1))
    crop = np.array(Image.fromarray(background[top:top + h, left:left + w]).resize((w, h)))
    img = Image.fromarray(crop)
    ImageDraw.Draw(img).text((mx - box[0], my - box[1]), word, font=font,
                             fill=_colours(rng, crop))
    return np.asarray(img)


def characters(source: onnx.ModelProto) -> list[str]:
    """The recogniser's classes, from the ``character`` dictionary the wheel's model carries in
    its metadata: class 0 is the CTC blank, then the 6,623 characters, then the space."""
    text = next((p.value for p in source.metadata_props if p.key == "character"), None)
    if text is None:
        raise ModelError("the recogniser's ONNX file has no 'character' metadata (its "
                         "dictionary); expected rapidocr-onnxruntime's ch_PP-OCRv4_rec_infer")
    chars = ["<blank>", *text.split("\n"), " "]
    if len(chars) != REC_CLASSES:
        raise ModelError(f"the recogniser's dictionary has {len(chars)} classes; expected "
                         f"{REC_CLASSES}")
    return chars


def encode(word: str, chars: list[str]) -> list[int]:
    """``word`` as the recogniser's class ids (what a perfect greedy CTC decoding gives)."""
    index = {c: i for i, c in enumerate(chars) if i}
    missing = [c for c in word if c not in index]
    if missing:
        raise ModelError(f"{word!r}: {missing[0]!r} is not in the recogniser's dictionary")
    return [index[c] for c in word]


def word_set(n: int, photos: list[np.ndarray], chars: list[str],
             seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` word crops for the recogniser ([n, 3, 48, 320]) and their labels: word
    ``i % len(WORDS)`` on photo ``i % len(photos)``, its class ids (:func:`encode`) padded with
    -1 to :data:`REC_STEPS` ([n, 40] int64)."""
    rng = np.random.default_rng(seed)
    xs = []
    labels = np.full((n, REC_STEPS), -1, np.int64)
    for i in range(n):
        word = WORDS[i % len(WORDS)]
        xs.append(preprocess_rec(render_word(word, photos[i % len(photos)], rng))[0])
        ids = encode(word, chars)
        labels[i, :len(ids)] = ids
    return np.stack(xs), labels


def word_of(label: np.ndarray, chars: list[str]) -> str:
    """The word a label row (class ids padded with -1) spells."""
    return "".join(chars[int(c)] for c in np.asarray(label).reshape(-1) if c >= 0)


def render_page(background: np.ndarray, rng: np.random.Generator,
                tries: int = 30) -> tuple[np.ndarray, np.ndarray]:
    """``background`` with 1-4 lines of 1-4 words each at random places and sizes, apart from
    each other (a line that finds no free place in ``tries`` is left out), and the lines'
    boxes: ``[MAX_LINES, 4]`` (x0, y0, x1, y1) in fractions of the detector's square input
    (the image padded right and bottom, :func:`preprocess_det`), tight around the ink, rows of
    -1 after the last line."""
    from PIL import Image, ImageDraw

    img = Image.fromarray(background)
    draw = ImageDraw.Draw(img)
    h, w = background.shape[:2]
    side = max(h, w)
    boxes = np.full((MAX_LINES, 4), -1.0, np.float32)
    taken: list[tuple[int, int, int, int]] = []
    for _ in range(int(rng.integers(1, 5))):
        words = " ".join(WORDS[int(j)] for j in rng.integers(0, len(WORDS),
                                                             int(rng.integers(1, 5))))
        font = _font(int(side * rng.uniform(0.035, 0.09)))
        ink = [int(v) for v in draw.textbbox((0, 0), words, font=font)]
        tw, th = ink[2] - ink[0], ink[3] - ink[1]
        if tw >= w or th >= h:
            continue
        for _ in range(tries):
            x = int(rng.integers(0, w - tw)) - ink[0]
            y = int(rng.integers(0, h - th)) - ink[1]
            box = (x + ink[0], y + ink[1], x + ink[2], y + ink[3])
            gap = th // 2  # lines at least half a line apart: one region each
            if all(box[0] >= b[2] + gap or box[2] + gap <= b[0] or box[1] >= b[3] + gap
                   or box[3] + gap <= b[1] for b in taken):
                break
        else:
            continue
        patch = background[box[1]:box[3], box[0]:box[2]]
        draw.text((x, y), words, font=font, fill=_colours(rng, patch if patch.size else
                                                         background))
        boxes[len(taken)] = [v / side for v in box]
        taken.append(box)
    return np.asarray(img), boxes


def page_set(backgrounds: list[np.ndarray], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Each background (an RGB photo) with text on it, for the detector: [n, 3, 640, 640], and
    each page's line boxes (:func:`render_page`): [n, MAX_LINES, 4]."""
    rng = np.random.default_rng(seed)
    pages = [render_page(b, rng) for b in backgrounds]
    return (np.stack([preprocess_det(p)[0] for p, _ in pages]),
            np.stack([b for _, b in pages]))
