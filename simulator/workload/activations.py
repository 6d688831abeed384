"""Activation memory of one micro-batch on one rank, by unit, as the workload allocates it.

The sizes come from the pure formulas of :mod:`simulator.costs.memory` (Korthikanti et al.
2022); this module only binds them to a scenario's shapes and parallel layout, once, so the
workload builder and the memory pre-estimate use the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from simulator.costs.dispatch_buffers import dispatch_transient_bytes
from simulator.costs.elementwise import EAGER_SAVED_FP32_BYTES
from simulator.costs.flops import selective_recomputed_params
from simulator.costs.fp8 import Fp8Casting, weight_cache_bytes
from simulator.costs.memory import (
    ModelStateBytes,
    backward_workspace_bytes,
    embedding_activation_bytes,
    forward_workspace_bytes,
    layer_activation_bytes,
    logits_activation_bytes,
    loss_forward_transient_bytes,
    loss_workspace_bytes,
    model_state_bytes_per_param,
)
from simulator.costs.mla_memory import MlaWidths
from simulator.scenario.spec import Scenario
from simulator.scenario.training import recompute_modules_of
from simulator.workload.data_parallel.base import grad_reduce_bytes
from simulator.workload.model import Shard
from simulator.workload.moe import imbalance_of
from simulator.workload.parallel import context
from simulator.workload.steps import LayerSpec

__all__ = ["ActivationSizes", "shard_of", "fp8_casting", "fp8_weight_shards", "state_bytes_per_param",
           "eager_saved_bytes", "recomputed_parts", "recomputed_matmul_params", "moe_dispatch_bytes", "mla_widths",
           "selective_rebuilt_bytes"]

# the shardings whose parameters are all-gathered from shards (FSDP, ZeRO-3, MiCS, and the
# ZeRO-1/2 parameter all-gather after the optimizer step): an fp8 all-gather casts on the shard
_GATHERED = ("zero1", "zero2", "zero3", "fsdp", "hsdp", "mics")


def fp8_weight_shards(scenario: Scenario) -> int:
    """Ranks a weight is sharded over when it is all-gathered in fp8 (1: cast whole)."""
    par = scenario.parallelism
    if scenario.training.fp8.all_gather != "fp8" or par.sharding not in _GATHERED:
        return 1
    return par.shard_group_size or scenario.dp


def fp8_casting(scenario: Scenario) -> Fp8Casting | None:
    """How the scenario's fp8 GEMMs cast (None unless ``precision: fp8``)."""
    train = scenario.training
    if train.precision != "fp8":
        return None
    te = train.fp8.gemms == "transformer-engine"
    return Fp8Casting(recipe=train.fp8.recipe, cached_weights=te, micro_batches=scenario.micro_batches,
                      weight_shards=fp8_weight_shards(scenario), fused_norm_input=te, saves_fp8_inputs=te,
                      output_head=train.fp8.output_head)


def state_bytes_per_param(scenario: Scenario) -> ModelStateBytes:
    """Model-state bytes per parameter, unsharded: precision, optimizer and the fp8 recipe's weight copies."""
    train = scenario.training
    casting = fp8_casting(scenario)
    return model_state_bytes_per_param(train.precision, train.optimizer,
                                       weight_cache_bytes(casting) if casting is not None else 0.0)


def shard_of(scenario: Scenario) -> Shard:
    """What one rank holds of one micro-batch under the scenario's layout."""
    par, train = scenario.parallelism, scenario.training
    return Shard(batch=train.micro_batch, seq=scenario.model.seq_len, tp=par.tp, cp=par.cp,
                 sequence_parallel=par.sequence_parallel and par.tp > 1, precision=train.precision,
                 attention_kernel=scenario.attention_kernel, fp8=fp8_casting(scenario), compile=train.compile,
                 cross_entropy=train.cross_entropy, embedding_grad=train.embedding_grad,
                 main_grad_bytes=float(grad_reduce_bytes(scenario)), tied_here=par.pp == 1)


def eager_saved_bytes(scenario: Scenario) -> float:
    """What eager PyTorch autograd keeps per block and micro-batch beyond the fused kernels'
    tensors (``training.compile: false``): the fp32 copy of each RMSNorm's input (two norms,
    ``Tn*h`` elements each), 4 bytes each (:mod:`simulator.costs.elementwise`). The rotary
    embedding keeps nothing of its own: its complex multiply saves only the frequency table.
    Kept only where the block is not recomputed."""
    m = scenario.model
    if scenario.training.compile is not False or m.norm != "rmsnorm":
        return 0.0
    return EAGER_SAVED_FP32_BYTES * 2.0 * shard_of(scenario).norm_tokens * m.hidden


