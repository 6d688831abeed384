"""Step times predicted from two short simulations instead of a whole one.

Part of step 4 of the search (:mod:`simulator.search`): past the pipeline's fill every
further micro-batch adds the same time, so runs with ``m1`` and ``2*m1`` micro-batches give
the step with ``m`` (:func:`probe_micro_batches`); candidates with few micro-batches are
simulated whole. Every point goes through :func:`simulator.sweep.run_sweep`
(:func:`simulate_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from simulator.scenario import Scenario
from simulator.search.report import Candidate
from simulator.search.space import scenario_json
from simulator.sweep import SweepPoint, SweepProgress, run_sweep

__all__ = ["probe_micro_batches", "Estimate", "estimate_round", "simulate_rows"]


def probe_micro_batches(scenario: Scenario) -> tuple[int, int] | None:
    """Micro-batch counts ``(m1, 2*m1)`` of the two short runs that predict ``scenario``'s
    step time, or None when it is cheaper to simulate it whole (``m < 3*m1``).

    ``m1`` is the smallest count that fills the pipeline as the full run does: ``pp`` for
    1F1B (``pp - stage`` micro-batches in flight at most), ``2*pp`` interleaved (its warm-up
    holds up to ``2*(pp-1) + (v-1)*pp + 1`` chunks), 1 without pipeline. Past that the step
    grows by the same time per micro-batch (steady state), so
    ``step(m) = step(m1) + (m - m1) * (step(2*m1) - step(m1)) / m1``, and the peak memory is
    the full run's. This is exact (to round-off) for DDP, ZeRO-1/2, FSDP and every pipeline
    schedule in ``tests/test_search.py``; ZeRO-3 (and MiCS, built on it), whose prefetching depends on what
    the previous micro-batch left gathered, come within a fraction of a percent (0.3 % on
    Llama 3 70B). The ranking printed is always from whole simulations.
    """
    par = scenario.parallelism
    m1 = 2 * par.pp if par.pipeline_schedule == "interleaved" else par.pp
    if scenario.micro_batches < 3 * m1:
        return None
    return m1, 2 * m1


def _with_micro_batches(scenario: Scenario, m: int) -> Scenario:
    data = scenario_json(scenario)
    data.setdefault("training", {})["global_batch"] = m * scenario.training.micro_batch * scenario.dp
    return Scenario.model_validate(data)


@dataclass
class Estimate:
    """A candidate's predicted step time, or why there is none (out of memory, an error)."""

    candidate: Candidate
    step_s: float | None = None
    oom: bool = False
    error: str | None = None
    row: dict[str, Any] | None = None  # the full run's row when it was simulated whole


def estimate_round(cands: Sequence[Candidate], folder: str, executor: Any,
                   progress: Callable[[str, SweepProgress], None] | None, stage: str) -> list[Estimate]:
    """Short runs (or whole ones) of every candidate, and the step time they predict."""
    points: list[Scenario] = []
    plans: list[tuple[int, ...]] = []
    for cand in cands:
        probe = probe_micro_batches(cand.scenario)
        if probe is None:
            plans.append((len(points),))
            points.append(cand.scenario)
        else:
            plans.append((len(points), len(points) + 1, *probe))
            points.extend(_with_micro_batches(cand.scenario, m) for m in probe)
    rows = simulate_rows(points, folder, executor, progress, stage)
    out = []
    for cand, plan in zip(cands, plans, strict=True):
        first = rows[plan[0]]
        est = Estimate(cand)
        if len(plan) == 1:
            est.row = first
        runs = [rows[i] for i in plan[:2] if len(plan) > 1] or [first]
        if any(r.get("oom") for r in runs):
            est.oom = True
        elif any(r.get("error") for r in runs):
            est.error = next(r["error"] for r in runs if r.get("error"))
        elif len(plan) == 1:
            est.step_s = float(first["step_time_s"])
        else:
            m1, m2 = plan[2], plan[3]
            s1, s2 = float(runs[0]["step_time_s"]), float(runs[1]["step_time_s"])
            est.step_s = s1 + (cand.scenario.micro_batches - m1) * (s2 - s1) / (m2 - m1)
        out.append(est)
    return out


def simulate_rows(scenarios: Sequence[Scenario], folder: str, executor: Any,
                  progress: Callable[[str, SweepProgress], None] | None, stage: str) -> list[dict[str, Any]]:
    """Simulate ``scenarios`` whole as one sweep (cached in ``folder``) and return their rows;
    ``progress(stage, state)`` as points finish."""
    points = [SweepPoint(i, {}, s) for i, s in enumerate(scenarios)]
    hook = None if progress is None else (lambda state: progress(stage, state))
    return run_sweep(points, folder, executor=executor, varied=[], progress=hook).rows
