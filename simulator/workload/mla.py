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
"""

from __future__ import annotations

from dataclasses import replace

from simulator.costs.attention import AttentionShape
from simulator.costs.flops import gemm_flops
from simulator.scenario.spec import ModelSpec
from simulator.workload.model import Kernel, Shard, _gemm

__all__ = ["with_mla"]


def with_mla(fwd: list[Kernel], model: ModelSpec, shard: Shard) -> list[Kernel]:
    """A block's forward kernels with MLA's projections and attention shape (module docstring)."""
    mla = model.mla
    assert mla is not None
    e, h, H, T, p = shard.elem, model.hidden, model.heads, shard.tokens, shard.gemm_precision
    b, s_q, s_k = shard.batch, shard.seq / shard.cp, float(shard.seq)
    dqk, dv = mla.qk_head_dim, mla.v_head_dim
    if mla.q_lora_rank is None:
        query = [_gemm("q_proj", T, H * dqk, h, e, "attn", p)]
    else:
        query = [_gemm("q_down", T, mla.q_lora_rank, h, e, "attn", p),
                 _gemm("q_up", T, H * dqk, mla.q_lora_rank, e, "attn", p)]
    kv = [_gemm("kv_down", T, mla.kv_lora_rank + mla.qk_rope_head_dim, h, e, "attn", p),
          _gemm("kv_up", T, H * (mla.qk_nope_head_dim + dv), mla.kv_lora_rank, e, "attn", p)]
    causal = 0.5 if model.causal else 1.0
    out: list[Kernel] = []
    for k in fwd:
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
            out.append(_gemm("proj", T, h, H * dv, e, "attn", p))
        else:
            out.append(k)
    return out
