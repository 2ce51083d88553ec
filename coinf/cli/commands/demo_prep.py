"""What ``coinf demo`` prepares before anything runs: the model, its bundle, its calibration.

A pretrained model (``coinf models list``) is built from its package, split and verified, and
calibrated on real inputs with its task's metric: the standard codecs and the quantizing
packings on the model input, the quantizing packings at the cuts that send the fewest bytes.
Everything is kept in ``--out`` and reused while the model file and the request are the same.
A zoo model (random weights) is split only; its packings stay uncalibrated (raw).

Learned bottlenecks are never trained here: ``coinf demo --learned BUNDLE`` copies those that
``coinf compress`` trained into another bundle of the same model file (:func:`import_learned`),
and the planner weighs them like any packing; a bundle that already has some keeps them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from coinf.cli.bench import progress

#: split cuts calibrated besides the model input: those that send the fewest bytes
CUTS = 3


@dataclass
class Prepared:
    """The demo's model: its bundle, where it came from, a held-out real input."""

    bundle_dir: Path
    info: dict[str, Any]  # name, package, version, license, sha256, pretrained
    input_file: Path | None  # a real input (.npy) for the end-to-end runs
    description: str


def ensure_bundle(model: Path, out: Path, post: str | None = None) -> Path:
    """Split ``model`` into ``out`` (verified; ``post``: convert/post.py) unless a bundle of
    this very file and post-processing is there."""
    from coinf.bundle import MANIFEST, Bundle, sha256_file
    from coinf.convert.split import split_model

    if (out / MANIFEST).is_file():
        try:
            meta = Bundle.load(out).meta
            if meta.get("source", {}).get("sha256") == sha256_file(model) and \
                    (meta.get("post") or {}).get("spec") == post:
                progress(f"reusing bundle {out}")
                return out
        except Exception as exc:  # a damaged bundle is rebuilt, whatever is wrong with it
            progress(f"rebuilding bundle {out} ({exc})")
    progress(f"splitting {model} into {out} ...")
    t0 = time.perf_counter()
    split_model(model, out, verify=True, force=True, post=post)
    progress(f"split + verify took {time.perf_counter() - t0:.1f} s")
    return out


def import_learned(src: Path, bundle_dir: Path) -> list[str]:
    """Copy the learned bottlenecks of bundle ``src`` (same model file, same cuts) into the
    bundle at ``bundle_dir``, replacing any of the same cut and lambda; their ``cut~gN`` ids.
    Anything else is one :class:`~coinf.errors.UserError`."""
    from coinf.bundle import Bundle
    from coinf.convert import bottleneck as bn
    from coinf.errors import BundleError, UserError

    try:
        source = Bundle.load(src)
    except (BundleError, OSError, ValueError) as exc:
        raise UserError(f"--learned {src}: {exc}") from None
    dst = Bundle.load(bundle_dir)
    if source.model_sha256 != dst.model_sha256:
        raise UserError(f"--learned {src}: a bundle of another model file (sha256 "
                        f"{source.model_sha256[:12]}, the demo's is {dst.model_sha256[:12]})")
    learned = [c for c in source.compressors() if c.kind == "learned"]
    if not learned:
        raise UserError(f"--learned {src}: the bundle holds no learned bottleneck (`coinf "
                        f"compress` trains them)")
    ids = []
    for cid in dict.fromkeys(c.candidate for c in learned):
        theirs, ours = source.candidate(cid), next(
            (c for c in dst.candidates if c.id == cid), None)
        if ours is None or ours.crossing != theirs.crossing:
            raise UserError(f"--learned {src}: its cut {cid} is not the demo bundle's")
        points = [bn.Trained(float(c.lam or 0.0), source.path(c.encoder), source.path(c.decoder),
                             source.path(c.priors or ""), c.code.shape, c.flops,
                             c.accuracy["raw"], float(c.rate_bytes or 0.0), int(c.test_feeds or 0),
                             c.code_bytes.get("latent"), c.code_ms.get("latent"))
                  for c in learned if c.candidate == cid]
        dst = bn.register(dst, ours, points)
        ids += [f"{cid}~g{c.gamma}" for c in dst.compressors(cid) if c.kind == "learned"]
    return ids


