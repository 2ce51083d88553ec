"""What ``coinf split`` needs for models exported by other tools, in one place.

:class:`Preparation` carries ``--freeze`` (inputs made constants, decided ``If`` nodes inlined:
:mod:`convert.freeze`), ``--input-data`` (representative inputs: they size symbolic dims, feed
the shape-learning trial run and ``--verify``) and ``--state`` (recurrent state pairs:
:mod:`convert.state`). :mod:`convert.split` calls it at three points: loading, annotating the
candidates and manifest, and verifying.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from coinf.convert import freeze as fz
from coinf.convert import state as st
from coinf.convert.feeds import read_npz
from coinf.convert.graph import Graph, load_graph
from onnx import ModelProto

from coinf.bundle import Candidate
from coinf.errors import InputError

MAX_VERIFY_FEEDS = 4


@dataclass
class Preparation:
    """Options of a real exported model; see the module docstring."""

    freeze: Mapping[str, Any] = field(default_factory=dict)
    data: dict[str, np.ndarray] | None = None
    data_name: str | None = None
    state: Sequence[tuple[str, str]] | None = None
    frozen: dict[str, np.ndarray] = field(default_factory=dict)
    pairs: list[tuple[str, str]] = field(default_factory=list)
    post: str | None = None  # --post (convert/post.py)
    post_meta: dict[str, Any] | None = None

    @classmethod
    def of(cls, freeze: Mapping[str, Any] | None = None,
           input_data: str | Path | Mapping[str, np.ndarray] | None = None,
           state: Sequence[tuple[str, str]] | None = None,
           post: str | None = None) -> Preparation:
        data: dict[str, np.ndarray] | None = None
        name = None
        if isinstance(input_data, str | Path):
            data, name = read_npz(input_data, "--input-data"), Path(input_data).name
        elif input_data is not None:
            data, name = {k: np.asarray(v) for k, v in input_data.items()}, "arrays"
        if post is not None:
            from coinf.convert.post import check_spec

            post = check_spec(post)  # before any work
        return cls(dict(freeze or {}), data, name, list(state) if state else None, post=post)

    def _prepare(self, model: ModelProto) -> None:
        if self.freeze:
            self.frozen = fz.freeze_inputs(model, self.freeze)
        if self.post:
            from coinf.convert.post import attach

            self.post_meta = attach(model, self.post)

    def load(self, model_path: str | Path, dims: Mapping[str, int] | None,
             weights: Path | None = None) -> Graph:
        """:func:`load_graph` with the freeze and the representative data applied (``weights``:
        where large initializers go, see :func:`load_graph`)."""
        data = self.data
        g = load_graph(model_path, dims,
                       prepare=self._prepare if self.freeze or self.post else None,
                       input_data=data, weights=weights)
        if data is not None:
            known = [k for k in data if k in g.inputs]
            if not known and g.inputs:
                raise InputError(f"--input-data {self.data_name}: no array is named after a model"
                                 f" input ({', '.join(g.inputs)}); it has {sorted(data)}")
        self.pairs = st.state_pairs(g, self.state)
        return g

    def annotate(self, g: Graph, candidates: Sequence[Candidate], meta: dict[str, Any]) -> None:
        """Record frozen inputs, the data's name and state pairs; mark state-like crossings."""
        if self.frozen:
            meta[fz.META_KEY] = fz.manifest_entry(self.frozen)
        if self.post_meta:
            meta["post"] = self.post_meta
        if self.data_name:
            meta["input_data"] = self.data_name
        if self.pairs:
            meta[st.META_KEY] = st.manifest_entry(self.pairs)
            like = st.state_like(g, self.pairs)
            for cand in candidates:
                names = [t.name for t in cand.crossing if t.name in like]
                if names:
                    cand.extra[st.EXTRA_KEY] = names

    def verify_kwargs(self) -> dict[str, Any]:
        """Arguments of :func:`convert.verify.verify_bundle`: the data and how many feeds."""
        if not self.data:
            return {}
        n = max((len(v) if v.ndim else 1) for v in self.data.values())
        return {"input_data": self.data, "feeds": max(1, min(n, MAX_VERIFY_FEEDS))}
