"""``sharding: fsdp / hsdp``: PyTorch FSDP FULL_SHARD / SHARD_GRAD_OP, and HYBRID_SHARD.

One unit per transformer block plus the root (the embedding and output parameters, gathered
once per micro-batch); all-gathers and reduce-scatters share one NCCL stream in issue order;
``limit_all_gathers`` keeps at most two units gathered; ``BACKWARD_PRE`` prefetches the next
unit before the current backward; HYBRID_SHARD all-reduces the 1/g gradient shard across
replicas after every backward (``torch/distributed/fsdp/_runtime_utils.py``;
shared/REFERENCE.md §4).

``fsdp.reduce_every_microbatch: false`` (no sync, ``set_requires_gradient_sync(False)``):
each unit's unsharded gradient accumulates over the micro-batches, in the reduce dtype (FSDP2
``FSDPParam.to_accumulated_grad_if_needed`` upcasts it when ``reduce_dtype`` differs from
the parameter dtype), and is reduce-scattered after the unit's last backward only.

Buffers, as FSDP2 makes them (``torch/distributed/_composable/fsdp/_fsdp_param_group.py``
``unshard`` / ``wait_for_unshard`` and ``_fsdp_collectives.py`` ``foreach_all_gather`` /
``foreach_all_gather_copy_out``, pytorch@012c62d62004bbd4896475c11315199d43b037ef): the
all-gather writes one flat output, allocated on the all-gather stream when it is issued; when
the unit's compute is reached (``pre_forward`` / ``pre_backward``), the copy-out allocates
each parameter's unsharded tensor on the default stream (``alloc_all_gather_outputs``) and
copies into them (``split_with_sizes_copy``); the flat output is then freed, in backward at
once, in forward only at the next unit's copy-out ("to overlap the current copy-out with the
next all-gather, we save a reference to the current all-gather result to free after the next
copy-out"; the last forward's is held until the next forward copy-out). Resharding frees the
unsharded parameter tensors. A unit whose parameters are still unsharded is not gathered
again (``unshard`` is a no-op), so it has no copy-out either.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.ir import MemDelta
from simulator.workload.data_parallel.base import gathered_bytes_per_element, grad_reduce_bytes
from simulator.workload.data_parallel.zero3 import Emit, Zero3

__all__ = ["FSDP"]


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
        return self.layout.unit_numel(stage, unit)

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

    def _gather(self, emit: Emit, unit: int, phase: str, mb: int, elements: float, deps: list[int], tag: str) -> int:
        """The all-gather, its flat output awaiting the copy-out (module docstring)."""
        key = (phase, mb, unit)
        nbytes = elements * self.gathered_bytes_per_element(emit.stage, unit)
        emit.state.ag_outputs[key] = emit.state.ag_outputs.get(key, 0.0) + nbytes
        return super()._gather(emit, unit, phase, mb, elements, deps, tag)

    def unsharded_deltas(self, stage: int, unit: int, sign: float) -> tuple[MemDelta, ...]:
        """One allocation (``sign`` +1) or free (-1) per unsharded parameter tensor of a unit
        (one tuple per unit and sign, shared by every use: never changed)."""
        found = self._memo.get(("unsharded", stage, unit, sign))
        if found is None:
            found = self._memo["unsharded", stage, unit, sign] = tuple(
                MemDelta(sign < 0, sign * p.numel * gathered_bytes_per_element(self.scenario, [p]), "buffers")
                for p in self.layout.unit_params(stage, unit) if p.numel > 0)
        return found  # type: ignore[no-any-return]

    def release_deltas(self, stage: int, unit: int) -> tuple[MemDelta, ...]:
        return self.unsharded_deltas(stage, unit, -1.0)

    def before(self, emit: Emit, unit: int, phase: str, mb: int, deps: list[int]) -> list[int]:
        """The unit's gathering (:class:`Zero3`), then FSDP2's copy-out of a fresh all-gather
        when the compute is reached: free the flat output it no longer needs (forward: the
        previous unit's, held till now; backward: its own), allocate the unsharded tensors."""
        out = super().before(emit, unit, phase, mb, deps)
        state = emit.state
        flat = state.ag_outputs.pop((phase, mb, unit), 0.0)
        if flat > 0:
            if phase == "fwd":
                freed, state.ag_held = state.ag_held, flat
            else:
                freed = flat
            frees = (MemDelta(False, -freed, "buffers"),) if freed > 0 else ()
            emit.marker(f"copy_out.u{unit}", out, frees + self.unsharded_deltas(emit.stage, unit, 1.0))
        return out

    def reduce_bucket_elements(self) -> float:
        return 0.0  # each unit's flat gradient is reduce-scattered right after its backward

    def reduce_gradients(self, emit: Emit, unit: int, mb: int, task: int, *, last: bool) -> None:
        """Reduce-scatter after every backward, or (no sync) keep the unit's unsharded gradient
        from its first backward and reduce-scatter it after its last."""
        if self.scenario.parallelism.fsdp.reduce_every_microbatch or self.scenario.micro_batches == 1:
            super().reduce_gradients(emit, unit, mb, task, last=last)
            return
        nbytes = self.layout.unit_numel(emit.stage, unit) * grad_reduce_bytes(self.scenario)
        state = emit.state
        if unit not in state.accumulated:
            state.accumulated.add(unit)
            emit.marker(f"grad_accum.u{unit}", [task], (MemDelta(True, nbytes, "grads"),))
        if last:  # the reduce-scatter's input is the accumulated gradient (allocated again there)
            state.accumulated.discard(unit)
            emit.marker(f"grad_accum.done.u{unit}", [task], (MemDelta(True, -nbytes, "grads"),))
            super().reduce_gradients(emit, unit, mb, task, last=last)

    def prefetch_before(self, phase: str) -> bool:
        return not (phase == "bwd" and self.scenario.parallelism.fsdp.backward_prefetch == "post")

    def prefetch_plan(self, stage: int, phase: str, order: list[int]) -> list[tuple[int, float]]:
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
            size = self.gathered_numel(stage, nxt)
            if self.needs_gather(nxt, phase) and size > 0:
                plan.append((nxt, size))
        return plan

    def gather_window(self, stage: int) -> int:
        """limit_all_gathers: the next unit's all-gather waits until the unit before the
        current one has finished (its parameters freed): two units gathered at most."""
        return 1 if self.scenario.parallelism.fsdp.limit_all_gathers else 2

    def overlap(self) -> bool:
        return True

    def replicate_axis(self) -> str | None:
        return "dp_replicate" if self.hybrid and len(self.mesh.group(0, "dp_replicate")) > 1 else None
