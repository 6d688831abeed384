"""The ``training`` and ``sim`` sections of a scenario: batch, precision and its fp8 recipe,
recomputation, attention kernel, optimizer, gradient-reduction dtype, kernel fusion and host
costs; and how the simulation itself runs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PositiveInt, field_validator

from simulator import limits
from simulator.errors import InfeasibleError
from simulator.fields import Frozen, Precision
from simulator.scenario.attention import AttentionKernel
from simulator.scenario.fp8 import Fp8Spec
from simulator.scenario.host import HostSpec
from simulator.scenario.moe import MoeRouting

__all__ = ["TrainingSpec", "SimSpec", "Recompute", "RecomputeModule", "recompute_modules_of", "check_recompute_modules"]

Recompute = Literal["none", "selective", "selective-op", "full"]
# Megatron-Core's --recompute-modules choices dtsim models (transformer_config.py:560-585 at
# NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553)
RecomputeModule = Literal["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "shared_experts", "moe"]


class TrainingSpec(Frozen):
    """What one training step does: batch, precision, recomputation, attention kernel, optimizer, host costs."""

    micro_batch: PositiveInt = Field(1, description="sequences per micro-batch per data-parallel rank (default 1)")
    global_batch: PositiveInt = Field(description="sequences per iteration, all data-parallel ranks together")
    precision: Precision = Field("bf16", description="compute precision; fp16/bf16/fp8 use fp32 master weights")
    fp8: Fp8Spec = Field(default_factory=Fp8Spec, description="the fp8 recipe, GEMMs and all-gather dtype "
                         "(read only when precision is fp8)")
    recompute: Recompute = Field(
        "none", description="activation recomputation: none; selective (Korthikanti et al. 2022: the attention core "
        "is recomputed); selective-op (torchtitan's op-level policy, selective_ac_option = 'op': each block keeps "
        "its input, every other matmul output, the fused-attention output and the reduce-scatter outputs, and "
        "recomputes the rest in its backward; with fp8 linears no matmul output is kept); full (each block keeps "
        "only its input and replays its forward in the backward)")
    recompute_modules: list[RecomputeModule] | None = Field(
        None, description="with recompute: selective, the submodules Megatron-Core recomputes (--recompute-modules; "
        "default [core_attn], Korthikanti's selective): core_attn (the attention core), moe_act (the routed experts' "
        "activation function: its output, fc2's input, is not kept), layernorm (the norms that are modules of their "
        "own: an MoE layer's pre-MLP norm, multi-head latent attention's input norm; Transformer Engine fuses the "
        "others into their linear), mla_up_proj (MLA's up-projections and rotary: the attention's query, key and "
        "value are not kept), mlp (a dense layer's whole MLP with its fused norm: only its input is kept), "
        "shared_experts (an MoE layer's shared experts: only their input is kept), moe (an MoE layer's whole "
        "MLP, router, dispatch, experts and combine, in a checkpoint: only its input, the pre-MLP norm output, is "
        "kept; its forward, all-to-alls and tensor-parallel collectives included, re-runs before its backward; "
        "nothing in a dense layer). Each is re-run in the block's backward")
    cross_entropy: Literal["fused", "megatron", "eager-fp32"] = Field(
        "fused", description="the loss kernels: fused (one kernel each way that keeps the fp32 softmax and writes its "
        "gradient in place), megatron (Megatron's vocab-parallel cross entropy without --cross-entropy-loss-fusion: "
        "the same memory, run op by op: float copy, max, subtract, exp, sum, divide; its backward a scale and the cast "
        "back) or eager-fp32 (cross_entropy(logits.float()) in eager PyTorch, torchtitan: the backward also holds two "
        "more fp32 tokens x vocab tensors)")
    embedding_grad: Literal["dense", "main-grad"] = Field(
        "dense", description="what the embedding table's gradient costs each micro-batch: dense (PyTorch's embedding "
        "backward writes a zeroed vocab x hidden gradient, and a tied output layer's gradient is added to it) or "
        "main-grad (Megatron's DDP then adds it into the fp32 main gradient, and a tied output layer on the same "
        "stage hands autograd a zeroed dummy of the table's size: simulator/costs/elementwise.py)")
    flash_attention: bool = Field(True, description="fused attention that never stores the s x s scores")
    flash_attention_version: Literal[1, 2, 3, "triton"] = Field(
        2, description="fused-attention kernel (speed): 1 (FlashAttention, 2022), 2 (FlashAttention-2, default), "
        "3 (FlashAttention-3, Hopper only), triton (the Triton FlashAttention of 2023, e.g. MPT's attn_impl: triton); "
        "the same as attention_kernel fa1 / fa2 / fa3 / triton-2023"
    )
    attention_kernel: AttentionKernel | None = Field(
        None, description="attention kernel, timed from its published benchmarks (topologies/kernels/attention.yaml) "
        "by sequence length, head dim and causal mask: fa2 (FlashAttention-2), fa3 (FlashAttention-3, Hopper only), "
        "cudnn (cuDNN fused attention, Transformer Engine's FusedAttention; Ampere/Hopper), triton (OpenAI Triton's "
        "fused-attention tutorial kernel, 2024; Ampere/Hopper), triton-2023 (the Triton FlashAttention of 2023, "
        "MPT's attn_impl: triton), fa1, unfused (scores materialised, as flash_attention: false). Default (null): "
        "the framework profile's kernel, else flash_attention / flash_attention_version (fa2). Written in the "
        "scenario it wins over a profile; contradicting flash_attention or flash_attention_version also written "
        "there is an error"
    )
    optimizer: Literal["adam", "sgd"] = Field("adam", description="adam: K = 12 bytes/param of fp32 states")
    grad_reduce_dtype: Literal["auto", "fp32", "bf16", "fp16", "fp32-for-bf16"] = Field(
        "auto", description="dtype of gradient reductions; auto = the parameters' training dtype; fp32-for-bf16 = "
        "fp32 when training in bf16 (or fp8 on bf16 parameters), else the training dtype (Megatron's fp32 main gradients)"
    )
    grad_clipping: bool = Field(True, description="gradient-norm all-reduce before the optimizer step")
    compile: bool | None = Field(
        None, description="how a block's elementwise and normalization ops run: null (default) = the framework's "
        "fused kernels (one read of each input, one write of each output: Megatron/Apex/Transformer Engine fused "
        "norm, activation and rotary kernels); true = torch.compile (Inductor fuses each block's pointwise and "
        "reduction chains into kernels of that cost); false = eager PyTorch, one kernel per op with fp32 upcasts "
        "(a composite RMSNorm, SiLU-times-up, complex rotary), which also keeps their fp32 intermediates for the "
        "backward when those are not recomputed")
    moe_routing: MoeRouting = Field(default_factory=MoeRouting, description="routing skew of an MoE model: "
                                    "per-expert token counts per micro-batch (simulator/costs/moe.py)")
    host: HostSpec = Field(default_factory=HostSpec, description="host-side issue costs: CPU time per launched op, "
                           "per micro-batch and per step (simulator/costs/host.py)")


class SimSpec(Frozen):
    """How the simulation runs: the network model, rank symmetry, the routing seed, the overlap slowdown."""

    network: Literal["flow", "analytical"] = Field(
        "flow", description="flow: max-min fair flows with contention; analytical: closed-form alpha-beta"
    )
    symmetry: Literal["auto", "off"] = Field("auto", description="auto: simulate identical ranks once")
    seed: int = Field(0, ge=0, description="seed of the hashed multipath routing (ECMP flow placement)")
    overlap_slowdown: float | None = Field(
        None, ge=0, description="compute slows by this fraction while a collective of the same GPU is in flight; "
        "default: the measured average in topologies/nccl.yaml (0 = ideal overlap)")
    samples: PositiveInt = Field(
        1, description="iterations to simulate, each with its own jitter draws (faults.jitter.seed + i): the "
        "result reports their mean, p50 and p99 step time and which rank was slowest (limit: sim_samples)")

    @field_validator("samples")
    @classmethod
    def _samples_limit(cls, value: int) -> int:
        limits.check("sim_samples", value, what="seeded iterations (sim.samples)", field="sim.samples")
        return value


def recompute_modules_of(training: TrainingSpec) -> frozenset[str]:
    """The submodules a block's backward recomputes under Megatron-Core's selective granularity
    (empty unless ``recompute: selective``; its default, ``[core_attn]``, transformer_config.py:
    1940-1941 at d98e8a6)."""
    if training.recompute != "selective":
        return frozenset()
    return frozenset(training.recompute_modules if training.recompute_modules is not None else ("core_attn",))


def check_recompute_modules(model: Any, par: Any, training: TrainingSpec) -> None:
    """``training.recompute_modules``'s rules: read only with selective recomputation; each
    module once; mla_up_proj needs multi-head latent attention and moe_act an MoE model (Megatron-
    Core refuses both otherwise, transformer_config.py:1964-1973 at d98e8a6); shared_experts
    needs shared experts and refuses overlap_ep_comm (moe_shared_expert_overlap, :1991-1998);
    moe is read in MoE layers only (``MoELayer.moe_layer_recompute``, moe_layer.py:247-251)."""
    mods = training.recompute_modules
    field = "training.recompute_modules"
    if mods is None:
        return
    if training.recompute != "selective":
        raise InfeasibleError(f"recompute_modules is read only with recompute: selective, not {training.recompute}",
                              field=field)
    repeated = sorted({m for m in mods if mods.count(m) > 1})
    if repeated:
        raise InfeasibleError(f"recompute_modules lists {', '.join(repeated)} more than once", field=field)
    refused = [("mla_up_proj" in mods and model.mla is None, "mla_up_proj needs multi-head latent attention "
                "(model.mla)"),
               ("moe_act" in mods and not model.moe, "moe_act needs an MoE model (model.experts > 0)"),
               ("shared_experts" in mods and not (model.moe and model.shared_experts), "shared_experts needs an MoE "
                "model with shared experts (model.shared_experts > 0)"),
               ("shared_experts" in mods and model.moe and par.moe.overlap_ep_comm, "shared_experts cannot be "
                "recomputed with parallelism.moe.overlap_ep_comm (Megatron-Core refuses it)")]
    for bad, message in refused:
        if bad:
            raise InfeasibleError(message, field=field)