def recomputed_parts(modules: frozenset[str], *, moe_block: bool, mla: bool) -> frozenset[str]:
    """The parts of :func:`~simulator.costs.memory.layer_activation_bytes` a block does not keep
    under Megatron-Core's selective ``recompute_modules`` (Transformer Engine layer spec,
    megatron/core/models/gpt/gpt_layer_specs.py:295-336 at NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553):
    core_attn -> the attention core; layernorm -> the norms that are modules of their own
    (``recompute_input_layernorm`` / ``recompute_pre_mlp_layernorm`` apply only to a norm that is
    not an ``IdentityOp``, transformer_layer.py:475-530): an MoE layer's pre-MLP norm
    (``backend.layer_norm() if num_experts``) and MLA's input norm; MHA's input norm and a dense
    layer's pre-MLP norm are fused into ``TELayerNormColumnParallelLinear`` and stay; mlp -> a
    dense layer's MLP (``if not self.is_moe_layer``, transformer_layer.py:537-539); mla_up_proj ->
    the attention's Q, K, V and the up-projections' norm outputs, the latents kept
    (:func:`~simulator.costs.mla_memory.mla_attention_activation_bytes`). moe_act and shared_experts act on the MoE MLP (:func:`moe_layer_bytes`)."""
    parts = {"core_attn"} & modules
    if "layernorm" in modules:
        parts |= ({"pre_mlp_norm"} if moe_block else set()) | ({"input_norm"} if mla else set())
    if "mlp" in modules and not moe_block:
        parts.add("mlp")
    if "mla_up_proj" in modules and mla:
        parts.add("qkv")
    return frozenset(parts)


# the parts of layer_activation_bytes the attention's modules drop (core_attn, layernorm's input norm, mla_up_proj);
# the others (pre_mlp_norm, mlp) and moe_layer_bytes' moe, moe_act and shared_experts are the MLP's
_ATTENTION_PARTS = frozenset({"core_attn", "input_norm", "qkv"})
_MOE_MLP_MODULES = frozenset({"moe", "moe_act", "shared_experts"})


def selective_rebuilt_bytes(scenario: Scenario, layer: Callable[..., float], moe_block: bool) -> float:
    """What a block's backward rebuilds under the selective ``recompute_modules`` and holds at
    once: the bytes the MLP's modules do not keep (re-made before the MLP's backward, e.g. moe_act's
    fc2 input, mlp's and moe's whole MLP) or those the attention's do not keep (re-made before the
    attention's backward, e.g. mla_up_proj's query, key and value, core_attn's softmax statistics),
    the larger: each is held until the backward of its part has read it (a reentrant checkpoint's
    re-run graph is freed once its own backward is done, tensor_parallel/random.py:635-672 at d98e8a6;
    an output-discarding checkpoint refills the storage its consumers saved, :848, freed with them),
    and the MLP's backward ends before the attention's begins. ``layer``: the block formula,
    ``layer(recompute, ffn, moe_block, parts)`` (:meth:`ActivationSizes.of`)."""
    m, modules = scenario.model, recompute_modules_of(scenario.training)
    parts = recomputed_parts(modules, moe_block=moe_block, mla=m.mla is not None)
    if moe_block:
        kept = moe_layer_bytes(scenario, layer, "selective")
        attention = moe_layer_bytes(scenario, layer, "selective", modules, parts - _ATTENTION_PARTS) - kept
        mlp = moe_layer_bytes(scenario, layer, "selective", modules - _MOE_MLP_MODULES, parts & _ATTENTION_PARTS) - kept
    else:
        kept = layer("selective", m.ffn, False, parts)
        attention = layer("selective", m.ffn, False, parts - _ATTENTION_PARTS) - kept
        mlp = layer("selective", m.ffn, False, parts & _ATTENTION_PARTS) - kept
    return max(0.0, attention, mlp)


def mla_widths(scenario: Scenario) -> MlaWidths | None:
    """The model's multi-head latent attention widths (None: standard attention)."""
    mla = scenario.model.mla
    if mla is None:
        return None
    return MlaWidths(mla.q_lora_rank, mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim)


