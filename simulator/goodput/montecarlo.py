"""Monte-Carlo goodput: seeded failure schedules replayed exactly (:func:`simulator.costs.goodput.replay`),
giving the spread of wall-clock, ETTR and cost around the expectation of :mod:`simulator.goodput.model`.

Each trial draws the unplanned failures of the job as one Poisson process (rate = hardware +
software), each a hardware one with probability hardware / total, and the planned
interruptions as a second one. A hardware failure takes a hot spare when one is free (the
nodes it replaced come back after ``repair_time``), else it waits ``requeue_time``; with
``elastic`` it never waits, and the run's work is the expectation's (stretched by the mean
data-parallel shortfall, not drawn per trial). Trial ``i`` uses the ``i``-th child of
``numpy.random.SeedSequence(seed)``, so a trial's schedule does not depend on how many run.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from simulator import limits
from simulator.costs.goodput import Failure, replay
from simulator.goodput.model import GoodputEstimate, GoodputInputs

__all__ = ["monte_carlo", "schedule"]


def schedule(rng: np.random.Generator, inputs: GoodputInputs, est: GoodputEstimate) -> Iterator[Failure]:
    """An endless time-ordered stream of failures of one trial."""
    spec = inputs.spec
    hw_rate = 1.0 / est.hardware_mtbf_s if math.isfinite(est.hardware_mtbf_s) else 0.0
    sw_rate = 1.0 / est.software_mtbf_s if math.isfinite(est.software_mtbf_s) else 0.0
    rate = hw_rate + sw_rate
    planned_rate = 1.0 / spec.planned_mtbf if spec.planned_mtbf else 0.0
    next_unplanned = rng.exponential(1.0 / rate) if rate > 0 else math.inf
    next_planned = rng.exponential(1.0 / planned_rate) if planned_rate > 0 else math.inf
    out: list[float] = []  # return times of the nodes in repair
    while math.isfinite(next_unplanned) or math.isfinite(next_planned):
        if next_planned < next_unplanned:
            yield Failure(next_planned, est.restart_software_s, planned=True)
            next_planned += rng.exponential(1.0 / planned_rate)
            continue
        f = next_unplanned
        restart = est.restart_software_s
        if rng.random() * rate < hw_rate:
            while out and out[0] <= f:
                heapq.heappop(out)
            if len(out) >= spec.hot_spares and not spec.elastic:
                restart += spec.requeue_time
            heapq.heappush(out, f + spec.repair_time)
        yield Failure(f, restart)
        next_unplanned += rng.exponential(1.0 / rate)


def monte_carlo(inputs: GoodputInputs, est: GoodputEstimate, trials: int, seed: int = 0) -> GoodputEstimate:
    """``est`` with ``spread``: mean, p5, p50, p95 of wall_s, ettr, cost_usd and failures over
    ``trials`` seeded trials (limits ``goodput_trials`` and ``goodput_events``)."""
    limits.check("goodput_trials", trials, field="--trials")
    expected = est.run.failures + est.run.planned
    limits.check("goodput_events", trials * expected, what="failures the Monte-Carlo trials replay (trials x "
                 f"{expected:,.0f} expected per run)", field="--trials")
    write_s = est.write_s if inputs.spec.checkpoint.asynchronous else 0.0
    children = np.random.SeedSequence(seed).spawn(trials)
    rows: dict[str, list[float]] = {"wall_s": [], "ettr": [], "cost_usd": [], "failures": []}
    for child in children:
        run = replay(est.run.productive_s, est.interval_s, est.checkpoint_s,
                     schedule(np.random.default_rng(child), inputs, est), write_s=write_s)
        rows["wall_s"].append(run.wall_s)
        rows["ettr"].append(est.ideal_s / run.wall_s)
        rows["failures"].append(run.failures)
        if est.usd_per_node_hour is not None:
            rows["cost_usd"].append(run.wall_s / 3600.0 * est.nodes_paid * est.usd_per_node_hour)
    spread = {name: _summary(values) for name, values in rows.items() if values}
    return replace(est, spread=spread)


def _summary(values: list[float]) -> dict[str, float]:
    a = np.asarray(values)
    p5, p50, p95 = np.percentile(a, [5, 50, 95])
    return {"mean": float(a.mean()), "p5": float(p5), "p50": float(p50), "p95": float(p95)}
