"""``sharding: zero3``: DeepSpeed ZeRO stage 3, and the parameter-gathering machinery that
FSDP and MiCS share.

Each module's parameters are all-gathered before its forward and again before its backward,
prefetching up to ``prefetch_bucket_size`` elements ahead, at most ``max_live_parameters``
elements alive; gradients are reduce-scattered every micro-step in ``reduce_bucket_size``
buckets on their own stream; parameters below ``param_persistence_threshold`` elements are
never partitioned (DeepSpeed ``runtime/zero/stage3.py``, ``partitioned_param_coordinator.py``;
shared/REFERENCE.md §3). The policy knobs (what is gathered when, how far ahead, which
stream) are methods that :mod:`.fsdp` and :mod:`.mics` override.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from simulator.costs.memory import ModelStateBytes, sharded_model_state_bytes
from simulator.ir import MemDelta
from simulator.workload.data_parallel.base import Strategy, gathered_bytes_per_element, grad_reduce_bytes
from simulator.workload.emitter import Collective, RankEmitter

__all__ = ["Zero3", "GatherState"]


@dataclass
class GatherState:
    gathered: dict[tuple[str, int, int], int] = field(default_factory=dict)  # (phase, mb, unit) -> all-gather
    remainder: dict[tuple[str, int, int], float] = field(default_factory=dict)  # elements still to gather
    computed: dict[tuple[str, int, int], int] = field(default_factory=dict)  # (phase, mb, unit) -> compute task
    pending: float = 0.0  # gradient elements waiting for a reduce-scatter bucket
    pending_units: list[int] = field(default_factory=list)
    comm_tasks: list[int] = field(default_factory=list)
    wait: list[int] = field(default_factory=list)  # reductions the next compute must wait for
    compute_seq: list[int] = field(default_factory=list)  # unit compute tasks in issue order
    # units kept gathered after forward (no reshard): unit -> [its all-gather, micro-batches still holding it]
    kept: dict[int, list[int]] = field(default_factory=dict)
    accumulated: set[int] = field(default_factory=set)  # units whose unsharded gradients accumulate (no sync)
    # FSDP2's all-gather outputs: bytes not yet copied out, by (phase, mb, unit); the last forward's, held
    ag_outputs: dict[tuple[str, int, int], float] = field(default_factory=dict)
    ag_held: float = 0.0


Emit = RankEmitter[GatherState]


@dataclass
class Zero3(Strategy[GatherState]):
    """DeepSpeed ZeRO stage 3 over the data-parallel ranks (see the module docstring)."""

    shard_axis: str = "dp"
    gather_stream: str = "shard"
    reduce_stream: str = "dp"
    # what depends on (stage, unit) alone, worked out once: asked for at every gather and release
    _memo: dict[tuple[Any, ...], Any] = field(init=False, default_factory=dict, repr=False, compare=False)

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

    def start_rank(self, rank: int) -> GatherState:
        return GatherState()

    def gathered_numel(self, stage: int, unit: int) -> float:
        found = self._memo.get(("numel", stage, unit))
        if found is None:
            threshold = self.scenario.parallelism.zero.param_persistence_threshold
            found = self._memo["numel", stage, unit] = float(
                sum(p.numel for p in self.layout.unit_params(stage, unit) if p.numel >= threshold))
        return float(found)

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

    def prefetch_plan(self, stage: int, phase: str, order: list[int]) -> list[tuple[int, float]]:
        """Units to gather ahead and how many elements of each: up to prefetch_bucket_size
        elements (the last unit possibly in part; the rest is gathered when it is reached)."""
        budget = float(self.scenario.parallelism.zero.prefetch_bucket_size)
        plan = []
        for nxt in order:
            if budget <= 0:
                break
            size = self.gathered_numel(stage, nxt)
            if self.needs_gather(nxt, phase) and size > 0:
                take = min(size, budget)
                plan.append((nxt, take))
                budget -= take
        return plan

    def gather_window(self, stage: int) -> int:
        """How many units may be gathered ahead of the compute: stage3_max_live_parameters
        elements, at least one unit (the CPU issues gathers ahead of the GPU, bounded by it).
        Worked out once per stage (every all-gather asks)."""
        found = self._memo.get(("window", stage))
        if found is None:
            largest = max((self.gathered_numel(stage, u) for u in {p.unit for p in self.layout.stage_params(stage)}),
                          default=1.0)
            found = self._memo["window", stage] = max(1, int(self.scenario.parallelism.zero.max_live_parameters
                                                             // max(largest, 1.0)))
        return int(found)

    def limiter_deps(self, state: GatherState, stage: int) -> list[int]:
        """An all-gather waits for the compute ``gather_window`` units back to finish (its
        parameters freed), which bounds the gathered parameters alive at once."""
        window = self.gather_window(stage)
        return [state.compute_seq[-window]] if len(state.compute_seq) >= window else []

    def reduce_bucket_elements(self) -> float:
        return float(self.scenario.parallelism.zero.reduce_bucket_size)

    def overlap(self) -> bool:
        overlap = self.scenario.parallelism.zero.overlap_comm
        return True if overlap is None else overlap

    def replicate_axis(self) -> str | None:
        return None

    # gathering -------------------------------------------------------------------------

    def gathered_bytes_per_element(self, stage: int, unit: int) -> float:
        """Bytes per element of the unit's gathered parameters (1 for fp8-gathered GEMM weights)."""
        found = self._memo.get(("bytes_per_element", stage, unit))
        if found is None:
            found = self._memo["bytes_per_element", stage, unit] = gathered_bytes_per_element(
                self.scenario, self.layout.unit_params(stage, unit))
        return float(found)

    def _order(self, stage: int, unit: int, phase: str) -> list[int]:
        """Units of the same chunk in execution order for this phase, after ``unit``."""
        for chunk in self.layout.chunks_of_stage(stage):
            units = self.layout.units_of(chunk)
            if unit in units:
                order = units if phase == "fwd" else list(reversed(units))
                return order[order.index(unit) + 1:]
        return []

    def _gather(self, emit: Emit, unit: int, phase: str, mb: int, elements: float, deps: list[int], tag: str) -> int:
        nbytes = elements * self.gathered_bytes_per_element(emit.stage, unit)
        return emit.collective(Collective(f"{tag}.allgather.u{unit}", "all_gather", self.shard_axis, nbytes,
                                          stream=self.gather_stream, key=(phase, mb, unit, tag),
                                          algorithm=self.gather_algorithm(), mem=(MemDelta(False, nbytes, "buffers"),),
                                          category="shard"), deps)

    def release_deltas(self, stage: int, unit: int) -> tuple[MemDelta, ...]:
        """Frees of a unit's gathered parameters when it is released: ZeRO-3 gathers into the
        parameters themselves, so the all-gather's buffer (one allocation) is freed."""
        found = self._memo.get(("release", stage, unit))
        if found is None:  # one tuple shared by every release of the unit (never changed)
            size = self.gathered_numel(stage, unit) * self.gathered_bytes_per_element(stage, unit)
            found = self._memo["release", stage, unit] = (MemDelta(True, -size, "buffers"),)
        return found  # type: ignore[no-any-return]

    def before(self, emit: Emit, unit: int, phase: str, mb: int, deps: list[int]) -> list[int]:
        state = emit.state
        deps = [*deps, *state.wait]
        state.wait = []
        if self.shard_ranks == 1 or not self.needs_gather(unit, phase):
            return deps
        key = (phase, mb, unit)
        size = self.gathered_numel(emit.stage, unit)
        limiter = self.limiter_deps(state, emit.stage)
        self._share_kept(state, phase, mb, unit)
        if size > 0 and key not in state.gathered:
            state.gathered[key] = self._gather(emit, unit, phase, mb, size, limiter, "gather")
        elif key in state.remainder:
            rest = state.remainder.pop(key)
            state.gathered[key] = self._gather(emit, unit, phase, mb, rest, limiter, "gather.rest")
        if self.prefetch_before(phase):
            self._prefetch(emit, unit, phase, mb, [])
        if size > 0:
            deps.append(state.gathered[key])
            if phase == "fwd" and not self.releases_after_forward(unit) and unit not in state.kept:
                state.kept[unit] = [state.gathered[key], 1]
        return deps

    def _share_kept(self, state: GatherState, phase: str, mb: int, unit: int) -> bool:
        """A unit kept gathered after forward (no reshard) is not gathered again while a
        micro-batch still holds it: FSDP2 unshards a parameter group that is already unsharded
        as a no-op (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, ``unshard``), so
        one gathered copy serves every micro-batch in flight."""
        kept = state.kept.get(unit)
        if phase != "fwd" or kept is None or (phase, mb, unit) in state.gathered:
            return False
        state.gathered[(phase, mb, unit)] = kept[0]
        kept[1] += 1
        return True

    def _prefetch(self, emit: Emit, unit: int, phase: str, mb: int, deps: list[int]) -> None:
        state = emit.state
        order = [u for u in self._order(emit.stage, unit, phase)
                 if (phase, mb, u) not in state.gathered and not self._share_kept(state, phase, mb, u)]
        for nxt, take in self.prefetch_plan(emit.stage, phase, order):
            key = (phase, mb, nxt)
            limiter = self.limiter_deps(state, emit.stage)
            state.gathered[key] = self._gather(emit, nxt, phase, mb, take, [*deps, *limiter], "prefetch")
            if phase == "fwd" and not self.releases_after_forward(nxt):
                state.kept[nxt] = [state.gathered[key], 1]
            size = self.gathered_numel(emit.stage, nxt)
            if take < size:
                state.remainder[key] = size - take

    def after(self, emit: Emit, unit: int, phase: str, mb: int, task: int, *, last: bool) -> None:
        state = emit.state
        state.computed[(phase, mb, unit)] = task
        state.compute_seq.append(task)
        size = self.gathered_numel(emit.stage, unit) * self.gathered_bytes_per_element(emit.stage, unit)
        if self.shard_ranks > 1 and size > 0:
            gathered_now = (phase, mb, unit) in state.gathered
            if phase == "fwd" and gathered_now and self.releases_after_forward(unit):
                emit.marker(f"release.u{unit}", [task], self.release_deltas(emit.stage, unit))
            kept = ("fwd", mb, unit) in state.gathered and not self.releases_after_forward(unit)
            holder = state.kept.get(unit) if kept and phase == "bwd" else None
            if holder is not None:  # one copy shared by the micro-batches in flight: freed by the last
                holder[1] -= 1
                kept = holder[1] == 0
                if kept:
                    del state.kept[unit]
            if phase == "bwd" and (gathered_now or kept):
                emit.marker(f"release.u{unit}", [task], self.release_deltas(emit.stage, unit))
        if phase == "bwd":
            if self.shard_ranks > 1 and not self.prefetch_before(phase):
                self._prefetch(emit, unit, phase, mb, [task])
            self.reduce_gradients(emit, unit, mb, task, last=last)

    # gradients ---------------------------------------------------------------------------

    def reduce_gradients(self, emit: Emit, unit: int, mb: int, task: int, *, last: bool) -> None:
        """Every micro-step: gradients collect in a bucket; a full bucket is reduce-scattered."""
        if self.shard_ranks == 1 and self.replicate_axis() is None:
            return
        state = emit.state
        state.pending += self.layout.unit_numel(emit.stage, unit)
        state.pending_units.append(unit)
        if state.pending >= self.reduce_bucket_elements():
            self._reduce_scatter(emit, mb, [task])

    def _reduce_scatter(self, emit: Emit, mb: int, deps: list[int]) -> None:
        state = emit.state
        elements = state.pending
        units = tuple(state.pending_units)
        state.pending, state.pending_units = 0.0, []
        nbytes = elements * grad_reduce_bytes(self.scenario)
        # the bucket's full gradients live until the reduce-scatter has produced the shard
        grads = (MemDelta(False, nbytes, "grads"), MemDelta(True, -nbytes, "grads"))
        if self.shard_ranks > 1:
            tid = emit.collective(Collective("shard.reduce_scatter", "reduce_scatter", self.shard_axis, nbytes,
                                             stream=self.reduce_stream, key=(mb, units), mem=grads,
                                             category="shard"), deps)
            state.comm_tasks.append(tid)
            deps = [tid]
        replicate = self.replicate_axis()
        if replicate is not None:
            tid = emit.collective(Collective("replicate.allreduce", "all_reduce", replicate,
                                             nbytes / self.shard_ranks, stream="dp", key=(mb, units),
                                             category="dp"), deps)
            state.comm_tasks.append(tid)
        if not self.overlap() and state.comm_tasks:
            state.wait.append(state.comm_tasks[-1])

    def finish_rank(self, emit: Emit) -> None:
        state = emit.state
        if state.pending > 0:
            self._reduce_scatter(emit, self.scenario.micro_batches - 1, [emit.last_compute])
        deps = self.end_of_boundary(emit, [emit.last_compute, *state.comm_tasks])
        deps = self.end_of_backward(emit, deps)
        if self.shard_ranks > 1:
            deps = self.grad_norm(emit, self.shard_axis, deps)
        shard = self.layout.params_of_stage(emit.stage) / self.shard_ranks
        if self.scenario.parallelism.offload_optimizer:
            self.offload_step(emit, shard, deps)
        else:
            emit.optimizer(deps, shard)

    def end_of_boundary(self, emit: Emit, deps: list[int]) -> list[int]:
        return deps
