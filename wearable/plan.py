"""A plan: the stages one inference runs through, as data (docs/ARCHITECTURE.md, "Plans").

A stage is (device, FROM..TO cuts, runtime, packing): which device runs which slice of the
bundle with which runtime, and how the tensors it sends on travel. The first stage always runs
on this wearable and starts at the bundle's first cut (the model's input); the last ends at its
last cut (the outputs). One stage is ``local``, two a ``split``, more a ``pipeline``. A plan
serialises to JSON (``coinf plan --json`` prints the one a Session would run; ``coinf run
--plan FILE`` runs one) and is checked against the bundle when read back.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from coinf.ble_protocol.packing import PackSpec
from coinf.ble_protocol.request import MAX_HOPS, Hop, Request, encode_request, valid_name
from coinf.convert.packcal import tensor_specs
from coinf.wearable.planner.codec_costs import parse_config_spec

from coinf.bundle import Bundle, Candidate
from coinf.errors import BundleError, InputError

WEARABLE = "wearable"
HANDHELD = "handheld"
STRATEGIES = ("local", "split", "pipeline")
RUNTIMES = ("onnxruntime", "litert", "auto")


@dataclass(frozen=True)
class Stage:
    """One device's part of an inference: cuts ``start..end`` on ``device``."""

    device: str
    start: str
    end: str
    runtime: str = "onnxruntime"
    #: how the tensors this stage sends on travel: ``raw``, a packing (``q8``, ``f16``,
    #: ``jpeg-q90``...), or a compressor's code (``g4``, ``g4+q8``); ``raw`` for the last stage
    packing: str = "raw"

    @property
    def slice(self) -> str:
        return f"{self.start}..{self.end}"

    @property
    def gamma(self) -> int:
        """The compressor whose code this stage sends on (0: none)."""
        return parse_config_spec(self.packing)[0] or 0

    @property
    def wire_packing(self) -> str:
        """The packing of what goes on the wire (the code's, with a compressor)."""
        return parse_config_spec(self.packing)[1]

    def to_json(self) -> dict[str, str]:
        return {"device": self.device, "start": self.start, "end": self.end,
                "runtime": self.runtime, "packing": self.packing}

    def __str__(self) -> str:
        return f"{self.slice}@{self.device}({self.runtime})"


