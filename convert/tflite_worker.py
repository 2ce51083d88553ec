"""Convert prepared ONNX slices to float32 TFLite with onnx2tf's TF-free ``flatbuffer_direct``
backend. Run as a script by :mod:`coinf.convert.tflite`, in a child process: onnx2tf prints
progress of its own, may abort or hang on an odd graph, and may live in another interpreter
(``--python``). It imports nothing of coinf, so any Python with onnx2tf can run it.

Usage: ``python tflite_worker.py JOBS.json RESULTS.jsonl``. ``JOBS.json`` is a list of
``{"onnx": path, "tflite": path, "keep": [input names kept in ONNX layout]}``; one JSON line per
job is appended to ``RESULTS.jsonl`` (``{"job": i, "ok": bool, "error": str, "seconds": s}``) as
soon as it is done, so the parent can bound each job's time and resume after a crash.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time


def convert_one(onnx_path: str, tflite_path: str, keep: list[str]) -> None:
    import onnx2tf  # type: ignore[import-not-found,unused-ignore]

    with tempfile.TemporaryDirectory(prefix="coinf-onnx2tf-") as out:
        onnx2tf.convert(
            input_onnx_file_path=onnx_path,
            output_folder_path=out,
            tflite_backend="flatbuffer_direct",
            keep_shape_absolutely_input_names=keep or None,
            copy_onnx_input_output_names_to_tflite=True,
            non_verbose=True,
        )
        stem = os.path.splitext(os.path.basename(onnx_path))[0]
        made = os.path.join(out, f"{stem}_float32.tflite")
        if not os.path.isfile(made):
            raise RuntimeError("onnx2tf wrote no float32 .tflite")
        shutil.move(made, tflite_path)


def main(argv: list[str]) -> int:
    jobs_file, results_file = argv[1], argv[2]
    with open(jobs_file) as f:
        jobs = json.load(f)
    start = int(argv[3]) if len(argv) > 3 else 0
    for i in range(start, len(jobs)):
        job = jobs[i]
        t0 = time.perf_counter()
        try:
            convert_one(job["onnx"], job["tflite"], list(job.get("keep", [])))
            result = {"job": i, "ok": True, "error": ""}
        except BaseException as exc:
            text = str(exc).strip().splitlines()
            result = {"job": i, "ok": False,
                      "error": f"{type(exc).__name__}: {text[0] if text else ''}"[:300]}
        result["seconds"] = round(time.perf_counter() - t0, 3)
        with open(results_file, "a") as f:
            f.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
