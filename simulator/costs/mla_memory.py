"""Stored activations of multi-head latent attention (DeepSeek-V2/V3) under Megatron-Core.

What Megatron-Core's ``MLASelfAttention`` with its Transformer Engine layer spec keeps for the
backward of one layer's attention, tensor by tensor (NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553,
``megatron/core/transformer/multi_latent_attention.py`` and ``models/gpt/gpt_layer_specs.py:295-316``;
Transformer Engine's linears at NVIDIA/TransformerEngine@d0067d0da6cb01811b8072a7d304f0e00344ce2b,
``transformer_engine/pytorch/module/layernorm_linear.py``). The spec builds a separate input norm
(``backend.layer_norm``), ``linear_q_down_proj`` and ``linear_kv_down_proj`` as ``TELinear`` in
``parallel_mode='duplicated'`` (multi_latent_attention.py:526-527, :573-574: whole on every TP
rank, on the rank's own tokens), and, with the latent norms (``qk_layernorm``), ``linear_q_up_proj``
and ``linear_kv_up_proj`` as ``TELayerNormColumnParallelLinear`` split by heads (gpt_layer_specs.py
:246-255; mla_qk_norm_config.py:132-168 fuses the norm into the linear when ``q_layernorm`` /
``kv_layernorm`` are ``IdentityOp``). Per token, e bytes an element, g the bytes of a linear's
kept input copy (e; 1 with TE's fp8), H = heads / tp, Tn tokens on the rank under sequence
parallelism (T / tp), T otherwise:

Replicated over tp (Tn tokens):

* the input norm's output, read by both down-projections: bf16 ``TELinear`` saves its input
  tensor itself, one ``e*h`` for both; in fp8 each casts and keeps its own copy, ``2*h``
  (1 byte each). Without query compression ``linear_q_proj`` is a fused norm-linear on that
  output (:508-522): it keeps the bf16 output as its norm input (``e*h``, kv_down's fp8 copy
  beside it) and its own norm's output ``g*h``.
* q_down's output (the query latent, ``r_q``): the fused q_up keeps it as its norm input
  (``inputmat``, layernorm_linear.py:181-182, saved at :526-536) and its norm output ``ln_out``
  (``g*r_q``, the local one: under sequence parallelism the all-gathered copy is cleared,
  :430-435, and gathered again in the backward, :787).
* kv_down's output ``[Tn, r_kv + rope]``: ``kv_compressed`` and ``k_pos_emb`` are
  ``torch.split`` views of it (multi_latent_attention.py:758-760); the fused kv_up keeps its
  ``kv_compressed`` input as a view (``inp.view((-1, in_features))``, layernorm_linear.py:181),
  so all ``e*(r_kv + rope)`` stays, and its norm output ``g*r_kv``.

Split by heads (T tokens): the attention core's inputs, which TE's fused attention saves:
query ``[T, H, nope + rope]`` and key ``[T, H, nope + rope]`` (new tensors, ``torch.cat`` of the
up-projections' no-position part with the rotated part, :967, :975; the up-projections' outputs
are freed once those are made: the linears keep their inputs, the rotary embedding only its
cos/sin), value ``[T, H, v]`` (a contiguous copy of the split, :979); the core's output
``[T, H*v]`` (kept by the attention and as ``linear_proj``'s input, one tensor in bf16) and the
fp32 softmax statistics ``4*H`` (FlashAttention/cuDNN's log-sum-exp). With fp8, ``linear_proj``
also keeps its 1-byte input copy only under the delayed-scaling recipe: for the others (TE >=
2.6) Megatron-Core sets it to save the original input (:235-251).

Recomputation (Megatron-Core ``recompute_modules``):

* ``mla_up_proj`` (:171-175, :983-988, :455-458): the up-projections, the rotary embedding and
  the concatenations run in a ``CheckpointWithoutOutput`` that runs them without autograd and
  saves only its inputs (``CheckpointWithoutOutputFunction.forward``, tensor_parallel/random.py
  :760-786: ``torch.no_grad()`` at :777, the arguments saved at :781); once the attention has run,
  its outputs' storage is released (``discard_output_and_register_recompute``, ``_discard_outputs``
  :985-996). Kept: the query
  latent ``e*r_q`` and kv_down's output ``e*(r_kv + rope)`` (the inputs), and, under sequence
  parallelism with tp > 1, the key's rotary part all-gathered to all T tokens (:761-763), a
  fourth input ``e*rope`` per token of T, replicated. Dropped: both ``ln_out`` and query, key
  and value.
* ``layernorm`` (the input norm, a module of its own in this spec): its output is discarded and
  re-made in the backward (transformer_layer.py:475-479); in fp8 the down-projections are set to
  keep the original (discarded) input instead of their fp8 copies (multi_latent_attention.py
  :1114-1118), so nothing of it stays.
* ``core_attn``: the softmax statistics (the core runs in a checkpoint whose inputs, the query,
  key and value, are kept anyway).

Not counted, as in the dense formula: the norms' fp32 reciprocal standard deviations (4 bytes a
token each) and fp8 scaling factors.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MlaWidths", "mla_attention_activation_bytes"]


@dataclass(frozen=True)
class MlaWidths:
    """Multi-head latent attention's widths: the ranks of the query and key/value compressions
    (``q_lora_rank`` None: queries projected from the hidden state) and the per-head widths."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


