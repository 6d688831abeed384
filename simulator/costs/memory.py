"""Memory formulas: model states (ZeRO paper) and activations (Korthikanti et al. 2022).

Model states, bytes per parameter, mixed-precision Adam (Rajbhandari et al., SC'20, §3.1):
2 (16-bit parameters) + 2 (16-bit gradients) + K = 12 (fp32 master weights, momentum,
variance; the master weights count as optimizer state) = 16. Sharded per ZeRO stage over
N_d ranks (§5): ZeRO-1 ``4 + 12/N_d``, ZeRO-2 ``2 + 14/N_d``, ZeRO-3 ``16/N_d``.

Activations per transformer layer, 16-bit tensors and 1-byte dropout masks (Korthikanti et
al. 2022, §4.1 / Table 2): ``s*b*h*(34 + 5*a*s/h)`` without parallelism, built from the
tensors each block keeps for backward. :func:`layer_activation_bytes` sums those tensors
one by one, so it also covers GQA, SwiGLU, any FFN width, no dropout, FlashAttention, tensor
and sequence parallelism and the recompute policies; for a standard GPT it reproduces the
table exactly (``tests/test_memory.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.costs.dtypes import bytes_per_element
from simulator.costs.mla_memory import MlaWidths, mla_attention_activation_bytes

__all__ = [
    "bytes_per_element",
    "ModelStateBytes",
    "model_state_bytes_per_param",
    "sharded_model_state_bytes",
    "layer_activation_bytes",
    "embedding_activation_bytes",
    "logits_activation_bytes",
    "backward_workspace_bytes",
    "forward_workspace_bytes",
    "block_matmuls",
    "op_policy_saved_matmuls",
    "op_policy_kept_matmuls",
    "loss_workspace_bytes",
    "loss_forward_transient_bytes",
]

# torchtitan's op-level selective activation checkpointing (``selective_ac_option = 'op'``):
# inside each TransformerBlock's checkpoint the outputs of aten.mm, the flash/efficient SDPA
# ops, _c10d_functional.reduce_scatter_tensor and aten.abs/max are saved (MUST_SAVE), except
# every second aten.mm (counted per block in forward order); every other op is recomputed
# (pytorch/torchtitan@9dec370ad26b5f8e9a7333a0e36165018262644b
# torchtitan/parallelisms/parallelize_llama.py:214-223 (_save_list) and :250-264 (the policy)).


def block_matmuls(mlp: str) -> tuple[str, ...]:
    """A block's aten.mm calls in forward order (torchtitan's Llama: wq, wk, wv, wo, then
    w1, w3, w2 with SwiGLU, ``F.silu(self.w1(x)) * self.w3(x)`` (torchtitan
    models/llama/model.py:189,253 at 9dec370); fc1, fc2 with a GELU MLP)."""
    mlp_mms = ("w1", "w3", "w2") if mlp == "swiglu" else ("fc1", "fc2")
    return ("wq", "wk", "wv", "wo", *mlp_mms)


def op_policy_saved_matmuls(mlp: str) -> frozenset[str]:
    """The matmuls whose outputs torchtitan's op policy saves: the 1st, 3rd, 5th, ... aten.mm
    (``meta[mm_count] % 2 == 0`` is recomputed after the count is incremented). SwiGLU:
    {wq, wv, w1, w2}; GELU: {wq, wv, fc1}. Float8 linears change nothing: torchao's
    ``Float8Linear`` calls ``torch.mm`` on its float8 tensor subclass, and a dispatch mode (the
    policy's) sees ``aten.mm`` before the subclass turns it into ``_scaled_mm``."""
    return frozenset(name for i, name in enumerate(block_matmuls(mlp), start=1) if i % 2 == 1)


def op_policy_kept_matmuls(mlp: str, *, compiled: bool) -> frozenset[str]:
    """The matmul outputs a block keeps for its backward under the op policy. Eager: every
    output the policy saves, needed or not (the checkpoint's caching dispatch mode stores each
    MUST_SAVE op's output when it runs, ``_CachingTorchDispatchMode.__torch_dispatch__`` in
    torch/utils/checkpoint.py, torch 2.13). torch.compile: only those the backward needs
    (AOTAutograd's min-cut partitioner, ``min_cut_rematerialization_partition`` in
    torch/_functorch/partitioners.py, torch 2.13: MUST_SAVE only bans a node's recomputation,
    ``should_ban_recomputation``; the saved values are the cut between the forward's inputs
    and what the backward reads). The block's last matmul (w2 / fc2) feeds only the residual
    add, whose backward reads no input, so its output is not kept: {wq, wv, w1} with SwiGLU."""
    saved = op_policy_saved_matmuls(mlp)
    return saved - {block_matmuls(mlp)[-1]} if compiled else saved

@dataclass(frozen=True)
class ModelStateBytes:
    """Bytes per parameter of each model state, unsharded."""

    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def model_state_bytes_per_param(precision: str, optimizer: str = "adam", fp8_cache_bytes: float = 0.0
                                ) -> ModelStateBytes:
    """ZeRO accounting: 16-bit training keeps 2+2 bytes on the model plus fp32 optimizer states.

    fp32/tf32: 4-byte parameters and gradients, Adam's two fp32 moments (8): 16 in all.
    fp16/bf16: 2 + 2 + 12 (fp32 master, momentum, variance) = 16 (ZeRO §3.1, K = 12).
    fp8: bf16 parameters plus ``fp8_cache_bytes`` per parameter of fp8 weight copies kept for
    the step (the recipe's, :func:`simulator.costs.fp8.weight_cache_bytes`), bf16 gradients,
    fp32 master + moments.
    SGD with momentum drops the variance: K = 8 mixed precision, 4 in fp32.
    """
    if precision in ("fp32", "tf32"):
        return ModelStateBytes(4.0, 4.0, 8.0 if optimizer == "adam" else 4.0)
    params = 2.0 + (fp8_cache_bytes if precision == "fp8" else 0.0)
    return ModelStateBytes(params, 2.0, 12.0 if optimizer == "adam" else 8.0)


def sharded_model_state_bytes(
    n_params: float, per_param: ModelStateBytes, *, stage: int, shard_ranks: int
) -> ModelStateBytes:
    """Model-state bytes held by one rank for ZeRO stage 0..3 over ``shard_ranks`` ranks.

    stage 0: everything replicated; 1: optimizer sharded; 2: + gradients; 3: + parameters.
    """
    n = max(1, shard_ranks)
    params = per_param.params * n_params / (n if stage >= 3 else 1)
    grads = per_param.grads * n_params / (n if stage >= 2 else 1)
    optimizer = per_param.optimizer * n_params / (n if stage >= 1 else 1)
    return ModelStateBytes(params, grads, optimizer)


def layer_activation_bytes(
    *,
    seq: int,
    batch: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn_hidden: int,
    mlp: str,
    tp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    flash_attention: bool = False,
    dropout: bool = True,
    act_bytes: int = 2,
    fp8_inputs: bool = False,
    sp_keeps_gathered: bool = False,
    compiled: bool = False,
    head_dim: int | None = None,
    recomputed: frozenset[str] | None = None,
    mla: MlaWidths | None = None,
    mla_proj_fp8_copy: bool = False,
) -> float:
    """Bytes one transformer layer keeps for its backward, per micro-batch, on one rank.
    ``head_dim`` (default h/a): with heads wider or narrower than h/a, Q and the attention
    output are a*head_dim wide instead of h.

    Korthikanti et al. 2022 Table 2 for a GPT block (MHA, GELU, F = 4h, dropout, 2-byte
    activations), s = sequence, b = micro-batch, a = heads, t = tp:

    * no recompute, no SP: ``s*b*h*(10 + 24/t + 5*a*s/(h*t))``
    * no recompute, SP:    ``s*b*h*(34 + 5*a*s/h)/t``
    * selective:           ``s*b*h*(10 + 24/t)`` (``34*s*b*h/t`` with SP)
    * full:                ``2*s*b*h`` (the layer input; ``/t`` with SP)
    * ``sp_keeps_gathered`` (PyTorch DTensor SP): the two norm outputs are kept all-gathered,
      ``2*2*s*b*h`` instead of ``/t``.
    * selective-op (torchtitan's op policy, see :func:`op_policy_saved_matmuls`): the
      checkpoint's input (``2*s*b*h``, ``/t`` with SP), the saved matmul outputs (q ``h/t``,
      v ``kv/t``, w1 ``F/t`` column-parallel; w2 row-parallel, a full-width ``h`` partial sum
      before its reduction), the SDPA output (``h/t``) and fp32 log-sum-exp (``4*b*a*s/t``)
      with a fused kernel, and under SP the two reduce-scatter outputs (``h/t`` each); with
      ``compiled`` (torch.compile) only the outputs the backward reads
      (:func:`op_policy_kept_matmuls`): not w2's, nor under SP the reduce-scatter after it;

    * selective with ``recomputed`` (Megatron-Core's ``--recompute-modules``, mapped to the parts of
      this formula by :func:`simulator.workload.activations.recomputed_parts`; default
      ``{"core_attn"}``, Korthikanti's selective): ``core_attn`` drops the attention core's
      tensors, ``input_norm`` / ``pre_mlp_norm`` the first / second norm output (``g*s*b*h``,
      ``/t`` with SP; Megatron-Core's ``CheckpointWithoutOutput`` frees a discarded output's
      storage and re-runs the norm in the backward, tensor_parallel/random.py:848 at
      NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553), ``mlp`` the MLP's
      intermediates and the second norm output (the MLP, its norm fused into fc1, runs in a
      checkpoint that keeps only its input, transformer_layer.py:992-1012), ``qkv`` the
      attention core's inputs Q, K and V (``mla_up_proj``).

    ``mla`` (multi-head latent attention): the attention's tensors, from the first norm's output
    to the output projection's input, are MLA's own (:func:`simulator.costs.mla_memory.
    mla_attention_activation_bytes`; ``mla_proj_fp8_copy``: its output projection keeps an fp8
    copy of its input, the delayed-scaling recipe); the block input, the masks, the second norm
    and the MLP are the dense block's.

    FlashAttention never stores the ``a*s*s`` score/softmax/dropout tensors (Dao et al.
    2022) but keeps the fp32 log-sum-exp, ``4*b*a*s/t`` bytes. Context parallelism keeps
    s/cp tokens per rank.

    ``fp8_inputs`` (Transformer Engine fp8 linears, assumed: TE keeps the fp8 copy of a
    linear's input it cast for the forward, for the weight gradient): the two norm outputs
    and the MLP product feeding fc2 are kept in 1 byte instead of ``act_bytes``; the
    attention output stays (the attention backward needs it) and proj's 1-byte input copy is
    kept beside it. torchao's ``Float8Linear`` saves its high-precision input
    (``ctx.save_for_backward(input_hp, weight_hp_t)``, torchao/float8/float8_linear.py:45 at
    pytorch/ao@36027d82) and changes nothing here.
    """
    s = seq / cp
    e = float(act_bytes)
    sbh = s * batch * hidden
    d = head_dim or hidden // heads
    kv_width, q_width = kv_heads * d, heads * d
    sbq = s * batch * q_width  # Q and the attention output (= sbh when heads * d = hidden)
    mask = 1.0 if dropout else 0.0
    shard_rep = float(tp) if sequence_parallel else 1.0  # replicated parts split only with SP
    if recompute == "full":
        return e * sbh / shard_rep
    if recompute == "selective-op":
        return _op_policy_bytes(s, batch, hidden, heads, kv_width, ffn_hidden, mlp, tp, sequence_parallel,
                                flash_attention, e, compiled, q_width)
    if recomputed is None:
        recomputed = frozenset({"core_attn"}) if recompute == "selective" else frozenset()
    g = 1.0 if fp8_inputs else e  # bytes of a kept linear input (norm outputs, fc2's input)
    # the first norm's output belongs to the attention, which MLA counts on its own
    norm_outputs = (0.0 if mla is not None else 1.0 - ("input_norm" in recomputed)) \
        + 1.0 - ("pre_mlp_norm" in recomputed or "mlp" in recomputed)
    # replicated across tp unless sequence parallel: LN inputs and outputs, dropout masks
    replicated = (e + mask + e + mask + g * norm_outputs) * sbh
    # split across tp: Q, K, V, attention output (and proj's fp8 input), MLP intermediates
    qkv = 0.0 if "qkv" in recomputed else e * sbq + 2 * e * s * batch * kv_width
    split = 0.0 if mla is not None else qkv + e * sbq + (sbq if fp8_inputs else 0.0)
    if "mlp" not in recomputed:
        split += ((2 * e + g) if mlp == "swiglu" else (e + g)) * s * batch * ffn_hidden
    core = 0.0
    attention = 0.0  # MLA's attention, already per rank
    if mla is not None:
        attention = mla_attention_activation_bytes(
            mla, tokens=s * batch, seq=seq, batch=batch, hidden=hidden, heads=heads, tp=tp,
            sequence_parallel=sequence_parallel, flash_attention=flash_attention, dropout=dropout, act_bytes=act_bytes,
            fp8_inputs=fp8_inputs, fp8_proj_copy=mla_proj_fp8_copy, recomputed=recomputed)
    elif "core_attn" not in recomputed:
        if flash_attention:
            core = 4.0 * batch * heads * s
        else:
            core = (e + mask + (e if dropout else 0.0)) * heads * s * seq * batch
    # DTensor SP: each column-parallel linear keeps its all-gathered input (the two norm outputs), not a shard
    gathered = norm_outputs * g * sbh * (1.0 - 1.0 / tp) if sp_keeps_gathered and sequence_parallel else 0.0
    return replicated / shard_rep + gathered + (split + core) / tp + attention


def _op_policy_bytes(s: float, batch: int, hidden: int, heads: int, kv_width: int, ffn_hidden: int, mlp: str,
                     tp: int, sequence_parallel: bool, flash: bool, e: float, compiled: bool, q_width: int) -> float:
    """What torchtitan's op policy keeps of one block (see :func:`layer_activation_bytes`)."""
    sb = s * batch
    widths = {"wq": q_width / tp, "wk": kv_width / tp, "wv": kv_width / tp, "wo": hidden,
              "w1": ffn_hidden / tp, "w3": ffn_hidden / tp, "w2": hidden, "fc1": ffn_hidden / tp, "fc2": hidden}
    saved = sum(widths[name] for name in op_policy_kept_matmuls(mlp, compiled=compiled))
    sdpa = (q_width / tp * e + 4.0 * heads / tp) if flash else 0.0  # output + fp32 log-sum-exp per token
    # the reduce-scatters after wo and w2; compiled keeps only the first (the second feeds the residual add)
    reduce_scatter = (1.0 if compiled else 2.0) * hidden / tp * e if sequence_parallel and tp > 1 else 0.0
    block_input = e * hidden / (tp if sequence_parallel else 1)
    return sb * (block_input + e * saved + sdpa + reduce_scatter)


def embedding_activation_bytes(
    *, seq: int, batch: int, hidden: int, tp: int = 1, cp: int = 1, sequence_parallel: bool = False,
    dropout: bool = True, act_bytes: int = 2,
) -> float:
    """First pipeline stage: the embedding output kept for the first layer's backward and its
    dropout mask (Megatron ``theoretical_memory_usage.py`` input-embedding terms)."""
    sbh = seq / cp * batch * hidden
    per = act_bytes + (1 if dropout else 0)
    return per * sbh / (tp if sequence_parallel else 1)


def logits_activation_bytes(
    *, seq: int, batch: int, hidden: int, vocab: int, tp: int = 1, cp: int = 1, sequence_parallel: bool = False,
    act_bytes: int = 2, sp_keeps_gathered: bool = False,
) -> float:
    """Last pipeline stage: the final norm input and the fp32 logits the vocab-parallel cross
    entropy keeps (``4*s*b*V/t``; Megatron keeps the softmax in fp32 for the loss). The norm
    output is kept ``/t`` under SP, whole with ``sp_keeps_gathered`` (the output projection's
    gathered input)."""
    sb = seq / cp * batch
    split = tp if sequence_parallel and not sp_keeps_gathered else 1
    return act_bytes * sb * hidden / split + 4.0 * sb * vocab / tp


def backward_workspace_bytes(*, tokens: float, hidden: int, ffn_hidden: int, mlp: str, tp: int, act_bytes: int,
                             recomputed_layer_bytes: float = 0.0) -> float:
    """Transient bytes of one transformer layer's backward on one rank.

    The gradients of its largest activations: the MLP intermediate (``3F/t`` wide with
    SwiGLU's gate, up and product, ``2F/t`` with GELU's input and output) and the layer's
    input and output (``2h``), over the rank's ``tokens`` (b*s/cp): ``tokens * (ffn_width +
    2h) * act_bytes``; plus ``recomputed_layer_bytes``, the layer's own activations rebuilt
    by recomputation while its backward runs: all of them under full recomputation; under
    torchtitan's op policy those it did not keep (the checkpoint re-runs the block's forward
    in the backward and autograd holds what the backward reads until it is consumed,
    torch/utils/checkpoint.py non-reentrant recomputation); under Megatron-Core's selective
    ``recompute_modules`` what they do not keep, the MLP's or the attention's part, whichever is
    larger (:func:`simulator.workload.activations.selective_rebuilt_bytes`). An estimate of what
    the caching allocator holds beyond the stored activations.
    """
    ffn_width = (3 if mlp == "swiglu" else 2) * ffn_hidden / tp
    return tokens * (ffn_width + 2 * hidden) * act_bytes + recomputed_layer_bytes


def forward_workspace_bytes(*, tokens: float, hidden: int, ffn_hidden: int, mlp: str, tp: int, act_bytes: int,
                            recompute: str) -> float:
    """Transient bytes one transformer layer's forward holds on one rank while it runs, beyond
    what it keeps, when it keeps too little for them to be among the stored activations: under
    full recomputation (the block runs inside a checkpoint that saves only its input) and
    torchtitan's op policy (the MLP's w3 output and product are not saved). Its largest live set
    is the MLP's: its input and output, ``h`` wide over all of the rank's tokens (the all-gathered
    input of the column-parallel w1/w3 and the row-parallel w2's partial sum before its
    reduce-scatter under tensor/sequence parallelism) and the gate, up and their product
    (``3F/t`` with SwiGLU, ``F/t`` in and out with GELU, ``2F/t``): ``tokens * (ffn_width + 2h)
    * act_bytes``, the tensors :func:`backward_workspace_bytes` counts for the backward (whose
    gradients have the same shapes). Each is freed once its consumers have run
    (non-reentrant ``torch.utils.checkpoint`` drops what the forward would save; torchtitan wraps
    each block in it, ``ptd_checkpoint_wrapper``, pytorch/torchtitan@9dec370ad26b5f8e9a7333a0e36165018262644b
    torchtitan/parallelisms/parallelize_llama.py:232 and :259-263), so the set is transient: it
    does not raise the allocated peak (a block's backward holds at least as much), but the CUDA
    caching allocator keeps the segments it took cached and, as what the forward keeps is
    allocated while it is live, cannot hand them to the loss's or the backward's larger
    requests (``get_free_block`` serves a request only from one free block, never across
    segments: :mod:`simulator.costs.allocator`). Without recomputation every one of those tensors
    is kept (0 here).

    Llama 3.1 70B, 131,072 tokens (16 x 8192), tp 8, bf16: ``131072 * (3*28672/8 + 2*8192) * 2
    = 131072 * 27136 * 2 = 7,113,539,584`` bytes (6.625 GiB)."""
    if recompute not in ("full", "selective-op"):
        return 0.0
    return backward_workspace_bytes(tokens=tokens, hidden=hidden, ffn_hidden=ffn_hidden, mlp=mlp, tp=tp,
                                    act_bytes=act_bytes)


def loss_workspace_bytes(*, tokens: float, vocab: int, tp: int = 1, cross_entropy: str = "fused") -> float:
    """Transient bytes of the loss backward beyond the stored fp32 logits (``4*T*V/t``).

    ``fused`` and ``megatron`` (Megatron's vocab-parallel cross entropy): the gradient is written
    over the kept softmax, nothing more (0). ``eager-fp32``: torchtitan's
    ``cross_entropy(pred.flatten(0, 1).float(), labels)`` (pytorch/torchtitan@9dec370 train.py:131-134)
    runs eagerly as ``log_softmax`` then ``nll_loss`` (PyTorch ``cross_entropy_loss``); autograd
    keeps the fp32 log-softmax output. In the backward, ``nll_loss_backward`` allocates an fp32
    ``T*V`` gradient and ``_log_softmax_backward_data`` its fp32 ``T*V`` result while the saved
    output is still held: two fp32 ``T*V`` tensors beyond the stored one, ``8*T*V`` bytes.
    With tp > 1 the vocab is sharded and torch's loss parallelism (torchtitan's default,
    ``enable_loss_parallel=not disable_loss_parallel``, train.py:57 at 9dec370) replaces both
    backwards by one function, ``(zeros_like(x) + exp(x)) * grad`` over the kept fp32
    log-softmax ``x`` (pytorch/pytorch@02eef6b8b631c5aefb17838edf8ae153aba45860
    torch/distributed/tensor/parallel/loss.py ``_nll_loss_and_log_softmax_backward``): the
    zeros, ``exp(x)`` and the sum are alive together when the sum is made (and the zeros, the
    sum and the product when the product is), three fp32 ``T*V/t`` tensors beyond the stored
    one, ``12*T*V/t`` bytes."""
    if cross_entropy in ("fused", "megatron"):
        return 0.0
    return (8.0 if tp == 1 else 12.0) * tokens * vocab / tp


def loss_forward_transient_bytes(*, tokens: float, vocab: int, tp: int = 1, cross_entropy: str = "fused",
                                 logits_bytes: float = 2.0) -> float:
    """Bytes the loss forward holds beside what it keeps, freed before the backward: with
    ``eager-fp32`` the output projection's ``T*V/t`` logits (``logits_bytes`` each; torchtitan
    ``del pred`` before ``loss.backward()``, pytorch/torchtitan@9dec370 train.py:303-308) and
    their fp32 copy (``pred.float()``, train.py:131-134; freed once ``log_softmax`` has made
    its output; none when the logits are fp32 already): ``(e + 4) * T * V / t``. The fused
    kernels (``fused``, ``megatron``) hold no copy (0)."""
    if cross_entropy in ("fused", "megatron"):
        return 0.0
    copy = 0.0 if logits_bytes == 4 else 4.0
    return (logits_bytes + copy) * tokens * vocab / tp
