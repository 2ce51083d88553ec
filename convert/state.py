"""Recurrent state: graph outputs the caller feeds back as inputs on the next step.

A *state pair* is (input, output) of the same dtype and shape where the output of step t is
the input of step t+1 (an LSTM's ``h``/``hn``, Silero VAD's ``state``/``stateN``).
``coinf split --state IN=OUT`` names pairs; without it they are detected by name: the two names
equal once the usual in/out markers are removed (``state_in``/``state_out``, ``h0``/``hn``,
``state``/``stateN``, ``past``/``present``), with the same dtype and shape.

A crossing tensor is **state-like** when it lies on a path from a state input to a state output
(the state itself, or what the cell computes from it): an error in it is fed back and
accumulates over a stream. Calibration packs state-like tensors losslessly by default and
measures drift over sequences (:mod:`convert.packcal`); the wearable packs them the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from coinf.convert.graph import Graph

from coinf.errors import InputError

META_KEY = "state"
EXTRA_KEY = "state_tensors"
_MARKERS = re.compile(r"(^|[_.\-/:])(in|out|input|output|prev|next|new|old|cur|current)"
                      r"(?=$|[_.\-/:\d])|(?<=[a-z])(N|_?new|_?next|_?out)$|(?<=[a-zA-Z])\d+$")


def _stem(name: str) -> str:
    s = name.strip()
    s = {"past": "kv", "present": "kv"}.get(s.split(".")[0], s) if s.startswith(
        ("past", "present")) else s
    if re.fullmatch(r"[a-zA-Z]n", s):  # h0 / hn, c0 / cn
        s = s[0]
    s = _MARKERS.sub("", s)
    return s.strip("_.-/:").lower()


def parse_state(items: Iterable[str]) -> list[tuple[str, str]]:
    """``["h=hn"]`` -> ``[("h", "hn")]``."""
    out: list[tuple[str, str]] = []
    for item in items:
        a, sep, b = item.partition("=")
        if not sep or not a.strip() or not b.strip():
            raise InputError(f"--state {item!r}: expected INPUT=OUTPUT (a state input and the "
                             "output fed back into it)")
        out.append((a.strip(), b.strip()))
    return out


def state_pairs(g: Graph, explicit: Sequence[tuple[str, str]] | None = None
                ) -> list[tuple[str, str]]:
    """The model's state pairs: ``explicit`` (checked), else detected by name, dtype, shape."""
    if explicit:
        for a, b in explicit:
            if a not in g.inputs:
                raise InputError(f"--state {a}={b}: {a!r} is not a model input; inputs are "
                                 f"{', '.join(g.inputs)}")
            if b not in g.outputs:
                raise InputError(f"--state {a}={b}: {b!r} is not a model output; outputs are "
                                 f"{', '.join(g.outputs)}")
            if g.types.get(a) != g.types.get(b):
                raise InputError(f"--state {a}={b}: shapes/dtypes differ ({g.types.get(a)} vs "
                                 f"{g.types.get(b)}); a fed-back output must match its input")
        return list(explicit)
    pairs: list[tuple[str, str]] = []
    used: set[str] = set()
    for a in g.inputs:
        ta = g.types.get(a)
        if ta is None or ta.dtype.kind != "f":
            continue
        stem = _stem(a)
        match = [b for b in g.outputs if b not in used and b != a and g.types.get(b) == ta
                 and stem and _stem(b) == stem]
        if len(match) == 1:
            pairs.append((a, match[0]))
            used.add(match[0])
    return pairs


def state_like(g: Graph, pairs: Sequence[tuple[str, str]]) -> set[str]:
    """Every tensor on a path from a state input to a state output (both included)."""
    if not pairs:
        return set()
    down: set[str] = {a for a, _ in pairs}
    for n in g.nodes:  # file order is topological
        if any(t in down for t in n.inputs):
            down.update(n.outputs)
    up: set[str] = {b for _, b in pairs}
    for n in reversed(g.nodes):
        if any(t in up for t in n.outputs):
            up.update(n.inputs)
    return (down & up) | {a for a, _ in pairs} | {b for _, b in pairs}


def manifest_entry(pairs: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"input": a, "output": b} for a, b in pairs]


def pairs_of(meta: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The state pairs a manifest records."""
    raw = meta.get(META_KEY) or []
    return [(str(p["input"]), str(p["output"])) for p in raw
            if isinstance(p, dict) and "input" in p and "output" in p]
