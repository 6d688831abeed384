"""The transformer as a list of kernels per layer, independent of how it is parallelised.

A :class:`Shard` says how much of each tensor one rank holds (tp splits heads and the FFN
width, sequence parallelism and cp split tokens); the functions here return the kernels
(:class:`Kernel`: GEMM shape, FLOPs, HBM bytes) one rank runs for one micro-batch. Strategies
place the communication between them; they never change this description (shared/STYLE.md #6).

Forward kernels of a block (Megatron-style, per rank, T = local tokens = b*s/cp):

    ln1 -> qkv GEMM [T, h] x [h, (h + 2*kv*d)/t] -> attention core -> proj GEMM [T, h/t] x [h/t, h]
    -> dropout+residual -> ln2 -> fc1 GEMM [T, h] x [h, F/t] (x2 for SwiGLU gate+up)
    -> activation -> fc2 GEMM [T, F/t] x [F/t, h] -> dropout+residual

Backward: every GEMM twice (input and weight gradients), fused attention 2.5x its forward
FLOPs (FlashAttention-2's backward runs 5 matrix products to the forward's 2), memory-bound
kernels twice their forward bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.costs import compute as cc
from simulator.costs.attention import AttentionShape
from simulator.costs.dtypes import activation_bytes
from simulator.costs.flops import attention_core_flops, gemm_flops
from simulator.scenario.spec import ModelSpec

__all__ = ["Kernel", "Shard", "block_forward", "block_backward", "embedding_forward", "logits_forward",
           "backward_of", "kernel_time_s", "kernels_time_s", "optimizer_kernel"]

# FlashAttention-2 backward / forward FLOP ratio: 5 GEMMs (S=QK^T and dP recomputed, dV, dQ,
# dK) against 2 (Dao 2023, "FlashAttention-2", §3.1).
FLASH_BWD_FLOP_RATIO = 2.5

@dataclass(frozen=True, slots=True)
class Kernel:
    name: str
    kind: str  # gemm | attention | memory
    flops: float
    nbytes: float
    mnk: tuple[float, float, float] | None = None
    section: str = ""  # attn | mlp | embed | logits: where TP collectives sit between sections
    attn: AttentionShape | None = None  # fused attention: what the kernel tables look up


@dataclass(frozen=True)
class Shard:
    """What one rank holds of one micro-batch: batch b, sequence s (full), splits t and cp, and
    the attention kernel (``unfused`` materialises the scores; every other kernel is fused)."""

    batch: int
    seq: int
    tp: int = 1
    cp: int = 1
    sequence_parallel: bool = False
    precision: str = "bf16"
    attention_kernel: str = "fa2"

    @property
    def flash(self) -> bool:
        """A fused attention kernel that never stores the s x s scores."""
        return self.attention_kernel != "unfused"

    @property
    def tokens(self) -> float:
        """Tokens this rank's GEMMs process: b*s/cp."""
        return self.batch * self.seq / self.cp

    @property
    def norm_tokens(self) -> float:
        """Tokens of the norm/dropout regions: split by tp too under sequence parallelism."""
        return self.tokens / (self.tp if self.sequence_parallel else 1)

    @property
    def elem(self) -> int:
        """Bytes per activation element (fp8 runs GEMMs in fp8 but keeps 16-bit activations)."""
        return activation_bytes(self.precision)


def _memory(name: str, nbytes: float, section: str) -> Kernel:
    return Kernel(name, "memory", 0.0, nbytes, None, section)


def _gemm(name: str, m: float, n: float, k: float, elem: int, section: str) -> Kernel:
    return Kernel(name, "gemm", gemm_flops(m, n, k), (m * k + k * n + m * n) * elem, (m, n, k), section)


def block_forward(model: ModelSpec, shard: Shard, *, recompute_core_only: bool = False) -> list[Kernel]:
    """Kernels of one transformer block's forward on one rank (``recompute_core_only``: just
    the attention core, as selective recomputation re-runs it)."""
    t, e, h = shard.tp, shard.elem, model.hidden
    d = model.head_dim
    heads, kv = model.heads / t, model.n_kv_heads / t
    T, Tn = shard.tokens, shard.norm_tokens
    b = shard.batch
    s_q, s_k = shard.seq / shard.cp, float(shard.seq)
    ffn = model.ffn / t
    causal = 0.5 if model.causal else 1.0
    core_flops = attention_core_flops(b, heads, s_q, s_k, d)
    if shard.flash:
        io = (2 * b * s_q * heads * d + 2 * b * s_k * kv * d) * e
        # the table's length is the block one call runs: s/cp (a ring step's local queries
        # against one rank's keys); with a load-balanced causal split only the diagonal step
        # (1/cp of the FLOPs) is masked (Megatron-Core / Transformer Engine context parallelism)
        masked = (1.0 / shard.cp) if model.causal else 0.0
        shape = AttentionShape(s_q, d, masked)
        core = [Kernel("attention", "attention", core_flops * causal, io, None, "attn", shape)]
    else:
        scores = b * heads * s_q * s_k
        core = [
            Kernel("scores", "gemm", core_flops / 2, (b * s_q * heads * d + b * s_k * kv * d + scores) * e,
                   (s_q, s_k, d), "attn"),
            _memory("softmax", scores * e * 2 + (scores if model.dropout else 0.0) * (1 + 2 * e), "attn"),
            Kernel("attn_v", "gemm", core_flops / 2, (scores + b * s_k * kv * d + b * s_q * heads * d) * e,
                   (s_q, d, s_k), "attn"),
        ]
    if recompute_core_only:
        return core
    mask = 1.0 if model.dropout else 0.0
    n_up = 2 if model.mlp == "swiglu" else 1
    kernels = [
        _memory("ln1", Tn * h * e * 2, "attn"),
        _gemm("qkv", T, (heads + 2 * kv) * d, h, e, "attn"),
        *core,
        _gemm("proj", T, h, heads * d, e, "attn"),
        _memory("residual1", Tn * h * (3 * e + mask), "mlp"),
        _memory("ln2", Tn * h * e * 2, "mlp"),
        _gemm("fc1", T, n_up * ffn, h, e, "mlp"),
        _memory("act", T * ffn * e * (n_up + 1), "mlp"),
        _gemm("fc2", T, h, ffn, e, "mlp"),
        _memory("residual2", Tn * h * (3 * e + mask), "out"),
    ]
    return kernels


