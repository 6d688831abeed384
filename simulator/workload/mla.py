"""Multi-head latent attention's kernels (DeepSeek-V2, arXiv:2405.04434 §2.1.2-2.1.3; the
training-time form, keys and values decompressed per head; tp = cp = 1, bf16).

The QKV GEMM of a block becomes four (or three without query compression), T = tokens,
H = heads, r_q / r_kv the ranks, d_qk = nope + rope, d_v the value width:

    q_down [T, h] x [h, r_q] -> q_up [T, r_q] x [r_q, H*d_qk]
    kv_down [T, h] x [h, r_kv + rope] -> kv_up [T, r_kv] x [r_kv, H*(nope + d_v)]

the fused attention computes QK^T over d_qk and AV over d_v (``2*b*H*s_q*s_k*(d_qk + d_v)``
FLOPs before the causal half, looked up in the kernel tables at head dim d_qk), and the output
projection is [T, H*d_v] x [H*d_v, h]. The norms of the two latents are left out (T x r
elements each, small beside the GEMMs). Activation memory keeps the MHA formula.

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

__all__ = ["with_mla"]


def with_mla(fwd: list[Kernel], model: ModelSpec, shard: Shard) -> list[Kernel]:
    """A block's forward kernels with MLA's projections and attention shape (module docstring)."""
    mla = model.mla
    assert mla is not None
    e, h, H, T = shard.elem, model.hidden, model.heads, shard.tokens
    b, s_q, s_k = shard.batch, shard.seq / shard.cp, float(shard.seq)
    dqk, dv = mla.qk_head_dim, mla.v_head_dim
    fused = shard.fp8 is not None and shard.fp8.fused_norm_input  # TE: the latent norm and its up-projection are one module
    if mla.q_lora_rank is None:
        query = _linear("q_proj", T, H * dqk, h, shard, "attn")
    else:
        query = [*_linear("q_down", T, mla.q_lora_rank, h, shard, "attn"),
                 *_linear("q_up", T, H * dqk, mla.q_lora_rank, shard, "attn", fused_input=fused)]
    kv = [*_linear("kv_down", T, mla.kv_lora_rank + mla.qk_rope_head_dim, h, shard, "attn"),
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
