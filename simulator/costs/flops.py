"""FLOP and parameter counts of a transformer (pure functions, no simulator state).

Conventions (stated in every Result):

* a multiply-add is 2 FLOPs; a GEMM of (m x k) by (k x n) is ``2*m*n*k``;
* **model FLOPs** per token (PaLM, Chowdhery et al. 2022, appendix B):
  ``6*N + 12*L*h*s``, where N counts the parameters that take part in matrix multiplies
  (everything but the input-embedding and position tables; with tied embeddings the shared
  matrix is counted once, for the output projection) and ``12*L*h*s`` is the attention
  score and value product (forward + backward, no causal discount);
* **hardware FLOPs** add what recomputation executes again: the whole layer forward for
  ``full`` recompute, the attention core (``4*L*h*s`` per token) for ``selective``.

Cross-check (nanoGPT-style second derivation): Megatron's per-iteration count without
recomputation ``72*B*s*L*h^2*(1 + s/(6h) + V/(12*L*h))`` (Narayanan et al. SC'21, Eq. 3
without the recompute forward) equals ``(6*N + 12*L*h*s)*B*s`` for a GPT with 4h MLP and
tied embeddings, up to biases and norms; ``tests/test_flops.py`` checks both.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.costs.memory import block_matmuls, op_policy_saved_matmuls

__all__ = [
    "gemm_flops",
    "attention_core_flops",
    "ParamCounts",
    "param_counts",
    "model_flops_per_token",
    "recompute_flops_per_token",
    "selective_recomputed_params",
    "op_policy_recomputed_params",
    "megatron_flops_per_iteration",
]


def gemm_flops(m: float, n: float, k: float) -> float:
    """FLOPs of one (m x k) @ (k x n) matrix product: 2*m*n*k."""
    return 2.0 * m * n * k


def attention_core_flops(batch: float, heads: float, s_q: float, s_k: float, head_dim: float) -> float:
    """Forward FLOPs of softmax(QK^T)V without masking: QK^T and AV are 2*b*a*s_q*s_k*d each."""
    return 4.0 * batch * heads * s_q * s_k * head_dim


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of one model (elements)."""

    per_layer: int
    layers: int
    embedding: int  # token embedding table V*h
    position: int  # learned position table s*h (0 for rotary)
    output: int  # untied output projection V*h (0 when tied)
    final_norm: int
    moe_layers: int = 0  # layers whose dense MLP is replaced by routed experts
    moe_extra: int = 0  # an MoE layer's parameters over a dense one's (all experts, router; costs/moe.py)
    moe_active_extra: int = 0  # the same for the parameters one token multiplies by (top-k + shared experts)

    @property
    def total(self) -> int:
        return (self.per_layer * self.layers + self.moe_layers * self.moe_extra + self.embedding + self.position
                + self.output + self.final_norm)

    @property
    def matmul(self) -> int:
        """Parameters that take part in a token's matrix multiplies (the N of 6N): for a mixture of
        experts the *active* ones (top-k routed and the shared experts, the router)."""
        logits = self.output if self.output else self.embedding
        return self.per_layer * self.layers + self.moe_layers * self.moe_active_extra + logits + self.final_norm

    @property
    def active(self) -> int:
        """Parameters a token's forward uses (total for a dense model)."""
        return self.total - self.moe_layers * (self.moe_extra - self.moe_active_extra)


def param_counts(
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn_hidden: int,
    vocab: int,
    seq_len: int,
    mlp: str,
    norm: str,
    position_embedding: str,
    tied_embeddings: bool,
    bias: bool,
    head_dim: int | None = None,
) -> ParamCounts:
    """Exact parameter counts of a GPT/Llama-style block stack.

    Per layer: attention ``h*(heads*d + 2*kv*d) + heads*d*h`` (Q, K, V, output; d = head_dim,
    by default h/heads, when heads*d = h the familiar ``h*(h + 2*kv*d) + h*h``), MLP
    ``2*h*F`` (GELU) or ``3*h*F`` (SwiGLU gate/up/down), two norms (``2h`` each for
    LayerNorm with bias, ``h`` for RMSNorm), biases when ``bias``.
    """
    d = head_dim or hidden // heads
    q_width, kv_width = heads * d, kv_heads * d
    attn = hidden * (q_width + 2 * kv_width) + q_width * hidden
    n_mats = 3 if mlp == "swiglu" else 2
    mlp_params = n_mats * hidden * ffn_hidden
    norm_params = 2 * hidden if norm == "layernorm" else hidden
    per_layer = attn + mlp_params + 2 * norm_params
    if bias:
        per_layer += (q_width + 2 * kv_width) + hidden  # qkv and output projection biases
        per_layer += (2 if mlp == "swiglu" else 1) * ffn_hidden + hidden
    return ParamCounts(
        per_layer=per_layer,
        layers=layers,
        embedding=vocab * hidden,
        position=seq_len * hidden if position_embedding == "learned" else 0,
        output=0 if tied_embeddings else vocab * hidden,
        final_norm=norm_params,
    )


