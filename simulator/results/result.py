"""The result of one simulation (shared/CONTRACT.md ``simulator.Result``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from simulator.results.faults import FaultsSummary
from simulator.results.moe import MoeSummary

__all__ = ["Result", "RankMemory", "Breakdown", "OomDetail", "LinkUsage", "CommSummary"]


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RankMemory(_Out):
    """Memory of one simulated rank (standing for ``represents`` identical ranks) at its peak."""

    rank: int
    stage: int
    represents: int
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    buffers_bytes: float
    other_bytes: float
    peak_bytes: float
    capacity_bytes: float
    peak_time_s: float
    peak_reserved_bytes: float = Field(
        0.0, description="the PyTorch caching allocator's reserved peak over the step (its segments, "
        "torch.cuda.max_memory_reserved), without the runtime reserve")

    @property
    def headroom_bytes(self) -> float:
        return self.capacity_bytes - self.peak_bytes


class OomDetail(_Out):
    rank: int
    time_s: float
    peak_bytes: float
    capacity_bytes: float
    by_category: dict[str, float]
    largest: str
    message: str


class Breakdown(_Out):
    """Where one rank's step went, seconds: compute + exposed comm + bubble + idle = step time."""

    rank: int
    stage: int
    compute_s: float
    exposed_comm_s: dict[str, float]
    bubble_s: float
    idle_s: float
    comm_s: dict[str, float] = Field(description="total time communication of each kind was in flight")

    @property
    def exposed_comm_total_s(self) -> float:
        return sum(self.exposed_comm_s.values())


class LinkUsage(_Out):
    label: str
    kind: str
    tier: str
    utilisation: float
    bytes: float
    links: int


class CommSummary(_Out):
    kind: str
    count: int
    bytes: float
    time_s: float
    algorithms: dict[str, int]


class Result(_Out):
    name: str
    scenario_hash: str
    simulator_version: str
    calibration: str
    flops_convention: str
    world_size: int
    tp: int
    pp: int
    cp: int
    dp: int
    micro_batches: int
    global_batch: int
    params: int
    step_time_s: float
    tokens_per_s: float
    samples_per_s: float
    tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    model_flops_per_step: float
    peak_memory_bytes: float = Field(
        description="largest per-GPU peak: the bytes dtsim allocates (as torch.cuda.max_memory_allocated counts "
        "them) plus the runtime reserve outside the caching allocator (category other: CUDA context, library "
        "workspaces, DeepEP's communication buffers with the deepep dispatcher); the out-of-memory verdict "
        "compares it with the GPU's memory")
    peak_allocated_bytes: float = Field(
        0.0, description="peak_memory_bytes less the runtime reserve: what the caching allocator hands out at the "
        "peak (torch.cuda.max_memory_allocated)")
    peak_reserved_bytes: float = Field(
        0.0, description="the caching allocator's reserved peak (torch.cuda.max_memory_reserved), largest over "
        "ranks: dtsim's allocations and frees replayed through a model of PyTorch's CUDA caching allocator "
        "(512 B rounding, 2 MiB / 20 MiB / rounded segments, best fit with splitting, a cache per stream, "
        "cached segments released when the device is full); at least peak_allocated_bytes. Each of dtsim's "
        "allocations stands for a group of tensors: fragmentation between the tensors of one group is not seen")
    gpu_memory_bytes: float
    oom: bool
    oom_detail: OomDetail | None = None
    memory: list[RankMemory]
    breakdown: Breakdown
    stage_breakdown: list[Breakdown]
    links: list[LinkUsage]
    link_bytes: dict[str, float] = Field(description="bytes per step over all links of each kind")
    wire_bytes_per_rank: dict[str, float] = Field(description="bytes the critical rank sends per step, by kind")
    communication: list[CommSummary]
    engine: dict[str, Any]
    moe: MoeSummary | None = Field(None, description="mixture-of-experts summary (null for a dense model)")
    faults: FaultsSummary | None = Field(None, description="what the scenario's faults section perturbed, the ranks "
                                         "simulated individually and, with sim.samples, the step-time distribution "
                                         "(null without faults); the other fields are the first sample's")