def recomputed_matmul_params(scenario: Scenario) -> float:
    """Matmul weights over all layers that the selective ``recompute_modules`` re-run
    (:func:`~simulator.costs.flops.selective_recomputed_params`): a dense MLP ``(3 or 2) x h x F``
    (SwiGLU or GELU), the shared experts ``(3 or 2) x h x shared x F_e``, MLA's up-projections,
    an MoE layer's MLP ``h x E + (3 or 2) x h x (k + shared) x F_e`` (router, routed, shared)."""
    m, mla = scenario.model, scenario.model.mla
    per_mlp = (3 if m.mlp == "swiglu" else 2) * m.hidden
    up = 0 if mla is None else sum(mla.projection_params(m.hidden, m.heads)) - mla.replicated_params(m.hidden)
    return selective_recomputed_params(recompute_modules_of(scenario.training), dense_mlp=per_mlp * m.ffn,
                                       dense_layers=m.layers - m.n_moe_layers, shared=per_mlp * m.shared_experts
                                       * m.expert_ffn, moe_layers=m.n_moe_layers, mla_up=up, layers=m.layers,
                                       moe_mlp=m.hidden * m.experts + per_mlp * (m.top_k + m.shared_experts)
                                       * m.expert_ffn)


@dataclass(frozen=True)
class ActivationSizes:
    """Bytes one rank stores per micro-batch (``per_layer`` under the recompute policy,
    ``full_layer`` without it), the transient ``backward_workspace`` of one block and the
    ``loss_workspace`` of the logits unit's backward; ``loss_transient``, what the logits
    unit's forward holds from its start to its end beyond what it keeps; ``forward_workspace``,
    the working set a block's forward holds while it runs when it keeps too little for it
    (:func:`~simulator.costs.memory.forward_workspace_bytes`); ``moe_dispatch``, the transient
    tensors of an MoE block's token dispatch and combine, in its forward's working set and its
    backward's workspace (:func:`moe_dispatch_bytes`)."""

    per_layer: float
    full_layer: float
    backward_workspace: float
    embedding: float
    logits: float
    loss_workspace: float = 0.0
    loss_transient: float = 0.0
    moe_layer: float = 0.0  # an MoE block's stored bytes (per_layer is a dense block's)
    forward_workspace: float = 0.0
    rebuilt: float = 0.0  # what a block's backward recomputes and holds at once, within backward_workspace
    moe_dispatch: float = 0.0  # an MoE block's dispatch / combine transients, beside its working sets
    moe_workspace: float = 0.0  # an MoE block's backward_workspace (its MLP k x f x F_e + shared x F_e wide)
    moe_forward_workspace: float = 0.0  # an MoE block's forward_workspace
    moe_rebuilt: float = 0.0  # what an MoE block's backward recomputes

    @classmethod
    def of(cls, scenario: Scenario) -> ActivationSizes:
        m, par, train = scenario.model, scenario.parallelism, scenario.training
        shard = shard_of(scenario)

        modules = recompute_modules_of(train)

        def layer(recompute: str, ffn: int = m.ffn, moe_block: bool = False,
                  parts: frozenset[str] | None = None) -> float:
            if recompute == "selective" and parts is None:
                parts = recomputed_parts(modules, moe_block=moe_block, mla=m.mla is not None)
            return layer_activation_bytes(
                seq=m.seq_len, batch=train.micro_batch, hidden=m.hidden, heads=m.heads, kv_heads=m.n_kv_heads,
                ffn_hidden=ffn, mlp=m.mlp, tp=par.tp, cp=par.cp, sequence_parallel=shard.sequence_parallel,
                recompute=recompute, flash_attention=shard.flash, dropout=m.dropout,
                act_bytes=shard.elem, fp8_inputs=shard.fp8 is not None and shard.fp8.saves_fp8_inputs,
                sp_keeps_gathered=par.sp_keeps_gathered_input, compiled=train.compile is True, head_dim=m.head_dim,
                recomputed=parts, mla=mla_widths(scenario),
                mla_proj_fp8_copy=shard.fp8 is not None and shard.fp8.recipe == "delayed")

        eager = eager_saved_bytes(scenario)
        full = layer("none") + eager
        stored = layer(train.recompute) + (eager if train.recompute == "none" else 0.0)
        # rebuilt while the block's backward runs: all of it (full), what the op policy did not keep (selective-op),
        # the larger of what the selective modules of the MLP and of the attention rebuild (selective)
        rebuilt = {"full": full, "selective-op": max(0.0, full - stored),
                   "selective": selective_rebuilt_bytes(scenario, layer, False)}.get(train.recompute, 0.0)
        context_workspace = context.backward_workspace_bytes(LayerSpec(
            m, shard, "block", "bwd", cp_comm=par.cp_comm, cp_kv_heads=par.cp_kv_heads))

        def workspaces(ffn: int, rebuilt_bytes: float) -> tuple[float, float]:
            """A block's backward workspace and forward working set with an MLP ``ffn`` wide."""
            backward = backward_workspace_bytes(tokens=shard.tokens, hidden=m.hidden, ffn_hidden=ffn, mlp=m.mlp,
                                                tp=shard.tp, act_bytes=shard.elem,
                                                recomputed_layer_bytes=rebuilt_bytes) + context_workspace
            forward = forward_workspace_bytes(tokens=shard.tokens, hidden=m.hidden, ffn_hidden=ffn, mlp=m.mlp,
                                              tp=shard.tp, act_bytes=shard.elem, recompute=train.recompute)
            return backward, forward

        workspace, forward = workspaces(m.ffn, rebuilt)
        moe_stored = moe_layer_bytes(scenario, layer) + (eager if m.moe and train.recompute == "none" else 0.0)
        moe_rebuilt = moe_workspace = moe_forward = 0.0
        if m.moe:  # an MoE block's: its MLP as wide as a token's share of the experts' rows
            moe_full = moe_layer_bytes(scenario, layer, "none") + eager
            moe_rebuilt = {"full": moe_full, "selective-op": max(0.0, moe_full - moe_stored),
                           "selective": selective_rebuilt_bytes(scenario, layer, True)}.get(train.recompute, 0.0)
            moe_workspace, moe_forward = workspaces(moe_mlp_width(scenario), moe_rebuilt)
        embedding = embedding_activation_bytes(seq=m.seq_len, batch=train.micro_batch, hidden=m.hidden, tp=par.tp,
                                               cp=par.cp, sequence_parallel=shard.sequence_parallel,
                                               dropout=m.dropout, act_bytes=shard.elem)
        logits = logits_activation_bytes(seq=m.seq_len, batch=train.micro_batch, hidden=m.hidden, vocab=m.vocab,
                                         tp=par.tp, cp=par.cp, sequence_parallel=shard.sequence_parallel,
                                         act_bytes=shard.elem, sp_keeps_gathered=par.sp_keeps_gathered_input)
        loss = loss_workspace_bytes(tokens=shard.tokens, vocab=m.vocab, tp=par.tp, cross_entropy=train.cross_entropy)
        transient = loss_forward_transient_bytes(tokens=shard.tokens, vocab=m.vocab, tp=par.tp,
                                                 cross_entropy=train.cross_entropy, logits_bytes=shard.elem)
        return cls(stored, full, workspace, embedding, logits, loss, transient, moe_stored, forward, rebuilt,
                   moe_dispatch_bytes(scenario), moe_workspace, moe_forward, moe_rebuilt)

    def stored(self, kind: str, moe: bool = False) -> float:
        """Bytes a unit of ``kind`` stores for its backward (``moe``: an MoE block)."""
        if moe:
            return self.moe_layer
        return {"embedding": self.embedding, "logits": self.logits, "block": self.per_layer}[kind]

    def forward_transient(self, kind: str) -> float:
        """Bytes a unit's forward holds beside what it keeps, freed at its end."""
        return self.loss_transient if kind == "logits" else 0.0

    def forward_working_set(self, kind: str, moe: bool = False) -> float:
        """Bytes a unit's forward holds while it runs and frees at its end, what it keeps
        allocated meanwhile (a block's ``forward_workspace``, with an MoE block's dispatch
        transients; 0 for the others)."""
        if kind != "block":
            return 0.0
        return self.moe_forward_workspace + self.moe_dispatch if moe else self.forward_workspace

    def workspace(self, kind: str, moe: bool = False) -> float:
        """Transient bytes of a unit's backward beyond what it stored (an MoE block's: with
        its dispatch transients, whose gradients its backward holds alike)."""
        if moe and kind == "block":
            return self.moe_workspace + self.moe_dispatch
        return {"embedding": 0.0, "logits": self.loss_workspace, "block": self.backward_workspace}[kind]

    def rebuilt_bytes(self, kind: str, moe: bool = False) -> float:
        """What a unit's backward recomputes and holds until its weight gradients are done."""
        if kind != "block":
            return 0.0
        return self.moe_rebuilt if moe else self.rebuilt


