"""Goodput of a whole training run (``dtsim goodput``, the sweep's goodput metrics): failure
rates, checkpoints and restarts of the scenario's ``reliability`` section turned into the
expected wall-clock, ETTR and cost of a token budget (:mod:`simulator.goodput.model`, on the
formulas of :mod:`simulator.costs.goodput`), with a seeded Monte-Carlo spread
(:mod:`simulator.goodput.montecarlo`)."""

from __future__ import annotations

from typing import Any

from simulator.goodput.model import GoodputEstimate, GoodputInputs, checkpoint_bytes, estimate, inputs_for

__all__ = ["GoodputEstimate", "GoodputInputs", "checkpoint_bytes", "estimate", "inputs_for", "goodput_metrics",
           "node_price"]


def node_price(node_type: str, prices: Any = None) -> float | None:
    """US dollars per node-hour of ``node_type`` from ``topologies/prices.yaml`` (or ``prices``), None if unlisted."""
    from simulator.search.pricing import load_prices

    entry = (prices or load_prices()).get(node_type)
    return entry.usd_per_hour if entry is not None else None


def goodput_metrics(scenario: Any, result: Any) -> dict[str, float | None]:
    """The sweep's goodput columns of a scenario with a ``reliability`` section: expected
    time-to-train (``goodput_wall_s``) and cost of ``reliability.tokens`` (default 20 per
    parameter), ETTR, the checkpoint interval and the job's mean time between failures."""
    from simulator.search.pricing import chinchilla_tokens

    spec = scenario.reliability
    tokens = spec.tokens if spec is not None and spec.tokens is not None else chinchilla_tokens(result.params)
    inputs = inputs_for(scenario, result)
    est = estimate(inputs, tokens, usd_per_node_hour=node_price(inputs.node_type))
    return {"goodput_tokens": tokens, "goodput_ettr": est.ettr, "goodput_wall_s": est.wall_s,
            "goodput_ideal_s": est.ideal_s, "goodput_cost_usd": est.cost_usd,
            "goodput_interval_s": est.interval_s, "goodput_checkpoint_s": est.checkpoint_s,
            "goodput_job_mtbf_s": est.job_mtbf_s}
