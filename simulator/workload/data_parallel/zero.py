"""``sharding: zero1 / zero2``: DeepSpeed ZeRO stage 1/2 and Megatron's distributed optimizer.

Gradients are reduced in buckets of ``reduce_bucket_size`` elements (all-reduce of
multi-rank buckets by default, or reduce-scatter, Megatron's distributed optimizer), every
micro-step for stage 2 and only at the accumulation boundary for stage 1. ``overlap_comm``
is off by default: stage 2's backward waits for each bucket; stage 1 reduces all its buckets
once the stage's last backward is done (DeepSpeed's pipeline engine ``ReduceGrads`` step,
Megatron's ``finalize_model_grads`` without ``--overlap-grad-reduce``), so later stages'
reductions never delay the pipeline's last backward. The optimizer steps on the 1/N shard;
the updated parameters are all-gathered after the step in ``allgather_bucket_size`` pieces.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field

from simulator.costs.memory import ModelStateBytes, sharded_model_state_bytes
from simulator.ir import OpName
from simulator.workload.data_parallel.base import Strategy, grad_reduce_bytes, param_bytes
from simulator.workload.emitter import Collective, RankEmitter

__all__ = ["BucketedZero", "ZeroState"]


@dataclass
class ZeroState:
    pending: float = 0.0  # gradient elements waiting in the IPG bucket
    comm_tasks: list[int] = field(default_factory=list)
    wait: list[int] = field(default_factory=list)  # reductions the next compute must wait for


@dataclass
class BucketedZero(Strategy[ZeroState]):
    """ZeRO stage ``zero_stage`` (1 or 2): see the module docstring."""

    zero_stage: int = 1

    @property
    def _reduce_op(self) -> OpName:
        return "reduce_scatter" if self.scenario.parallelism.zero.gradient_reduction == "reduce_scatter" else "all_reduce"

    @property
    def _overlap(self) -> bool:
        overlap = self.scenario.parallelism.zero.overlap_comm
        return bool(overlap) if overlap is not None else False

    def model_states(self, stage: int, params: float, per: ModelStateBytes) -> ModelStateBytes:
        states = sharded_model_state_bytes(params, per, stage=self.zero_stage, shard_ranks=self.dp_ranks)
        if self.scenario.parallelism.offload_optimizer:
            return ModelStateBytes(states.params, states.grads, 0.0)
        return states

    def static_buffers(self, params: float) -> float:
        """The IPG bucket DeepSpeed reduces from (contiguous gradients): reduce_bucket_size
        elements (the Megatron-style reduce-scatter keeps its gradients in the grad buffer)."""
        if self._reduce_op == "reduce_scatter":
            return 0.0
        return min(self.scenario.parallelism.zero.reduce_bucket_size, params) * grad_reduce_bytes(self.scenario)

    def boundary_units(self, stage: int, phase: str, last: bool) -> set[int] | None:
        if phase == "bwd" and (self.zero_stage == 2 or (last and self._overlap)):
            return None
        return set()

    def start_rank(self, rank: int) -> ZeroState:
        return ZeroState()

    def before(self, emit: RankEmitter[ZeroState], unit: int, phase: str, mb: int, deps: list[int]) -> list[int]:
        state = emit.state
        if state.wait:
            deps = [*deps, *state.wait]
            state.wait = []
        return deps

    def after(self, emit: RankEmitter[ZeroState], unit: int, phase: str, mb: int, task: int, *, last: bool) -> None:
        if phase != "bwd" or self.dp_ranks == 1:
            return
        if self.zero_stage == 1 and not last:
            return
        state = emit.state
        state.pending += self.layout.unit_numel(emit.stage, unit)
        if self.zero_stage == 1 and not self._overlap:
            return  # reduced after the stage's last backward (finish_rank)
        bucket = self.scenario.parallelism.zero.reduce_bucket_size
        if state.pending >= bucket:
            count = int(state.pending // bucket)
            self._reduce(emit, count * bucket, count, [task], key=(mb, unit))
            state.pending -= count * bucket

    def _reduce(self, emit: RankEmitter[ZeroState], elements: float, count: int, deps: list[int],
                key: Hashable) -> None:
        nbytes = elements * grad_reduce_bytes(self.scenario) / count
        op = self._reduce_op
        tid = emit.collective(Collective(f"zero.{op}", op, self.grad_axis, nbytes, stream="dp", key=key,
                                         count=count), deps)
        emit.state.comm_tasks.append(tid)
        if not self._overlap:
            emit.state.wait.append(tid)

    def finish_rank(self, emit: RankEmitter[ZeroState]) -> None:
        state = emit.state
        if state.pending > 0 and self.dp_ranks > 1:
            bucket = self.scenario.parallelism.zero.reduce_bucket_size
            count = 1 if self._overlap else max(1, math.ceil(state.pending / bucket))
            self._reduce(emit, state.pending, count, [emit.last_compute], key="tail")
            state.pending = 0.0
        deps = self.end_of_backward(emit, [emit.last_compute, *state.comm_tasks])
        if self.dp_ranks > 1:
            deps = self.grad_norm(emit, self.grad_axis, deps)
        params = self.layout.params_of_stage(emit.stage)
        shard = params / self.dp_ranks
        if self.scenario.parallelism.offload_optimizer:
            deps = self.offload_step(emit, shard, deps)
        else:
            deps = [emit.optimizer(deps, shard)]
        if self.dp_ranks > 1:  # updated 16-bit shards all-gathered into every rank's parameters
            bucket = self.scenario.parallelism.zero.allgather_bucket_size
            count = max(1, math.ceil(params / bucket))
            emit.collective(Collective("zero.param_allgather", "all_gather", self.grad_axis,
                                       params * param_bytes(self.scenario) / count, stream="dp", key="params",
                                       count=count), deps)
