"""``sharding: none``: PyTorch DistributedDataParallel (Megatron's DDP when tp/pp > 1).

25 MiB buckets (:mod:`.buckets`) all-reduced as they fill during the last micro-batch's
backward (``no_sync`` before), overlapped with the rest of the backward, on one stream; the
optimizer waits for all of them (``torch/nn/parallel/distributed.py``; shared/REFERENCE.md
§2.1).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from simulator.workload.data_parallel.base import Strategy, grad_reduce_bytes
from simulator.workload.data_parallel.buckets import Bucket, assign_buckets, split_expert
from simulator.workload.emitter import Collective, RankEmitter

__all__ = ["DDP", "BucketState"]


@dataclass
class BucketState:
    """One rank's buckets and which of them have been reduced."""

    buckets: list[Bucket]
    emitted: set[int] = field(default_factory=set)
    comm_tasks: list[int] = field(default_factory=list)


@dataclass
class DDP(Strategy[BucketState]):
    """PyTorch DistributedDataParallel: bucketed all-reduce (module docstring)."""

    def _buckets(self, stage: int) -> list[Bucket]:
        """The dense parameters' buckets, then the routed experts' (reduced over the expert
        data-parallel group, :func:`~.buckets.split_expert`)."""
        ddp = self.scenario.parallelism.ddp
        dense, expert = split_expert(self.layout.stage_params(stage))
        elem = grad_reduce_bytes(self.scenario)
        out = assign_buckets(dense, elem, ddp.bucket_size_bytes, ddp.first_bucket_size_bytes)
        if expert:
            out += [replace(b, expert=True) for b in assign_buckets(expert, elem, ddp.bucket_size_bytes,
                                                                    ddp.first_bucket_size_bytes)]
        return out

    def static_buffers(self, params: float) -> float:
        ddp = self.scenario.parallelism.ddp
        return 0.0 if ddp.gradient_as_bucket_view else params * grad_reduce_bytes(self.scenario)

    def boundary_units(self, stage: int, phase: str, last: bool) -> set[int] | None:
        if phase != "bwd" or not last or not self.scenario.parallelism.ddp.overlap:
            return set()
        return {b.ready_unit for b in self._buckets(stage)}

    def start_rank(self, rank: int) -> BucketState:
        return BucketState(self._buckets(self.mesh.stage(rank)))

    def after(self, emit: RankEmitter[BucketState], unit: int, phase: str, mb: int, task: int, *,
              last: bool) -> None:
        if phase != "bwd" or not last or not self.reduces or not self.scenario.parallelism.ddp.overlap:
            return
        state = emit.state
        ready = [i for i, b in enumerate(state.buckets) if i not in state.emitted and b.ready_unit == unit]
        if ready:
            self._reduce(emit, ready, [task])

    def _reduce(self, emit: RankEmitter[BucketState], indices: list[int], deps: list[int]) -> None:
        """One task for the buckets of one group that become ready together; NCCL runs them
        back to back. A group of one rank reduces nothing."""
        state = emit.state
        state.emitted.update(indices)
        for expert in (False, True):
            group = [i for i in indices if state.buckets[i].expert == expert]
            if not group or self.ranks_of(expert) == 1:
                continue
            nbytes = sum(state.buckets[i].nbytes for i in group)
            tid = emit.collective(Collective(f"dp.allreduce[{group[0]}..{group[-1]}]", "all_reduce", self.axis_of(expert),
                                             nbytes / len(group), stream="dp", key=tuple(group), count=len(group)), deps)
            state.comm_tasks.append(tid)

    def finish_rank(self, emit: RankEmitter[BucketState]) -> None:
        state = emit.state
        rest = [i for i in range(len(state.buckets)) if i not in state.emitted]
        if rest and self.reduces:
            self._reduce(emit, rest, [emit.last_compute])
        deps = self.end_of_backward(emit, [emit.last_compute, *state.comm_tasks])
        emit.optimizer(deps, self.layout.params_of_stage(emit.stage))
