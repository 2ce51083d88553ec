"""Import layering of the ``coinf`` packages, checked statically with :mod:`ast`.

Every ``.py`` file of the folders that setup.cfg's ``package_dir`` installs under ``coinf`` is
scanned: module-level imports, imports inside functions, and imports under
``if TYPE_CHECKING:`` all count, relative imports are resolved, and ``from coinf import NAME``
is followed through the facade's lazy ``_LAZY`` table to the module that really provides NAME.

Rules (a package may only import packages of a lower rank; within rank 0 they may import each
other):

====  ================================================================
rank  packages
====  ================================================================
0     ``coinf.errors``, ``coinf.deps``, ``coinf.files``, ``coinf.bundle`` (the bundle format,
      shared by the runtime and ``coinf.convert``), ``coinf.jsonobject`` (bounded JSON from a
      peer or a file), ``coinf.tile`` (a spatial tile) (and the bare ``coinf`` namespace:
      ``__version__``)
1     ``coinf.ble_protocol``
2     ``coinf.models`` -- never imports ``coinf.ble_protocol``
3     ``coinf.convert``
4     ``coinf.device`` -- never imports ``coinf.ble_protocol``
5     ``coinf.research`` (latency-prediction research, the spatial-partition benchmark's
      coordinator) -- may import ``coinf.device`` and below, and ``coinf.wearable`` (one way:
      the coordinator reuses its connections and result checks); imported only by
      ``coinf.cli.bench`` and ``coinf.cli.commands.profile`` (``coinf profile --train``),
      never by the runtime packages
5     ``coinf.wearable``, ``coinf.handheld`` -- never each other (nor coinf.research, except
      research importing wearable as said)
6     ``coinf.cli`` -- imported by nothing outside ``coinf.cli``
====  ================================================================

The facade ``coinf/__init__.py`` and
``coinf/__main__.py`` are exempt as importers. On top of the ranks: no import cycle between
top-level packages, and none between modules.
"""

from __future__ import annotations

import ast
import configparser
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

RANKS: dict[str, int] = {
    "coinf": 0,  # the namespace itself (``from coinf import __version__``); see _resolve_facade
    "coinf.errors": 0,
    "coinf.deps": 0,
    "coinf.files": 0,
    "coinf.bundle": 0,
    "coinf.jsonobject": 0,
    "coinf.tile": 0,
    "coinf.ble_protocol": 1,
    "coinf.models": 2,
    "coinf.convert": 3,
    "coinf.device": 4,
    "coinf.research": 5,
    "coinf.wearable": 5,
    "coinf.handheld": 5,
    "coinf.cli": 6,
}
#: Same-rank packages that must not import each other.
#: Same-rank imports allowed one way (IMPORT_ONLY_FROM keeps the other way shut).
ONE_WAY = frozenset({("coinf.research", "coinf.wearable")})
SIBLINGS_APART = [frozenset({"coinf.wearable", "coinf.handheld"}),
                  frozenset({"coinf.handheld", "coinf.research"})]
#: Packages only these importers (packages or modules, with their submodules) may import.
IMPORT_ONLY_FROM: dict[str, tuple[str, ...]] = {
    "coinf.research": ("coinf.cli.bench", "coinf.cli.commands.profile"),
}
#: Packages that never import the wire, whatever their rank: a slice runs, a device is profiled
#: and a model is built without it (the wire's errors and JSON decoding are rank 0).
NEVER_IMPORT: dict[str, frozenset[str]] = {
    "coinf.device": frozenset({"coinf.ble_protocol"}),
    "coinf.models": frozenset({"coinf.ble_protocol"}),
}
#: Modules whose imports are not checked (the public facade and ``python -m coinf``).
EXEMPT_IMPORTERS = frozenset({"coinf", "coinf.__main__"})


@dataclass(frozen=True)
class Import:
    """One import statement's edge: ``importer`` (file:line) -> ``target`` module."""

    importer: str
    path: str
    line: int
    target: str

    def where(self) -> str:
        return f"{self.path}:{self.line}"


# --- scanning ----------------------------------------------------------------------------------


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """setup.cfg ``[options] package_dir``: dotted package -> folder."""
    cfg = configparser.ConfigParser()
    cfg.read(root / "setup.cfg")
    out = {}
    for line in cfg["options"]["package_dir"].strip().splitlines():
        name, _, folder = line.partition("=")
        out[name.strip()] = root / folder.strip()
    return out


