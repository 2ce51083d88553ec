"""The CLI's shared contracts: every benchmark accepts ``--json``; user errors exit 2 quietly."""

from __future__ import annotations

import pytest

from coinf.bench import BENCHES
from coinf.cli import build_parser, main


@pytest.mark.parametrize("name", [b[0] for b in BENCHES])
def test_every_bench_accepts_json(name: str) -> None:
    parser = build_parser()
    required = {"plan": ["--bundle", "b"], "predict": ["--bundle", "b"],
                "stream": ["--bundle", "b"], "overhead": ["m.onnx"]}
    args = parser.parse_args(["bench", name, *required.get(name, []), "--json"])
    assert args.json is True


def test_missing_bundle_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "predict", "--bundle", "/nonexistent/bundle", "--json"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "/nonexistent/bundle" in err


def test_missing_optional_dependency_is_a_one_line_error(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A Pi with only coinf[wearable] gets the extra to install, not a traceback."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "scipy" else real(name, *a))
    assert main(["bench", "mincut", "--repeats", "1"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "coinf[convert]" in err and "scipy" in err
    assert main(["profile", "--train", "--quick", "--out", "/nonexistent/p.json"]) == 2
    err = capsys.readouterr().err
    assert "coinf[train]" in err and "scipy" in err
