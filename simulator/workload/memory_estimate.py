"""A cheap lower estimate of a scenario's peak memory per GPU, without simulating it.

The search prunes configurations whose memory certainly exceeds the device before it spends
a simulation on them. The estimate adds, for each pipeline stage, what is surely allocated
at the moment the first steady-state backward starts (where 1F1B-like schedules peak):

* model states and static buffers as the data-parallel strategy allocates them
  (``Strategy.model_states`` / ``static_buffers`` of :mod:`simulator.workload.data_parallel`, on
  the stage's parameters from :class:`~simulator.workload.layout.ModelLayout`) plus the runtime
  reserve outside the caching allocator (the CUDA context, ``CUDA_CONTEXT_BYTES``, and DeepEP's
  buffers with the ``deepep`` dispatcher, :func:`~simulator.workload.builder.runtime_reserve_bytes`);
* activations of the micro-batches in flight: the stored activations of one micro-batch
  through the stage (:func:`~simulator.costs.memory.layer_activation_bytes` per layer, the
  embedding output on the first stage, the logits on the last;
  Korthikanti et al. 2022) times the micro-batches a schedule holds before its first
  backward (GPipe ``m``; 1F1B ``min(p - stage, m)``; interleaved 1F1B Megatron's warm-up
  ``(p - stage - 1) * 2 + (v - 1) * p`` plus one chunk, capped at ``m * v``, in chunks of
  ``layers / (p * v)`` layers; DualPipe the forwards of both its chunks that its schedule
  runs before its first backward, ``p`` on most ranks and ``p + 1`` on the middle two; its
  peak, ``p + 1`` on every rank as arXiv:2412.19437 Table 2 says, comes later);
* one layer's backward workspace (the gradients of its largest activations; with ``full``
  recomputation also the layer's recomputed activations, with ``selective-op`` those the
  policy did not keep), the workload's own
  :class:`~simulator.workload.activations.ActivationSizes`, and for ZeRO-3 / FSDP / HSDP / MiCS that layer's gathered parameters.

It leaves out what is transient and depends on timing (parameters prefetched for the next
layers, gradient buckets in flight, communication buffers), so it stays at or below
the simulated peak: a configuration it rejects does not fit, and one it accepts may still
run out of memory in the simulation (the search then drops it). ``tests/test_search.py``
checks both against :func:`simulator.simulate` on several layouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.cluster.mesh import mesh_for
from simulator.scenario import Scenario
from simulator.workload.activations import ActivationSizes, state_bytes_per_param
from simulator.workload.builder import runtime_reserve_bytes
from simulator.workload.data_parallel import Strategy, Zero3, expert_sharded_states, strategy_for
from simulator.workload.layout import Chunk, ModelLayout
from simulator.workload.pipeline.schedules import pipeline_schedule

__all__ = ["MemoryEstimate", "estimate_peak_memory", "estimate_stage_memory", "in_flight_chunks"]


@dataclass(frozen=True)
class MemoryEstimate:
    """Lower estimate of the peak bytes of the fullest stage, by category."""

    stage: int
    states_bytes: float  # parameters + gradients + optimizer states
    buffers_bytes: float  # static buffers of the strategy + CUDA context
    activations_bytes: float  # in-flight micro-batches + one layer's backward workspace
    capacity_bytes: float
    # states_bytes and buffers_bytes by part (for ``dtsim fit``'s breakdown)
    params_bytes: float = 0.0
    grads_bytes: float = 0.0
    optimizer_bytes: float = 0.0
    context_bytes: float = 0.0  # the runtime reserve (CUDA context, DeepEP's buffers), within buffers_bytes

    @property
    def peak_bytes(self) -> float:
        return self.states_bytes + self.buffers_bytes + self.activations_bytes

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes

    @property
    def headroom_bytes(self) -> float:
        return self.capacity_bytes - self.peak_bytes


def in_flight_chunks(schedule: str, pp: int, stage: int, micro_batches: int, virtual_stages: int = 1) -> int:
    """(micro-batch, chunk) forwards a pipeline rank holds when its first backward starts
    (the schedules of :mod:`simulator.workload.pipeline.schedules`)."""
    m, v = micro_batches, virtual_stages
    if schedule == "dualpipe":
        return len(_dualpipe_held(pp, stage, m))
    if schedule == "gpipe":
        return m
    if schedule == "interleaved":
        return min((pp - stage - 1) * 2 + (v - 1) * pp + 1, m * v)
    return min(pp - stage, m)


def _dualpipe_held(pp: int, stage: int, micro_batches: int) -> list[int]:
    """The local chunk of each forward a DualPipe rank runs before its first backward."""
    held = []
    for action in pipeline_schedule("dualpipe", pp, stage, micro_batches):
        if action.kind != "F":
            break
        held.append(action.chunk)
    return held


def estimate_peak_memory(scenario: Scenario) -> MemoryEstimate:
    """Lower estimate of the largest per-GPU peak over pipeline stages (module docstring)."""
    return max(estimate_stage_memory(scenario), key=lambda e: e.peak_bytes)


def estimate_stage_memory(scenario: Scenario) -> tuple[MemoryEstimate, ...]:
    """Lower estimate of the per-GPU peak of each pipeline stage (module docstring)."""
    par = scenario.parallelism
    layout = ModelLayout(scenario)
    strategy = strategy_for(scenario, mesh_for(scenario), layout)
    per_param = state_bytes_per_param(scenario)
    sizes = ActivationSizes.of(scenario)
    per_layer, workspace, embedding, logits = sizes.per_layer, sizes.backward_workspace, sizes.embedding, sizes.logits
    capacity = scenario.cluster.gpu_spec.memory_bytes
    out: list[MemoryEstimate] = []
    for stage in range(par.pp):
        params = layout.params_of_stage(stage)
        states = expert_sharded_states(strategy, scenario, stage, params, per_param)
        chunks = layout.chunks_of_stage(stage)
        held = in_flight_chunks(par.pipeline_schedule, par.pp, stage, scenario.micro_batches, par.virtual_stages)
        # the held chunks are the stage's chunks in forward order, repeated over micro-batches
        stored = 0.0
        last = chunks[0]
        for k in range(held):
            last = chunks[(k // par.pp) % len(chunks)] if par.pipeline_schedule == "interleaved" else chunks[0]
            if par.pipeline_schedule == "dualpipe":
                last = chunks[_dualpipe_held(par.pp, stage, scenario.micro_batches)[k]]
            stored += len(last.layers) * per_layer + (embedding if last.embedding else 0.0)
            stored += logits if last.logits else 0.0
            stored += last.mtp * (per_layer + logits)  # a multi-token prediction layer: a block and logits
        # a layer's backward: its workspace and, for parameter-gathering strategies, its gathered weights
        block = workspace + _gathered_block_bytes(scenario, strategy, stage, last)
        # the first backward starts with the logits (the loss workspace, then freeing them), then a layer
        transient = max(sizes.loss_workspace, block - logits) if last.logits else block
        reserve = runtime_reserve_bytes(scenario, layout, stage)
        out.append(MemoryEstimate(stage, states.total, strategy.static_buffers(params) + reserve,
                                  stored + transient, capacity, params_bytes=states.params, grads_bytes=states.grads,
                                  optimizer_bytes=states.optimizer, context_bytes=reserve))
    return tuple(out)


def _gathered_block_bytes(scenario: Scenario, strategy: Strategy[Any], stage: int, chunk: Chunk) -> float:
    """Bytes of one transformer block's parameters gathered for its backward (ZeRO-3, FSDP,
    HSDP, MiCS with more than one shard rank; 0 for the other strategies)."""
    if not isinstance(strategy, Zero3) or strategy.shard_ranks == 1 or not chunk.layers:
        return 0.0
    unit = chunk.layers[-1] + 1
    return strategy.gathered_numel(stage, unit) * strategy.gathered_bytes_per_element(stage, unit)
