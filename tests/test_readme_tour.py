"""README's quick tour runs as written after ``make demo`` alone: every command exists with the
flags it is given, every bundle it uses is made earlier in the tour, and what its commands need
(matplotlib for ``--png``, scikit-learn for ``--data digits``, bumble and bleak for the radio)
comes with the ``demo`` extra that ``make demo`` installs."""

from __future__ import annotations

import configparser
import re
import shlex
from pathlib import Path

from coinf.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def tour_lines() -> list[list[str]]:
    """The ``coinf ...`` commands of README's "Quick tour" block, as argv (comments and
    trailing ``&`` dropped)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Quick tour\s+```sh\n(.*?)```", text, re.S)
    assert block, "README has no Quick tour shell block"
    out = []
    for line in block.group(1).splitlines():
        argv = shlex.split(line, comments=True)
        if argv and argv[-1] == "&":
            argv = argv[:-1]
        if argv and argv[0] == "coinf":
            out.append(argv[1:])
    return out


def extra_requirements(extra: str, seen: set[str] | None = None) -> set[str]:
    """The distributions an extra of setup.cfg installs, following ``coinf[...]`` references."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    seen = set() if seen is None else seen
    seen.add(extra)
    names: set[str] = set()
    for req in cfg["options.extras_require"][extra].split("\n"):
        req = req.split("#")[0].strip()
        if not req:
            continue
        nested = re.fullmatch(r"coinf\[(.*)\]", req)
        if nested:
            for sub in nested.group(1).split(","):
                if sub not in seen:
                    names |= extra_requirements(sub, seen)
        else:
            names.add(re.split(r"[<>=!~ ;\[]", req, maxsplit=1)[0].lower())
    return names


def option_strings(command: str) -> set[str]:
    parser = build_parser(only=command)
    sub = next(a for a in parser._actions if a.dest == "command")
    cmd = sub.choices[command]  # type: ignore[attr-defined]
    return {s for a in cmd._actions for s in a.option_strings}


def test_every_tour_command_exists_with_its_flags_and_its_bundles_are_made_first() -> None:
    lines = tour_lines()
    assert len(lines) >= 8
    made: set[str] = set()
    for argv in lines:
        command, rest = argv[0], argv[1:]
        flags = {a.split("=")[0] for a in rest if a.startswith("--")}
        known = option_strings(command)
        assert flags <= known, f"coinf {command}: {sorted(flags - known)} unknown"
        if command == "split" and "-o" in rest:
            made.add(rest[rest.index("-o") + 1])
            continue
        bundles = [a for a in rest if a.startswith("out/")]
        for b in bundles:
            assert b in made, f"`coinf {' '.join(argv)}` uses {b}, which no earlier line makes"


def test_what_the_tour_needs_comes_with_the_demo_extra() -> None:
    demo = extra_requirements("demo")
    for dist in ("matplotlib", "scikit-learn", "bumble", "bleak", "pillow"):
        assert dist in demo, f"{dist} is not in the demo extra"
    assert "torch" not in demo  # the demo stays light
