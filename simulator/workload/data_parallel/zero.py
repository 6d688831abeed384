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

``bucketing: megatron-core`` (stage 1: Megatron's distributed optimizer) forms the buckets as
Megatron-Core's ``ParamAndGradBuffer`` does (NVIDIA/Megatron-LM@f2e5db402c44ae309aa6448bcb4ae87e8ae0f5f4;
:func:`~.buckets.megatron_buckets`), one set per model chunk, shared by the gradient
reduce-scatter and the parameter all-gather:

* bucket size ``max(reduce_bucket_size, bucket_size_per_dp_rank * dp)`` elements
  (megatron/core/distributed/distributed_data_parallel.py:51-54), but a single bucket without
  ``overlap_comm`` (:55-57), on every pipeline stage after the first (:71-72) and on every
  model chunk after the first (``disable_bucketing``, megatron/training/training.py:455-458);
* the routed experts' parameters are buckets of their own after the dense ones, reduced and
  gathered over the expert data-parallel group (:func:`~.buckets.split_expert`); the optimizer
  steps on dense / (dp x cp) + experts / edp parameters;
* with pipeline parallelism the tied embedding (first stage) and output weight (last stage)
  are a bucket of their own (param_and_grad_buffer.py:305-325);
* with ``overlap_comm`` a first-stage bucket's reduce-scatter starts once every gradient in it
  is ready during the last backward (``register_grad_ready`` only while
  ``is_last_microbatch``, param_and_grad_buffer.py:172-187 and 537-549; ``no_sync`` for the
  other micro-batches, distributed_data_parallel.py:232-243, schedules.py:1416-1417 and
  1441-1442); the later stages keep ``no_sync`` through their whole backward and launch
  their buckets after the cool-down (``--no-delay-grad-reduce`` unset: ``grad_sync_func``,
  megatron/training/training.py:1001-1004, schedules.py:1455-1459); under the interleaved
  schedule a chunk's buckets are launched after its last backward (schedules.py:745-759; on
  stage p Megatron waits p more backward steps, not modelled); without ``overlap_comm`` every
  bucket is reduced after the backward (``finish_grad_sync``, param_and_grad_buffer.py:154-165);
* the parameter all-gather runs over the same buckets, chunk by chunk, each chunk's buckets
  in reverse (``_get_model_param_buffer_dp_views``, distrib_optimizer.py:1339-1376): the
  later stages gather their whole stage in one collective at the start of the step;
