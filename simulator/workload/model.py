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

fp8 (``Shard.fp8`` set): the block's four linears (and the LM head if the recipe says so)
run on the fp8 tensor cores, reading 1-byte operands and writing a 16-bit output; each is
preceded by the kernels casting its operands (``kind == "cast"``, :mod:`simulator.costs.fp8`),
and its backward by the casts of its output gradient. Everything else, attention included,
stays 16-bit.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.costs import compute as cc
from simulator.costs.attention import AttentionShape
from simulator.costs.dtypes import activation_bytes
from simulator.costs.elementwise import (
    cross_entropy_bytes_per_element,
    embedding_grad_bytes_per_element,
    rmsnorm_bytes_per_element,
    rotary_bytes_per_element,
    swiglu_bytes_per_element,
)
from simulator.costs.flops import attention_core_flops, gemm_flops
from simulator.costs.fp8 import FP8_BYTES, CastKernel, Fp8Casting, cast_kernels
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
    precision: str = ""  # a GEMM's tensor-core format; "" = the run's precision
    fp8: Fp8Casting | None = None  # an fp8 GEMM: how its operands are cast (its backward casts its gradient)
    of: str = ""  # a cast kernel: the GEMM pass it feeds (qkv, qkv.dgrad, ...), which passes keep it with
    attn: AttentionShape | None = None  # fused attention: what the kernel tables look up
    bwd_nbytes: float | None = None  # a memory kernel whose backward moves other than twice its bytes
    elements: tuple[float, ...] | None = None  # a memory-bound kernel: the tensor shape it sweeps (traces)
    groups: float = 1.0  # a grouped GEMM: the [k, n] weights it multiplies (local experts), each read (and cast) once


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
    fp8: Fp8Casting | None = None  # how the fp8 GEMMs cast (precision fp8 only)
    compile: bool | None = None  # training.compile: None = framework-fused kernels, True = Inductor, False = eager
    cross_entropy: str = "fused"  # training.cross_entropy: the loss's kernels (costs/elementwise.py)
    embedding_grad: str = "dense"  # training.embedding_grad: the table gradient's passes (costs/elementwise.py)
    main_grad_bytes: float = 4.0  # bytes of a main-gradient element (embedding_grad main-grad)
    tied_here: bool = False  # the embedding table is also the output layer's weight on the same pipeline stage

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

    @property
    def gemm_precision(self) -> str:
        """Tensor-core format of the GEMMs that do not run in fp8 (bf16 in an fp8 run)."""
        return "bf16" if self.precision == "fp8" else self.precision


def _memory(name: str, nbytes: float, section: str, elements: tuple[float, ...]) -> Kernel:
    """A memory-bound kernel moving ``nbytes`` over a tensor of shape ``elements``."""
    return Kernel(name, "memory", 0.0, nbytes, None, section, elements=elements)


def _gemm_bytes(m: float, n: float, k: float, operand_bytes: float, out_bytes: float, groups: float = 1.0) -> float:
    """HBM bytes of [m, k] x [k, n]: both operands read once, the output written once; a grouped
    GEMM (``groups`` weights, the m rows split among them) reads each of its [k, n] weights."""
    return (m * k + groups * k * n) * operand_bytes + m * n * out_bytes


def _gemm(name: str, m: float, n: float, k: float, elem: int, section: str, precision: str = "",
          groups: float = 1.0) -> Kernel:
    return Kernel(name, "gemm", gemm_flops(m, n, k), _gemm_bytes(m, n, k, elem, elem, groups), (m, n, k), section,
                  precision, groups=groups)


def _cast(of: str, cast: CastKernel, section: str) -> Kernel:
    return Kernel(f"{of}.{cast.name}", "cast", 0.0, cast.nbytes, None, section, of=of,
                  elements=(cast.numel,) if cast.numel else None)


