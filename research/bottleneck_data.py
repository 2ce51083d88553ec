"""Real photos for ``coinf compress`` on an image model, split by photo, and the standard codecs'
bytes and agreement on the held-out inputs (docs/BOTTLENECK.md, "Today's figures").

The photos: the wheels' own (:func:`coinf.models.realdata.photos`: scikit-image, scikit-learn),
matplotlib's ``grace_hopper.jpg``, and the photographs among the wallpapers of three Debian
packages, unpacked without installing them::

    cd /tmp/wp && apt-get download mate-backgrounds ukui-wallpapers plasma-workspace-wallpapers
    for f in *.deb; do dpkg -x "$f" /tmp/wp/root; done
    python -m coinf.research.bottleneck_data --model mobilenetv2_imagenet --root /tmp/wp/root \\
        --out /tmp/bn -n 2400 --n-test 300

Licences (each package's ``usr/share/doc/*/copyright``): mate-backgrounds GPL-2+, ukui-wallpapers
(Kleiber, Infinite-Sea) CC-BY-SA-3.0, plasma-workspace-wallpapers GPL-2+/LGPL/CC-BY-SA; they are
read, never committed. Test photos (:data:`TEST`) are never cropped into the training set; every
feed is a seeded :func:`~coinf.models.realdata.augment` crop (scale, aspect, flip, colour).
"""

from __future__ import annotations

import argparse
import importlib.util
import io
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from coinf.models import realdata
from coinf.models.pretrained import spec_for

from coinf.errors import InputError

#: wallpapers that are photographs (the rest of those packages is drawn or rendered art)
MATE_NATURE = ("Aqua", "Blinds", "Dune", "FreshFlower", "Garden", "GreenMeadow", "LadyBird",
               "RainDrops", "Storm", "TwoWings", "Wood", "YellowFlower")
UKUI = ("Kleiber_by_Lukas_Baubkus", "Infinite-Sea_by_Aury88")
PLASMA = ("BytheWater", "ColdRipple", "ColorfulCups", "DarkestHour", "EveningGlow",
          "FallenLeaf", "Grey", "Kite", "OneStandsOut", "Path", "summer_1am")
#: held out: never cropped into training
TEST = frozenset({"chelsea.png", "rocket.jpg", "flower.jpg", "grace_hopper.jpg", "LadyBird",
                  "Storm", "ColorfulCups", "BytheWater", "Kite"})
#: shorter side of a decoded photo (the wallpapers are up to 5120 px wide)
MAX_SIDE = 1024


def _load(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as src:
        img = src.convert("RGB")
    short = min(img.size)
    if short > MAX_SIDE:
        img = img.resize((round(img.size[0] * MAX_SIDE / short),
                          round(img.size[1] * MAX_SIDE / short)), Image.Resampling.BILINEAR)
    return np.asarray(img)


def photos(root: Path | None) -> list[tuple[str, np.ndarray]]:
    """(name, RGB uint8) of every photo found: the wheels', matplotlib's, and under ``root``
    (an unpacked file system of the Debian packages) the wallpaper photographs."""
    found = list(realdata.photos())
    spec = importlib.util.find_spec("matplotlib")
    if spec is not None and spec.submodule_search_locations:
        hopper = Path(next(iter(spec.submodule_search_locations))) / "mpl-data" / \
            "sample_data" / "grace_hopper.jpg"
        if hopper.is_file():
            found.append((hopper.name, _load(hopper)))
    if root is not None:
        share = root / "usr" / "share"
        for name in MATE_NATURE:
            p = share / "backgrounds" / "mate" / "nature" / f"{name}.jpg"
            if p.is_file():
                found.append((name, _load(p)))
        for name in UKUI:
            p = share / "backgrounds" / f"{name}.jpg"
            if p.is_file():
                found.append((name, _load(p)))
        for name in PLASMA:
            images = sorted((share / "wallpapers" / name / "contents" / "images").glob("*"))
            if images:
                found.append((name, _load(max(images, key=lambda f: f.stat().st_size))))
    return found


def feeds(model: str, pics: Sequence[tuple[str, np.ndarray]], n: int, seed: int) -> np.ndarray:
    """``n`` augmented crops cycling through ``pics``, preprocessed for ``model``."""
    pre = spec_for(model).preprocess
    if pre is None:
        raise InputError(f"{model} does not take images")
    rng = np.random.default_rng(seed)
    return np.stack([pre(realdata.augment(pics[i % len(pics)][1], rng))[0]
                     for i in range(n)]).astype(np.float32)


# -- the standard codecs on the same inputs -----------------------------------------------------
MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)