def prepare(name: str, out: Path, samples: int, learned: Path | None = None) -> Prepared:
    """Build, split and calibrate ``name`` (a pretrained or a zoo model) under ``out``; with
    ``learned``, copy that bundle's learned bottlenecks in (:func:`import_learned`)."""
    from coinf.models import pretrained, zoo

    if name in pretrained.PRETRAINED:
        spec = pretrained.spec_for(name)
        onnx_path = out / spec.file_name()
        if not onnx_path.is_file():
            progress(f"building {name} from {spec.requirement} (no torch needed)")
            pretrained.build(name, out)
        bundle_dir = ensure_bundle(onnx_path, out / name, spec.post)
        calibrate(bundle_dir, name, out, samples, spec.metric, list(spec.metric_outputs))
        if learned is not None:
            progress(f"learned bottlenecks from {learned}: "
                     f"{', '.join(import_learned(learned, bundle_dir))}")
        info = {"name": name, "package": spec.package, "version": spec.version,
                "license": spec.licence, "sha256": spec.sha256, "pretrained": True,
                "task": spec.task}
        return Prepared(bundle_dir, info, held_out_input(name, out), spec.description)
    if name not in zoo.ZOO:
        from coinf.errors import UserError

        raise UserError(f"unknown model {name!r}; pretrained: {', '.join(pretrained.PRETRAINED)}"
                        f"; zoo (random weights): {', '.join(zoo.ZOO)}")
    bundle_dir = ensure_bundle(zoo.committed_path(name), out / name)
    if learned is not None:
        progress(f"learned bottlenecks from {learned}: "
                 f"{', '.join(import_learned(learned, bundle_dir))}")
    info = {"name": name, "package": "coinf (models/onnx)", "version": "committed",
            "license": "Apache-2.0", "pretrained": bool(zoo.spec_for(name).trained),
            "task": "classification"}
    return Prepared(bundle_dir, info, None, zoo.spec_for(name).description)


def _request(name: str, samples: int, metric: str, outputs: list[str]) -> dict[str, Any]:
    from coinf.models.realdata import data_version

    request = {"model": name, "samples": samples, "metric": metric, "outputs": outputs,
               "cuts": CUTS, "version": 1}
    version = data_version(name)
    return request if version == 1 else {**request, "data": version}


def calibrate(bundle_dir: Path, name: str, out: Path, samples: int, metric_name: str,
              outputs: list[str]) -> None:
    """Calibrate the input and the ``CUTS`` cheapest cuts on ``samples`` real inputs, unless
    the bundle already holds this very calibration."""
    from coinf.bundle import Bundle
    from coinf.convert import calibrate as cal
    from coinf.convert.metrics import parse_metric
    from coinf.convert.packcal import Options
    from coinf.models import realdata

    bundle = Bundle.load(bundle_dir)
    want = _request(name, samples, metric_name, outputs)
    if bundle.meta.get("demo_calibration") == want:
        progress(f"reusing the calibration in {bundle_dir} ({samples} real inputs)")
        return
    data_path = out / realdata.data_file(name, samples)
    if not data_path.is_file():
        progress(f"making {samples} real inputs for calibration ...")
        realdata.write_npz(name, data_path, samples, seed=0)
    data = cal.load_dataset(str(data_path), bundle)
    opts = Options(metric=parse_metric(metric_name, outputs, [t.name for t in bundle.outputs]))
    splits = sorted((c for c in bundle.candidates
                     if not (c.is_handheld_only or c.is_wearable_only)),
                    key=lambda c: c.crossing_bytes)[:CUTS]
    jobs = [(bundle.candidates[0].id, cal.DEFAULT_SPECS),
            *((c.id, cal.SPLIT_SPECS) for c in splits)]
    progress(f"calibrating {', '.join(c for c, _ in jobs)} on {len(data)} real inputs ...")
    results = calibrate_jobs(bundle_dir, data_path, jobs, opts)
    cal.store(bundle, results, data, opts)
    bundle = Bundle.load(bundle_dir)
    bundle.meta["demo_calibration"] = want
    bundle.save()


def calibrate_jobs(bundle_dir: Path, data_path: Path, jobs: list[tuple[str, tuple[str, ...]]],
                   opts: Any) -> dict[str, list[dict[str, Any]]]:
    """The packing tables of ``jobs`` (candidate id, packings), one process per core."""
    from coinf.convert.pool import calibrate_many

    return calibrate_many(bundle_dir, data_path, jobs, opts, progress=progress)


def held_out_input(name: str, out: Path) -> Path:
    """One real input that calibration did not see (another seed), as ``.npy``."""
    from coinf.models import realdata

    path = out / f"{name}-input.npy"
    if not path.is_file():
        from coinf.models.pretrained import spec_for

        arrays, _ = realdata.dataset(name, 1, seed=12345)
        array = arrays[spec_for(name).inputs[0].name]  # not its label
        np.save(path, np.ascontiguousarray(array[:1]))
    return path


def describe(prep: Prepared) -> str:
    i = prep.info
    kind = "pretrained by its publisher" if i["pretrained"] else "random weights (a zoo model)"
    return (f"{i['name']}: {prep.description} -- {kind}; {i['package']} {i['version']}, "
            f"licence {i['license']}")
