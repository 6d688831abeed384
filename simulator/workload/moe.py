"""An MoE layer's MLP as kernels, and the expert-parallel pass that puts the token dispatch
and combine between them.

Forward of an MoE layer's MLP on one rank (Megatron-Core MoELayer.forward,
megatron/core/transformer/moe/moe_layer.py at d98e8a6), T = the rank's tokens (b*s/cp, split
by tp under sequence parallelism, which Megatron-Core requires with MoE and tp > 1:
moe_layer.py:636), k = top-k, f = the busiest EP rank's load over the balanced one
(:func:`simulator.costs.moe.routing_imbalance`):

    router GEMM [T, h] x [h, E] -> top-k and permute (T*k rows of h) -> dispatch all-to-all
    (ep group) -> all-gather over the expert-TP group (etp > 1) -> shared experts (fc1, act,
    fc2 on the tp-gathered T*tp tokens, split by tp) -> routed experts' fc1
    [f*T*k*etp, h] x [h, n_up*F_e/etp], act, fc2 [f*T*k*etp, F_e/etp] x [F_e/etp, h] (one
    grouped GEMM over the rank's E/ep experts, reading each one's weight) -> reduce-scatter over the expert-TP group ->
    combine all-to-all -> unpermute and weighted sum

The all-gather / reduce-scatter over the expert-TP group (``pg_collection.expt_tp``) are
MoEAlltoAllTokenDispatcher's dispatch_postprocess / combine_preprocess (token_dispatcher.py:
741-750 and 824-833 at d98e8a6): the etp ranks that share an expert's FFN shards each bring
their own tokens. The shared experts use the attention TP group (SharedExpertMLP, tp_group =
pg_collection.tp, shared_experts.py:131) with its sequence-parallel all-gather and
reduce-scatter (shared_experts.py:247 and 348).

The shared experts sit between dispatch and the routed experts so that, with
``parallelism.moe.overlap_ep_comm``, the dispatch runs beside them (Megatron-Core
--moe-shared-expert-overlap). The backward mirrors it: the combine's all-to-all of output
gradients before the experts' backward, the dispatch's after it. The all-to-all carries
``f x T x k x h x bytes`` per rank each way (:func:`simulator.costs.moe.dispatch_bytes_per_token`);
the ``allgather`` dispatcher all-gathers the ep x etp group's T x h tokens and reduce-scatters
the outputs instead (MoEAllGatherTokenDispatcher over tp_ep_group, token_dispatcher.py:285-300).

fp8 (``training.precision: fp8``): the shared experts' fc1 / fc2 are linears like the dense
block's (TE ``TEColumnParallelLinear`` / ``TERowParallelLinear``, moe_module_specs.py:74-84;
torchao ``Float8Linear`` swaps the shared FeedForward's ``Linear`` s) and run in fp8 with their
casts (:func:`simulator.workload.model._linear`); their input casts read the bf16 output of the
MoE layer's own pre-MLP norm, not fused into a linear (``pre_mlp_layernorm=backend.layer_norm()
if num_experts``, gpt_layer_specs.py:282, 313 and 336). The routed experts' fc1 / fc2 run in
fp8 when ``training.fp8.experts`` resolves so (:attr:`simulator.scenario.fp8.Fp8Spec.
routed_experts_fp8`), through the same ``_linear`` as grouped GEMMs: the input cast covers the
routed rows, the weight casts every local expert's [k, n] weight (E/ep of them: TE
GroupedLinear holds weight0 .. weightN-1, torchao quantizes the 3-D expert weight), the fp8
weight cached for the step under TE (TEGroupedLinear passes ``is_first_microbatch``,
extensions/transformer_engine.py:2719-2728) and cast on the expert-data-parallel shard under an
fp8 parameter gather; under torchao with rowwise dynamic scaling (torchtitan
components/quantization/float8.py:262-265 at b5bcd76) and no fp8 gather. The router stays
bf16: Megatron-Core computes it with ``router_gating_linear`` in the input's dtype or
``moe_router_dtype`` fp32 (router.py:106-111 at d98e8a6), torchtitan under an fp32 autocast
(models/common/moe.py:290-292 at b5bcd76) with ``router.gate`` in ``filter_fqns``
(quantization/float8.md:43). TE pads each expert's rows to a multiple of 16 for fp8
(Fp8Padding, experts.py:306-313), not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from simulator.costs.moe import RoutingImbalance, SeedSpread, routing_imbalance, spread_over_seeds
from simulator.scenario.spec import ModelSpec, Scenario
from simulator.workload.model import Kernel, Shard, _gemm, _linear, _memory

__all__ = ["MoeShape", "moe_shape", "expert_recipe", "experts_shard", "moe_mlp_forward", "with_moe_mlp", "imbalance_of", "imbalance_over_seeds",
           "EXPERT_KERNELS",
           "MOE_MLP_KERNELS", "forward_name", "is_moe_mlp"]

# the routed experts' kernels: the imbalance scales these, the all-to-alls sit around them
EXPERT_KERNELS = ("experts.fc1", "experts.act", "experts.fc2")
# every kernel of an MoE layer's MLP, in forward order
MOE_MLP_KERNELS = ("router", "permute", "shared.fc1", "shared.act", "shared.fc2", *EXPERT_KERNELS, "unpermute")


def forward_name(kernel: Kernel) -> str:
    """The forward kernel a kernel belongs to: ``experts.fc1`` for ``experts.fc1.dgrad``, its
    fp8 casts and ``experts.act.bwd``."""
    name = kernel.of or kernel.name
    return name.split(".dgrad")[0].split(".wgrad")[0].removesuffix(".bwd")


def is_moe_mlp(kernel: Kernel) -> bool:
    """Whether a kernel (forward or backward) is part of an MoE layer's MLP."""
    return forward_name(kernel) in MOE_MLP_KERNELS


