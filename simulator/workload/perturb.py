"""Compute perturbations of one iteration (``faults.stragglers`` and ``faults.jitter``) as
per-task durations for the engine.

A compute task of rank r takes ``d + (s_r * j - 1) * c`` seconds, where ``d`` is its nominal
duration, ``c`` the compute inside it (all of ``d`` for a plain compute task; the inner
compute ``FusedLayers.compute_s`` of a fused run of layers, whose collectives keep their
time), ``s_r`` the rank's straggler slowdown and ``j`` its jitter factor. Jitter draws one
lognormal factor of mean 1 and coefficient of variation ``cv`` per compute task, in program
order, from ``numpy.random.default_rng(seed)``; a fused run of n layers stands for n layers'
independent draws, so its factor has ``cv / sqrt(n)``. Lognormal: sigma^2 = ln(1 + cv^2),
mu = -sigma^2 / 2 (mean exp(mu + sigma^2/2) = 1, variance (e^{sigma^2} - 1) = cv^2).

Communication tasks are untouched here: degraded links change the cluster graph
(:mod:`simulator.cluster.faults`), and a collective waits for its slowest member in the engine.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from simulator.ir import Program, Task

__all__ = ["perturbed_durations", "lognormal_factors"]


def lognormal_factors(rng: np.random.Generator, cv: np.ndarray) -> np.ndarray:
    """One factor of mean 1 and coefficient of variation ``cv[i]`` for each entry."""
    sigma2 = np.log1p(cv * cv)
    return np.exp(rng.standard_normal(len(cv)) * np.sqrt(sigma2) - sigma2 / 2)


def perturbed_durations(program: Program, slowdown_of: Callable[[int], float], cv: float | None,
                        seed: int) -> list[float] | None:
    """Each task's duration under the stragglers' slowdowns and the jitter (None: nothing changes)."""
    tasks = program.tasks
    compute = [t.id for t in tasks if t.comm is None and t.category == "compute" and t.duration_s > 0]
    slow = {r: slowdown_of(r) for r in program.ranks}
    if not cv and all(s == 1.0 for s in slow.values()):
        return None
    inner = np.array([_compute_s(tasks[i]) for i in compute])
    factor = np.array([slow[tasks[i].rank] for i in compute])
    if cv:
        units = np.array([_units(tasks[i]) for i in compute], dtype=float)
        factor = factor * lognormal_factors(np.random.default_rng(seed), cv / np.sqrt(units))
    out = [t.duration_s for t in tasks]
    for i, c, f in zip(compute, inner.tolist(), factor.tolist(), strict=True):
        out[i] = max(0.0, out[i] + (f - 1.0) * c)
    return out


def _compute_s(task: Task) -> float:
    fused = task.info.fused if task.info is not None else None
    return fused.compute_s if fused is not None else task.duration_s


def _units(task: Task) -> int:
    fused = task.info.fused if task.info is not None else None
    return 1 if fused is None else max(1, fused.units[1] - fused.units[0] + 1)
