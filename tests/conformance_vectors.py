"""Writes docs/conformance/vectors.json: byte-exact conformance vectors of docs/PROTOCOL.md.

Run ``.venv/bin/python -m tests.conformance_vectors`` (``--check``: only compare with the
committed file). Each vector is built here with coinf's own encoders (or by hand, for the bytes
coinf never sends), run through coinf's receiver (:mod:`tests.conformance`), and written with
the outcome. Bodies made by a codec library (Pillow, soundfile, zstandard: their bytes may
differ between versions) are kept as committed once made. The intent of every vector (valid,
or the one error) is stated here too: a vector whose outcome is not its intent stops the
generator, so the file never records a surprise.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from tests import conformance
from tests.conformance_cases import bundle_manifest, context_identity, every_case
from tests.conformance_cases_packed import LIBRARY_MADE

HEADER = {
    "format": "coinf-conformance-vectors",
    "version": 1,
    "protocol": 2,
    "spec": "docs/PROTOCOL.md",
    "generated_by": "python -m tests.conformance_vectors",
}


def build() -> dict[str, Any]:
    """The whole file, every outcome computed by coinf's receivers."""
    ctx = {"identity": context_identity(), "bundle": bundle_manifest()}
    vectors = []
    seen: set[str] = set()
    before = _committed()
    for case in every_case():
        intent = case.pop("intent")
        if case["id"] in LIBRARY_MADE and case["id"] in before:
            case["hex"] = before[case["id"]]  # made once by Pillow, soundfile or zstandard
        if case["id"] in seen:
            raise SystemExit(f"duplicate vector id {case['id']}")
        seen.add(case["id"])
        if not conformance.runnable(case):
            raise SystemExit(f"{case['id']}: needs {case['needs']}, not installed here")
        got = conformance.outcome(case, ctx)
        status = _status(got)
        if status != intent:
            raise SystemExit(f"{case['id']}: intended {intent}, coinf gives {got}")
        vectors.append({**case, "expect": got})
    return {**HEADER, "context": ctx, "vectors": vectors}


def _committed() -> dict[str, str]:
    """The bytes of the committed file's vectors, by id (none: a first run)."""
    try:
        return {v["id"]: v.get("hex", "") for v in conformance.load()["vectors"]}
    except (OSError, ValueError, KeyError):
        return {}


def _status(got: dict[str, Any]) -> str:
    if "steps" in got:  # chunks: the last step decides
        last = got["steps"][-1]
        return last["error"] if isinstance(last, dict) and "error" in last else "ok"
    return "ok" if "ok" in got else str(got["error"])


def text(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=False, ensure_ascii=True) + "\n"


def main(argv: list[str]) -> int:
    logging.disable(logging.WARNING)  # the refused frames' log lines are expected here
    out = text(build())
    if "--check" in argv:
        same = conformance.VECTORS.read_text() == out
        print("vectors.json is up to date" if same else "vectors.json differs: regenerate it")
        return 0 if same else 1
    conformance.VECTORS.parent.mkdir(parents=True, exist_ok=True)
    conformance.VECTORS.write_text(out)
    n = out.count('"layer":')
    print(f"wrote {conformance.VECTORS.relative_to(conformance.ROOT)}: {n} vectors, "
          f"{len(out.encode())} B")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