def to_rgb(x: np.ndarray) -> np.ndarray:
    """ImageNet-normalised NCHW floats back to the uint8 HxWx3 crops they came from (exact)."""
    return np.clip(np.rint((x * STD + MEAN) * 255), 0, 255).astype(np.uint8).transpose(0, 2, 3, 1)


def from_rgb(u: np.ndarray) -> np.ndarray:
    return ((u.transpose(0, 3, 1, 2).astype(np.float32) / 255 - MEAN) / STD).astype(np.float32)


def _pil(fmt: str, **kw: object) -> Callable[[np.ndarray], tuple[int, np.ndarray]]:
    from PIL import Image

    def run(im: np.ndarray) -> tuple[int, np.ndarray]:
        buf = io.BytesIO()
        Image.fromarray(im).save(buf, fmt, **kw)
        data = buf.getvalue()
        return len(data), np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))

    return run


def _jpeg(q: int) -> Callable[[np.ndarray], tuple[int, np.ndarray]]:
    import simplejpeg

    def run(im: np.ndarray) -> tuple[int, np.ndarray]:
        data = simplejpeg.encode_jpeg(im, quality=q, colorspace="RGB")
        return len(data), simplejpeg.decode_jpeg(data)

    return run


def codec_table(model_path: Path, x: np.ndarray) -> list[tuple[str, float, float]]:
    """(codec, mean bytes, top-1 agreement loss in pp) of PNG, lossless WebP, JPEG and WebP at
    several qualities on the inputs ``x`` (an image classifier's, ImageNet-normalised)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name

    def top1(batch: np.ndarray) -> np.ndarray:
        return np.array([int(np.argmax(sess.run(None, {name: batch[i:i + 1]})[0]))
                         for i in range(len(batch))])

    rgb = to_rgb(x)
    ref = top1(from_rgb(rgb))
    codecs: list[tuple[str, Callable[[np.ndarray], tuple[int, np.ndarray]]]] = [
        ("png", _pil("PNG")), ("webp lossless", _pil("WEBP", lossless=True))]
    codecs += [(f"jpeg q{q}", _jpeg(q)) for q in (100, 98, 95, 90, 80)]
    codecs += [(f"webp q{q}", _pil("WEBP", quality=q)) for q in (100, 95, 90, 80)]
    rows = []
    for label, codec in codecs:
        sizes, decoded = zip(*[codec(np.ascontiguousarray(im)) for im in rgb], strict=True)
        agree = float(np.mean(top1(from_rgb(np.stack(decoded))) == ref))
        rows.append((label, float(np.mean(sizes)), 100 * (1 - agree)))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m coinf.research.bottleneck_data")
    ap.add_argument("--model", default="mobilenetv2_imagenet")
    ap.add_argument("--root", type=Path, default=None,
                    help="where the wallpaper packages were unpacked (dpkg -x)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("-n", type=int, default=2400)
    ap.add_argument("--n-test", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--codecs", type=Path, default=None, metavar="MODEL_ONNX",
                    help="also print the codec table on the test inputs with this model")
    args = ap.parse_args(argv)
    pics = photos(args.root)
    train = [p for p in pics if p[0] not in TEST]
    test = [p for p in pics if p[0] in TEST]
    if not train or not test:
        raise SystemExit("no photos found for one side of the split")
    args.out.mkdir(parents=True, exist_ok=True)
    x_test = feeds(args.model, test, args.n_test, args.seed + 1)
    np.savez(args.out / "train.npz", image=feeds(args.model, train, args.n, args.seed))
    np.savez(args.out / "test.npz", image=x_test)
    print(f"{len(train)} training photos: {', '.join(p[0] for p in train)}")
    print(f"{len(test)} held-out photos: {', '.join(p[0] for p in test)}")
    print(f"wrote {args.out}/train.npz ({args.n} feeds), {args.out}/test.npz ({args.n_test})")
    if args.codecs is not None:
        for label, size, loss in codec_table(args.codecs, x_test):
            print(f"{label:14s} {size / 1000:8.2f} kB  {loss:5.1f} pp")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
