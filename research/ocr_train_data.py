"""Training crops for ``coinf compress`` on the text recogniser, disjoint from its test words.

The labelled test set (``coinf bench rate --model ppocr_rec``) writes the 115 words of
:data:`coinf.models.ocr.WORDS`. A learned bottleneck must never train on them, so its training
crops spell seeded pseudo-words instead (3-10 characters from lower-case letters, digits and a
few capitals, none of them a test word), written by the same renderer on the same wheels' photos
(:func:`coinf.models.ocr.render_word`). Unlabelled: distillation needs no labels::

    python -m coinf.research.ocr_train_data --out /tmp/ocr-train.npz -n 1200
"""

from __future__ import annotations

import argparse

import numpy as np
from coinf.models import ocr, realdata

LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHKLMNPRST"


def pseudo_words(n: int, rng: np.random.Generator) -> list[str]:
    """``n`` seeded strings that are none of the test words."""
    taken = set(ocr.WORDS)
    out: list[str] = []
    while len(out) < n:
        word = "".join(rng.choice(list(LETTERS), int(rng.integers(3, 11))))
        if word not in taken:
            out.append(word)
    return out


def crops(n: int, seed: int) -> np.ndarray:
    """``n`` recogniser inputs ([n, 3, 48, 320] float32) of pseudo-words on the photos."""
    rng = np.random.default_rng(seed)
    pics = [p for _, p in realdata.photos()]
    words = pseudo_words(n, rng)
    return np.stack([ocr.preprocess_rec(ocr.render_word(w, pics[i % len(pics)], rng))[0]
                     for i, w in enumerate(words)]).astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the .npz to write")
    ap.add_argument("-n", type=int, default=1200, help="crops (default 1200)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    x = crops(args.n, args.seed)
    np.savez(args.out, x=x)
    print(f"{args.out}: {len(x)} crops {list(x.shape[1:])} of pseudo-words")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
