"""Data-parallel strategies: how gradients are synchronised and model states are sharded.

One small interface (:class:`Strategy`) and a registry keyed by ``parallelism.sharding``
(shared/STYLE.md #7). The workload builder calls the hooks while it walks a rank's schedule, for
every *unit* (0 = embedding, ``layer + 1`` = transformer block, ``layers + 1`` = logits):

* ``model_states`` / ``static_buffers``: what the rank holds from the start;
* ``before(unit, phase)``: returns the dependencies of the unit's compute (parameter
  gathering for ZeRO-3 / FSDP / MiCS, a blocking reduction to wait for);
* ``after(unit, phase)``: the unit's compute is issued (release gathered parameters;
  gradients ready: bucketed reductions);
* ``finish_rank``: the end of the iteration (last reductions, gradient-norm all-reduce,
  tied-embedding sync, optimizer step on the local shard, parameter all-gather).

Semantics follow the frameworks' code (shared/REFERENCE.md §2-§4, §9):

* ``none`` -- PyTorch DDP: 25 MiB buckets all-reduced as they fill during the last
  micro-batch's backward (``no_sync`` before), overlapped; Megatron's DDP when tp/pp > 1.
* ``zero1`` / ``zero2`` -- DeepSpeed stage 1/2: gradients reduced in buckets of
  ``reduce_bucket_size`` elements (all-reduce of multi-rank buckets by default, or
  reduce-scatter, Megatron's distributed optimizer), every micro-step for stage 2 and only
  at the accumulation boundary for stage 1; ``overlap_comm`` off by default: stage 2's
  backward waits for each bucket, stage 1 reduces all its buckets once the stage's last
  backward is done (DeepSpeed's pipeline engine ``ReduceGrads`` step, Megatron's
  ``finalize_model_grads`` without ``--overlap-grad-reduce``), so later stages' reductions
  never delay the pipeline's last backward; optimizer on the 1/N shard; updated parameters
  all-gathered after the step in ``allgather_bucket_size`` pieces.
* ``zero3`` -- DeepSpeed stage 3: each module's parameters all-gathered before its forward
  and again before its backward, prefetching up to ``prefetch_bucket_size`` elements ahead;
  gradients reduce-scattered every micro-step in ``reduce_bucket_size`` buckets on their own
  stream; parameters below ``param_persistence_threshold`` elements never partitioned.
* ``fsdp`` / ``hsdp`` -- PyTorch FSDP: one unit per transformer block plus the root (the
  embedding and output parameters, gathered once per micro-batch); all-gathers and
  reduce-scatters share one NCCL stream in issue order; ``limit_all_gathers`` keeps at most
  two units gathered; ``BACKWARD_PRE`` prefetches the next unit before the current backward;
  HYBRID_SHARD all-reduces the 1/g gradient shard across replicas after every backward.
* ``mics`` -- MiCS (DeepSpeed ``mics.py``): ZeRO-3 mechanics inside partition groups of
  ``shard_group_size`` ranks (hierarchical parameter gather when they span nodes and it is
  enabled), and the 1/P gradient shard all-reduced across replication groups only at the
  accumulation boundary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simulator.cluster.mesh import Axis, Mesh
from simulator.costs.memory import ModelStateBytes, bytes_per_element, sharded_model_state_bytes
from simulator.scenario.spec import Scenario
from simulator.workload.data_parallel import Bucket, Param, assign_buckets
from simulator.workload.tasks import CommOp, MemDelta

if TYPE_CHECKING:
    from simulator.workload.plan import ModelLayout, WorkloadBuilder, _RankContext

__all__ = ["Strategy", "DDP", "BucketedZero", "Zero3", "FSDP", "MiCS", "strategy_for", "STRATEGIES",
           "grad_reduce_bytes", "param_bytes"]

# DeepSpeed's CPU Adam streams fp32 master weights, momentum, variance and the gradient in
# and out (the same 28 bytes per parameter as the GPU step); it is vectorised and memory
# bound (ZeRO-Offload, Ren et al. ATC'21 §5.1). Fraction of the host memory bandwidth it
# reaches (estimate):
CPU_ADAM_BANDWIDTH_EFFICIENCY = 0.5
CPU_ADAM_BYTES_PER_PARAM = 28.0


def grad_reduce_bytes(scenario: Scenario) -> int:
    """Bytes per gradient element on the wire: the training dtype unless overridden."""
    dtype = scenario.training.grad_reduce_dtype
    if dtype == "auto":
        precision = scenario.training.precision
        return 4 if precision in ("fp32", "tf32") else 2
    return bytes_per_element(dtype)


def param_bytes(scenario: Scenario) -> int:
    """Bytes per parameter element as gathered (16-bit weights; fp32 when training in fp32)."""
    return 4 if scenario.training.precision in ("fp32", "tf32") else 2


@dataclass
class Strategy:
    scenario: Scenario
    mesh: Mesh
    layout: ModelLayout

    @property
    def grad_axis(self) -> Axis:
        """The ranks that hold the same parameters: dp, and cp ranks with them."""
        return "dp_cp" if self.mesh.cp > 1 else "dp"

    @property
    def dp_ranks(self) -> int:
        return self.mesh.dp * self.mesh.cp

    # states and buffers ----------------------------------------------------------------

    def model_states(self, stage: int, params: float, per: ModelStateBytes) -> ModelStateBytes:
        return sharded_model_state_bytes(params, per, stage=0, shard_ranks=1)

    def static_buffers(self, params: float) -> float:
        return 0.0

    # hooks -------------------------------------------------------------------------------

    def start_rank(self, builder: WorkloadBuilder, rank: int) -> Any:
        return None

    def boundary_units(self, stage: int, phase: str, last: bool) -> set[int] | None:
        """Units after which the strategy needs its own hook (a task boundary); None = after
        every unit. Units in between may be fused into one task."""
        return set()

    def before(self, builder: WorkloadBuilder, ctx: _RankContext, unit: int, phase: str, mb: int,
               deps: list[int]) -> list[int]:
        return deps

    def after(self, builder: WorkloadBuilder, ctx: _RankContext, unit: int, phase: str, mb: int, task: int, *,
              last: bool) -> None:
        return None

    def finish_rank(self, builder: WorkloadBuilder, ctx: _RankContext) -> None:
        deps = self.end_of_backward(builder, ctx, [ctx.last_compute])
        builder.optimizer_task(ctx, deps, self.layout.params_of_stage(ctx.stage))

    # shared pieces -------------------------------------------------------------------------

    def collective(self, builder: WorkloadBuilder, ctx: _RankContext, name: str, op: str, axis: Axis, nbytes: float,
                   deps: list[int], *, stream: str, key: Any, count: int = 1, algorithm: str | None = None,
                   mem: tuple[MemDelta, ...] = (), category: str | None = None) -> int:
        comm = builder.comm(ctx.rank, op, axis, nbytes, count=count, algorithm=algorithm)
        join = (axis, comm.group, name, key)
        return builder.pb.add(ctx.rank, stream, name, category or stream, comm=comm, join=join, deps=deps, mem=mem,
                              meta={"bytes": nbytes * count, "axis": axis})

    def end_of_backward(self, builder: WorkloadBuilder, ctx: _RankContext, deps: list[int]) -> list[int]:
        """Tied-embedding gradient sync between the first and last stage (Megatron), then the
        gradient-norm all-reduce of sharded optimizers."""
        out = list(deps)
        m = self.scenario.model
        if self.mesh.pp > 1 and m.tied_embeddings and ctx.stage in (0, self.mesh.pp - 1):
            nbytes = self.layout.counts.embedding / self.mesh.tp * grad_reduce_bytes(self.scenario)
            out.append(self.collective(builder, ctx, "embedding.grad_sync", "all_reduce", "embedding", nbytes, deps,
                                       stream="pp", key="step", category="pp"))
        return out

    def grad_norm(self, builder: WorkloadBuilder, ctx: _RankContext, axis: Axis, deps: list[int]) -> list[int]:
        if not self.scenario.training.grad_clipping:
            return deps
        return [self.collective(builder, ctx, "grad_norm", "all_reduce", axis, 8.0, deps, stream="dp", key="norm",
                                category="dp")]

    def offload_step(self, builder: WorkloadBuilder, ctx: _RankContext, shard_params: float,
                     deps: list[int]) -> list[int]:
        """ZeRO-Offload: gradient shard to the host, CPU Adam, updated 16-bit shard back."""
        grad = shard_params * grad_reduce_bytes(self.scenario)
        down = self._host_copy(builder, ctx, "d2h.grads", "d2h", grad, deps)
        node = self.scenario.cluster.node_type
        sockets = node.pcie.cpu_sockets
        host_bw = host_memory_bandwidth(node.host_memory_bandwidth_bytes_per_s, sockets)
        ranks_per_node = self.scenario.cluster.gpus_in_node
        cpu_s = shard_params * CPU_ADAM_BYTES_PER_PARAM / (host_bw * CPU_ADAM_BANDWIDTH_EFFICIENCY / ranks_per_node)
        step = builder.pb.add(ctx.rank, "offload", "cpu_adam", "offload", duration_s=cpu_s, deps=[down],
                              meta={"params": shard_params, "phase": "optimizer"})
        up = self._host_copy(builder, ctx, "h2d.params", "h2d", shard_params * param_bytes(self.scenario), [step])
        return [up]

    def _host_copy(self, builder: WorkloadBuilder, ctx: _RankContext, name: str, op: str, nbytes: float,
                   deps: list[int]) -> int:
        instances = tuple((x,) for x in builder.siblings(ctx.rank))
        comm = CommOp(op, (ctx.rank,), nbytes, "offload", instances, "direct")
        return builder.pb.add(ctx.rank, "offload", name, "offload", comm=comm, deps=deps, meta={"bytes": nbytes})


def host_memory_bandwidth(given: float | None, sockets: int) -> float:
    """Host DRAM bandwidth of a node: the node type's figure, else 8 channels of DDR4-3200
    (25.6 GB/s each) per socket = 204.8 GB/s per socket (estimate)."""
    return given if given else 204.8e9 * sockets


# ----------------------------------------------------------------------------------------
# DDP


@dataclass
class _BucketState:
    buckets: list[Bucket]
    emitted: set[int] = field(default_factory=set)
    comm_tasks: list[int] = field(default_factory=list)
    blocking: list[int] = field(default_factory=list)


@dataclass
class DDP(Strategy):
    """PyTorch DistributedDataParallel (Megatron's DDP for tp/pp > 1): bucketed all-reduce."""

    def static_buffers(self, params: float) -> float:
        ddp = self.scenario.parallelism.ddp
        return 0.0 if ddp.gradient_as_bucket_view else params * grad_reduce_bytes(self.scenario)

    def boundary_units(self, stage: int, phase: str, last: bool) -> set[int] | None:
        if phase != "bwd" or not last or not self.scenario.parallelism.ddp.overlap:
            return set()
        ddp = self.scenario.parallelism.ddp
        buckets = assign_buckets(self.layout.stage_params(stage), grad_reduce_bytes(self.scenario),
                                 ddp.bucket_size_bytes, ddp.first_bucket_size_bytes)
        return {b.ready_unit for b in buckets}

    def start_rank(self, builder: WorkloadBuilder, rank: int) -> Any:
        ddp = self.scenario.parallelism.ddp
        params = self.layout.stage_params(self.mesh.stage(rank))
        return _BucketState(assign_buckets(params, grad_reduce_bytes(self.scenario), ddp.bucket_size_bytes,
                                           ddp.first_bucket_size_bytes))

    def after(self, builder: WorkloadBuilder, ctx: _RankContext, unit: int, phase: str, mb: int, task: int, *,
              last: bool) -> None:
        state: _BucketState = ctx.strategy_state
        if phase != "bwd" or not last or self.dp_ranks == 1 or not self.scenario.parallelism.ddp.overlap:
            return
        ready = [i for i, b in enumerate(state.buckets) if i not in state.emitted and b.ready_unit == unit]
        if ready:
            self._reduce(builder, ctx, state, ready, [task])

    def _reduce(self, builder: WorkloadBuilder, ctx: _RankContext, state: _BucketState, indices: list[int],
                deps: list[int]) -> None:
        """One task for buckets that become ready together; NCCL runs them back to back."""
        state.emitted.update(indices)
        nbytes = sum(state.buckets[i].nbytes for i in indices)
        tid = self.collective(builder, ctx, f"dp.allreduce[{indices[0]}..{indices[-1]}]", "all_reduce",
                              self.grad_axis, nbytes / len(indices), deps, stream="dp", key=tuple(indices),
                              count=len(indices))
        state.comm_tasks.append(tid)

    def finish_rank(self, builder: WorkloadBuilder, ctx: _RankContext) -> None:
        state: _BucketState = ctx.strategy_state
        rest = [i for i in range(len(state.buckets)) if i not in state.emitted]
        if rest and self.dp_ranks > 1:
            self._reduce(builder, ctx, state, rest, [ctx.last_compute])
        deps = self.end_of_backward(builder, ctx, [ctx.last_compute, *state.comm_tasks])
        builder.optimizer_task(ctx, deps, self.layout.params_of_stage(ctx.stage))


# ----------------------------------------------------------------------------------------
# ZeRO-1 / ZeRO-2 (DeepSpeed), Megatron distributed optimizer


@dataclass
class _ZeroState:
    pending: float = 0.0  # gradient elements waiting in the IPG bucket
    comm_tasks: list[int] = field(default_factory=list)
    wait: list[int] = field(default_factory=list)  # reductions the next compute must wait for
    count: int = 0


@dataclass
class BucketedZero(Strategy):
    stage: int = 1

    @property
    def _reduce_op(self) -> str:
        return "reduce_scatter" if self.scenario.parallelism.zero.gradient_reduction == "reduce_scatter" else "all_reduce"

    @property
    def _overlap(self) -> bool:
        overlap = self.scenario.parallelism.zero.overlap_comm
        return bool(overlap) if overlap is not None else False

    def model_states(self, stage: int, params: float, per: ModelStateBytes) -> ModelStateBytes:
        states = sharded_model_state_bytes(params, per, stage=self.stage, shard_ranks=self.dp_ranks)
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
        if phase == "bwd" and (self.stage == 2 or (last and self._overlap)):
            return None
        return set()

    def start_rank(self, builder: WorkloadBuilder, rank: int) -> Any:
        return _ZeroState()

    def before(self, builder: WorkloadBuilder, ctx: _RankContext, unit: int, phase: str, mb: int,
               deps: list[int]) -> list[int]:
        state: _ZeroState = ctx.strategy_state
        if state.wait:
            deps = [*deps, *state.wait]
            state.wait = []
        return deps

    def after(self, builder: WorkloadBuilder, ctx: _RankContext, unit: int, phase: str, mb: int, task: int, *,
              last: bool) -> None:
        if phase != "bwd" or self.dp_ranks == 1:
            return
        if self.stage == 1 and not last:
            return
        state: _ZeroState = ctx.strategy_state
        state.pending += _unit_numel(self.layout, ctx.stage, unit)
        if self.stage == 1 and not self._overlap:
            return  # reduced after the stage's last backward (finish_rank)
        bucket = self.scenario.parallelism.zero.reduce_bucket_size
        if state.pending >= bucket:
            count = int(state.pending // bucket)
            self._reduce(builder, ctx, state, count * bucket, count, [task], key=(mb, unit))
            state.pending -= count * bucket

    def _reduce(self, builder: WorkloadBuilder, ctx: _RankContext, state: _ZeroState, elements: float, count: int,
                deps: list[int], key: Any) -> None:
        nbytes = elements * grad_reduce_bytes(self.scenario) / count
        tid = self.collective(builder, ctx, f"zero.{self._reduce_op}", self._reduce_op, self.grad_axis, nbytes, deps,
                              stream="dp", key=key, count=count)
        state.comm_tasks.append(tid)
        if not self._overlap:
            state.wait.append(tid)

    def finish_rank(self, builder: WorkloadBuilder, ctx: _RankContext) -> None:
        state: _ZeroState = ctx.strategy_state
        if state.pending > 0 and self.dp_ranks > 1:
            bucket = self.scenario.parallelism.zero.reduce_bucket_size
            count = 1 if self._overlap else max(1, math.ceil(state.pending / bucket))
            self._reduce(builder, ctx, state, state.pending, count, [ctx.last_compute], key="tail")
            state.pending = 0.0
        deps = self.end_of_backward(builder, ctx, [ctx.last_compute, *state.comm_tasks])
        if self.dp_ranks > 1:
            deps = self.grad_norm(builder, ctx, self.grad_axis, deps)
        params = self.layout.params_of_stage(ctx.stage)
        shard = params / self.dp_ranks
        if self.scenario.parallelism.offload_optimizer:
            deps = self.offload_step(builder, ctx, shard, deps)
        else:
            deps = [builder.optimizer_task(ctx, deps, shard)]
        if self.dp_ranks > 1:  # updated 16-bit shards all-gathered into every rank's parameters
            bucket = self.scenario.parallelism.zero.allgather_bucket_size
            count = max(1, math.ceil(params / bucket))
            self.collective(builder, ctx, "zero.param_allgather", "all_gather", self.grad_axis,
                            params * param_bytes(self.scenario) / count, deps, stream="dp", key="params",
                            count=count)


# ----------------------------------------------------------------------------------------
# parameter-gathering strategies: ZeRO-3, FSDP / HSDP, MiCS


@dataclass
class _GatherState:
    gathered: dict[tuple[str, int, int], int] = field(default_factory=dict)  # (phase, mb, unit) -> all-gather
    remainder: dict[tuple[str, int, int], float] = field(default_factory=dict)  # elements still to gather
    computed: dict[tuple[str, int, int], int] = field(default_factory=dict)  # (phase, mb, unit) -> compute task
    pending: float = 0.0  # gradient elements waiting for a reduce-scatter bucket
    pending_units: list[int] = field(default_factory=list)
    comm_tasks: list[int] = field(default_factory=list)
    wait: list[int] = field(default_factory=list)  # reductions the next compute must wait for
    compute_seq: list[int] = field(default_factory=list)  # unit compute tasks in issue order


@dataclass
class Zero3(Strategy):
    """DeepSpeed ZeRO stage 3 over the data-parallel ranks (see the module docstring)."""

    shard_axis: Axis = "dp"
    gather_stream: str = "shard"
    reduce_stream: str = "dp"

    def __post_init__(self) -> None:
        if self.mesh.cp > 1 and self.shard_axis == "dp":
            self.shard_axis = "dp_cp"

    @property
    def shard_ranks(self) -> int:
        return len(self.mesh.group(0, self.shard_axis))

    # states ---------------------------------------------------------------------------

    def persistent(self, stage: int) -> float:
        """Elements never partitioned (parameters below the persistence threshold)."""
        threshold = self.scenario.parallelism.zero.param_persistence_threshold
        return float(sum(p.numel for p in self.layout.stage_params(stage) if p.numel < threshold))

    def model_states(self, stage: int, params: float, per: ModelStateBytes) -> ModelStateBytes:
        persistent = min(self.persistent(stage), params)
        sharded = sharded_model_state_bytes(params - persistent, per, stage=3, shard_ranks=self.shard_ranks)
        full = sharded_model_state_bytes(persistent, per, stage=0, shard_ranks=1)
        optimizer = 0.0 if self.scenario.parallelism.offload_optimizer else sharded.optimizer + full.optimizer
        return ModelStateBytes(sharded.params + full.params, sharded.grads + full.grads, optimizer)

    def static_buffers(self, params: float) -> float:
        """The reduce bucket the gradients are copied into before the reduce-scatter."""
        return min(self.scenario.parallelism.zero.reduce_bucket_size, params) * grad_reduce_bytes(self.scenario)

    def boundary_units(self, stage: int, phase: str, last: bool) -> set[int] | None:
        return None

    def start_rank(self, builder: WorkloadBuilder, rank: int) -> Any:
        return _GatherState()

    def gathered_numel(self, stage: int, unit: int) -> float:
        threshold = self.scenario.parallelism.zero.param_persistence_threshold
        return float(sum(p.numel for p in _unit_params(self.layout, stage, unit) if p.numel >= threshold))

    # policy knobs (FSDP and MiCS override them) ----------------------------------------

    def needs_gather(self, unit: int, phase: str) -> bool:
        return True

    def releases_after_forward(self, unit: int) -> bool:
        return True

    def gather_algorithm(self) -> str | None:
        return None

    def prefetch_before(self, phase: str) -> bool:
        """Prefetch before the unit's compute (else after it: FSDP BACKWARD_POST)."""
        return True

    def prefetch_plan(self, ctx: _RankContext, phase: str, order: list[int]) -> list[tuple[int, float]]:
        """Units to gather ahead and how many elements of each: up to prefetch_bucket_size
        elements (the last unit possibly in part; the rest is gathered when it is reached)."""
        budget = float(self.scenario.parallelism.zero.prefetch_bucket_size)
        plan = []
        for nxt in order:
            if budget <= 0:
                break
            size = self.gathered_numel(ctx.stage, nxt)
            if self.needs_gather(nxt, phase) and size > 0:
                take = min(size, budget)
                plan.append((nxt, take))
                budget -= take
        return plan

    def gather_window(self, stage: int) -> int:
        """How many units may be gathered ahead of the compute: stage3_max_live_parameters
        elements, at least one unit (the CPU issues gathers ahead of the GPU, bounded by it)."""
        largest = max((self.gathered_numel(stage, u) for u in {p.unit for p in self.layout.stage_params(stage)}),
                      default=1.0)
        return max(1, int(self.scenario.parallelism.zero.max_live_parameters // max(largest, 1.0)))

    def limiter_deps(self, state: _GatherState, stage: int) -> list[int]:
        """An all-gather waits for the compute ``gather_window`` units back to finish (its
        parameters freed), which bounds the gathered parameters alive at once."""
        window = self.gather_window(stage)
        return [state.compute_seq[-window]] if len(state.compute_seq) >= window else []

    def reduce_bucket_elements(self) -> float:
        return float(self.scenario.parallelism.zero.reduce_bucket_size)

    def overlap(self) -> bool:
        overlap = self.scenario.parallelism.zero.overlap_comm
        return True if overlap is None else overlap

    def replicate_axis(self) -> Axis | None:
        return None

    # gathering -------------------------------------------------------------------------

    def _order(self, builder: WorkloadBuilder, ctx: _RankContext, unit: int, phase: str) -> list[int]:
        """Units of the same chunk in execution order for this phase, after ``unit``."""
        for chunk in self.layout.chunks_of_stage(ctx.stage):
            units = builder.units_of(chunk)
            if unit in units:
                order = units if phase == "fwd" else list(reversed(units))
                return order[order.index(unit) + 1:]
        return []

    def _gather(self, builder: WorkloadBuilder, ctx: _RankContext, unit: int, phase: str, mb: int, elements: float,
                deps: list[int], tag: str) -> int:
        nbytes = elements * param_bytes(self.scenario)
        return self.collective(builder, ctx, f"{tag}.allgather.u{unit}", "all_gather", self.shard_axis, nbytes, deps,
                               stream=self.gather_stream, key=(phase, mb, unit, tag), algorithm=self.gather_algorithm(),
                               mem=(MemDelta(False, nbytes, "buffers"),), category="shard")

    def before(self, builder: WorkloadBuilder, ctx: _RankContext, unit: int, phase: str, mb: int,
               deps: list[int]) -> list[int]:
        state: _GatherState = ctx.strategy_state
        deps = [*deps, *state.wait]
        state.wait = []
        if self.shard_ranks == 1 or not self.needs_gather(unit, phase):
            return deps
        key = (phase, mb, unit)
        size = self.gathered_numel(ctx.stage, unit)
        limiter = self.limiter_deps(state, ctx.stage)
        if size > 0 and key not in state.gathered:
            state.gathered[key] = self._gather(builder, ctx, unit, phase, mb, size, limiter, "gather")
        elif key in state.remainder:
            rest = state.remainder.pop(key)
            state.gathered[key] = self._gather(builder, ctx, unit, phase, mb, rest, limiter, "gather.rest")
        if self.prefetch_before(phase):
            self._prefetch(builder, ctx, unit, phase, mb, [])
        if size > 0:
            deps.append(state.gathered[key])
        return deps

    def _prefetch(self, builder: WorkloadBuilder, ctx: _RankContext, unit: int, phase: str, mb: int,
                  deps: list[int]) -> None:
        state: _GatherState = ctx.strategy_state
        order = [u for u in self._order(builder, ctx, unit, phase) if (phase, mb, u) not in state.gathered]
        for nxt, take in self.prefetch_plan(ctx, phase, order):
            key = (phase, mb, nxt)
            limiter = self.limiter_deps(state, ctx.stage)
            state.gathered[key] = self._gather(builder, ctx, nxt, phase, mb, take, [*deps, *limiter], "prefetch")
            size = self.gathered_numel(ctx.stage, nxt)
            if take < size:
                state.remainder[key] = size - take

    def after(self, builder: WorkloadBuilder, ctx: _RankContext, unit: int, phase: str, mb: int, task: int, *,
              last: bool) -> None:
        state: _GatherState = ctx.strategy_state
        state.computed[(phase, mb, unit)] = task
        state.compute_seq.append(task)
        size = self.gathered_numel(ctx.stage, unit) * param_bytes(self.scenario)
        if self.shard_ranks > 1 and size > 0:
            gathered_now = (phase, mb, unit) in state.gathered
            if phase == "fwd" and gathered_now and self.releases_after_forward(unit):
                builder.marker(ctx, f"release.u{unit}", [task], (MemDelta(True, -size, "buffers"),))
            kept = ("fwd", mb, unit) in state.gathered and not self.releases_after_forward(unit)
            if phase == "bwd" and (gathered_now or kept):
                builder.marker(ctx, f"release.u{unit}", [task], (MemDelta(True, -size, "buffers"),))
        if phase == "bwd":
            if self.shard_ranks > 1 and not self.prefetch_before(phase):
                self._prefetch(builder, ctx, unit, phase, mb, [task])
            self.reduce_gradients(builder, ctx, unit, mb, task, last=last)

    # gradients ---------------------------------------------------------------------------

    def reduce_gradients(self, builder: WorkloadBuilder, ctx: _RankContext, unit: int, mb: int, task: int, *,
                         last: bool) -> None:
        """Every micro-step: gradients collect in a bucket; a full bucket is reduce-scattered."""
        if self.shard_ranks == 1 and self.replicate_axis() is None:
            return
        state: _GatherState = ctx.strategy_state
        state.pending += _unit_numel(self.layout, ctx.stage, unit)
        state.pending_units.append(unit)
        if state.pending >= self.reduce_bucket_elements():
            self._reduce_scatter(builder, ctx, state, mb, [task])

    def _reduce_scatter(self, builder: WorkloadBuilder, ctx: _RankContext, state: _GatherState, mb: int,
                        deps: list[int]) -> None:
        elements = state.pending
        units = tuple(state.pending_units)
        state.pending, state.pending_units = 0.0, []
        nbytes = elements * grad_reduce_bytes(self.scenario)
        # the bucket's full gradients live until the reduce-scatter has produced the shard
        grads = (MemDelta(False, nbytes, "grads"), MemDelta(True, -nbytes, "grads"))
        if self.shard_ranks > 1:
            tid = self.collective(builder, ctx, "shard.reduce_scatter", "reduce_scatter", self.shard_axis, nbytes,
                                  deps, stream=self.reduce_stream, key=(mb, units), mem=grads, category="shard")
            state.comm_tasks.append(tid)
            deps = [tid]
        replicate = self.replicate_axis()
        if replicate is not None:
            tid = self.collective(builder, ctx, "replicate.allreduce", "all_reduce", replicate,
                                  nbytes / self.shard_ranks, deps, stream="dp", key=(mb, units), category="dp")
            state.comm_tasks.append(tid)
        if not self.overlap() and state.comm_tasks:
            state.wait.append(state.comm_tasks[-1])

    def finish_rank(self, builder: WorkloadBuilder, ctx: _RankContext) -> None:
        state: _GatherState = ctx.strategy_state
        if state.pending > 0:
            self._reduce_scatter(builder, ctx, state, self.scenario.micro_batches - 1, [ctx.last_compute])
        deps = self.end_of_boundary(builder, ctx, [ctx.last_compute, *state.comm_tasks])
        deps = self.end_of_backward(builder, ctx, deps)
        if self.shard_ranks > 1:
            deps = self.grad_norm(builder, ctx, self.shard_axis, deps)
        shard = self.layout.params_of_stage(ctx.stage) / self.shard_ranks
        if self.scenario.parallelism.offload_optimizer:
            self.offload_step(builder, ctx, shard, deps)
        else:
            builder.optimizer_task(ctx, deps, shard)

    def end_of_boundary(self, builder: WorkloadBuilder, ctx: _RankContext, deps: list[int]) -> list[int]:
        return deps


@dataclass
class FSDP(Zero3):
    """PyTorch FSDP FULL_SHARD / SHARD_GRAD_OP; HYBRID_SHARD with ``hybrid``."""

    reduce_stream: str = "shard"  # one NCCL stream for all collectives of the process group, in issue order
    hybrid: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hybrid:
            self.shard_axis = "dp_shard"

    def persistent(self, stage: int) -> float:
        return 0.0  # FSDP flattens and shards every parameter of a unit

    def gathered_numel(self, stage: int, unit: int) -> float:
        return _unit_numel(self.layout, stage, unit)

    def static_buffers(self, params: float) -> float:
        return 0.0

    def _is_root(self, unit: int) -> bool:
        return unit in (0, self.scenario.model.layers + 1)

    def releases_after_forward(self, unit: int) -> bool:
        """FULL_SHARD reshards after forward, except the root unit (FSDP's heuristic: its
        parameters would be gathered again at once for backward); SHARD_GRAD_OP never."""
        return self.scenario.parallelism.fsdp.reshard_after_forward and not self._is_root(unit)

    def needs_gather(self, unit: int, phase: str) -> bool:
        return phase == "fwd" or self.releases_after_forward(unit)

    def reduce_bucket_elements(self) -> float:
        return 0.0  # each unit's flat gradient is reduce-scattered right after its backward

    def prefetch_before(self, phase: str) -> bool:
        return not (phase == "bwd" and self.scenario.parallelism.fsdp.backward_prefetch == "post")

    def prefetch_plan(self, ctx: _RankContext, phase: str, order: list[int]) -> list[tuple[int, float]]:
        """Forward: the CPU runs ahead and issues the next unit's all-gather (the rate limiter
        holds it to one unit ahead); backward: BACKWARD_PRE / POST prefetch one unit, or none."""
        fsdp = self.scenario.parallelism.fsdp
        if phase == "bwd" and fsdp.backward_prefetch == "none":
            return []
        ahead = 1 if fsdp.limit_all_gathers else 2
        plan: list[tuple[int, float]] = []
        for nxt in order:
            if len(plan) == ahead:
                break
            size = self.gathered_numel(ctx.stage, nxt)
            if self.needs_gather(nxt, phase) and size > 0:
                plan.append((nxt, size))
        return plan

    def gather_window(self, stage: int) -> int:
        """limit_all_gathers: the next unit's all-gather waits until the unit before the
        current one has finished (its parameters freed): two units gathered at most."""
        return 1 if self.scenario.parallelism.fsdp.limit_all_gathers else 2

    def overlap(self) -> bool:
        return True

    def replicate_axis(self) -> Axis | None:
        return "dp_replicate" if self.hybrid and len(self.mesh.group(0, "dp_replicate")) > 1 else None


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

    def end_of_boundary(self, builder: WorkloadBuilder, ctx: _RankContext, deps: list[int]) -> list[int]:
        """allreduce_mics_shard_grads: the 1/P gradient shard across the replication group,
        once, at the accumulation boundary."""
        if len(self.mesh.group(0, "dp_replicate")) == 1:
            return deps
        nbytes = self.layout.params_of_stage(ctx.stage) * grad_reduce_bytes(self.scenario) / self.shard_ranks
        return [self.collective(builder, ctx, "mics.replicate.allreduce", "all_reduce", "dp_replicate", nbytes, deps,
                                stream="dp", key="boundary", category="dp")]


def _unit_params(layout: ModelLayout, stage: int, unit: int) -> list[Param]:
    return [p for p in layout.stage_params(stage) if p.unit == unit]


def _unit_numel(layout: ModelLayout, stage: int, unit: int) -> float:
    return float(sum(p.numel for p in _unit_params(layout, stage, unit)))


STRATEGIES: dict[str, Any] = {
    "none": DDP,
    "zero1": lambda sc, mesh, layout: BucketedZero(sc, mesh, layout, stage=1),
    "zero2": lambda sc, mesh, layout: BucketedZero(sc, mesh, layout, stage=2),
    "zero3": Zero3,
    "fsdp": FSDP,
    "hsdp": lambda sc, mesh, layout: FSDP(sc, mesh, layout, hybrid=True),
    "mics": MiCS,
}


def strategy_for(scenario: Scenario, mesh: Mesh, layout: ModelLayout) -> Strategy:
    strategy: Strategy = STRATEGIES[scenario.parallelism.sharding](scenario, mesh, layout)
    return strategy