def discover(dirs: dict[str, Path]) -> dict[str, Path]:
    """Every module name -> its file, for all .py files under the mapped folders."""
    modules: dict[str, Path] = {}
    # the longest folder wins, so a mapped subfolder is not also named through its parent
    owner: dict[Path, str] = {}
    for pkg, folder in sorted(dirs.items(), key=lambda kv: len(str(kv[1]))):
        for file in sorted(folder.rglob("*.py")):
            if "__pycache__" in file.parts:
                continue
            owner[file] = pkg
    for file, pkg in owner.items():
        rel = file.relative_to(dirs[pkg]).with_suffix("").parts
        if rel[-1] == "__init__":
            rel = rel[:-1]
        modules[".".join((pkg, *rel))] = file
    return modules


def _is_package(module: str, modules: dict[str, Path]) -> bool:
    return modules[module].name == "__init__.py"


def _known(name: str, modules: dict[str, Path]) -> str:
    """The longest existing module that ``name`` starts with (``coinf.x.y.Class`` -> coinf.x.y)."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in modules:
            return cand
        parts.pop()
    return name


def facade_exports(modules: dict[str, Path]) -> dict[str, str]:
    """The facade's lazy table ``_LAZY`` (exported name -> module that defines it)."""
    if "coinf" not in modules:
        return {}
    tree = ast.parse(modules["coinf"].read_text(), str(modules["coinf"]))
    for node in tree.body:
        if (
            isinstance(node, ast.Assign | ast.AnnAssign)
            and any(
                isinstance(t, ast.Name) and t.id == "_LAZY"
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            )
            and node.value is not None
        ):
            return dict(ast.literal_eval(node.value))
    return {}


def _imports_of(
    module: str, file: Path, modules: dict[str, Path], lazy: dict[str, str], root: Path
) -> Iterator[Import]:
    tree = ast.parse(file.read_text(), str(file))
    rel = str(file.relative_to(root))
    package = module if _is_package(module, modules) else module.rpartition(".")[0]

    def edge(node: ast.AST, target: str) -> Import:
        return Import(module, rel, getattr(node, "lineno", 0), target)

    for node in ast.walk(tree):  # walks into functions, classes and `if TYPE_CHECKING:` blocks
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield edge(node, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level - 1 > len(base) - 1:
                    raise AssertionError(f"{rel}:{node.lineno}: relative import beyond 'coinf'")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub in modules:  # `from pkg import submodule`
                    yield edge(node, sub)
                elif source == "coinf" and alias.name in lazy:  # through the lazy facade
                    yield edge(node, lazy[alias.name])
                else:
                    yield edge(node, source)
        elif (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id in ("import_module",
                                                                           "__import__"))
            )
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and not node.args[0].value.startswith(".")
        ):
            yield edge(node, node.args[0].value)


def scan(root: Path = ROOT) -> tuple[dict[str, Path], list[Import]]:
    """(modules, every import of a ``coinf`` module by a scanned module, targets normalized)."""
    modules = discover(package_dirs(root))
    lazy = facade_exports(modules)
    edges = []
    for module, file in sorted(modules.items()):
        for imp in _imports_of(module, file, modules, lazy, root):
            if imp.target == "coinf" or imp.target.startswith("coinf."):
                edges.append(
                    Import(imp.importer, imp.path, imp.line, _known(imp.target, modules))
                )
    return modules, sorted(edges, key=lambda e: (e.path, e.line, e.target))


# --- rules -------------------------------------------------------------------------------------


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def top_package(module: str) -> str:
    """The ranked unit a module belongs to (``coinf.wearable.planner.x`` -> coinf.wearable)."""
    for name in sorted(RANKS, key=len, reverse=True):
        if module == name or (name != "coinf" and module.startswith(name + ".")):
            return name
    if module == "coinf.__main__":
        return "coinf"
    return module  # unranked: reported by layering_violations


def layering_violations(edges: Iterable[Import]) -> list[str]:
    out = []
    for imp in edges:
        if imp.importer in EXEMPT_IMPORTERS:
            continue
        src, dst = top_package(imp.importer), top_package(imp.target)
        what = f"{imp.where()}: {imp.importer} imports {imp.target}"
        if src not in RANKS:
            out.append(f"{what}: {src} has no rank in tests/test_layering.py")
        elif dst not in RANKS:
            out.append(f"{what}: {dst} has no rank in tests/test_layering.py")
        elif src == dst:
            continue
        elif dst == "coinf.cli":
            out.append(f"{what}: nothing outside coinf.cli may import it")
        elif dst in NEVER_IMPORT.get(src, ()):
            out.append(f"{what}: {src} never imports {dst}")
        elif dst in IMPORT_ONLY_FROM and not any(
                _within(imp.importer, p) for p in IMPORT_ONLY_FROM[dst]):
            out.append(f"{what}: only {', '.join(IMPORT_ONLY_FROM[dst])} may import {dst}")
        elif frozenset({src, dst}) in SIBLINGS_APART:
            out.append(f"{what}: {src} and {dst} never import each other")
        elif (src, dst) in ONE_WAY:
            continue
        elif RANKS[dst] > RANKS[src] or (RANKS[dst] == RANKS[src] > 0):
            out.append(f"{what}: rank {RANKS[src]} ({src}) may not import rank {RANKS[dst]}")
    return out


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (or a self loop), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sccs: list[list[str]] = []
    counter = 0
    nodes = sorted(set(graph) | {d for ds in graph.values() for d in ds})

    for start in nodes:  # iterative Tarjan (no recursion limit on deep graphs)
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        n = stack.pop()
                        on_stack.discard(n)
                        comp.append(n)
                        if n == node:
                            break
                    if len(comp) > 1 or node in graph.get(node, ()):
                        sccs.append(sorted(comp))
    return sorted(sccs)


