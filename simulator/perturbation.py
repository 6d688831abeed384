"""The ``faults`` section in a run (used by :mod:`simulator.run`): what stops symmetry
reduction, the seeded iterations of ``sim.samples``, and the summary the Result carries.

Stragglers make the ranks of a stage differ (the symmetry's rank key); jitter gives every rank
its own draws and a perturbed link its own routes, so both switch the reduction off: every rank
is simulated and nothing is averaged away. Iteration i draws its jitter from seed
``faults.jitter.seed + i``; the Result's other fields are iteration 0's.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from simulator.cluster.faults import PerturbedLink
from simulator.cluster.graph import ClusterGraph
from simulator.engine import CommResolver, EngineRun, run_program
from simulator.ir import Program
from simulator.results.faults import FaultsSummary, PerturbedLinkOut, StepSamples, rank_ranges, step_samples
from simulator.scenario import Scenario
from simulator.workload.perturb import perturbed_durations

__all__ = ["symmetry_inputs", "run_iterations", "faults_summary"]


def symmetry_inputs(scenario: Scenario, gpus_per_node: int) -> tuple[Callable[[int], Hashable] | None, str | None]:
    """(rank key, reason to switch symmetry off) for the workload."""
    faults = scenario.faults
    off = []
    if faults.links:
        off.append("faults.links perturbs links, so ranks route differently")
    if faults.jitter is not None and faults.jitter.compute_cv > 0:
        off.append("faults.jitter draws each rank's compute times")
    reason = "; ".join(off) + ": every rank is simulated" if off else None
    key = None
    if faults.stragglers:
        def key(rank: int) -> Hashable:
            return f"slowdown {faults.slowdown_of(rank, gpus_per_node):g}"
    return key, reason


def run_iterations(scenario: Scenario, program: Program, resolver: CommResolver, gpus_per_node: int,
                   **engine: Any) -> tuple[EngineRun, StepSamples | None]:
    """Iteration 0's engine run, and with ``sim.samples`` > 1 the distribution over all of them."""
    faults = scenario.faults
    jitter = faults.jitter
    cv = jitter.compute_cv if jitter is not None else None
    base = jitter.seed if jitter is not None else 0

    def slowdown(rank: int) -> float:
        return faults.slowdown_of(rank, gpus_per_node)

    n = scenario.sim.samples
    first: EngineRun | None = None
    times: list[float] = []
    compute: list[dict[int, float]] = []
    is_compute = np.array([t.comm is None and t.category == "compute" for t in program.tasks], dtype=bool)
    ranks = np.array([t.rank for t in program.tasks], dtype=np.int64)
    for i in range(n):
        durations = perturbed_durations(program, slowdown, cv, base + i)
        run = run_program(program, resolver, durations=durations, **engine)
        first = first or run
        if n > 1:
            times.append(run.makespan_s)
            busy = np.bincount(ranks[is_compute], weights=(run.end_s - run.start_s)[is_compute],
                               minlength=int(ranks.max()) + 1 if len(ranks) else 0)
            compute.append({r: float(busy[r]) for r in program.ranks})
    assert first is not None
    samples = step_samples([base + i for i in range(n)], times, compute) if n > 1 else None
    return first, samples


def faults_summary(scenario: Scenario, program: Program, symmetry_reason: str, cluster: ClusterGraph,
                   links: list[PerturbedLink], samples: StepSamples | None) -> FaultsSummary | None:
    """The Result's account of the perturbations (None for a scenario without faults)."""
    faults = scenario.faults
    if faults.empty:
        return None
    gpn = cluster.gpus_per_node
    slow = {r: faults.slowdown_of(r, gpn) for r in range(scenario.world_size)}
    out = [PerturbedLinkOut(label=p.label, kind=cluster.links[p.link_id].kind, tier=cluster.links[p.link_id].tier,
                            bandwidth_factor=p.bandwidth_factor, latency_add_s=p.latency_add_s, faults=list(p.faults))
           for p in links]
    individually = program.ranks if all(v == 1 for v in program.represents.values()) else ()
    return FaultsSummary(simulated_individually=rank_ranges(individually) or "none (one rank stands for each stage)",
                         symmetry=symmetry_reason, stragglers={r: s for r, s in slow.items() if s != 1.0},
                         jitter_cv=faults.jitter.compute_cv if faults.jitter else None, links=out, samples=samples)