def moe_dispatch_bytes(scenario: Scenario) -> float:
    """The transient bytes of one MoE block's token dispatch and combine on one rank
    (:func:`~simulator.costs.dispatch_buffers.dispatch_transient_bytes`: the largest set of
    dispatch / combine tensors alive at once, over the rank's ``Tn`` routed tokens, and the
    router's tensors); 0 without experts."""
    m, par = scenario.model, scenario.parallelism
    if not m.moe:
        return 0.0
    shard = shard_of(scenario)
    return dispatch_transient_bytes(tokens=shard.norm_tokens, hidden=m.hidden, top_k=m.top_k, experts=m.experts,
                                    ep=par.ep, etp=par.expert_tp, factor=imbalance_of(scenario).factor,
                                    dispatcher=par.moe.dispatcher, act_bytes=shard.elem)


def moe_mlp_width(scenario: Scenario) -> int:
    """The intermediate width one token's share of an MoE block's MLP has, ``k x f x F_e +
    shared x F_e`` (f: the busiest EP rank's load factor): the width the dense block's formulas
    take for an MoE block (its stored activations, its forward working set and backward
    workspace)."""
    m = scenario.model
    return round(m.top_k * imbalance_of(scenario).factor * m.expert_ffn + m.shared_experts * m.expert_ffn)


