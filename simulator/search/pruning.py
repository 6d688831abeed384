"""Pruning before any simulation: invalid layouts, then out-of-memory ones.

2. **Prune invalid layouts**: whatever :class:`~simulator.scenario.Scenario` validation
   rejects (:class:`~simulator.errors.InfeasibleError`: tp does not divide the heads, pp*v
   does not split the layers, the batch does not split, ZeRO-2/3 with pipelines, ...).
3. **Prune out-of-memory ones** with :func:`~simulator.workload.memory_estimate.estimate_peak_memory`,
   a lower estimate: what it rejects cannot fit. Recomputation only trades time for memory,
   so each layout starts with the lightest policy (none, selective, full) the estimate admits;
   a heavier one is simulated only if the lighter one runs out of memory in the simulation.
"""

from __future__ import annotations

from simulator.errors import ScenarioError
from simulator.scenario import Scenario
from simulator.search.report import Candidate, SearchReport
from simulator.search.space import SearchSpace, enumerate_layouts, layout_scenario
from simulator.workload.memory_estimate import estimate_peak_memory

__all__ = ["candidates"]


def candidates(base: Scenario, space: SearchSpace, report: SearchReport) -> list[Candidate]:
    """Validated layouts, each with the lightest recompute policy the memory estimate admits
    and the heavier admitted ones as fallbacks (counts of enumerated, invalid and
    over-memory layouts go to ``report``)."""
    base_json = base.model_dump(mode="json", by_alias=True)
    out = []
    for layout in enumerate_layouts(base, space):
        report.enumerated += 1
        try:  # validity does not depend on the recompute policy
            scenarios = [(r, layout_scenario(base_json, layout, r)) for r in space.recompute]
        except ScenarioError:  # InfeasibleError and friends
            report.invalid += 1
            continue
        fitting = [(r, sc, mem) for r, sc in scenarios if (mem := estimate_peak_memory(sc)).fits]
        if not fitting:
            report.over_memory += 1
            continue
        recompute, scenario, memory = fitting[0]
        out.append(Candidate(layout, recompute, scenario, memory, tuple(r for r, _, _ in fitting[1:])))
    return out