@dataclass(frozen=True)
class Plan:
    """Stages in order, and the strategy they make. The fields after ``stages`` are derived
    from the bundle when the plan is built (:meth:`build`), for the executor."""

    strategy: str
    stages: tuple[Stage, ...]
    #: the cut whose crossing tensors leave this wearable (the first stage's end)
    candidate: Candidate = field(compare=False, hash=False)
    #: how the first link's tensors are packed, except those ``tensor_packing`` names
    packing: PackSpec = field(compare=False, hash=False)
    tensor_packing: Mapping[str, PackSpec] = field(default_factory=dict, compare=False,
                                                   hash=False)
    #: the compressor whose code crosses the first link (coinf.bundle.Compressor), if any
    compressor: Any = field(default=None, compare=False, hash=False)
    #: the planner's predictions: ``latency_ms``, ``wearable_mj`` (empty for a fixed plan)
    predicted: Mapping[str, float] = field(default_factory=dict, compare=False, hash=False)

    # -- building ---------------------------------------------------------------------------
    @classmethod
    def build(cls, bundle: Bundle, stages: Sequence[Stage],
              predicted: Mapping[str, float] | None = None) -> Plan:
        """A plan of ``stages`` over ``bundle``, checked: contiguous cuts from the first to the
        last, nested (each slice non-empty), known runtimes and packings, at most 16 remote
        stages. Anything wrong is an :class:`InputError` naming the stage."""
        stages = tuple(stages)
        if not stages:
            raise InputError("a plan needs at least one stage")
        if len(stages) - 1 > MAX_HOPS:
            raise InputError(f"a plan has at most {MAX_HOPS + 1} stages, got {len(stages)}")
        ids = [c.id for c in bundle.candidates]
        first, last = ids[0], ids[-1]
        if stages[0].device != WEARABLE:
            raise InputError(f"stage 1 runs on {stages[0].device!r}: the first stage is always "
                             f"this wearable's")
        if stages[0].start != first or stages[-1].end != last:
            raise InputError(f"a plan runs from the first cut {first} to the last {last}, not "
                             f"{stages[0].start}..{stages[-1].end}")
        order = {c: i for i, c in enumerate(ids)}
        for i, st in enumerate(stages, 1):
            where = f"stage {i} ({st})"
            if st.start not in order or st.end not in order:
                raise InputError(f"{where}: unknown cut; this bundle has {first}..{last}")
            if i > 1 and st.start != stages[i - 2].end:
                raise InputError(f"{where} starts at {st.start}, the stage before ends at "
                                 f"{stages[i - 2].end}")
            # a first stage is any cut's head, a last stage any cut's tail (the bundle has
            # both); a stage between two cuts needs the first head inside the second
            ends = i == 1 or st.end == last
            empty = st.start == st.end and i > 1
            if empty or not (ends or _nested(bundle, st.start, st.end)):
                raise InputError(f"{where}: its end must come after its start (the head of "
                                 f"{st.start} a strict part of the head of {st.end})")
            if i > 1 and not valid_name(st.device):
                raise InputError(f"{where}: device names are 1-32 of [A-Za-z0-9_-]")
            if st.runtime not in RUNTIMES:
                raise InputError(f"{where}: runtime must be one of {', '.join(RUNTIMES)}")
            try:
                wire = PackSpec.parse(st.wire_packing)
            except ValueError as exc:
                raise InputError(f"{where}: packing {st.packing!r}: {exc}") from None
            if wire.codec == "latent" and not st.gamma:
                raise InputError(f"{where}: packing 'latent' codes a learned compressor's code: "
                                 f"give its gamma (gN+latent)")
            if i == len(stages) and st.packing != "raw":
                raise InputError(f"{where}: the last stage sends nothing to pack")
        cand = bundle.candidate(stages[0].end)
        head = stages[0]
        spec = PackSpec.parse(head.wire_packing)
        try:
            comp = bundle.compressor(cand.id, head.gamma) if head.gamma else None
        except BundleError as exc:
            raise InputError(f"stage 1: {exc}") from None
        for prev, st in itertools.pairwise(stages[1:]):
            if prev.gamma:
                try:
                    bundle.compressor(st.start, prev.gamma)
                except BundleError as exc:
                    raise InputError(f"stage {prev}: {exc}") from None
        kind = ("local" if len(stages) == 1 else "split" if len(stages) == 2 else "pipeline")
        specs = {} if comp is not None or len(stages) == 1 else tensor_specs(cand, spec)
        return cls(kind, stages, cand, spec, specs, comp, dict(predicted or {}))

    @classmethod
    def for_candidate(cls, bundle: Bundle, cand: Candidate, packing: PackSpec | str = "raw",
                      helper: str = HANDHELD,
                      runtimes: tuple[str, str] = ("onnxruntime", "onnxruntime"),
                      gamma: int = 0) -> Plan:
        """The plan of a two-part candidate: head here, tail on ``helper`` (unless it is
        ``wearable-only``); ``runtimes`` are the head's and the tail's; ``gamma`` sends that
        compressor's code."""
        first, last = bundle.candidates[0].id, bundle.candidates[-1].id
        spec = str(packing)
        if cand.is_wearable_only:
            return cls.build(bundle, [Stage(WEARABLE, first, last, runtimes[0])])
        wire = spec if not gamma else (f"g{gamma}" if spec == "raw" else f"g{gamma}+{spec}")
        return cls.build(bundle, [Stage(WEARABLE, first, cand.id, runtimes[0], wire),
                                  Stage(helper, cand.id, last, runtimes[1])])

    # -- reading ----------------------------------------------------------------------------
    @property
    def local(self) -> bool:
        """True when the whole inference stays on this wearable."""
        return len(self.stages) == 1

    @property
    def remote(self) -> tuple[Stage, ...]:
        """The stages after the first: what crosses links."""
        return self.stages[1:]

    def spec_of(self, tensor: str) -> PackSpec:
        """How ``tensor`` is packed on the first link."""
        return self.tensor_packing.get(tensor, self.packing)

    def hops(self) -> tuple[Hop, ...]:
        """The route the first remote device receives (docs/PROTOCOL.md §6.9): one hop per
        remote stage, each with the gamma of the code it receives and the packing of what it
        sends on. A split's one hop carries no device name (whoever receives it runs it)."""
        hops = []
        for prev, st in itertools.pairwise(self.stages):
            name = st.device if len(self.stages) > 2 else ""
            hops.append(Hop(st.start, st.end, name, prev.gamma, st.wire_packing))
        return tuple(hops)

    @functools.cached_property
    def request_header(self) -> bytes:
        """The REQUEST header of :meth:`hops` (the tensor map follows it), encoded once."""
        return encode_request(Request.route(self.hops()), b"")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"strategy": self.strategy,
                               "stages": [s.to_json() for s in self.stages]}
        out.update({k: round(float(v), 3) for k, v in self.predicted.items()})
        return out

    @classmethod
    def from_json(cls, obj: Any, bundle: Bundle) -> Plan:
        """A plan from JSON (untrusted: every field checked, then :meth:`build`)."""
        if not isinstance(obj, dict) or not isinstance(obj.get("stages"), list):
            raise InputError("a plan is a JSON object with a list 'stages' (coinf plan --json "
                             "prints one under 'plan')")
        stages = []
        for i, s in enumerate(obj["stages"], 1):
            if not isinstance(s, dict):
                raise InputError(f"plan stage {i} is not an object")
            bad = [k for k in ("device", "start", "end") if not isinstance(s.get(k), str)]
            extra = sorted(set(s) - {"device", "start", "end", "runtime", "packing"})
            if bad or extra:
                raise InputError(f"plan stage {i}: " + (f"missing {bad}" if bad else
                                                        f"unknown fields {extra}"))
            runtime, packing = s.get("runtime", "onnxruntime"), s.get("packing", "raw")
            if not isinstance(runtime, str) or not isinstance(packing, str):
                raise InputError(f"plan stage {i}: runtime and packing are strings")
            stages.append(Stage(s["device"], s["start"], s["end"], runtime, packing))
        plan = cls.build(bundle, stages)
        if "strategy" in obj and obj["strategy"] != plan.strategy:
            raise InputError(f"the plan says strategy {obj['strategy']!r}, its stages make a "
                             f"{plan.strategy}")
        return plan

    def __str__(self) -> str:
        return f"{self.strategy}: " + " -> ".join(
            f"{s}[{s.packing}]" if s.packing != "raw" else str(s) for s in self.stages)


def _nested(bundle: Bundle, start: str, end: str) -> bool:
    """The head of cut ``start`` is a strict part of the head of cut ``end``: the slice
    start..end runs something and needs nothing after it."""
    a, b = bundle.candidate(start), bundle.candidate(end)
    return set(a.head.nodes) < set(b.head.nodes)
