"""Multi-head latent attention's kernels (DeepSeek-V2, arXiv:2405.04434 §2.1.2-2.1.3; the
training-time form, keys and values decompressed per head; cp = 1, bf16), under tensor
parallelism as Megatron-Core splits it (MLASelfAttention, megatron/core/transformer/
multi_latent_attention.py at d98e8a6; its TE layer spec, models/gpt/gpt_layer_specs.py:121-130).

The QKV GEMM of a block becomes four (or three without query compression), T = tokens,
Tn = the rank's sequence-parallel share (T / tp under sequence parallelism, else T), H = heads,
t = tp, r_q / r_kv the ranks, d_qk = nope + rope, d_v the value width:

    q_down [Tn, h] x [h, r_q] -> q_up [T, r_q] x [r_q, H/t*d_qk]
    kv_down [Tn, h] x [h, r_kv + rope] -> kv_up [T, r_kv] x [r_kv, H/t*(nope + d_v)]

The down-projections are replicated on every TP rank (TELinear ``parallel_mode='duplicated'``,
multi_latent_attention.py:526-527 and 573-574) and run on the rank's own tokens; the
up-projections are column-parallel by heads (``gather_output=False``, :557-569, :604-616), so
under sequence parallelism their input, the latents, is all-gathered (T x (r_q + r_kv) x e)
with the key's shared rotary part (T x rope x e, gather_from_sequence_parallel_region,
:761-763) instead of the hidden state (T x h x e); without it the latents' input gradient is
all-reduced in the backward (the column-parallel linear's). The fused attention runs on H/t
heads, QK^T over d_qk and AV over d_v (``2*b*H/t*s_q*s_k*(d_qk + d_v)`` FLOPs before the
causal half, looked up in the kernel tables at head dim d_qk), and the row-parallel output
projection [T, H/t*d_v] x [H/t*d_v, h] ends in the dense block's all-reduce / reduce-scatter.
The norms of the two latents (fused into the up-projections in the TE spec, replicated) are
left out of the kernels (T x r elements each, small beside the GEMMs) and counted in the
parameters. Under sequence parallelism the replicated down-projections' and norms' gradients
are all-reduced over tp once a step (finalize_model_grads.py:416-470; emitted with the
tied-embedding sync, :meth:`simulator.workload.data_parallel.base.Strategy.end_of_backward`).
The bytes the attention keeps for its backward are :mod:`simulator.costs.mla_memory`'s.

fp8: the five projections are linears like the MHA block's and run in fp8 with their casts
(:func:`simulator.workload.model._linear`); the attention core stays bf16. Megatron-Core's TE
spec (gpt_layer_specs.py:245-256, 295-310 at d98e8a6) builds q_down and kv_down as ``TELinear``
after a separate input norm (their casts read the bf16 norm output, each its own copy) and,
with the latent norms (``qk_layernorm``, True in NeMo's DeepSeekConfig, which
DeepSeekV3Config extends: nemo/collections/llm/gpt/model/deepseek.py:86 at 8cfedd7), q_up and
kv_up as ``TELayerNormColumnParallelLinear``: the latent norm writes their fp8 input
(``fused_norm_input``). torchao's Float8Linear swaps every ``nn.Linear`` (torchtitan
models/deepseek_v3/model.py:74-83 at b5bcd76: wq_a, wq_b, wkv_a, wkv_b, wo, whose ``Linear`` is
an ``nn.Linear``, models/common/linear.py:26), each cast on its own.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.costs.attention import AttentionShape
from simulator.costs.flops import gemm_flops
from simulator.scenario.spec import ModelSpec
from simulator.workload.model import Kernel, Shard, _linear

__all__ = ["with_mla", "mla_tp_names", "mla_tp_bytes"]


def mla_tp_names(model: ModelSpec) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the kernels before the tensor-parallel gather: ln1 and the replicated down-projections;
    the column-parallel GEMMs after it: the up-projections, or q_proj without query compression)."""
    mla = model.mla
    assert mla is not None
    if mla.q_lora_rank is None:
        return ("ln1", "kv_down"), ("q_proj", "kv_up")
    return ("ln1", "q_down", "kv_down"), ("q_up", "kv_up")


def mla_tp_bytes(model: ModelSpec, shard: Shard) -> tuple[float, float]:
    """(bytes of the column-parallel GEMMs' gathered input, T x (r_q + r_kv) x e (the hidden
    state h for r_q without query compression); bytes of the key's rotary part gathered beside
    it under sequence parallelism, T x rope x e)."""
    mla = model.mla
    assert mla is not None
    q = model.hidden if mla.q_lora_rank is None else mla.q_lora_rank
    return (shard.tokens * (q + mla.kv_lora_rank) * shard.elem,
            shard.tokens * mla.qk_rope_head_dim * shard.elem)


def with_mla(fwd: list[Kernel], model: ModelSpec, shard: Shard) -> list[Kernel]:
    """A block's forward kernels with MLA's projections and attention shape (module docstring)."""
    mla = model.mla
    assert mla is not None
    e, h, T, Tn = shard.elem, model.hidden, shard.tokens, shard.norm_tokens
    H = model.heads / shard.tp
    b, s_q, s_k = shard.batch, shard.seq / shard.cp, float(shard.seq)
    dqk, dv = mla.qk_head_dim, mla.v_head_dim
    fused = shard.fp8 is not None and shard.fp8.fused_norm_input  # TE: the latent norm and its up-projection are one module
    if mla.q_lora_rank is None:
        query = _linear("q_proj", T, H * dqk, h, shard, "attn")
    else:
        query = [*_linear("q_down", Tn, mla.q_lora_rank, h, shard, "attn"),
                 *_linear("q_up", T, H * dqk, mla.q_lora_rank, shard, "attn", fused_input=fused)]
    kv = [*_linear("kv_down", Tn, mla.kv_lora_rank + mla.qk_rope_head_dim, h, shard, "attn"),
          *_linear("kv_up", T, H * (mla.qk_nope_head_dim + dv), mla.kv_lora_rank, shard, "attn", fused_input=fused)]
    causal = 0.5 if model.causal else 1.0
    out: list[Kernel] = []
    for k in fwd:
        if k.kind == "cast" and k.of in ("qkv", "proj"):  # the MHA linears' fp8 casts: MLA's own come with its linears
            continue
        if k.name == "qkv":
            out += [*query, *kv]
        elif k.kind == "attention":
            flops = 2.0 * b * H * s_q * s_k * (dqk + dv) * causal
            io = (b * s_q * H * dqk + b * s_k * H * (dqk + dv) + b * s_q * H * dv) * e
            shape = AttentionShape(s_q, dqk, k.attn.causal_fraction if k.attn is not None else 0.0)
            out.append(replace(k, flops=flops, nbytes=io, attn=shape))
        elif k.name == "scores" and k.mnk is not None:
            out.append(replace(k, flops=gemm_flops(b * H * s_q, s_k, dqk), mnk=(s_q, s_k, dqk)))
        elif k.name == "attn_v" and k.mnk is not None:
            out.append(replace(k, flops=gemm_flops(b * H * s_q, dv, s_k), mnk=(s_q, dv, s_k)))
        elif k.name == "proj":
            out += _linear("proj", T, h, H * dv, shard, "attn")
        else:
            out.append(k)
    return out
