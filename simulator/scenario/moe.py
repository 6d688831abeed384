"""Mixture-of-experts pieces of the scenario format: which layers are MoE, the dispatcher
options (``parallelism.moe``) and the routing-skew model (``training.moe_routing``).

The model's own MoE fields (``experts``, ``experts_per_token``, ``shared_experts``,
``expert_ffn_hidden``, ``moe_layers``, ``capacity_factor``, ``router``) live on
:class:`~simulator.scenario.model.ModelSpec`; this module holds their types and the rule
that says which layer is an MoE layer:

* ``all`` (default when ``experts > 0``): every layer;
* ``{every: n}``: layers ``i`` with ``i % n == n - 1`` (Megatron-Core ``--moe-layer-freq n``:
  ``[1 if (i % n == 0) else 0 ...]`` counted from 1, i.e. the n-th, 2n-th, ... layer);
* ``{first_dense: k}``: the first ``k`` layers dense, the rest MoE (DeepSeek-V3's
  ``first_k_dense_replace = 3``, DeepSeek-V3 technical report, arXiv:2412.19437 §4.2).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt

from simulator.errors import InfeasibleError
from simulator.fields import Frozen

__all__ = ["MoeEvery", "MoeFirstDense", "MoeLayers", "MoeOptions", "MoeRouting", "Router", "is_moe_layer", "check_experts", "MlaSpec"]

Router = Literal["softmax-topk", "sigmoid-topk"]


class MoeEvery(Frozen):
    """Every n-th layer is an MoE layer (layers i with i % n == n - 1)."""

    every: PositiveInt = Field(description="an MoE layer every n layers (Megatron-Core moe_layer_freq)")


class MoeFirstDense(Frozen):
    """The first k layers dense, the rest MoE (DeepSeek style)."""

    first_dense: NonNegativeInt = Field(description="dense layers before the first MoE layer")


MoeLayers = Literal["all"] | MoeEvery | MoeFirstDense


def is_moe_layer(moe_layers: MoeLayers, layer: int) -> bool:
    """Whether 0-based ``layer`` is an MoE layer under ``moe_layers`` (the model has experts)."""
    if isinstance(moe_layers, MoeEvery):
        return layer % moe_layers.every == moe_layers.every - 1
    if isinstance(moe_layers, MoeFirstDense):
        return layer >= moe_layers.first_dense
    return True


class MoeOptions(Frozen):
    """How tokens reach their experts (``parallelism.moe``)."""

    dispatcher: Literal["alltoall", "allgather", "deepep"] = Field(
        "alltoall", description="alltoall: each token's hidden state goes to the EP ranks of its top-k experts and "
        "comes back (Megatron-Core MoEAlltoAllTokenDispatcher); allgather: every EP rank gathers all tokens and the "
        "outputs are reduce-scattered back (MoEAllGatherTokenDispatcher); deepep: DeepEP's normal kernels "
        "(Megatron-Core --moe-token-dispatcher-type flex with the deepep backend) over the etp x ep group: each "
        "token once per destination rank, across nodes once per node over RDMA to the same-index GPU and on by "
        "NVLink")
    fp8_dispatch: bool = Field(
        False, description="deepep only: dispatch in fp8 with one fp32 scale per 128 elements (h + h/128 x 4 bytes "
        "a token) and the backward's dispatch of gradients too; combines stay bf16 (DeepSeek-V3, arXiv:2412.19437 "
        "§3.3.2)")
    deepep_sms: PositiveInt = Field(
        20, description="deepep only: SMs DeepEP's kernels take while dispatch or combine runs (Megatron-Core "
        "--moe-flex-dispatcher-num-sms, default 20, token_dispatcher.py:1287-1292 at d98e8a6; DeepSeek-V3 20 of the "
        "H800's 132, arXiv:2412.19437 §3.5.1); compute beside it runs at (SMs - deepep_sms) / SMs of its speed "
        "where the GPU's SM count is known, else with sim.overlap_slowdown")
    max_nodes_per_token: PositiveInt | None = Field(
        None, description="deepep only: node-limited routing, each token's experts on at most this many nodes "
        "(DeepSeek-V3: 4, arXiv:2412.19437 §2.1.2), which bounds its RDMA copies; null: no limit")
    overlap_ep_comm: bool = Field(
        False, description="run the dispatch and combine beside the shared experts' GEMMs (Megatron-Core "
        "--moe-shared-expert-overlap) instead of before and after them")
    overlap_a2a_1f1b: bool = Field(
        False, description="Megatron-Core --overlap-moe-expert-parallel-comm (with --delay-wgrad-compute): the "
        "combined 1F1B schedule, each steady-state forward run layer by layer beside the backward of another "
        "micro-batch so that one's dispatch and combine run beside the other's compute, one extra warm-up forward; "
        "pp 1 or the interleaved schedule, ep > 1, the alltoall or deepep dispatcher, no full recomputation, a "
        "bf16/fp16/fp8 model, overlap_ep_comm false, at most one mtp layer (Megatron-Core's asserts)")
    delay_wgrad_compute: bool = Field(
        False, description="Megatron-Core --delay-wgrad-compute (needs overlap_a2a_1f1b): a layer's weight-gradient "
        "GEMMs issued after the next layer's backward has started, so that its first all-to-all runs beside them")


class MoeRouting(Frozen):
    """Routing skew (``training.moe_routing``): how unevenly tokens spread over the experts.

    Per micro-batch and MoE layer, the experts' shares of the routed tokens are drawn from a
    symmetric Dirichlet distribution of concentration ``alpha = 1 / skew`` (seeded by
    ``seed``); each EP rank's load is the sum over its experts of ``round(share x tokens x
    top-k)``, capped at the capacity when ``capacity_factor`` is set. ``skew: 0`` is perfect
    balance. For a Dirichlet share p_e of E experts the coefficient of variation of the
    per-expert load is ``sqrt((E - 1) / (E * alpha + 1))``, about ``sqrt(skew)`` for large E:
    skew 0.01 is a 10% spread. A ``histogram`` (fractions of the routed tokens per expert,
    summing to 1) fixes the shares instead. ``aux_loss_coeff`` is recorded only: no source
    we have maps the load-balancing loss coefficient to a load distribution, so it sets no
    skew (give ``skew`` or ``histogram``). The Switch Transformer defines the loss,
    alpha x N x sum_i f_i x P_i, and picks alpha = 1e-2 from a sweep by model quality (Fedus
    et al., arXiv:2101.03961 §2.2); neither it, GShard (arXiv:2006.16668, Algorithm 1) nor DeepSeek-V3
    (which replaces the loss by a bias update, arXiv:2412.19437 §2.1.2) states the per-expert
    load spread a coefficient leads to: that depends on the data and the training run.
    """

    skew: float = Field(
        0.0, ge=0, description="1 / Dirichlet concentration of the experts' token shares; 0 = perfect balance; "
        "the per-expert load's coefficient of variation is about sqrt(skew)")
    seed: int = Field(0, ge=0, description="seed of the per-micro-batch token-count draws")
    samples: PositiveInt = Field(16, description="micro-batch draws averaged (and whose spread is reported)")
    seeds: PositiveInt = Field(
        8, description="routing draws repeated with seeds seed, seed+1, ..., seed+seeds-1 (samples micro-batches "
        "each) for the Result's spread of the imbalance slowdown over seeds (mean, p10, p90); the simulated step "
        "uses the first. samples x seeds is bounded by the routing_draws limit")
    histogram: list[float] | None = Field(
        None, description="fixed fractions of the routed tokens per expert (one per expert, summing to 1); "
        "overrides skew")
    aux_loss_coeff: float | None = Field(
        None, ge=0, description="the load-balancing auxiliary-loss coefficient (Megatron --moe-aux-loss-coeff), "
        "recorded only: no published mapping from it to a load distribution, so it sets no skew")


def check_experts(model: Any, par: Any, training: Any, world_size: int) -> None:
    """The MoE rules of a scenario (``model``, ``parallelism``, ``training`` sections). Expert
    parallelism folds over the ranks of a pipeline stage as Megatron-Core's expert rank generator
    does (parallel_state.py:870-890 at d98e8a6): etp x ep x edp = world / pp, attention keeping
    tp x cp x dp = world / pp; etp defaults to tp (parallel_state.py:871-872)."""
    etp, per_stage = par.expert_tp, world_size // par.pp
    if model.mla is not None:
        unsupported = [(par.cp > 1, "cp > 1", "parallelism.cp"),
                       (training.recompute == "selective-op", "selective-op", "training.recompute"),
                       (model.bias, "bias", "model.bias")]
        for bad, what, field in unsupported:
            if bad:
                raise InfeasibleError(f"multi-head latent attention with {what} is not modelled", field=field)
    check_overlap_a2a_1f1b(model, par, training)
    if not model.moe:
        if par.ep > 1 or (par.etp or 1) > 1:  # etp 1 (the nemo profile's) splits nothing
            raise InfeasibleError("ep / etp need an MoE model (model.experts > 0)",
                                  field="parallelism.ep" if par.ep > 1 else "parallelism.etp")
        return
    if par.tp > 1 and not par.sequence_parallel:
        raise InfeasibleError(f"an MoE model with tp={par.tp} needs parallelism.sequence_parallel: true (Megatron-Core "
                              "refuses MoE with tensor parallelism without it, moe_layer.py:636 at d98e8a6)",
                              field="parallelism.sequence_parallel")
    if training.recompute == "selective-op":
        raise InfeasibleError("selective-op recomputation of MoE layers is not modelled: use none, selective or "
                              "full", field="training.recompute")
    if par.moe.dispatcher != "deepep" and (par.moe.fp8_dispatch or par.moe.max_nodes_per_token is not None):
        raise InfeasibleError("fp8_dispatch and max_nodes_per_token apply to the deepep dispatcher only",
                              field="parallelism.moe.fp8_dispatch" if par.moe.fp8_dispatch
                              else "parallelism.moe.max_nodes_per_token")
    if par.moe.dispatcher == "deepep" and par.ep * etp == 1:
        raise InfeasibleError("the deepep dispatcher needs ep x etp > 1 (Megatron-Core asserts it, token_dispatcher.py:"
                              "1836 at d98e8a6)", field="parallelism.moe.dispatcher")
    if model.experts % par.ep:
        raise InfeasibleError(f"ep={par.ep} does not divide model.experts={model.experts}", field="parallelism.ep")
    if per_stage % (par.ep * etp):
        raise InfeasibleError(
            f"ep*etp = {par.ep}*{etp} = {par.ep * etp} does not divide the ranks of a pipeline stage, "
            f"world/pp = {world_size}/{par.pp} = {per_stage}",
            field="parallelism.etp" if par.etp is not None and per_stage % par.ep == 0 else "parallelism.ep")
    if model.expert_ffn % etp:
        raise InfeasibleError(f"etp={etp} does not divide model.expert_ffn_hidden={model.expert_ffn}",
                              field="parallelism.etp")
    hist = training.moe_routing.histogram
    if hist is not None and (len(hist) != model.experts or abs(sum(hist) - 1.0) > 1e-6 or min(hist) < 0):
        raise InfeasibleError(f"histogram needs model.experts={model.experts} non-negative fractions summing to 1 "
                              f"(got {len(hist)} summing to {sum(hist):.6g})", field="training.moe_routing.histogram")


def check_overlap_a2a_1f1b(model: Any, par: Any, training: Any) -> None:
    """What Megatron-Core refuses with overlap_moe_expert_parallel_comm (TransformerConfig.
    __post_init__, megatron/core/transformer/transformer_config.py:3002-3041 at
    NVIDIA/Megatron-LM@3816e4de305284599b4d25137b22175412807913): pp > 1 without virtual stages
    (3007-3011), ep 1 (3013-3015), a dispatcher other than alltoall/flex (3016-3019), full
    recomputation (3021-3023), a model in neither bf16 nor fp16 (3035-3037; fp8 runs on a bf16 model),
    moe_shared_expert_overlap (3039-3041) and more than one multi-token-prediction layer (3042-3046)."""
    if par.moe.delay_wgrad_compute and not par.moe.overlap_a2a_1f1b:
        raise InfeasibleError("delay_wgrad_compute needs overlap_a2a_1f1b (Megatron-Core asserts "
                              "overlap_moe_expert_parallel_comm with it, transformer_config.py:3073-3077 at 3816e4de)",
                              field="parallelism.moe.delay_wgrad_compute")
    if par.moe.delay_wgrad_compute and par.sharding not in ("none", "zero1"):
        raise InfeasibleError(f"delay_wgrad_compute is modelled with sharding none or zero1 (Megatron's distributed "
                              f"optimizer), not {par.sharding}", field="parallelism.sharding")
    if not par.moe.overlap_a2a_1f1b:
        return
    refused = [(par.pp > 1 and par.pipeline_schedule != "interleaved", "parallelism.pipeline_schedule",
                f"with pp={par.pp} needs the interleaved schedule (Megatron-Core asserts virtual pipeline stages "
                f"when pp > 1), not {par.pipeline_schedule}"),
               (par.ep == 1, "parallelism.ep", "needs expert parallelism, ep > 1"),
               (par.moe.dispatcher == "allgather", "parallelism.moe.dispatcher",
                "needs the alltoall or deepep (flex) dispatcher"),
               (training.recompute == "full", "training.recompute", "does not run with full recomputation"),
               (training.precision in ("fp32", "tf32"), "training.precision",
                f"needs a bf16 or fp16 model, not {training.precision}"),
               (par.moe.overlap_ep_comm, "parallelism.moe.overlap_ep_comm",
                "excludes overlap_ep_comm (moe_shared_expert_overlap)"),
               (model.mtp_layers > 1, "model.mtp_layers", "supports at most one multi-token-prediction layer")]
    for bad, field, why in refused:
        if bad:
            raise InfeasibleError(f"overlap_a2a_1f1b (Megatron-Core's combined 1F1B) {why}", field=field)


class MlaSpec(Frozen):
    """Multi-head latent attention's ranks (DeepSeek-V2, arXiv:2405.04434 §2.1; DeepSeek-V3 config.json)."""

    q_lora_rank: PositiveInt | None = Field(description="rank of the query compression (null: queries projected "
                                            "directly from the hidden state)")
    kv_lora_rank: PositiveInt = Field(description="rank of the joint key/value compression")
    qk_nope_head_dim: PositiveInt = Field(description="per-head query/key width without rotary embedding")
    qk_rope_head_dim: PositiveInt = Field(description="per-head query/key width with rotary embedding (the key's "
                                          "rotary part is shared by the heads)")
    v_head_dim: PositiveInt = Field(description="per-head value width")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def replicated_params(self, hidden: int) -> int:
        """Parameters of one layer every TP rank holds whole: the down-projections W_DQ [h, r_q] and
        W_DKV [h, r_kv + rope] and the latents' norms r_q + r_kv (Megatron-Core duplicates them)."""
        q = 0 if self.q_lora_rank is None else hidden * self.q_lora_rank + self.q_lora_rank
        return q + hidden * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank

    def projection_params(self, hidden: int, heads: int, tp: int = 1) -> tuple[int, int]:
        """(query, key/value) projection parameters of one layer on one of ``tp`` tensor-parallel
        ranks: W_DQ [h, r_q] + its RMSNorm r_q + W_UQ [r_q, H*(nope+rope)] / tp (or W_Q [h,
        H*(nope+rope)] / tp); W_DKV [h, r_kv + rope] + its RMSNorm r_kv + W_UKV [r_kv, H*(nope+v)]
        / tp. The down-projections and norms are replicated on every TP rank, the
        up-projections split by heads (Megatron-Core MLASelfAttention, workload/mla.py)."""
        qk = heads * self.qk_head_dim
        q = (hidden * qk // tp if self.q_lora_rank is None
             else hidden * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * qk // tp)
        kv = (hidden * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
              + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim) // tp)
        return q, kv
