"""Pruning before any simulation (steps 2 and 3 of :mod:`simulator.search`): invalid layouts,
then those the lower memory estimate
(:func:`~simulator.workload.memory_estimate.estimate_peak_memory`) says cannot fit.
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