def moe_layer_bytes(scenario: Scenario, layer: Callable[..., float], recompute: str | None = None,
                    modules: frozenset[str] | None = None, parts: frozenset[str] | None = None) -> float:
    """An MoE block's stored activations: the dense block's formula (which splits the MLP's
    intermediate width by tp) with the intermediate width one token's share of the experts'
    rows has, ``k x f x F_e + shared x F_e`` (f: the busiest EP rank's load factor,
    :mod:`simulator.workload.moe`; a rank's routed rows, ``T/tp x k x f x etp`` after the
    expert-TP all-gather, are ``F_e / etp`` wide, so ``T x k x f x F_e / tp`` elements), plus the
    dispatched tokens the routed experts' fc1 keeps for its weight gradient, ``f x T/tp x k x
    etp x h`` elements (T: b*s/cp; / tp under sequence parallelism, which MoE with tp > 1
    needs). Under full recomputation only the block input is kept, as for a dense block.

    Selective ``recompute_modules``: moe_act keeps no routed activation output, fc2's input
    (``g`` bytes, 1 with Transformer Engine's fp8 inputs), ``g x T x k x f x F_e / tp``
    (megatron/core/transformer/moe/experts.py:1019-1030 at d98e8a6: ``CheckpointWithoutOutput``
    around the activation, its output discarded once fc2 ran); shared_experts keeps none of the
    shared experts' intermediates, ``(2e + g) x T x shared x F_e / tp`` with SwiGLU (``e + g``
    GELU): they run in a checkpoint whose input, the pre-MLP norm output, is kept anyway
    (moe_layer.py:517-533); moe keeps nothing of the MLP but that input: the router, dispatch,
    experts and combine run in ``tensor_parallel.checkpoint`` (moe_layer.py:658-713), which runs
    them without autograd and saves only its arguments (``CheckpointFunction.forward``,
    tensor_parallel/random.py:616-628), the block's formula with a zero-wide MLP. ``modules`` and
    ``parts`` (the formula's parts, :func:`recomputed_parts`) replace the scenario's."""
    m, train = scenario.model, scenario.training
    if not m.moe:
        return 0.0
    policy = train.recompute if recompute is None else recompute
    if policy != "selective":
        modules = frozenset()
    elif modules is None:
        modules = recompute_modules_of(train)
    if "moe" in modules:
        return layer(policy, 0, True, parts)
    stored = layer(policy, moe_mlp_width(scenario), True, parts)
    if policy == "full":
        return stored
    shard = shard_of(scenario)
    etp, tp = scenario.parallelism.expert_tp, scenario.parallelism.tp
    g = 1.0 if shard.fp8 is not None and shard.fp8.saves_fp8_inputs else float(shard.elem)
    f = imbalance_of(scenario).factor
    if "moe_act" in modules:
        stored -= g * shard.tokens * m.top_k * f * m.expert_ffn / tp
    if "shared_experts" in modules:
        stored -= ((2 * shard.elem + g) if m.mlp == "swiglu" else (shard.elem + g)) * shard.tokens * \
            m.shared_experts * m.expert_ffn / tp
    return stored + f * shard.norm_tokens * m.top_k * etp * m.hidden * shard.elem