def backward_of(kernels: list[Kernel]) -> list[Kernel]:
    """Backward kernels, in execution order (reverse of the forward)."""
    out: list[Kernel] = []
    for k in reversed(kernels):
        if k.kind == "gemm" and k.mnk is not None:
            m, n, kk = k.mnk
            out.append(Kernel(k.name + ".dgrad", "gemm", k.flops, k.nbytes, (m, kk, n), k.section))
            out.append(Kernel(k.name + ".wgrad", "gemm", k.flops, k.nbytes, (kk, n, m), k.section))
        elif k.kind == "attention":
            out.append(Kernel(k.name + ".bwd", "attention", FLASH_BWD_FLOP_RATIO * k.flops, 2 * k.nbytes, None,
                              k.section, k.attn))
        else:
            out.append(Kernel(k.name + ".bwd", "memory", 0.0, 2 * k.nbytes, None, k.section))
    return out


def block_backward(model: ModelSpec, shard: Shard) -> list[Kernel]:
    return backward_of(block_forward(model, shard))


def embedding_forward(model: ModelSpec, shard: Shard) -> list[Kernel]:
    """Token (and learned position) embedding lookup, dropout: memory bound."""
    e, h = shard.elem, model.hidden
    T = shard.tokens
    lookups = 2 if model.position_embedding == "learned" else 1
    return [_memory("embedding", T * h * e * (lookups + 1) + (T * h if model.dropout else 0.0), "embed")]


def logits_forward(model: ModelSpec, shard: Shard) -> list[Kernel]:
    """Final norm, output GEMM [T, h] x [h, V/t], and the fp32 cross-entropy over V/t."""
    e, h, t = shard.elem, model.hidden, shard.tp
    T, Tn = shard.tokens, shard.norm_tokens
    vocab = model.vocab / t
    return [
        _memory("final_ln", Tn * h * e * 2, "logits"),
        _gemm("logits", T, vocab, h, e, "logits"),
        _memory("cross_entropy", T * vocab * (e + 4 + 4), "loss"),
    ]


def optimizer_kernel(n_params: float, precision: str, optimizer: str) -> Kernel:
    """Fused (multi-tensor) optimizer step over ``n_params`` local parameters: memory bound.

    Mixed-precision Adam reads the 16-bit gradient, fp32 master weight and both moments and
    writes back master, moments and the 16-bit weight: 2+4+4+4 + 4+4+4+2 = 28 bytes, plus
    2 for the gradient-norm pass (30). fp32 Adam: 4*4 read + 3*4 written + 4 = 32. SGD with
    momentum drops the variance (8 bytes less).
    """
    if precision in ("fp32", "tf32"):
        per = 32.0
    else:
        per = 30.0
    if optimizer == "sgd":
        per -= 8.0
    return _memory("optimizer", n_params * per, "optimizer")


def kernel_time_s(profile: cc.ComputeProfile, kernel: Kernel, precision: str, attention_kernel: str = "fa2") -> float:
    """Roofline time of one kernel (GEMMs use the precision's tensor-core peak; fused attention
    the named ``attention_kernel``'s published rate, :func:`simulator.costs.compute.attention_time_s`)."""
    if kernel.kind == "gemm":
        assert kernel.mnk is not None
        rate = profile.peak(precision) * profile.gemm_efficiency(kernel.flops, precision)
        return cc.roofline_time_s(kernel.flops, kernel.nbytes, rate, profile.memory_bytes_per_s,
                                  profile.launch_overhead_s)
    if kernel.kind == "attention":
        backward = kernel.name.endswith(".bwd")
        attn_precision = "bf16" if precision == "fp8" else precision
        return cc.attention_time_s(profile, kernel.flops, kernel.nbytes, attn_precision, backward=backward,
                                   kernel=attention_kernel, shape=kernel.attn)
    return cc.memory_time_s(profile, kernel.nbytes)


def kernels_time_s(profile: cc.ComputeProfile, kernels: list[Kernel], precision: str,
                   attention_kernel: str = "fa2") -> float:
    return sum(kernel_time_s(profile, k, precision, attention_kernel) for k in kernels)
