"""The house rules of the code (issue 51): no module of the installed packages over 600 lines,
no function over 80, and docs/BENCHMARKS.md a reference of at most 400 lines."""

from __future__ import annotations

import ast
import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def package_files() -> list[Path]:
    """Every .py file of the folders setup.cfg installs under ``coinf``."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    folders = {line.split("=")[1].strip() for line in
               cfg["options"]["package_dir"].strip().splitlines() if "=" in line}
    return sorted(p for d in folders for p in (ROOT / d).rglob("*.py"))


def test_no_module_over_600_lines_and_no_function_over_80() -> None:
    files = package_files()
    assert len(files) > 100 and any(p.name == "core.py" for p in files)
    problems = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > MAX_MODULE_LINES:
            problems.append(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    problems.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: "
                                    f"{length} lines")
    assert not problems, "\n".join(problems)


def test_benchmarks_md_is_a_reference_of_at_most_400_lines() -> None:
    text = (ROOT / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert text.count("\n") <= 400
    assert "## Where cooperation pays (`bench map`)" in text  # README links this section