def _linear(name: str, m: float, n: float, k: float, shard: Shard, section: str, *, fused_input: bool = False,
            head: bool = False, groups: float = 1.0) -> list[Kernel]:
    """A linear layer's forward [m, k] x [k, n]: its GEMM, after its operand casts when it runs
    in fp8 (``fused_input``: the norm before it writes the fp8 input; ``head``: the LM head).
    ``groups``: a grouped GEMM over that many [k, n] weights (an MoE layer's local experts, the
    m rows split among them): each weight is read and cast, ``groups * k * n`` elements."""
    casting = shard.fp8
    if casting is None or (head and not casting.output_head):
        return [_gemm(name, m, n, k, shard.elem, section, shard.gemm_precision, groups)]
    casts = [*cast_kernels(casting, "input", m * k, "fwd", fused_read=fused_input),
             *cast_kernels(casting, "weight", groups * k * n, "fwd")]
    gemm = Kernel(name, "gemm", gemm_flops(m, n, k), _gemm_bytes(m, n, k, FP8_BYTES, shard.elem, groups), (m, n, k),
                  section, "fp8", casting, groups=groups)
    return [*(_cast(name, c, section) for c in casts), gemm]


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
    hp = shard.gemm_precision
    if shard.flash:
        io = (2 * b * s_q * heads * d + 2 * b * s_k * kv * d) * e
        # one call over the rank's queries: with cp > 1 the context-parallel pass
        # (workload/parallel/context.py, ring_blocks) replaces this kernel by the ring's per-step
        # calls and their own block shapes; this shape stands only for a kernel timed whole
        masked = (1.0 / shard.cp) if model.causal else 0.0
        shape = AttentionShape(s_q, d, masked)
        core = [Kernel("attention", "attention", core_flops * causal, io, None, "attn", attn=shape)]
    else:
        scores = b * heads * s_q * s_k
        core = [
            Kernel("scores", "gemm", core_flops / 2, (b * s_q * heads * d + b * s_k * kv * d + scores) * e,
                   (s_q, s_k, d), "attn", hp),
            _memory("softmax", scores * e * 2 + (scores if model.dropout else 0.0) * (1 + 2 * e), "attn",
                    (b, heads, s_q, s_k)),
            Kernel("attn_v", "gemm", core_flops / 2, (scores + b * s_k * kv * d + b * s_q * heads * d) * e,
                   (s_q, d, s_k), "attn", hp),
        ]
    if recompute_core_only:
        return core
    mask = 1.0 if model.dropout else 0.0
    n_up = 2 if model.mlp == "swiglu" else 1
    eager = shard.compile is False
    # eager PyTorch runs RMSNorm and SwiGLU op by op (simulator/costs/elementwise.py); LayerNorm
    # and GELU are single kernels in eager PyTorch too
    norm = rmsnorm_bytes_per_element(e, eager=eager) if model.norm == "rmsnorm" else 2 * e
    act = swiglu_bytes_per_element(e, eager=eager) if model.mlp == "swiglu" else (n_up + 1) * e
    rotary: list[Kernel] = []
    if model.position_embedding == "rotary" and shard.compile is not None:
        # torch-level models (compile true/false) apply rotary as its own kernel(s) after the QKV GEMM;
        # the framework-fused path (compile null) keeps dtsim's earlier kernel list
        rotary = [_memory("rotary", T * (heads + kv) * d * rotary_bytes_per_element(e, eager=eager), "attn",
                           (T, heads + kv, d))]
    fused = shard.fp8 is not None and shard.fp8.fused_norm_input
    kernels = [
        _memory("ln1", Tn * h * norm, "attn", (Tn, h)),
        *_linear("qkv", T, (heads + 2 * kv) * d, h, shard, "attn", fused_input=fused),
        *rotary,
        *core,
        *_linear("proj", T, h, heads * d, shard, "attn"),
        _memory("residual1", Tn * h * (3 * e + mask), "mlp", (Tn, h)),
        _memory("ln2", Tn * h * norm, "mlp", (Tn, h)),
        *_linear("fc1", T, n_up * ffn, h, shard, "mlp", fused_input=fused),
        _memory("act", T * ffn * act, "mlp", (T, ffn)),
        *_linear("fc2", T, h, ffn, shard, "mlp"),
        _memory("residual2", Tn * h * (3 * e + mask), "out", (Tn, h)),
    ]
    return kernels


def _gemm_backward(k: Kernel) -> list[Kernel]:
    """dgrad [m, n] x [n, k] and wgrad [k, m] x [m, n] of a forward GEMM [m, k] x [k, n]; an fp8
    GEMM's preceded by its backward casts (output gradient and weight before dgrad, the input's
    transposed copy before wgrad). A grouped GEMM's dgrad reads its ``groups`` weights and its
    wgrad writes their gradients: ``groups * k * n`` elements each (16-bit when the run is not
    fp8, so dgrad and wgrad move the forward's bytes)."""
    assert k.mnk is not None
    m, n, kk = k.mnk
    g = k.groups
    dgrad, wgrad = k.name + ".dgrad", k.name + ".wgrad"
    if k.fp8 is None:
        return [Kernel(dgrad, "gemm", k.flops, k.nbytes, (m, kk, n), k.section, k.precision, groups=g),
                Kernel(wgrad, "gemm", k.flops, k.nbytes, (kk, n, m), k.section, k.precision, groups=g)]
    c, elem = k.fp8, activation_bytes("fp8")  # fp8 operands, 16-bit gradients out
    before_dgrad = [*cast_kernels(c, "grad_output", m * n, "bwd"), *cast_kernels(c, "weight", g * kk * n, "bwd")]
    dgrad_bytes = (m * n + g * n * kk) * FP8_BYTES + m * kk * elem
    wgrad_bytes = (kk * m + m * n) * FP8_BYTES + g * kk * n * elem
    return [*(_cast(dgrad, x, k.section) for x in before_dgrad),
            Kernel(dgrad, "gemm", k.flops, dgrad_bytes, (m, kk, n), k.section, "fp8", groups=g),
            *(_cast(wgrad, x, k.section) for x in cast_kernels(c, "input", m * kk, "bwd")),
            Kernel(wgrad, "gemm", k.flops, wgrad_bytes, (kk, n, m), k.section, "fp8", groups=g)]