@dataclass(frozen=True)
class MoeShape:
    """What one MoE layer pass needs: the routed tokens' factor and the dispatcher."""

    ep: int
    etp: int
    factor: float  # busiest EP rank's routed tokens over the balanced share
    dispatcher: str
    overlap: bool
    fp8_dispatch: bool = False  # deepep: dispatch-direction transfers in fp8 with scales
    max_nodes: int | None = None  # deepep: node-limited routing
    sm_slowdown: float | None = None  # deepep: compute slowdown beside its kernels (None: the run's)
    expert_recipe: str | None = None  # fp8 routed experts: the recipe they cast with (None: bf16)
    edp: int = 1  # expert data-parallel ranks: the shards of an fp8-gathered expert weight


def imbalance_of(scenario: Scenario, seed: int | None = None) -> RoutingImbalance:
    """The routing-skew model for the scenario's micro-batch (costs/moe.py), drawn with
    ``training.moe_routing.seed`` (or ``seed``)."""
    m, par, r = scenario.model, scenario.parallelism, scenario.training.moe_routing
    tokens = scenario.training.micro_batch * m.seq_len / (par.cp * par.tp)  # one source rank's (module docstring)
    hist = None if r.histogram is None else tuple(r.histogram)
    return _imbalance(m.experts, par.ep, tokens, m.top_k, r.skew, r.seed if seed is None else seed, r.samples, hist,
                      m.capacity_factor)