* the gradient buffer's own passes on the compute stream: it is zeroed at the start of every
  step (``zero_grad_buffer``, megatron/training/training.py:584-585 -> ``grad_data.zero_()``,
  param_and_grad_buffer.py:503-508: one write of the stage's reduce-dtype gradients), and
  before each bucket's reduction ``start_grad_sync`` takes its L2 norm when ``grad_nan_check``
  (``check_for_nan_in_grad``, :109-118: one read) and multiplies it by 1/dp when
  ``grad_prescale`` (``gradient_scaling_factor``, :120-123 and distributed_data_parallel.py:147-158
  without ``average_in_collective``: a read and a write); the reduction starts after them.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from functools import cached_property

from simulator.costs.memory import ModelStateBytes, sharded_model_state_bytes
from simulator.ir import OpName
from simulator.workload.data_parallel.base import Strategy, gathered_bytes_per_element, grad_reduce_bytes
from simulator.workload.data_parallel.buckets import Bucket, megatron_buckets, split_expert
from simulator.workload.emitter import Collective, RankEmitter

__all__ = ["BucketedZero", "ZeroState"]


@dataclass
class ZeroState:
    pending: float = 0.0  # gradient elements waiting in the IPG bucket
    comm_tasks: list[int] = field(default_factory=list)
    wait: list[int] = field(default_factory=list)  # reductions the next compute must wait for
    gather_buckets: list[tuple[set[int], float, bool]] = field(default_factory=list)  # (units, elements, expert), gather order
    gathers: list[int] = field(default_factory=list)  # all-gather task of each bucket dispatched so far
    gated: set[int] = field(default_factory=set)  # units whose first forward already waited
    buckets: list[Bucket] = field(default_factory=list)  # bucketing megatron-core: reduction buckets
    launch_units: list[int | None] = field(default_factory=list)  # ... the unit whose last backward launches each
    reduced: set[int] = field(default_factory=set)  # ... whose reduction is emitted
    zeroed: bool = False  # bucketing megatron-core: the gradient buffer's zeroing is emitted


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

    @cached_property  # read per unit and pass: the scenario is fixed
    def _megatron(self) -> bool:
        return self.zero_stage == 1 and self.scenario.parallelism.zero.bucketing == "megatron-core"

    def bucket_elements(self, size: int) -> int:
        """A bucket size grown with the data-parallel size: max(size, bucket_size_per_dp_rank * dp)
        (Megatron counts the data-parallel ranks without context parallelism)."""
        return max(size, self.scenario.parallelism.zero.bucket_size_per_dp_rank * self.mesh.dp)

    def megatron_chunk_buckets(self, stage: int) -> list[list[Bucket]]:
        """Megatron-Core's buckets of each model chunk of ``stage`` (module docstring), in
        bucket (reduction) order."""
        par, model = self.scenario.parallelism, self.scenario.model
        out = []
        for c, chunk in enumerate(self.layout.chunks_of_stage(stage)):
            bucketed = self._overlap and stage == 0 and c == 0
            cap = self.bucket_elements(par.zero.reduce_bucket_size) if bucketed else None
            own: set[str] = set()
            if par.pp > 1 and model.tied_embeddings:
                own |= {"embedding"} if chunk.embedding else set()
                own |= {"final_norm+output"} if chunk.logits else set()
            dense, expert = split_expert(self.layout.chunk_params(chunk))
            out.append(megatron_buckets(dense, cap, frozenset(own))
                       + [replace(b, expert=True) for b in megatron_buckets(expert, cap)])
        return out

    def launch_units(self, stage: int) -> list[int | None]:
        """For each Megatron-Core bucket of ``stage`` (bucket order), the unit after whose last
        backward its reduction is launched; None: after the stage's backward (module docstring)."""
        interleaved = self.scenario.parallelism.pipeline_schedule == "interleaved"
        out: list[int | None] = []
        for chunk in self.megatron_chunk_buckets(stage):
            chunk_end = min(b.ready_unit for b in chunk)
            for b in chunk:
                if not self._overlap or (stage > 0 and not interleaved):
                    out.append(None)
                else:
                    out.append(chunk_end if interleaved else b.ready_unit)
        return out

    def boundary_units(self, stage: int, phase: str, last: bool) -> set[int] | None:
        if phase == "bwd" and self._megatron:
            return {u for u in self.launch_units(stage) if u is not None} if last else set()
        if phase == "bwd" and (self.zero_stage == 2 or (last and self._overlap)):
            return None
        if phase == "fwd" and self._gather_in_forward:
            return None  # each unit's forward waits for its own bucket
        return set()

    @property
    def _gather_in_forward(self) -> bool:
        return self.scenario.parallelism.zero.overlap_param_gather and (self.reduces if self._megatron
                                                                        else self.dp_ranks > 1)

    def start_rank(self, rank: int) -> ZeroState:
        state = ZeroState()
        stage = self.mesh.stage(rank)
        if self._megatron:
            chunks = self.megatron_chunk_buckets(stage)
            state.buckets = [b for chunk in chunks for b in chunk]
            state.launch_units = self.launch_units(stage)
            if self._gather_in_forward:
                state.gather_buckets = [({p.unit for p in b.params}, b.elements, b.expert) for chunk in chunks
                                        for b in reversed(chunk) if self.ranks_of(b.expert) > 1]
        elif self._gather_in_forward:
            state.gather_buckets = self._gather_buckets(stage)
        return state

    def _gather_buckets(self, stage: int) -> list[tuple[set[int], float, bool]]:
        """(units, elements) of the parameter all-gather buckets in the order they are gathered:
        filled over the parameters in reverse order, up to allgather_bucket_size elements
        (a parameter larger than that fills a bucket alone), then reversed."""
        cap = self.bucket_elements(self.scenario.parallelism.zero.allgather_bucket_size)
        buckets: list[tuple[set[int], float, bool]] = []
        units: set[int] = set()
        size = 0.0
        for param in reversed(self.layout.stage_params(stage)):
            units.add(param.unit)
            size += param.numel
            if size >= cap:
                buckets.append((units, size, False))
                units, size = set(), 0.0
        if size > 0:
            buckets.append((units, size, False))
        return list(reversed(buckets))

    def _gather_elem_bytes(self, stage: int) -> float:
        return gathered_bytes_per_element(self.scenario, self.layout.stage_params(stage))

    def _dispatch_gather(self, emit: RankEmitter[ZeroState], deps: list[int]) -> None:
        """The next bucket's all-gather: the first at the start of the step (the optimizer's
        ``zero_grad``), each later one once the one before it is done and the compute that
        waits for that one may start (``deps``): with CUDA_DEVICE_MAX_CONNECTIONS=1 it is
        queued behind that wait and the kernels launched before it."""
        state = emit.state
        index = len(state.gathers)
        _, elements, expert = state.gather_buckets[index]
        after = [state.gathers[-1], *deps] if state.gathers else []
        state.gathers.append(emit.collective(Collective(
            "zero.param_allgather", "all_gather", self.axis_of(expert), elements * self._gather_elem_bytes(emit.stage),
            stream="dp", key=("params", index)), after))

    def before(self, emit: RankEmitter[ZeroState], unit: int, phase: str, mb: int, deps: list[int]) -> list[int]:
        state = emit.state
        if state.wait:
            deps = [*deps, *state.wait]
            state.wait = []
        if self._megatron and not state.zeroed:  # zero_grad_buffer() before the step's first forward
            state.zeroed = True
            elements = self.layout.params_of_stage(emit.stage)
            zeroing = emit.memory_pass("zero_grad_buffer", elements * grad_reduce_bytes(self.scenario), elements, [])
            deps = [*deps, zeroing]
        if phase == "fwd" and state.gather_buckets and unit not in state.gated:
            state.gated.add(unit)
            index = next((i for i, (units, _, _) in enumerate(state.gather_buckets) if unit in units), None)
            if index is not None:
                while len(state.gathers) <= index:  # the pre-hook dispatches a bucket nothing has yet
                    self._dispatch_gather(emit, deps)
                deps = [*deps, state.gathers[index]]
                if len(state.gathers) < len(state.gather_buckets):  # ... and the next one once it waited
                    self._dispatch_gather(emit, deps)
        return deps

    def after(self, emit: RankEmitter[ZeroState], unit: int, phase: str, mb: int, task: int, *, last: bool) -> None:
        if phase != "bwd" or not self.reduces:
            return
        if self.zero_stage == 1 and not last:
            return
        state = emit.state
        if self._megatron:
            self._reduce_buckets(emit, [i for i, u in enumerate(state.launch_units) if u == unit], [task])
            return
        if self.dp_ranks == 1:
            return
        state.pending += self.layout.unit_numel(emit.stage, unit)
        if self.zero_stage == 1 and not self._overlap:
            return  # reduced after the stage's last backward (finish_rank)
        bucket = self.bucket_elements(self.scenario.parallelism.zero.reduce_bucket_size)
        if state.pending >= bucket:
            count = int(state.pending // bucket)
            self._reduce(emit, count * bucket, count, [task], key=(mb, unit))
            state.pending -= count * bucket

    def _bucket_passes(self) -> int:
        """Passes over a bucket before its reduction (module docstring): norm 1, prescale 2."""
        zero = self.scenario.parallelism.zero
        return (1 if zero.grad_nan_check else 0) + (2 if zero.grad_prescale else 0)

    def _reduce(self, emit: RankEmitter[ZeroState], elements: float, count: int, deps: list[int],
                key: Hashable, expert: bool = False) -> None:
        if self.ranks_of(expert) == 1:
            return
        nbytes = elements * grad_reduce_bytes(self.scenario) / count
        passes = self._bucket_passes() if self._megatron else 0
        if passes:
            deps = [emit.memory_pass("bucket.grad_checks", passes * nbytes * count, elements, deps)]
        op = self._reduce_op
        tid = emit.collective(Collective(f"zero.{op}", op, self.axis_of(expert), nbytes, stream="dp", key=key,
                                         count=count), deps)
        emit.state.comm_tasks.append(tid)
        if not self._overlap:
            emit.state.wait.append(tid)

    def _reduce_buckets(self, emit: RankEmitter[ZeroState], indices: list[int], deps: list[int]) -> None:
        """Megatron-Core buckets ``indices``: one reduction each, in bucket order."""
        for i in indices:
            if i not in emit.state.reduced:
                emit.state.reduced.add(i)
                bucket = emit.state.buckets[i]
                self._reduce(emit, bucket.elements, 1, deps, key=("bucket", i), expert=bucket.expert)

    def finish_rank(self, emit: RankEmitter[ZeroState]) -> None:
        state = emit.state
        if self._megatron and self.reduces:
            self._reduce_buckets(emit, list(range(len(state.buckets))), [emit.last_compute])
        if state.pending > 0 and self.dp_ranks > 1:
            bucket = self.bucket_elements(self.scenario.parallelism.zero.reduce_bucket_size)
            count = 1 if self._overlap else max(1, math.ceil(state.pending / bucket))
            self._reduce(emit, state.pending, count, [emit.last_compute], key="tail")
            state.pending = 0.0
        params = self.layout.params_of_stage(emit.stage)
        shard = self.shard_params(emit.stage) if self._megatron else params / self.dp_ranks
        deps = self.end_of_backward(emit, [emit.last_compute, *state.comm_tasks], shard)
        if self.reduces:
            deps = self.grad_norm(emit, self.grad_axis, deps)
        if self.scenario.parallelism.offload_optimizer:
            deps = self.offload_step(emit, shard, deps)
        else:
            deps = [emit.optimizer(deps, shard)]
        if self.reduces and not self._gather_in_forward:  # updated 16-bit shards into every rank's parameters
            self._gather_after_step(emit, params, deps)

    def _gather_after_step(self, emit: RankEmitter[ZeroState], params: float, deps: list[int]) -> None:
        """The updated parameters all-gathered after the optimizer step: Megatron-Core's buckets,
        the dense ones over dp x cp and the routed experts' over the expert data-parallel group;
        else ``allgather_bucket_size`` pieces over dp x cp."""
        elem = self._gather_elem_bytes(emit.stage)
        if not self._megatron:
            if self.dp_ranks > 1:
                count = max(1, math.ceil(params / self.bucket_elements(self.scenario.parallelism.zero.allgather_bucket_size)))
                emit.collective(Collective("zero.param_allgather", "all_gather", self.grad_axis, params * elem / count,
                                           stream="dp", key="params", count=count), deps)
            return
        for expert in (False, True):
            group = [b for b in emit.state.buckets if b.expert == expert]
            if group and self.ranks_of(expert) > 1:
                elements = sum(b.elements for b in group)
                emit.collective(Collective("zero.param_allgather", "all_gather", self.axis_of(expert),
                                           elements * elem / len(group), stream="dp", key=("params", expert),
                                           count=len(group)), deps)
