"""The ``parallelism`` section: parallel sizes, pipeline schedule, sharding strategy and its options.

The option blocks (``ddp``, ``zero``, ``fsdp``, ``mics``) form a union tagged by
``sharding``: each block belongs to the strategies that read it (:data:`OPTION_BLOCKS`,
as in ``simulator/workload/sharding.py``), and a block of another strategy given with
non-default values is an error naming it. Every block stays readable as an attribute with
its defaults (``parallelism.zero.reduce_bucket_size``), whatever the sharding.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from simulator.errors import InfeasibleError, ScenarioError
from simulator.fields import Bytes, Elements, Frozen, NonNegativeElements
from simulator.scenario.moe import MoeOptions
from simulator.units import MiB

__all__ = [
    "Sharding",
    "PipelineSchedule",
    "CpComm",
    "CpKvHeads",
    "DdpOptions",
    "ZeroOptions",
    "FsdpOptions",
    "MicsOptions",
    "ParallelismSpec",
    "OPTION_BLOCKS",
    "drop_foreign_options",
    "check_dualpipe",
]

Sharding = Literal["none", "zero1", "zero2", "zero3", "fsdp", "hsdp", "mics"]
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved", "dualpipe"]
CpComm = Literal["ring-p2p", "allgather"]
CpKvHeads = Literal["grouped", "repeated"]

# option block -> the shardings whose strategy reads it (MiCS is ZeRO-3 in partition groups:
# it reads zero's bucket, prefetch and persistence options too)
OPTION_BLOCKS: dict[str, tuple[str, ...]] = {
    "ddp": ("none",),
    "zero": ("zero1", "zero2", "zero3", "mics"),
    "fsdp": ("fsdp", "hsdp"),
    "mics": ("mics",),
}


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

    reduce_bucket_size: Elements = Field(500_000_000, description="elements per gradient reduction bucket")
    allgather_bucket_size: Elements = Field(500_000_000, description="elements per stage-1/2 parameter all-gather")
    prefetch_bucket_size: Elements = Field(50_000_000, description="stage3_prefetch_bucket_size (elements)")
    param_persistence_threshold: Elements = Field(100_000, description="stage3: smaller params stay unpartitioned")
    max_live_parameters: Elements = Field(1_000_000_000, description="stage3_max_live_parameters (elements)")
    overlap_comm: bool | None = Field(None, description="None = DeepSpeed default (True for stage 3 only)")
    gradient_reduction: Literal["allreduce", "reduce_scatter"] = Field(
        "allreduce", description="stage 1/2: DeepSpeed all-reduces multi-rank buckets (default); reduce_scatter is "
        "Megatron's distributed optimizer"
    )
    overlap_param_gather: bool = Field(
        False, description="stage 1/2 (Megatron-Core --overlap-param-gather): the updated parameters are all-gathered "
        "during the next step's forward, a bucket of allgather_bucket_size elements at a time, each layer's first "
        "forward waiting for its bucket, instead of after the optimizer step"
    )
    bucketing: Literal["deepspeed", "megatron-core"] = Field(
        "deepspeed", description="stage 1/2 buckets: deepspeed = a reduction each time reduce_bucket_size gradient "
        "elements are pending, parameters gathered in allgather_bucket_size pieces; megatron-core = Megatron-Core's "
        "ParamAndGradBuffer: buckets of whole parameters filled in reverse order, one bucket on pipeline stages after "
        "the first and without overlap_comm, the tied embedding in a bucket of its own, the parameter all-gather over "
        "the same buckets")
    bucket_size_per_dp_rank: NonNegativeElements = Field(
        0, description="buckets hold at least this many elements per data-parallel rank (Megatron-Core: 1,000,000, "
        "so buckets grow to 1M x dp above dp 40); 0 = the bucket sizes alone")
    grad_nan_check: bool = Field(
        False, description="bucketing megatron-core: the L2 norm of each gradient bucket is checked for NaN before "
        "its reduction (Megatron-Core check_for_nan_in_grad): one read of the bucket on the compute stream")
    grad_prescale: bool = Field(
        False, description="bucketing megatron-core: each gradient bucket is multiplied by 1/dp before a summing "
        "reduction (Megatron-Core without average_in_collective): one read and one write of the bucket on the "
        "compute stream")


class FsdpOptions(Frozen):
    """PyTorch FSDP knobs (sharding: fsdp / hsdp)."""

    reshard_after_forward: bool = Field(True, description="True: FULL_SHARD; False: SHARD_GRAD_OP")
    backward_prefetch: Literal["pre", "post", "none"] = Field("pre", description="BackwardPrefetch.BACKWARD_PRE default")
    forward_prefetch: bool = Field(False, description="FSDP forward_prefetch; no effect here: the simulated CPU "
                                   "already issues the next unit's forward all-gather one unit ahead")
    limit_all_gathers: bool = Field(True, description="rate limiter: at most two FSDP units' parameters in flight")
    reduce_every_microbatch: bool = Field(
        True, description="True: each unit's gradient is reduce-scattered after every micro-batch's backward; False "
        "(no sync, set_requires_gradient_sync(False), as torch.distributed.pipelining runs FSDP2 stages): the "
        "unsharded gradients accumulate in the reduce dtype until the last micro-batch's backward")


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
    ep: PositiveInt = Field(
        1, description="expert-parallel size: the routed experts of an MoE layer are split over ep ranks, which "
        "exchange tokens by all-to-all (Megatron-Core expert_model_parallel_size); attention keeps tp/cp/dp")
    etp: PositiveInt | None = Field(
        None, description="expert tensor-parallel size: each expert's FFN split over etp ranks; null = tp "
        "(Megatron-Core expert_tensor_parallel_size default). Expert data-parallel size = world / (pp*ep*etp)")
    moe: MoeOptions = Field(default_factory=MoeOptions, description="MoE token dispatcher and its overlap")
    sequence_parallel: bool = Field(False, description="Megatron sequence parallelism (with tp > 1)")
    cp_comm: CpComm = Field(
        "ring-p2p", description="how context parallelism moves keys and values between the ring's attention steps: "
        "ring-p2p = a send/recv to the next rank beside each step, gradients riding along in backward (Transformer "
        "Engine's KV-P2P, Megatron-Core --cp-comm-type p2p); allgather = one all-gather beside the first step and "
        "an fp32 dK/dV ring in backward (PyTorch's experimental context_parallel, torchtitan)")
    cp_kv_heads: CpKvHeads = Field(
        "grouped", description="heads of the keys and values the attention call (and the CP exchange) sees: "
        "grouped = the model's kv heads; repeated = grouped-query K/V repeated to the query heads before attention")
    sp_keeps_gathered_input: bool = Field(
        False, description="with sequence parallelism, what a column-parallel linear keeps of its all-gathered "
        "input for its weight gradient: false = its 1/tp shard, all-gathered again in the backward (Megatron, "
        "Korthikanti et al. 2022); true = the gathered tensor itself (PyTorch DTensor tensor parallelism, e.g. "
        "torchtitan: autograd saves the matmul's gathered input)")
    pipeline_schedule: PipelineSchedule = Field(
        "1f1b", description="gpipe (all forwards, then all backwards) | 1f1b (one forward, one backward) | "
        "interleaved (1F1B over virtual_stages model chunks per rank) | dualpipe (DeepSeek-V3: a bidirectional "
        "pipeline, each rank holding stages r and pp-1-r so twice the parameters, micro-batches fed from both ends, "
        "each forward overlapped with another micro-batch's backward and weight gradients deferred into the bubbles; "
        "pp and the micro-batch count even, micro-batches >= 2*pp)")
    virtual_stages: PositiveInt = Field(1, description="model chunks per pipeline rank (interleaved only)")
    stage_layers: list[NonNegativeInt] | None = Field(
        None, description="explicit transformer layers per (virtual) pipeline stage in model order (pp*virtual_stages "
        "entries; rank p holds stages p, p+pp, ...); the first stage also holds the embedding and the last the "
        "output layer and loss, so those two may hold 0 layers; default: even split")
    pipeline_layout: str | None = Field(
        None, description="Megatron-Core pipeline_model_parallel_layout string instead of stage_layers, e.g. "
        "'Et|(tt|)*30L': stages split by |, E embedding (first stage), t transformer layer, L loss (last stage), "
        "(...)*n and x*n repeat; m a multi-token-prediction layer (model.mtp_layers of them, on the last stage)")
    sharding: Sharding = Field("none", description="none = DDP; zero1/2/3 = DeepSpeed; fsdp/hsdp = PyTorch; mics")
    shard_group_size: PositiveInt | None = Field(None, description="hsdp / mics: ranks holding one model replica")
    offload_optimizer: bool = Field(False, description="ZeRO-Offload: optimizer states and step on the CPU")
    tp_overlap: bool = Field(True, description="overlap the backward TP collective with the weight-gradient GEMM")
    rank_order: Literal["tp-cp-pp-dp", "tp-cp-dp-pp"] = Field(
        "tp-cp-pp-dp", description="how ranks are placed on GPUs, innermost axis first: tp-cp-pp-dp (a pipeline's "
        "stages on neighbouring GPUs, each data-parallel replica a contiguous block) or tp-cp-dp-pp (Megatron-Core's "
        "default order tp-cp-ep-dp-pp: each pipeline stage a contiguous block of world/pp ranks, so an expert-parallel "
        "group folded inside a stage stays on the fewest nodes); expert groups fold within a stage either way")
    p2p_blocking: bool = Field(
        False, description="a pipeline send holds its rank until the transfer is done (Megatron: batched isend/irecv "
        "waited on, then torch.cuda.synchronize; 1F1B and GPipe); false: sends run beside the next compute")
    pp_microbatch_buffers: bool = Field(
        False, description="torch.distributed.pipelining (torchtitan): each pipeline stage owns a receive buffer per "
        "micro-batch for its input activations and one for its output gradients, allocated once and held, and keeps "
        "every micro-batch's output (on the last stage its logits) until the step ends, when the last stage "
        "concatenates its outputs into one tensor (step()'s merged result); false: received tensors and outputs "
        "live only while their micro-batch is in flight (Megatron)")
    tp_comm_overlap: bool = Field(
        False, description="Megatron-Core --tp-comm-overlap (Transformer Engine userbuffers): every TP all-gather "
        "and reduce-scatter pipelined with the GEMM it feeds or follows; needs sequence_parallel")
    ddp: DdpOptions = Field(default_factory=DdpOptions, description="options of sharding: none")
    zero: ZeroOptions = Field(default_factory=ZeroOptions, description="options of sharding: zero1, zero2, zero3, mics")
    fsdp: FsdpOptions = Field(default_factory=FsdpOptions, description="options of sharding: fsdp, hsdp")
    mics: MicsOptions = Field(default_factory=MicsOptions, description="options of sharding: mics")

    @property
    def expert_tp(self) -> int:
        """etp, defaulting to tp (Megatron-Core parallel_state.py:871-872 at d98e8a6)."""
        return self.etp or self.tp

    @model_validator(mode="after")
    def _options_match_sharding(self) -> ParallelismSpec:
        """A block given for another strategy (with values other than its defaults, which
        would silently do nothing) is an error naming it."""
        for block, shardings in OPTION_BLOCKS.items():
            if block not in self.model_fields_set or self.sharding in shardings:
                continue
            options = getattr(self, block)
            if options != type(options)():
                raise ScenarioError(
                    f"options for sharding {'/'.join(shardings)} given with sharding: {self.sharding}",
                    field=f"parallelism.{block}",
                )
        return self


def drop_foreign_options(parallelism: dict[str, Any]) -> dict[str, Any]:
    """A copy of a ``parallelism`` mapping without the option blocks its ``sharding`` does not
    read (for tools that change the sharding of an existing scenario, e.g. the search)."""
    sharding = parallelism.get("sharding", "none")
    return {k: v for k, v in parallelism.items() if k not in OPTION_BLOCKS or sharding in OPTION_BLOCKS[k]}


def check_dualpipe(par: ParallelismSpec, micro_batches: int) -> None:
    """DualPipe's requirements as deepseek-ai/DualPipe asserts them (dualpipe/dualpipe.py
    ``step``: ``num_ranks % 2 == 0``, ``num_chunks % 2 == 0 and num_chunks >= num_ranks * 2``, at
    3da1bbea53606543d7f5f232338fc58096db30e3; the report, arXiv:2412.19437 §3.2.1, asks only
    that stages and micro-batches be even, but the public schedule's steady phase needs
    ``m / 2 >= pp``), and the strategies this model of it covers. Virtual stages and
    ``stage_layers`` (one entry per stage) are checked with the other schedules."""
    m = micro_batches
    if par.pp < 2 or par.pp % 2:
        raise InfeasibleError(f"the dualpipe schedule needs an even pp >= 2 (pp={par.pp}): each rank pairs "
                              "stage r with stage pp-1-r", field="parallelism.pp")
    if m % 2 or m < 2 * par.pp:
        raise InfeasibleError(
            f"the dualpipe schedule needs an even micro-batch count >= 2*pp = {2 * par.pp} (half fed from each "
            f"end); got {m} = global_batch / (micro_batch*dp)", field="training.global_batch")
    if par.sharding not in ("none", "zero1"):
        raise InfeasibleError(f"the dualpipe schedule is modelled with sharding none or zero1 (DeepSeek-V3 "
                              f"trains with ZeRO-1), not {par.sharding}", field="parallelism.sharding")
    if par.pp_microbatch_buffers:
        raise InfeasibleError("pp_microbatch_buffers describes torch.distributed.pipelining's schedules, "
                              "not dualpipe", field="parallelism.pp_microbatch_buffers")