def imbalance_over_seeds(scenario: Scenario) -> SeedSpread:
    """The routing-skew model redrawn with seeds ``seed .. seed + seeds - 1`` (analytic: no
    simulation per seed); the first is :func:`imbalance_of`'s. Balance and a fixed histogram
    draw nothing: every seed has the same factor."""
    r = scenario.training.moe_routing
    n = 1 if r.histogram is not None or r.skew == 0 else r.seeds
    factors = [imbalance_of(scenario, r.seed + i).factor for i in range(n)]
    return spread_over_seeds(factors * (r.seeds // n))


@lru_cache(maxsize=64)
def _imbalance(experts: int, ep: int, tokens: float, top_k: int, skew: float, seed: int, samples: int,
               histogram: tuple[float, ...] | None, capacity_factor: float | None) -> RoutingImbalance:
    return routing_imbalance(experts=experts, ep=ep, tokens=tokens, top_k=top_k, skew=skew, seed=seed, samples=samples,
                             histogram=None if histogram is None else list(histogram), capacity_factor=capacity_factor)


def moe_shape(scenario: Scenario) -> MoeShape:
    par = scenario.parallelism
    return MoeShape(par.ep, par.expert_tp, imbalance_of(scenario).factor, par.moe.dispatcher, par.moe.overlap_ep_comm,
                    par.moe.fp8_dispatch, par.moe.max_nodes_per_token, deepep_slowdown(scenario),
                    expert_recipe(scenario), scenario.edp)


def expert_recipe(scenario: Scenario) -> str | None:
    """The recipe the routed experts' fp8 GEMMs cast with, None when they run bf16 (module
    docstring): the run's under Transformer Engine, rowwise under torchao."""
    train = scenario.training
    if train.precision != "fp8" or not train.fp8.routed_experts_fp8:
        return None
    return train.fp8.recipe if train.fp8.gemms == "transformer-engine" else "rowwise"


def experts_shard(shard: Shard, moe: MoeShape) -> Shard:
    """The shard the routed experts' GEMMs see: no fp8 casting when they run bf16; otherwise
    their recipe, their weights cast on the expert-data-parallel shard under an fp8 gather
    (Transformer Engine; torchao gathers them in bf16)."""
    if shard.fp8 is None or moe.expert_recipe is None:
        return replace(shard, fp8=None)
    te = shard.fp8.cached_weights
    shards = moe.edp if te and shard.fp8.weight_shards > 1 else 1
    return replace(shard, fp8=replace(shard.fp8, recipe=moe.expert_recipe, weight_shards=shards))


def deepep_slowdown(scenario: Scenario) -> float | None:
    """How much longer compute takes beside DeepEP's kernels: they hold ``deepep_sms`` of the
    GPU's SMs, so the rest run at (SMs - deepep_sms) / SMs of full speed: slowdown SMs / (SMs -
    deepep_sms) - 1 (H800, 20 of 132: 0.1786). None for another dispatcher, or a GPU whose SM
    count is not known (the run's overlap slowdown applies)."""
    moe, sms = scenario.parallelism.moe, scenario.cluster.gpu_spec.sm_count
    if moe.dispatcher != "deepep" or not sms:
        return None
    return sms / (sms - moe.deepep_sms) - 1.0


def moe_mlp_forward(model: ModelSpec, shard: Shard, moe: MoeShape) -> list[Kernel]:
    """The kernels replacing fc1 / act / fc2 in an MoE layer's forward (module docstring)."""
    e, h, T = shard.elem, model.hidden, shard.norm_tokens
    n_up = 2 if model.mlp == "swiglu" else 1
    routed = T * model.top_k * moe.factor * moe.etp
    fe = model.expert_ffn / moe.etp
    local = model.experts / moe.ep  # the grouped GEMM reads (and in fp8 casts) each local expert's weight
    act = (n_up + 1) * e
    kernels = [
        _gemm("router", T, model.experts, h, e, "mlp", shard.gemm_precision),
        _memory("permute", 2 * T * model.top_k * h * e, "mlp", (T * model.top_k, h)),
    ]
    if model.shared_experts:
        fs, Ts = model.shared_experts * model.expert_ffn / shard.tp, shard.tokens
        kernels += [*_linear("shared.fc1", Ts, n_up * fs, h, shard, "mlp"),
                    _memory("shared.act", Ts * fs * act, "mlp", (Ts, fs)),
                    *_linear("shared.fc2", Ts, h, fs, shard, "mlp")]
    xs = experts_shard(shard, moe)
    kernels += [
        *_linear("experts.fc1", routed, n_up * fe, h, xs, "mlp", groups=local),
        _memory("experts.act", routed * fe * act, "mlp", (routed, fe)),
        *_linear("experts.fc2", routed, h, fe, xs, "mlp", groups=local),
        _memory("unpermute", 2 * T * model.top_k * h * e, "mlp", (T * model.top_k, h)),
    ]
    return kernels


def with_moe_mlp(fwd: list[Kernel], model: ModelSpec, shard: Shard, moe: MoeShape) -> list[Kernel]:
    """A block's forward kernels with the dense fc1 / act / fc2 replaced by the MoE MLP's."""
    i = next(n for n, k in enumerate(fwd) if (k.of or k.name) == "fc1")
    j = max(n for n, k in enumerate(fwd) if (k.of or k.name) == "fc2") + 1
    return [*fwd[:i], *moe_mlp_forward(model, shard, moe), *fwd[j:]]
