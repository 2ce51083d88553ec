"""Labelled crops for PaddleOCR's text-orientation classifier (``ch_ppocr_mobile_v2.0_cls``).

The classifier that ships in ``rapidocr-onnxruntime`` beside the detector and the recogniser
says whether a text crop is upright (class 0) or turned 180 degrees (class 1). Nothing in coinf
was tuned on it: it is one of the models ``coinf compress`` is judged on without code changes
(docs/BOTTLENECK.md). This writes its inputs as a user would: words rendered by the same
renderer on the wheels' photos (:func:`coinf.models.ocr.render_word`), half of them turned,
resized to height 48 keeping the aspect, padded right to 192 and normalised as rapidocr does.
``--words test`` spells the 115 words of the labelled recogniser set; ``--words train``
seeded pseudo-words that are none of them (:func:`coinf.research.ocr_train_data.
pseudo_words`), so training and judged crops never share a word::

    python -m coinf.research.ocr_cls_data --words train -n 1200 --out /tmp/cls-train.npz
    python -m coinf.research.ocr_cls_data --words test -n 400 --seed 7 --out /tmp/cls-test.npz

Each file holds ``x`` (N, 3, 48, 192) float32 and ``labels`` (N,) int64.
"""

from __future__ import annotations

import argparse

import numpy as np
from coinf.models import ocr, realdata
from coinf.research.ocr_train_data import pseudo_words

#: the classifier's input height and width (rapidocr's ``cls_image_shape``)
CLS_SHAPE = (48, 192)


def preprocess_cls(rgb: np.ndarray) -> np.ndarray:
    """[1, 3, 48, 192]: height 48 keeping the aspect (width at most 192), normalised to
    [-1, 1], zero on the right."""
    from PIL import Image

    a = np.asarray(rgb, dtype=np.uint8)[..., :3]
    h, w = CLS_SHAPE
    width = int(min(w, max(8, round(a.shape[1] * h / max(a.shape[0], 1)))))
    img = Image.fromarray(a).resize((width, h), Image.Resampling.BILINEAR)
    x = np.asarray(img, dtype=np.float32) / 255.0
    out = np.zeros((1, 3, h, w), np.float32)
    out[..., :width] = ((x - 0.5) / 0.5).transpose(2, 0, 1)[None]
    return out


def crops(n: int, words: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` inputs and labels (1 = turned 180 degrees, every other crop) of ``words``
    ("train": pseudo-words, "test": the recogniser set's words) on the photos."""
    rng = np.random.default_rng(seed)
    pics = [p for _, p in realdata.photos()]
    spelt = (pseudo_words(n, rng) if words == "train"
             else [ocr.WORDS[int(k)] for k in rng.integers(0, len(ocr.WORDS), n)])
    xs, labels = [], []
    for i, word in enumerate(spelt):
        img = ocr.render_word(word, pics[i % len(pics)], rng)
        turned = i % 2 == 1
        xs.append(preprocess_cls(img[::-1, ::-1] if turned else img)[0])
        labels.append(int(turned))
    return np.stack(xs).astype(np.float32), np.asarray(labels, np.int64)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the .npz to write")
    ap.add_argument("--words", choices=("train", "test"), default="train")
    ap.add_argument("-n", type=int, default=1200, help="crops (default 1200)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    x, labels = crops(args.n, args.words, args.seed)
    np.savez(args.out, x=x, labels=labels)
    print(f"{args.out}: {len(x)} crops {list(x.shape[1:])}, {int(labels.sum())} turned")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
