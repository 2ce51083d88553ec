"""Optional dependencies: which extra brings a package, and a one-line error when it is missing.

A Pi installs ``coinf[wearable]`` only; commands and features that need more say so instead of
failing with a traceback.
"""

from __future__ import annotations

import importlib.util
import shlex
import sys
from pathlib import Path

from coinf.errors import MissingDependency

#: top-level import name -> the extra of setup.cfg that installs it
EXTRA_OF: dict[str, str] = {
    "scipy": "convert", "matplotlib": "convert", "tqdm": "convert",
    "torch": "models", "sklearn": "train", "onnx2torch": "compress",
    "bleak": "handheld", "bumble": "wearable", "psutil": "wearable",
    "zeroconf": "discovery", "ray": "serve",
}


def checkout() -> Path | None:
    """The source checkout this coinf runs from (an editable install: ``pip install -e .``), or
    None for an installed wheel."""
    root = Path(__file__).resolve().parents[1]
    cfg = root / "setup.cfg"
    try:
        is_coinf = cfg.is_file() and "\nname = coinf\n" in cfg.read_text(encoding="utf-8")
    except OSError:
        return None
    return root if is_coinf else None


def install_command(extra: str) -> str:
    """The command that adds ``extra`` to this very install: from a checkout, pip of the running
    interpreter on that checkout (what ``make demo`` set up); else the full wheel's line
    (coinf is installed from its wheel, docs/DEPLOY.md, not from a package index)."""
    root = checkout()
    if root is None:
        return f"pip install 'COINF_WHEEL.whl[{extra}]' (the wheel of `make wheel`)"
    try:
        shown = Path(sys.executable).relative_to(Path.cwd())
        target = "." if root == Path.cwd() else str(root)
    except ValueError:
        shown, target = Path(sys.executable), str(root)
    return f"{shlex.quote(str(shown))} -m pip install -e {shlex.quote(f'{target}[{extra}]')}"


def missing_message(package: str, what: str, extra: str | None = None) -> str:
    extra = extra or EXTRA_OF.get(package)
    hint = (f"install the coinf[{extra}] extra: {install_command(extra)}" if extra
            else f"pip install {package}")
    return f"{what} needs {package!r}, which is not installed ({hint})"


#: What the Pi wheel (``make wheel-pi``, setup.py) leaves out: module -> (what it is, the extra a
#: full install (``make wheel``) needs to run it). Keep in step with setup.py's PI_DROP_*.
PI_LEFT_OUT: dict[str, tuple[str, str]] = {
    "coinf.cli.bench": ("benchmarks are", "demo"),
    "coinf.research": ("in-context predictor training (`coinf profile --train` without "
                       "--no-context) is", "train"),
    **{f"coinf.models.{m}": ("the zoo's model builders are", "models") for m in (
        "architectures", "compressors", "digitnet", "export", "large", "pruning", "sequence",
        "training")},
    "coinf.convert.compressor_set": ("training compressor sets (`coinf models compressors`) is",
                                     "models"),
    **{f"coinf.convert.{m}": ("training learned bottlenecks (`coinf compress`) is", "compress")
       for m in ("bottleneck_train", "bottleneck_nets", "torchable", "torchable_ops",
                 "torchable_resize")},
}


def left_out(module: str | None) -> str | None:
    """The one-line error for a module (or a submodule of one) the Pi wheel leaves out, else
    None: ``benchmarks are not part of the Pi install; run them from a full install (...)``."""
    for name, (what, extra) in PI_LEFT_OUT.items():
        if module is not None and (module == name or module.startswith(name + ".")):
            them = "them" if what.endswith(" are") else "it"
            return (f"{what} not part of the Pi install; run {them} from a full install (the "
                    f"wheel of `make wheel`: pip install 'COINF_WHEEL.whl[{extra}]')")
    return None


def require_full(module: str) -> None:
    """Raise :class:`MissingDependency` (:func:`left_out`'s line) when this is the Pi wheel and
    ``module`` is one of what it leaves out."""
    message = left_out(module)
    if message is not None and importlib.util.find_spec(module) is None:
        raise MissingDependency(message)


def require(package: str, extra: str | None = None, what: str = "this feature") -> None:
    """Raise :class:`MissingDependency` naming the extra when ``package`` cannot be imported."""
    if importlib.util.find_spec(package) is None:
        raise MissingDependency(missing_message(package, what, extra))


#: LiteRT interpreters, preferred first: (import module, pip package)
LITERT_MODULES: tuple[tuple[str, str], ...] = (
    ("ai_edge_litert.interpreter", "ai-edge-litert"),
    ("tflite_runtime.interpreter", "tflite-runtime"),
)


def litert_package() -> str | None:
    """The LiteRT runtime installed here (``ai-edge-litert``, else ``tflite-runtime``), or None."""
    for module, package in LITERT_MODULES:
        if importlib.util.find_spec(module.split(".")[0]) is not None:
            return package
    return None


def litert_interpreter() -> type:
    """The ``Interpreter`` class of the LiteRT runtime installed here; :class:`MissingDependency`
    naming both packages when neither is."""
    import importlib

    for module, _ in LITERT_MODULES:
        if importlib.util.find_spec(module.split(".")[0]) is None:
            continue
        interpreter: type = importlib.import_module(module).Interpreter
        return interpreter
    raise MissingDependency(
        "the LiteRT runtime needs 'ai-edge-litert' (pip install 'coinf[litert]'), or "
        "'tflite-runtime' where numpy<2 is fine; neither is installed")