def describe_cycle(
    comp: list[str], edges: Iterable[Import], unit: Callable[[str], str] = lambda m: m
) -> str:
    """A cycle's members and every import (file:line: module imports module) that keeps them
    together. ``unit`` maps a module to the cycle's nodes (identity, or its top package)."""
    members = set(comp)
    lines = [f"import cycle among {', '.join(comp)}:"]
    seen = set()
    for imp in edges:
        src, dst = unit(imp.importer), unit(imp.target)
        line = f"  {imp.where()}: {imp.importer} imports {imp.target}"
        if src in members and dst in members and src != dst and line not in seen:
            seen.add(line)
            lines.append(line)
    return "\n".join(lines)


def _checked(edges: list[Import]) -> list[Import]:
    return [e for e in edges if e.importer not in EXEMPT_IMPORTERS]


def module_cycles(edges: list[Import]) -> list[list[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for e in _checked(edges):
        if e.target != e.importer:
            graph[e.importer].add(e.target)
    return find_cycles(graph)


def package_cycles(edges: list[Import]) -> list[list[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for e in _checked(edges):
        src, dst = top_package(e.importer), top_package(e.target)
        if src != dst:
            graph[src].add(dst)
    return find_cycles(graph)


# --- the tests ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scanned() -> tuple[dict[str, Path], list[Import]]:
    return scan()


def test_scan_sees_every_package_and_its_imports(scanned) -> None:
    modules, edges = scanned
    assert {top_package(m) for m in modules} >= set(RANKS) - {"coinf.errors", "coinf.deps"}
    assert any(e.importer == "coinf.deps" and e.target == "coinf.errors" for e in edges)
    assert len(edges) > 100


def test_packages_respect_the_layers(scanned) -> None:
    _, edges = scanned
    problems = layering_violations(edges)
    assert not problems, "layering violations:\n" + "\n".join(problems)


def test_no_cycles_between_top_level_packages(scanned) -> None:
    _, edges = scanned
    cycles = package_cycles(edges)
    checked = _checked(edges)
    assert not cycles, "\n".join(describe_cycle(c, checked, top_package) for c in cycles)


def test_no_import_cycles_between_modules(scanned) -> None:
    """Cycles between modules, function-level imports included."""
    _, edges = scanned
    checked = _checked(edges)
    cycles = [describe_cycle(comp, checked) for comp in module_cycles(edges)]
    assert not cycles, "\n\n".join(cycles)


# --- the checker itself catches what it should -------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "setup.cfg").write_text(
        "[options]\npackage_dir =\n"
        + "".join(f"    {pkg} = {folder}\n" for pkg, folder in PKG_DIRS.items())
    )
    for rel, text in files.items():
        f = tmp_path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    for folder in PKG_DIRS.values():
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / "__init__.py").touch()
    return tmp_path


PKG_DIRS = {
    "coinf": "coinf",
    "coinf.ble_protocol": "ble_protocol",
    "coinf.convert": "convert",
    "coinf.device": "device",
    "coinf.handheld": "handheld",
    "coinf.models": "models",
    "coinf.research": "research",
    "coinf.wearable": "wearable",
}


def test_checker_reports_each_kind_of_violation(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "coinf/__init__.py": '_LAZY = {"Session": "coinf.wearable.session"}\n'
            "from coinf.cli import x\n",  # the facade is exempt
            "coinf/errors.py": "",
            "coinf/cli/__init__.py": "from coinf.wearable import session\n",
            "ble_protocol/link.py": "from coinf.errors import LinkClosed\n",
            "ble_protocol/tensors.py": "def f():\n    from . import packing\n",
            "ble_protocol/packing.py": "from .tensors import f\n",
            "device/status.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from coinf.wearable.session import Session\n",
            "convert/split.py": "from coinf import Session\n",
            "models/zoo.py": "import importlib\nimportlib.import_module('coinf.cli')\n",
            "models/pruning.py": "from coinf.convert import graph\n",  # rank 2 -> 3
            "models/compressors.py": "from coinf.ble_protocol import packing\n",  # never
            "convert/compressor_set.py": "from coinf.ble_protocol import packing\n",  # 3 -> 1
            "device/runtime.py": "from coinf.ble_protocol.messages import ErrorCode\n",  # never
            "convert/cuts.py": "from coinf.device import sweep\n",  # rank 3 -> 4
            "convert/graph.py": "",
            "device/sweep.py": "",
            "wearable/session.py": "from ..handheld import daemon\n",
            "wearable/stream.py": "",
            "handheld/daemon.py": "from coinf.wearable.stream import X\n",
            "research/train.py": "from coinf.device.status import x\n",  # allowed
            "research/late.py": "from coinf.handheld import daemon\n",
            "research/coord.py": "from coinf.wearable import stream\n",  # allowed (one way)
            "device/predict.py": "from coinf.research import train\n",
            "wearable/plan.py": "def f():\n    from coinf.research.train import fit\n",
            "coinf/cli/bench/predict.py": "from coinf.research.train import fit\n",  # allowed
            "coinf/cli/commands/profile.py": "import coinf.research.train\n",  # allowed
            "coinf/cli/commands/plan.py": "import coinf.research.train\n",
        },
    )
    modules, edges = scan(root)
    assert "coinf.cli" in modules and "coinf.ble_protocol.packing" in modules
    problems = "\n".join(layering_violations(edges))
    expected = [
        "device/status.py:3: coinf.device.status imports coinf.wearable.session: rank 4",
        "convert/split.py:1: coinf.convert.split imports coinf.wearable.session: rank 3",
        "models/pruning.py:1: coinf.models.pruning imports coinf.convert.graph: rank 2",
        "models/compressors.py:1: coinf.models.compressors imports coinf.ble_protocol.packing: "
        "coinf.models never imports coinf.ble_protocol",
        "device/runtime.py:1: coinf.device.runtime imports coinf.ble_protocol: "
        "coinf.device never imports coinf.ble_protocol",
        "convert/cuts.py:1: coinf.convert.cuts imports coinf.device.sweep: rank 3",
        "models/zoo.py:2: coinf.models.zoo imports coinf.cli: nothing outside coinf.cli",
        "wearable/session.py:1: coinf.wearable.session imports coinf.handheld.daemon: "
        "coinf.wearable and coinf.handheld never import each other",
        "handheld/daemon.py:1: coinf.handheld.daemon imports coinf.wearable.stream:",
        "research/late.py:1: coinf.research.late imports coinf.handheld.daemon: "
        "coinf.research and coinf.handheld never import each other",
        "device/predict.py:1: coinf.device.predict imports coinf.research.train: only "
        "coinf.cli.bench, coinf.cli.commands.profile may import coinf.research",
        "wearable/plan.py:2: coinf.wearable.plan imports coinf.research.train: only ",
        "coinf/cli/commands/plan.py:1: coinf.cli.commands.plan imports coinf.research.train: "
        "only ",
    ]
    for line in expected:
        assert line in problems, f"{line!r} missing from\n{problems}"
    assert "coinf/__init__.py" not in problems and "ble_protocol/link.py" not in problems
    assert "convert/compressor_set.py" not in problems  # a lower rank is fine
    assert "coinf/cli/__init__.py" not in problems  # the top layer may import anything below
    assert "research/coord.py" not in problems  # research -> wearable, one way
    for allowed in ("research/train.py", "coinf/cli/bench/predict.py",
                    "coinf/cli/commands/profile.py"):
        assert allowed not in problems

    cycles = module_cycles(edges)
    assert ["coinf.ble_protocol.packing", "coinf.ble_protocol.tensors"] in cycles
    text = describe_cycle(["coinf.ble_protocol.packing", "coinf.ble_protocol.tensors"], edges)
    assert "ble_protocol/tensors.py:2: coinf.ble_protocol.tensors imports " in text
    assert "ble_protocol/packing.py:1: coinf.ble_protocol.packing imports " in text
    pcycles = package_cycles(edges)
    assert any({"coinf.handheld", "coinf.wearable"} <= set(c) for c in pcycles)
    assert any({"coinf.device", "coinf.research"} <= set(c) for c in pcycles)


def test_find_cycles_on_synthetic_graphs() -> None:
    assert find_cycles({"a": {"b"}, "b": {"c"}}) == []
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"a"}}) == [["a"]]
    assert find_cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}) == [
        ["a", "b"],
        ["c", "d"],
    ]
