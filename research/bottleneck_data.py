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

The larger held-out set adds 85 photographs that are only ever held out (:func:`held_out`), from
two more packages unpacked into a second root (so that lomiri's copies of two ukui wallpapers
cannot replace the training ones)::

    cd /tmp/wp2 && apt-get download lomiri-wallpapers-16.04 gcompris-qt-data
    for f in *.deb; do dpkg -x "$f" /tmp/wp2/root; done
    python -m coinf.research.bottleneck_data --root /tmp/wp/root --root /tmp/wp2/root \
        --out /tmp/bn2 --n-test 1880 --test-only --codecs MODEL.onnx

* lomiri-wallpapers-16.04 (:data:`LOMIRI`): 12 photographs (2018, each by the photographer its
  file name gives), CC-BY-4.0 / CC-BY-SA-4.0 / CC0-1.0 (per file in its copyright);
* gcompris-qt-data (:data:`GCOMPRIS`): the 49 monument, 15 wild and 9 farm animal photographs
  of three activities (Wikimedia Commons photographs; the copyright file gives CC-BY-SA-2.0/4.0
  or GFDL for ten of the wild animals and the package's GPL-3 / GPL-3+ for the rest), read out
  of the package's Qt resource files by :mod:`coinf.research.qrcc`.
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
#: lomiri-wallpapers-16.04's photographs (its renders and the two ukui duplicates left out)
LOMIRI = ("Bridge_by_Sander_Klootwijk", "Dragonfly_by_Bolly", "Picture_0B_by_freespace",
          "Picture_1A_by_freespace", "Wine_by_Jakkub_Mede", "aitzgorri_by_Aitzol_Berasategi",
          "free_by_Peter_Nerlich", "friends_by_Aitzol_Berasategi", "life_by_Aitzol_Berasategi",
          "picosdeeuropa_by_Aitzol_Berasategi", "seeding_by_Clements_Engelhardt",
          "sunset_by_Aitzol_Berasategi")
#: gcompris-qt-data activities whose ``resource/<folder>/`` pictures are all photographs
GCOMPRIS = ("explore_monuments", "explore_world_animals", "explore_farm_animals")
#: held out: never cropped into training (with every LOMIRI and GCOMPRIS photo, held_out())
TEST = frozenset({"chelsea.png", "rocket.jpg", "flower.jpg", "grace_hopper.jpg", "LadyBird",
                  "Storm", "ColorfulCups", "BytheWater", "Kite"})
#: shorter side of a decoded photo (the wallpapers are up to 5120 px wide)
MAX_SIDE = 1024


def held_out(name: str) -> bool:
    """Whether photo ``name`` (as :func:`photos` names it) is only ever a test photo."""
    return name in TEST or name in LOMIRI or name.split("/")[0] in GCOMPRIS


def _load(path: Path | bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(path) if isinstance(path, bytes) else path) as src:
        img = src.convert("RGB")
    short = min(img.size)
    if short > MAX_SIDE:
        img = img.resize((round(img.size[0] * MAX_SIDE / short),
                          round(img.size[1] * MAX_SIDE / short)), Image.Resampling.BILINEAR)
    return np.asarray(img)


def _gcompris(share: Path) -> list[tuple[str, np.ndarray]]:
    from coinf.research import qrcc

    found = []
    for activity in GCOMPRIS:
        rcc = share / "gcompris-qt" / "rcc" / f"{activity}.rcc"
        if not rcc.is_file():
            continue
        for path, data in sorted(qrcc.files(rcc.read_bytes())):
            parts = path.split("/")
            if (len(parts) >= 3 and parts[-3] == "resource"
                    and parts[-1].lower().endswith((".webp", ".jpg", ".jpeg", ".png"))):
                found.append((f"{activity}/{parts[-1].rsplit('.', 1)[0]}", _load(data)))
    return found


def photos(roots: Sequence[Path] | Path | None) -> list[tuple[str, np.ndarray]]:
    """(name, RGB uint8) of every photo found: the wheels', matplotlib's, and under each of
    ``roots`` (an unpacked file system of the Debian packages) the packages' photographs."""
    found = list(realdata.photos())
    spec = importlib.util.find_spec("matplotlib")
    if spec is not None and spec.submodule_search_locations:
        hopper = Path(next(iter(spec.submodule_search_locations))) / "mpl-data" / \
            "sample_data" / "grace_hopper.jpg"
        if hopper.is_file():
            found.append((hopper.name, _load(hopper)))
    if isinstance(roots, Path):
        roots = [roots]
    for root in roots or ():
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
        for name in LOMIRI:
            p = share / "backgrounds" / f"{name}.jpg"
            if p.is_file():
                found.append((name, _load(p)))
        found += _gcompris(share)
    names = [n for n, _ in found]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise InputError(f"photos found twice (pass each package's root once): {dup}")
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
    ap.add_argument("--root", type=Path, action="append", default=None,
                    help="where the packages were unpacked (dpkg -x); repeatable")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("-n", type=int, default=2400)
    ap.add_argument("--n-test", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--test-only", action="store_true",
                    help="write test.npz only (keep an existing train.npz)")
    ap.add_argument("--packages-only", action="store_true",
                    help="train on the Debian packages' photographs alone: every photo of the "
                    "wheels (what `coinf bench rate --model` and the demo measure on) stays "
                    "out of training")
    ap.add_argument("--codecs", type=Path, default=None, metavar="MODEL_ONNX",
                    help="also print the codec table on the test inputs with this model")
    args = ap.parse_args(argv)
    pics = photos(args.root)
    wheels = {name for name, _ in realdata.photos()} | {"grace_hopper.jpg"}
    train = [p for p in pics if not held_out(p[0])
             and not (args.packages_only and p[0] in wheels)]
    test = [p for p in pics if held_out(p[0])]
    if not train or not test:
        raise SystemExit("no photos found for one side of the split")
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"{len(train)} training photos: {', '.join(p[0] for p in train)}")
    print(f"{len(test)} held-out photos: {', '.join(p[0] for p in test)}", flush=True)
    x_test = feeds(args.model, test, args.n_test, args.seed + 1)
    np.savez(args.out / "test.npz", image=x_test)
    print(f"wrote {args.out}/test.npz ({args.n_test} feeds)", flush=True)
    if not args.test_only:
        np.savez(args.out / "train.npz", image=feeds(args.model, train, args.n, args.seed))
        print(f"wrote {args.out}/train.npz ({args.n} feeds)", flush=True)
    if args.codecs is not None:
        for label, size, loss in codec_table(args.codecs, x_test):
            print(f"{label:14s} {size / 1000:8.2f} kB  {loss:5.1f} pp")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