def backward_of(kernels: list[Kernel]) -> list[Kernel]:
    """Backward kernels, in execution order (reverse of the forward); forward casts have none
    of their own (their GEMM's backward casts what it needs)."""
    out: list[Kernel] = []
    for k in reversed(kernels):
        if k.kind == "gemm" and k.mnk is not None:
            out += _gemm_backward(k)
        elif k.kind == "cast":
            continue
        elif k.kind == "attention":
            out.append(Kernel(k.name + ".bwd", "attention", FLASH_BWD_FLOP_RATIO * k.flops, 2 * k.nbytes, None,
                              k.section, attn=k.attn))
        else:
            nbytes = 2 * k.nbytes if k.bwd_nbytes is None else k.bwd_nbytes
            out.append(Kernel(k.name + ".bwd", "memory", 0.0, nbytes, None, k.section, elements=k.elements))
    return out


def block_backward(model: ModelSpec, shard: Shard) -> list[Kernel]:
    return backward_of(block_forward(model, shard))


def embedding_forward(model: ModelSpec, shard: Shard) -> list[Kernel]:
    """Token (and learned position) embedding lookup, dropout: memory bound. Its backward moves
    twice the forward's bytes plus the tables' dense gradients (the rank's ``V/t x h`` token table,
    tied or not, and a learned ``s x h`` position table), per element
    :func:`~simulator.costs.elementwise.embedding_grad_bytes_per_element`."""
    e, h = shard.elem, model.hidden
    T = shard.tokens
    learned = model.position_embedding == "learned"
    lookups = 2 if learned else 1
    nbytes = T * h * e * (lookups + 1) + (T * h if model.dropout else 0.0)
    per = embedding_grad_bytes_per_element(e, shard.embedding_grad, main_grad_bytes=shard.main_grad_bytes,
                                           tied_here=shard.tied_here and model.tied_embeddings)
    tables = model.vocab / shard.tp * h * per
    if learned:
        tables += model.seq_len * h * embedding_grad_bytes_per_element(
            e, shard.embedding_grad, main_grad_bytes=shard.main_grad_bytes, tied_here=False)
    return [Kernel("embedding", "memory", 0.0, nbytes, None, "embed", bwd_nbytes=2 * nbytes + tables, elements=(T, h))]


def logits_forward(model: ModelSpec, shard: Shard) -> list[Kernel]:
    """Final norm, output GEMM [T, h] x [h, V/t], and the fp32 cross-entropy over V/t (its bytes
    per logits element: :func:`~simulator.costs.elementwise.cross_entropy_bytes_per_element`)."""
    e, h, t = shard.elem, model.hidden, shard.tp
    T, Tn = shard.tokens, shard.norm_tokens
    vocab = model.vocab / t
    # torch.compile is applied per block (pytorch/torchtitan@9dec370 torchtitan/parallelisms/parallelize_llama.py:
    # 297-303): the final norm stays eager in torch-level models, compiled or not
    norm = rmsnorm_bytes_per_element(e, eager=shard.compile is not None) if model.norm == "rmsnorm" else 2 * e
    loss_fwd, loss_bwd = cross_entropy_bytes_per_element(e, shard.cross_entropy)
    return [
        _memory("final_ln", Tn * h * norm, "logits", (Tn, h)),
        *_linear("logits", T, vocab, h, shard, "logits", head=True),
        Kernel("cross_entropy", "memory", 0.0, T * vocab * loss_fwd, None, "loss", bwd_nbytes=T * vocab * loss_bwd,
               elements=(T, vocab)),
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
    return _memory("optimizer", n_params * per, "optimizer", (n_params,))


def kernel_time_s(profile: cc.ComputeProfile, kernel: Kernel, precision: str, attention_kernel: str = "fa2") -> float:
    """Roofline time of one kernel: a GEMM at its own precision's tensor-core peak (the run's
    ``precision`` if it names none), fused attention 16-bit at the named ``attention_kernel``'s
    published rate (:func:`simulator.costs.compute.attention_time_s`), casts and the rest memory bound."""
    if kernel.kind == "gemm":
        assert kernel.mnk is not None
        precision = kernel.precision or precision
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
