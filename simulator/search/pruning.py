"""Pruning before any simulation (steps 2 and 3 of :mod:`simulator.search`): invalid layouts,
then those the lower memory estimate
(:func:`~simulator.workload.memory_estimate.estimate_peak_memory`) says cannot fit; and, for
those left, the closed-form terms of stage 1 (:mod:`simulator.search.estimate`).
:func:`screen` spreads the layouts over the search's executor in chunks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from simulator.catalog import default_catalog
from simulator.errors import ScenarioError
from simulator.scenario import Scenario
from simulator.search.estimate import CommCoster, Terms, terms_of
from simulator.search.report import Candidate, SearchReport
from simulator.search.space import Layout, SearchSpace, enumerate_layouts, layout_scenario, scenario_json
from simulator.workload.memory_estimate import estimate_peak_memory

__all__ = ["candidates", "screen", "admitted"]

Screened = tuple[Candidate, Terms] | str  # a candidate and its terms, or why the layout was dropped


def candidates(base: Scenario, space: SearchSpace, report: SearchReport) -> list[Candidate]:
    """Validated layouts, each with the lightest recompute policy the memory estimate admits
    and the heavier admitted ones as fallbacks (counts of enumerated, invalid and
    over-memory layouts go to ``report``)."""
    base_json = scenario_json(base)
    out = []
    for layout in enumerate_layouts(base, space):
        report.enumerated += 1
        found = _admit(base_json, layout, space.recompute)
        _count(report, found)
        if isinstance(found, Candidate):
            out.append(found)
    return out


def screen(base: Scenario, space: SearchSpace, report: SearchReport, executor: Any,
           chunks: int = 8) -> list[tuple[Candidate, Terms]]:
    """:func:`candidates` with each one's closed-form terms, the layouts spread over
    ``executor`` in ``chunks`` parts (counts go to ``report``)."""
    layouts = list(enumerate_layouts(base, space))
    base_json = scenario_json(base)
    size = max(1, -(-len(layouts) // max(1, chunks)))
    futures = [executor.submit(screen_layouts, base_json, layouts[i:i + size], space.recompute)
               for i in range(0, len(layouts), size)]
    out = []
    for future in futures:
        for found in future.result():
            report.enumerated += 1
            if isinstance(found, str):
                _count(report, found)
            else:
                out.append(found)
    return out


def screen_layouts(base_json: dict[str, Any], layouts: Sequence[Layout],
                   recompute: Sequence[str]) -> list[Screened]:
    """One chunk of :func:`screen` (runs in a worker): each layout's candidate and terms, or
    ``"invalid"`` / ``"over_memory"``."""
    from simulator.workload import compute_profile

    out: list[Screened] = []
    catalog = default_catalog()  # once: the default catalog re-stamps its folders on every call
    coster: dict[Any, tuple[Any, CommCoster]] = {}
    for layout in layouts:
        found = _admit(base_json, layout, recompute, catalog)
        if not isinstance(found, Candidate):
            out.append(found)
            continue
        cluster = found.scenario.cluster
        if cluster not in coster:
            coster[cluster] = (compute_profile(cluster.gpu_spec, cluster.calibration, catalog),
                               CommCoster(found.scenario))
        profile, comm = coster[cluster]
        # the data-parallel traffic of the stage whose memory peaks: the one holding the most parameters
        out.append((found, terms_of(found.scenario, profile, comm, found.memory.stage)))
    return out


def _admit(base_json: dict[str, Any], layout: Layout, recompute: Sequence[str],
           catalog: Any = None) -> Candidate | str:
    """The layout with the lightest recompute policy the memory estimate admits, the heavier
    ones as fallbacks (checked when taken: :func:`admitted`), or why it has none."""
    catalog = catalog or default_catalog()
    for i, policy in enumerate(recompute):
        try:  # validity does not depend on the recompute policy
            scenario = layout_scenario(base_json, layout, policy, catalog)
        except ScenarioError:  # InfeasibleError and friends
            return "invalid"
        memory = estimate_peak_memory(scenario)
        if memory.fits:
            return Candidate(layout, policy, scenario, memory, tuple(recompute[i + 1:]))
    return "over_memory" if recompute else "invalid"


def admitted(base_json: dict[str, Any], cand: Candidate) -> Candidate | None:
    """``cand`` with the next heavier recompute policy of its fallbacks that the memory
    estimate admits (None if none does)."""
    for i, policy in enumerate(cand.fallbacks):
        scenario = layout_scenario(base_json, cand.layout, policy)
        memory = estimate_peak_memory(scenario)
        if memory.fits:
            return replace(cand, recompute=policy, scenario=scenario, memory=memory, fallbacks=cand.fallbacks[i + 1:])
    return None


def _count(report: SearchReport, found: Candidate | str) -> None:
    if found == "invalid":
        report.invalid += 1
    elif found == "over_memory":
        report.over_memory += 1
