"""The ``parallelism`` section: parallel sizes, pipeline schedule, sharding strategy and its options."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt

from simulator.fields import Bytes, Frozen
from simulator.units import MiB

__all__ = [
    "Sharding",
    "PipelineSchedule",
    "DdpOptions",
    "ZeroOptions",
    "FsdpOptions",
    "MicsOptions",
    "ParallelismSpec",
]

Sharding = Literal["none", "zero1", "zero2", "zero3", "fsdp", "hsdp", "mics"]
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved"]


class DdpOptions(Frozen):
    """PyTorch DistributedDataParallel (sharding: none)."""

    bucket_size_bytes: Bytes = Field(25 * MiB, alias="bucket_size", description="bucket_cap_mb (PyTorch default 25 MiB)")
    first_bucket_size_bytes: Bytes = Field(
        1 * MiB, alias="first_bucket_size", description="dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB)"
    )
    gradient_as_bucket_view: bool = Field(
        False, description="False (PyTorch default): buckets are copies, costing one more gradient-sized buffer"
    )
    overlap: bool = Field(
        True, description="start each bucket's all-reduce when its gradients are ready (PyTorch DDP, Megatron "
        "--overlap-grad-reduce); false: all-reduce after the whole backward (Megatron-LM before 2023)"
    )


class ZeroOptions(Frozen):
    """DeepSpeed ZeRO knobs (counts are in elements, as in DeepSpeed's config)."""

    reduce_bucket_size: PositiveInt = Field(500_000_000, description="elements per gradient reduction bucket")
    allgather_bucket_size: PositiveInt = Field(500_000_000, description="elements per stage-1/2 parameter all-gather")
    prefetch_bucket_size: PositiveInt = Field(50_000_000, description="stage3_prefetch_bucket_size (elements)")
    param_persistence_threshold: PositiveInt = Field(100_000, description="stage3: smaller params stay unpartitioned")
    max_live_parameters: PositiveInt = Field(1_000_000_000, description="stage3_max_live_parameters (elements)")
    overlap_comm: bool | None = Field(None, description="None = DeepSpeed default (True for stage 3 only)")
    gradient_reduction: Literal["allreduce", "reduce_scatter"] = Field(
        "allreduce", description="stage 1/2: DeepSpeed all-reduces multi-rank buckets (default); reduce_scatter is "
        "Megatron's distributed optimizer"
    )


class FsdpOptions(Frozen):
    """PyTorch FSDP knobs (sharding: fsdp / hsdp)."""

    reshard_after_forward: bool = Field(True, description="True: FULL_SHARD; False: SHARD_GRAD_OP")
    backward_prefetch: Literal["pre", "post", "none"] = Field("pre", description="BackwardPrefetch.BACKWARD_PRE default")
    forward_prefetch: bool = False
    limit_all_gathers: bool = Field(True, description="rate limiter: at most two FSDP units' parameters in flight")


class MicsOptions(Frozen):
    hierarchical_params_gather: bool = Field(
        False, description="mics_hierarchical_params_gather: inter-node all-gather, copy, intra-node all-gather"
    )


class ParallelismSpec(Frozen):
    """How the model is split: tensor, context, pipeline and data parallel sizes, and sharding."""

    tp: PositiveInt = Field(1, description="tensor-parallel size (Megatron), innermost rank axis")
    pp: PositiveInt = Field(1, description="pipeline stages")
    dp: PositiveInt | Literal["auto"] = Field("auto", description="data-parallel size; auto = world / (tp*pp*cp)")
    cp: PositiveInt = Field(1, description="context-parallel size (sequence split across ranks)")
    sequence_parallel: bool = Field(False, description="Megatron sequence parallelism (with tp > 1)")
    pipeline_schedule: PipelineSchedule = "1f1b"
    virtual_stages: PositiveInt = Field(1, description="model chunks per pipeline rank (interleaved only)")
    stage_layers: list[PositiveInt] | None = Field(
        None, description="explicit layers per (virtual) pipeline stage, first to last; default: even split"
    )
    sharding: Sharding = Field("none", description="none = DDP; zero1/2/3 = DeepSpeed; fsdp/hsdp = PyTorch; mics")
    shard_group_size: PositiveInt | None = Field(None, description="hsdp / mics: ranks holding one model replica")
    offload_optimizer: bool = Field(False, description="ZeRO-Offload: optimizer states and step on the CPU")
    tp_overlap: bool = Field(True, description="overlap the backward TP collective with the weight-gradient GEMM")
    tp_comm_overlap: bool = Field(
        False, description="Megatron-Core --tp-comm-overlap (Transformer Engine userbuffers): every TP all-gather "
        "and reduce-scatter pipelined with the GEMM it feeds or follows; needs sequence_parallel")
    ddp: DdpOptions = Field(default_factory=DdpOptions)
    zero: ZeroOptions = Field(default_factory=ZeroOptions)
    fsdp: FsdpOptions = Field(default_factory=FsdpOptions)
    mics: MicsOptions = Field(default_factory=MicsOptions)
