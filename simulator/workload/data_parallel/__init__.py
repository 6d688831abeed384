"""Data-parallel strategies, one module each, registered by ``parallelism.sharding``.

* ``none`` -- :mod:`.ddp` (PyTorch DDP); ``zero1`` / ``zero2`` -- :mod:`.zero`;
  ``zero3`` -- :mod:`.zero3`; ``fsdp`` / ``hsdp`` -- :mod:`.fsdp`; ``mics`` -- :mod:`.mics`.

The interface is :class:`~.base.Strategy`. Adding a strategy is one module plus one entry in
:data:`STRATEGIES` (and its tag in the scenario's ``Sharding`` literal); a strategy can also be
registered from outside the package with :func:`register_strategy`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simulator.cluster.mesh import Mesh
from simulator.costs.memory import ModelStateBytes
from simulator.costs.moe import expert_state_shards
from simulator.scenario.spec import Scenario
from simulator.workload.data_parallel.base import Strategy, gathered_bytes_per_element, grad_reduce_bytes, param_bytes
from simulator.workload.data_parallel.buckets import Bucket, Param, assign_buckets
from simulator.workload.data_parallel.ddp import DDP
from simulator.workload.data_parallel.fsdp import FSDP
from simulator.workload.data_parallel.mics import MiCS
from simulator.workload.data_parallel.zero import BucketedZero
from simulator.workload.data_parallel.zero3 import Zero3
from simulator.workload.layout import ModelLayout

__all__ = ["expert_sharded_states", "Strategy", "DDP", "BucketedZero", "Zero3", "FSDP", "MiCS", "STRATEGIES", "strategy_for",
           "register_strategy", "grad_reduce_bytes", "param_bytes", "gathered_bytes_per_element", "Param", "Bucket", "assign_buckets"]

StrategyFactory = Callable[[Scenario, Mesh, ModelLayout], Strategy[Any]]

STRATEGIES: dict[str, StrategyFactory] = {
    "none": DDP,
    "zero1": lambda sc, mesh, layout: BucketedZero(sc, mesh, layout, zero_stage=1),
    "zero2": lambda sc, mesh, layout: BucketedZero(sc, mesh, layout, zero_stage=2),
    "zero3": Zero3,
    "fsdp": FSDP,
    "hsdp": lambda sc, mesh, layout: FSDP(sc, mesh, layout, hybrid=True),
    "mics": MiCS,
}


def register_strategy(tag: str, factory: StrategyFactory) -> None:
    """Register (or replace) the strategy for ``parallelism.sharding: tag``. A tag outside the
    scenario's ``Sharding`` literal is only reachable through :func:`strategy_for` and
    ``build_workload(..., strategy=...)``."""
    STRATEGIES[tag] = factory


def strategy_for(scenario: Scenario, mesh: Mesh, layout: ModelLayout, tag: str | None = None) -> Strategy[Any]:
    """The registered strategy for the scenario's ``parallelism.sharding`` (or ``tag``)."""
    return STRATEGIES[tag or scenario.parallelism.sharding](scenario, mesh, layout)


def expert_sharded_states(strategy: Strategy[Any], scenario: Scenario, stage: int, params: float,
                          per: ModelStateBytes) -> ModelStateBytes:
    """A stage's model states with its routed-expert parameters sharded over the expert
    data-parallel group (world / (pp*ep*etp)) where the strategy shards (over dp x cp) what the
    dense parameters are; the rest as the strategy holds it (:func:`simulator.costs.moe.expert_state_shards`)."""
    experts = strategy.layout.expert_params_of_stage(stage) if scenario.model.moe else 0.0
    dense = strategy.model_states(stage, params - experts, per)
    if experts == 0.0:
        return dense
    sharded = strategy.model_states(stage, experts, per)
    full = (per.params * experts, per.grads * experts, per.optimizer * experts)
    edp = scenario.edp
    ex = [expert_state_shards(v, f, edp) for v, f in zip((sharded.params, sharded.grads, sharded.optimizer), full,
                                                          strict=True)]
    return ModelStateBytes(dense.params + ex[0], dense.grads + ex[1], dense.optimizer + ex[2])