def mla_attention_activation_bytes(
    mla: MlaWidths,
    *,
    tokens: float,
    seq: int,
    batch: int,
    hidden: int,
    heads: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    flash_attention: bool = True,
    dropout: bool = False,
    act_bytes: int = 2,
    fp8_inputs: bool = False,
    fp8_proj_copy: bool = False,
    recomputed: frozenset[str] = frozenset(),
) -> float:
    """Bytes MLA's attention keeps for its backward on one rank, from the input norm's output
    to the output projection's input (module docstring); the block input and the dropout masks
    are the block's. ``tokens`` = b*s/cp; ``seq`` the full sequence (the unfused attention's
    score matrices). ``recomputed``: the parts :func:`~simulator.costs.memory.layer_activation_bytes`
    names, ``input_norm``, ``qkv`` (``mla_up_proj``) and ``core_attn``.

    DeepSeek-V3 (h 7168, 128 heads, r_q 1536, r_kv 512, rope 64, nope 128, v 128), bf16, no
    recomputation, per token at tp 1: ``2*7168 + 2*2*1536 + 2*(512 + 64) + 2*512 +
    128*(2*192 + 2*192 + 2*128 + 2*128 + 4) = 14336 + 6144 + 1152 + 1024 + 164,352 = 187,008``."""
    e = float(act_bytes)
    g = 1.0 if fp8_inputs else e
    split = float(tp) if sequence_parallel else 1.0
    norm_tokens = tokens / split
    heads_here = heads / tp
    up_recomputed = "qkv" in recomputed
    rope = mla.qk_rope_head_dim

    # replicated, per token of the rank's Tn
    if mla.q_lora_rank is None:
        norm_out = 0.0 if "input_norm" in recomputed else e * hidden + (hidden if fp8_inputs else 0.0)
        q_latent = 0.0 if up_recomputed else g * hidden
    else:
        norm_out = 0.0 if "input_norm" in recomputed else (2.0 * hidden if fp8_inputs else e * hidden)
        q_latent = e * mla.q_lora_rank + (0.0 if up_recomputed else g * mla.q_lora_rank)
    kv_latent = e * (mla.kv_lora_rank + rope) + (0.0 if up_recomputed else g * mla.kv_lora_rank)
    replicated = norm_tokens * (norm_out + q_latent + kv_latent)
    if up_recomputed and sequence_parallel and tp > 1:
        replicated += tokens * e * rope  # the checkpoint's all-gathered rotary key input

    # split by heads, per token of T
    d_qk = mla.qk_nope_head_dim + rope
    qkv = 0.0 if up_recomputed else e * heads_here * (2 * d_qk + mla.v_head_dim)
    out = (e + (1.0 if fp8_inputs and fp8_proj_copy else 0.0)) * heads_here * mla.v_head_dim
    per_token = tokens * (qkv + out)
    core = 0.0
    if "core_attn" not in recomputed:
        mask = 1.0 if dropout else 0.0
        core = (4.0 * heads_here * tokens if flash_attention
                else (e + mask + (e if dropout else 0.0)) * heads_here * tokens * seq)
    return replicated + per_token + core
