"""``sharding: zero1 / zero2``: DeepSpeed ZeRO stage 1/2 and Megatron's distributed optimizer.

Gradients are reduced in buckets of ``reduce_bucket_size`` elements (all-reduce of
multi-rank buckets by default, or reduce-scatter, Megatron's distributed optimizer), every
micro-step for stage 2 and only at the accumulation boundary for stage 1. ``overlap_comm``
is off by default: stage 2's backward waits for each bucket; stage 1 reduces all its buckets
once the stage's last backward is done (DeepSpeed's pipeline engine ``ReduceGrads`` step,
Megatron's ``finalize_model_grads`` without ``--overlap-grad-reduce``), so later stages'
reductions never delay the pipeline's last backward. The optimizer steps on the 1/N shard;
the updated parameters are all-gathered after the step in ``allgather_bucket_size`` pieces.

With ``overlap_param_gather`` (Megatron-Core's distributed optimizer,
``megatron/core/distributed/distributed_data_parallel.py`` and ``param_and_grad_buffer.py``
at NVIDIA/Megatron-LM@d98e8a64: ``_make_forward_pre_hook``, ``finish_param_sync``) the
all-gather of the updated parameters moves into the next step's forward, which this
steady-state iteration stands for: buckets are formed over the parameters in reverse
(backward) order and gathered in reverse bucket order, so the first layers' bucket goes
first. The first bucket's all-gather is dispatched at the start of the step
(``DistributedOptimizer.zero_grad``, megatron/core/optimizer/distrib_optimizer.py:1330-1337 at
NVIDIA/Megatron-LM@f2e5db402c44ae309aa6448bcb4ae87e8ae0f5f4), before the stage has its
input; a module's forward pre-hook waits for its bucket and then dispatches the next
bucket's (``_finish_param_sync_helper``, :1454-1475), which with
CUDA_DEVICE_MAX_CONNECTIONS=1 (required with sequence parallelism,
megatron/training/arguments.py:476-484) starts once that wait is passed: when the bucket is
gathered and the compute before the module is done. Only a unit's first forward of the step
waits; nothing is gathered after the optimizer step.
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
    gather_buckets: list[tuple[set[int], float]] = field(default_factory=list)  # (units, elements), gather order
    gathers: list[int] = field(default_factory=list)  # all-gather task of each bucket dispatched so far
    gated: set[int] = field(default_factory=set)  # units whose first forward already waited


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
        if phase == "fwd" and self._gather_in_forward:
            return None  # each unit's forward waits for its own bucket
        return set()

    @property
    def _gather_in_forward(self) -> bool:
        return self.scenario.parallelism.zero.overlap_param_gather and self.dp_ranks > 1

    def start_rank(self, rank: int) -> ZeroState:
        state = ZeroState()
        if self._gather_in_forward:
            state.gather_buckets = self._gather_buckets(self.mesh.stage(rank))
        return state

    def _gather_buckets(self, stage: int) -> list[tuple[set[int], float]]:
        """(units, elements) of the parameter all-gather buckets in the order they are gathered:
        filled over the parameters in reverse order, up to allgather_bucket_size elements
        (a parameter larger than that fills a bucket alone), then reversed."""
        cap = self.scenario.parallelism.zero.allgather_bucket_size
        buckets: list[tuple[set[int], float]] = []
        units: set[int] = set()
        size = 0.0
        for param in reversed(self.layout.stage_params(stage)):
            units.add(param.unit)
            size += param.numel
            if size >= cap:
                buckets.append((units, size))
                units, size = set(), 0.0
        if size > 0:
            buckets.append((units, size))
        return list(reversed(buckets))

    def _dispatch_gather(self, emit: RankEmitter[ZeroState], deps: list[int]) -> None:
        """The next bucket's all-gather: the first at the start of the step (the optimizer's
        ``zero_grad``), each later one once the one before it is done and the compute that
        waits for that one may start (``deps``): with CUDA_DEVICE_MAX_CONNECTIONS=1 it is
        queued behind that wait and the kernels launched before it."""
        state = emit.state
        index = len(state.gathers)
        _, elements = state.gather_buckets[index]
        after = [state.gathers[-1], *deps] if state.gathers else []
        state.gathers.append(emit.collective(Collective(
            "zero.param_allgather", "all_gather", self.grad_axis, elements * param_bytes(self.scenario),
            stream="dp", key=("params", index)), after))

    def before(self, emit: RankEmitter[ZeroState], unit: int, phase: str, mb: int, deps: list[int]) -> list[int]:
        state = emit.state
        if state.wait:
            deps = [*deps, *state.wait]
            state.wait = []
        if phase == "fwd" and state.gather_buckets and unit not in state.gated:
            state.gated.add(unit)
            index = next((i for i, (units, _) in enumerate(state.gather_buckets) if unit in units), None)
            if index is not None:
                while len(state.gathers) <= index:  # the pre-hook dispatches a bucket nothing has yet
                    self._dispatch_gather(emit, deps)
                deps = [*deps, state.gathers[index]]
                if len(state.gathers) < len(state.gather_buckets):  # ... and the next one once it waited
                    self._dispatch_gather(emit, deps)
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
        if self.dp_ranks > 1 and not self._gather_in_forward:  # updated 16-bit shards into every rank's parameters
            bucket = self.scenario.parallelism.zero.allgather_bucket_size
            count = max(1, math.ceil(params / bucket))
            emit.collective(Collective("zero.param_allgather", "all_gather", self.grad_axis,
                                       params * param_bytes(self.scenario) / count, stream="dp", key="params",
                                       count=count), deps)
