"""A plan: the stages one inference runs through, and the links between them.

A stage is (device, slice, runtime): which device runs which slice of the bundle with which
runtime. Consecutive stages are joined by a link that carries the crossing tensors, packed as
the plan says. The first stage always runs on this wearable; a plan of one stage is local. Two
devices (wearable head -> handheld tail) is the N = 2 case; nothing here assumes two.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from coinf.ble_protocol.packing import PackSpec
from coinf.convert.packcal import tensor_specs

from coinf.bundle import Candidate

WEARABLE = "wearable"
HANDHELD = "handheld"


@dataclass(frozen=True)
class Stage:
    """One device's part of an inference."""

    device: str
    slice: str  # "head", "tail", "whole" (a bundle file role of the candidate)
    runtime: str = "onnxruntime"

    def __str__(self) -> str:
        return f"{self.slice}@{self.device}({self.runtime})"


@dataclass(frozen=True)
class Plan:
    """Stages in order; ``packing`` says how tensors travel on every link between them, except
    the crossing tensors ``tensor_packing`` names (calibrated per tensor; state lossless)."""

    candidate: Candidate
    packing: PackSpec
    stages: tuple[Stage, ...]
    tensor_packing: Mapping[str, PackSpec] = field(default_factory=dict, compare=False,
                                                   hash=False)
    #: an attached compressor (coinf.bundle.Compressor): the wearable sends its code, packed
    #: with ``packing``, in a request whose hop names its gamma; the handheld decodes it first
    compressor: Any = field(default=None, compare=False, hash=False)

    def spec_of(self, tensor: str) -> PackSpec:
        """How ``tensor`` is packed on the link."""
        return self.tensor_packing.get(tensor, self.packing)

    @classmethod
    def for_candidate(cls, cand: Candidate, packing: PackSpec,
                      helper: str = HANDHELD,
                      runtimes: tuple[str, str] = ("onnxruntime", "onnxruntime")) -> Plan:
        """The plan of a two-part candidate: head here, tail on ``helper`` (unless local);
        ``runtimes`` are the head's and the tail's."""
        if cand.is_wearable_only:
            return cls(cand, PackSpec.parse("raw"), (Stage(WEARABLE, "whole", runtimes[0]),))
        return cls(cand, packing, (Stage(WEARABLE, "head", runtimes[0]),
                                   Stage(helper, "tail", runtimes[1])),
                   tensor_specs(cand, packing))

    @property
    def local(self) -> bool:
        """True when the whole inference stays on this wearable."""
        return len(self.stages) == 1

    @property
    def remote(self) -> tuple[Stage, ...]:
        """The stages after the first: what crosses links."""
        return self.stages[1:]

    def __str__(self) -> str:
        # the planner's configuration id: CUT, or CUT~SPEC where a compressor's code is a spec
        code = "" if self.compressor is None else f"~g{self.compressor.gamma}"
        return f"{self.candidate.id}{code}[{self.packing}]: " + " -> ".join(map(str, self.stages))
