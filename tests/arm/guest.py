"""The wearable's side of ``make test-arm``: run under qemu as a Cortex-A53 (aarch64 CPython,
onnxruntime, numpy and coinf from the built wheel). The host-side tests start it with one job:

    guest.py heads BUNDLE IN.npz OUT.npz CID...    run heads with the wearable's SliceRunner
    guest.py pack IN.npz DIR SPEC...               pack every array (DIR/NAME.SPEC.arm.bin) and
                                                   unpack every DIR/*.x86.bin (-> DIR/arm.npz)
    guest.py session BUNDLE ADDR IN.npz OUT.npz CID...  Session.run over a socket link
    guest.py imports OUT.json                      import every module the wheel ships; the
                                                   platform and onnxruntime version

Only the standard library, numpy and coinf: this file is what the host test is testing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def heads(bundle_dir: str, feeds_file: str, out_file: str, *cids: str) -> None:
    from coinf.device.runtime import SliceRunner

    from coinf.bundle import Bundle

    bundle = Bundle.load(bundle_dir)
    feeds = dict(np.load(feeds_file))
    runner = SliceRunner(bundle, capacity=1)
    out = {}
    by_id = {c.id: c for c in bundle.candidates}
    for cid in cids:
        values, _ = runner.run_slice(by_id[cid], "head", feeds)
        out.update({f"{cid}/{k}": v for k, v in values.items()})
    np.savez(out_file, **out)


def pack(arrays_file: str, folder: str, *specs: str) -> None:
    from coinf.ble_protocol.packing import pack as pack_one
    from coinf.ble_protocol.packing import unpack

    arrays = dict(np.load(arrays_file))
    root = Path(folder)
    for name, arr in arrays.items():
        for spec in specs:
            (root / f"{name}.{spec}.arm.bin").write_bytes(pack_one(arr, spec))
    unpacked = {p.name[: -len(".bin")]: unpack(p.read_bytes()) for p in root.glob("*.bin")}
    np.savez(root / "arm.npz", **unpacked)


def session(bundle_dir: str, address: str, feeds_file: str, out_file: str, *cids: str) -> None:
    from coinf import LinkOptions, PlacementOptions, Session, SessionOptions

    feeds = dict(np.load(feeds_file))
    out, stats = {}, {}
    link = LinkOptions(transport=address, fallback=False, connect_timeout=60.0, timeout=120.0)
    for cid in cids:
        opts = SessionOptions(placement=PlacementOptions(split=cid), link=link)
        with Session(bundle_dir, opts) as sess:
            names = [o.name for o in sess.get_outputs()]
            values = sess.run(None, feeds)
            out.update({f"{cid}/{n}": v for n, v in zip(names, values, strict=True)})
            assert sess.last_run is not None
            stats[cid] = sess.last_run.as_dict()
    np.savez(out_file, **out)
    print(json.dumps(stats))


def imports(out_file: str) -> None:
    import importlib
    import pkgutil
    import traceback

    import coinf

    result: dict[str, str] = {}
    names = ["coinf"] + [m.name for m in pkgutil.walk_packages(coinf.__path__, "coinf.")
                         if not m.name.endswith("__main__")]  # that one runs the CLI
    for name in names:
        try:
            importlib.import_module(name)
            result[name] = "ok"
        except ModuleNotFoundError as exc:
            result[name] = f"missing:{exc.name}"
        except Exception:
            result[name] = "error:" + traceback.format_exc(limit=3)
    import platform

    import onnxruntime

    Path(out_file).write_text(json.dumps({
        "file": coinf.__file__, "modules": result, "machine": platform.machine(),
        "python": platform.python_version(), "onnxruntime": onnxruntime.__version__}))


JOBS = {"heads": heads, "pack": pack, "session": session, "imports": imports}

if __name__ == "__main__":
    JOBS[sys.argv[1]](*sys.argv[2:])
