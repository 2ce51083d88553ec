"""The decision maker: cost tables, schedulers, min-cut, prediction and run-time adaptation.

Pure functions live in :mod:`.costs`, :mod:`.schedulers` and :mod:`.mincut`; :class:`Planner`
(in :mod:`.planner`) ties them to a bundle, device profiles and a policy.
"""

from coinf.wearable.planner.costs import CandidateCost, Decision
from coinf.wearable.planner.schedulers import Constraint, Target, coinf_schedule, dyno, neurosurgeon

__all__ = ["CandidateCost", "Constraint", "Decision", "Target", "coinf_schedule", "dyno",
           "neurosurgeon"]
