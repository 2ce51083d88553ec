"""Every committed zoo model splits, and every candidate composes to the whole model."""

from __future__ import annotations

from pathlib import Path

import pytest
from coinf.convert.split import split_model

from tests.test_convert_split import check_invariants

ZOO = sorted((Path(__file__).resolve().parent.parent / "models" / "onnx").glob("*.onnx"))


@pytest.mark.parametrize("model", ZOO, ids=[p.stem for p in ZOO])
def test_zoo_model_composes(model: Path, tmp_path: Path) -> None:
    check_invariants(split_model(model, tmp_path / "b", verify=True))
