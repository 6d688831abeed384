"""What a search finds: candidates, ranked configurations and the report of a whole search."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from simulator.scenario import Scenario
from simulator.search.space import Layout, Objective
from simulator.workload.memory_estimate import MemoryEstimate

__all__ = ["Candidate", "Ranked", "SearchReport"]


@dataclass(frozen=True)
class Candidate:
    """A layout with a recomputation policy, validated, and its memory estimate."""

    layout: Layout
    recompute: str
    scenario: Scenario
    memory: MemoryEstimate
    fallbacks: tuple[str, ...] = ()  # heavier recompute policies to try if this one runs out of memory

    @property
    def label(self) -> str:
        return f"{self.layout.label} rc={self.recompute}"


@dataclass(frozen=True)
class Ranked:
    """A simulated candidate that fits, with its metrics and what it would take to train."""

    candidate: Candidate
    metrics: dict[str, Any]
    tokens: float
    time_to_train_s: float  # with a reliability section: the expected wall-clock, failures included
    cost_usd: float | None
    ettr: float | None = None  # effective training time ratio, with a reliability section (simulator/goodput/)

    @property
    def scenario(self) -> Scenario:
        return self.candidate.scenario

    @property
    def label(self) -> str:
        return self.candidate.label


@dataclass
class SearchReport:
    """Everything a search did: counts at each step, the ranking, and the naive baseline."""

    objective: Objective
    tokens: float
    tokens_default: bool = True  # the budget is the Chinchilla rule's, not the caller's
    enumerated: int = 0
    invalid: int = 0
    over_memory: int = 0
    candidates: int = 0  # layouts left after both prunings, each with its lightest admitted recompute policy
    retried: int = 0  # candidates queued again with a heavier recompute policy after running out of memory
    bounded_out: int = 0  # candidates whose step bound could not beat the top predictions
    capped: int = 0  # candidates left when max_estimates was reached
    estimated: int = 0  # candidates whose step time was predicted from short runs (or simulated whole)
    simulated_oom: int = 0  # of those, out of memory in the simulation
    failed: int = 0
    simulated: int = 0  # best predictions simulated whole
    # the layered search: stage 1 estimates every candidate in closed form; stage 2 simulates
    # (short runs) those whose estimate less ``margin`` could still enter the top (``estimated``);
    # stage 3 simulates the finalists whole (``simulated``)
    stage1: int = 0  # candidates estimated in closed form
    stage1_s: float = 0.0  # wall time of stage 1 (validation, memory estimate, closed form)
    margin: float = 0.0  # the estimate's error margin that justified pruning (fraction)
    cutoff_s: float | None = None  # the top-th simulated step: stage 2 kept what could beat it
    closed_form: list[tuple[str, float]] = field(default_factory=list)  # label, estimated step (s), best first
    predictions: list[tuple[str, float | None]] = field(default_factory=list)  # label, predicted step (s), best first
    ranked: list[Ranked] = field(default_factory=list)
    baseline: dict[str, Any] | None = None  # plain DDP: label, verdict, metrics
    prices: dict[str, Any] = field(default_factory=dict)  # node type -> NodePrice used
    wall_s: float = 0.0

