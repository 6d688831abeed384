"""Data-parallel strategies: how gradients are synchronised and model states are sharded.

One small interface (:class:`Strategy`) and a registry keyed by ``parallelism.sharding``
(STYLE.md #7). The workload builder calls the hooks while it walks a rank's schedule:

* ``model_states`` / ``static_buffers``: what the rank holds from the start;
* ``before_layer`` / ``after_layer``: per layer and pass (parameter gathering, gradient
  reduce-scatter for ZeRO-3/FSDP/MiCS);
* ``after_unit``: a module's gradients are complete (bucketed reductions);
* ``finish_rank``: the end of the iteration (remaining reductions, optimizer step,
  parameter all-gather after a sharded step).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from simulator.cluster.mesh import Mesh
from simulator.costs.memory import ModelStateBytes, bytes_per_element, sharded_model_state_bytes
from simulator.scenario.spec import Scenario
from simulator.workload.data_parallel import Bucket, assign_buckets

if TYPE_CHECKING:
    from simulator.workload.plan import ModelLayout, WorkloadBuilder, _RankContext

__all__ = ["Strategy", "DDP", "strategy_for", "STRATEGIES", "grad_reduce_bytes"]


def grad_reduce_bytes(scenario: Scenario) -> int:
    """Bytes per gradient element on the wire: the training dtype unless overridden."""
    dtype = scenario.training.grad_reduce_dtype
    if dtype == "auto":
        precision = scenario.training.precision
        return 4 if precision in ("fp32", "tf32") else 2
    return bytes_per_element(dtype)


@dataclass
class Strategy:
    scenario: Scenario
    mesh: Mesh
    layout: ModelLayout

    # states and buffers ----------------------------------------------------------------

    def model_states(self, params: float, per: ModelStateBytes) -> ModelStateBytes:
        return sharded_model_state_bytes(params, per, stage=0, shard_ranks=1)

    def static_buffers(self, params: float) -> float:
        return 0.0

    # hooks -------------------------------------------------------------------------------

    def start_rank(self, builder: WorkloadBuilder, rank: int) -> object:
        return None

    def before_layer(self, builder: WorkloadBuilder, ctx: _RankContext, layer: int, phase: str, mb: int,
                     deps: list[int]) -> list[int]:
        return deps

    def after_layer(self, builder: WorkloadBuilder, ctx: _RankContext, layer: int, phase: str, mb: int,
                    task: int, *, last: bool) -> None:
        return None

    def after_unit(self, builder: WorkloadBuilder, ctx: _RankContext, unit: int, mb: int, task: int, *,
                   last: bool) -> None:
        return None

    def finish_rank(self, builder: WorkloadBuilder, ctx: _RankContext) -> None:
        params = builder.layout.params_of_stage(ctx.stage)
        builder.optimizer_task(ctx, [ctx.last_compute], params)


@dataclass
class _DdpState:
    buckets: list[Bucket]
    emitted: set[int] = field(default_factory=set)
    comm_tasks: list[int] = field(default_factory=list)


@dataclass
class DDP(Strategy):
    """PyTorch DistributedDataParallel: bucketed all-reduce overlapped with backward."""

    def static_buffers(self, params: float) -> float:
        ddp = self.scenario.parallelism.ddp
        return 0.0 if ddp.gradient_as_bucket_view else params * grad_reduce_bytes(self.scenario)

    def start_rank(self, builder: WorkloadBuilder, rank: int) -> object:
        ddp = self.scenario.parallelism.ddp
        params = self.layout.stage_params(self.mesh.stage(rank))
        buckets = assign_buckets(params, grad_reduce_bytes(self.scenario), ddp.bucket_size_bytes,
                                 ddp.first_bucket_size_bytes)
        return _DdpState(buckets)

    def after_unit(self, builder: WorkloadBuilder, ctx: _RankContext, unit: int, mb: int, task: int, *,
                   last: bool) -> None:
        state: _DdpState = ctx.strategy_state  # type: ignore[assignment]
        if not last or self.mesh.dp == 1:
            return
        ready = [i for i, b in enumerate(state.buckets) if i not in state.emitted and b.ready_unit == unit]
        if ready:
            self._reduce(builder, ctx, state, ready, [task])

    def _reduce(self, builder: WorkloadBuilder, ctx: _RankContext, state: _DdpState, indices: list[int],
                deps: list[int]) -> None:
        """One task for buckets that become ready together; NCCL runs them back to back."""
        state.emitted.update(indices)
        nbytes = sum(state.buckets[i].nbytes for i in indices)
        count = len(indices)
        comm = builder.comm(ctx.rank, "all_reduce", "dp", nbytes / count, count=count)
        join = ("dp", comm.group, tuple(indices))
        tid = builder.pb.add(ctx.rank, "dp", f"dp.allreduce[{indices[0]}..{indices[-1]}]", "dp", comm=comm,
                             join=join, deps=deps, meta={"buckets": count, "bytes": nbytes})
        state.comm_tasks.append(tid)

    def finish_rank(self, builder: WorkloadBuilder, ctx: _RankContext) -> None:
        state: _DdpState = ctx.strategy_state  # type: ignore[assignment]
        rest = [i for i in range(len(state.buckets)) if i not in state.emitted]
        if rest and self.mesh.dp > 1:
            self._reduce(builder, ctx, state, rest, [ctx.last_compute])
        params = builder.layout.params_of_stage(ctx.stage)
        builder.optimizer_task(ctx, [ctx.last_compute, *state.comm_tasks], params)


STRATEGIES: dict[str, type[Strategy]] = {"none": DDP}


def strategy_for(scenario: Scenario, mesh: Mesh, layout: ModelLayout) -> Strategy:
    kind = scenario.parallelism.sharding
    if kind not in STRATEGIES:
        from simulator.errors import InfeasibleError

        raise InfeasibleError(f"sharding {kind!r} is not available yet", field="parallelism.sharding")
    return STRATEGIES[kind](scenario, mesh, layout)
