"""``sharding: mics``: MiCS (DeepSpeed ``runtime/zero/mics.py``; Zhang et al. VLDB'22).

ZeRO-3 mechanics inside partition groups of ``shard_group_size`` ranks (a hierarchical
parameter gather when they span nodes and it is enabled), and the 1/P gradient shard
all-reduced across replication groups only at the accumulation boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.workload.data_parallel.base import grad_reduce_bytes
from simulator.workload.data_parallel.zero3 import Emit, Zero3
from simulator.workload.emitter import Collective

__all__ = ["MiCS"]


@dataclass
class MiCS(Zero3):
    """MiCS: ZeRO-3 inside partition groups, 2-hop gradient synchronisation."""

    def __post_init__(self) -> None:
        self.shard_axis = "dp_shard"

    def gather_algorithm(self) -> str | None:
        if not self.scenario.parallelism.mics.hierarchical_params_gather:
            return None
        group = self.mesh.group(0, self.shard_axis)
        nodes = {r // self.scenario.cluster.gpus_in_node for r in group}
        return "hierarchical" if len(nodes) > 1 else None

    def end_of_boundary(self, emit: Emit, deps: list[int]) -> list[int]:
        """allreduce_mics_shard_grads: the 1/P gradient shard across the replication group,
        once, at the accumulation boundary."""
        if len(self.mesh.group(0, "dp_replicate")) == 1:
            return deps
        nbytes = self.layout.params_of_stage(emit.stage) * grad_reduce_bytes(self.scenario) / self.shard_ranks
        return [emit.collective(Collective("mics.replicate.allreduce", "all_reduce", "dp_replicate", nbytes,
                                           stream="dp", key="boundary", category="dp"), deps)]