def model_flops_per_token(matmul_params: int, layers: int, hidden: int, seq_len: int) -> float:
    """PaLM model FLOPs per trained token: 6*N + 12*L*H*Q*T (Chowdhery et al. 2022, appendix B: H
    heads of width Q, T tokens), written 6*N + 12*L*h*s with ``hidden`` = H*Q, the attention
    width (the model's hidden size unless its heads are wider or narrower)."""
    return 6.0 * matmul_params + 12.0 * layers * hidden * seq_len


def op_policy_recomputed_params(*, hidden: int, q_width: int, kv_width: int, ffn_hidden: int, mlp: str) -> float:
    """Weights per block whose matmuls torchtitan's op policy re-runs in the backward: the
    unsaved matmuls (:func:`simulator.costs.memory.op_policy_saved_matmuls`) before the down
    projection (non-reentrant early stop skips it). SwiGLU: wk + wo + w3 = ``h*kv + q*h + h*F``;
    GELU: wk + wo = ``h*kv + q*h``."""
    sizes = {"wq": hidden * q_width, "wk": hidden * kv_width, "wv": hidden * kv_width, "wo": q_width * hidden,
             "w1": hidden * ffn_hidden, "w3": hidden * ffn_hidden, "fc1": hidden * ffn_hidden}
    saved = op_policy_saved_matmuls(mlp)
    return float(sum(sizes[n] for n in block_matmuls(mlp)[:-1] if n not in saved))


def selective_recomputed_params(modules: frozenset[str], *, dense_mlp: float, dense_layers: int, shared: float,
                                moe_layers: int, mla_up: float, layers: int, moe_mlp: float = 0.0) -> float:
    """Matmul weights, summed over the model's layers, whose GEMMs Megatron-Core's selective
    ``recompute_modules`` re-run in the backward: mlp, every dense layer's MLP (``dense_mlp``
    weights each); shared_experts, every MoE layer's shared experts (``shared``); mla_up_proj,
    every layer's MLA up-projections (``mla_up``); moe, every MoE layer's MLP (``moe_mlp``: the
    weights a token meets, router, its top-k routed experts and the shared experts; with
    shared_experts too, the shared experts run again in their own backward). core_attn, moe_act
    and layernorm re-run no weight matmul."""
    return (dense_mlp * dense_layers * ("mlp" in modules) + shared * moe_layers * ("shared_experts" in modules)
            + mla_up * layers * ("mla_up_proj" in modules) + moe_mlp * moe_layers * ("moe" in modules))


def recompute_flops_per_token(
    recompute: str, layer_params: int, layers: int, hidden: int, seq_len: int, *, op_policy_params: float = 0.0,
    core_attn: bool = True, selective_params: float = 0.0,
) -> float:
    """FLOPs per token executed again by activation recomputation.

    full: one more forward of every transformer layer, ``2*N_layers + 4*L*h*s``;
    selective: the attention core, ``4*L*h*s`` (Korthikanti et al. 2022 §5; ``core_attn``), and
    ``2*selective_params``, the matmuls the other recompute modules re-run
    (:func:`selective_recomputed_params`);
    selective-op: the unsaved matmuls, ``2*L*op_policy_params``
    (:func:`op_policy_recomputed_params`; the attention is saved).
    """
    if recompute == "selective-op":
        return 2.0 * layers * op_policy_params
    attention = 4.0 * layers * hidden * seq_len
    if recompute == "full":
        return 2.0 * layer_params * layers + attention
    if recompute == "selective":
        return attention * core_attn + 2.0 * selective_params
    return 0.0


def megatron_flops_per_iteration(
    batch: int, seq_len: int, layers: int, hidden: int, vocab: int, *, recompute: bool
) -> float:
    """Narayanan et al. SC'21 Eq. 3: 96*B*s*l*h^2*(1 + s/6h + V/16lh) with full recompute,
    72*B*s*l*h^2*(1 + s/6h + V/12lh) without (the convention of SC'21 and DeepSpeed-era TFLOP/s)."""
    b, s, n, h, v = float(batch), float(seq_len), float(layers), float(hidden), float(vocab)
    if recompute:
        return 96.0 * b * s * n * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * n * h))
    return 72.0 * b * s * n * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * n * h))
