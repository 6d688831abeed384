"""An MoE layer's MLP as kernels, and the expert-parallel pass that puts the token dispatch
and combine between them.

Forward of an MoE layer's MLP on one rank (tp = 1; Megatron-Core MoELayer.forward,
megatron/core/transformer/moe/moe_layer.py at d98e8a6), T = the rank's tokens, k = top-k,
f = the busiest EP rank's load over the balanced one (:func:`simulator.costs.moe.routing_imbalance`):

    router GEMM [T, h] x [h, E] -> top-k and permute (T*k rows of h) -> dispatch all-to-all
    -> shared experts (fc1, act, fc2 on T tokens) -> routed experts' fc1 [f*T*k, h] x [h, n_up*F_e/etp],
    act, fc2 [f*T*k, F_e/etp] x [F_e/etp, h] (one grouped GEMM over the rank's E/ep experts)
    -> combine all-to-all -> unpermute and weighted sum

The shared experts sit between dispatch and the routed experts so that, with
``parallelism.moe.overlap_ep_comm``, the dispatch runs beside them (Megatron-Core
--moe-shared-expert-overlap). The backward mirrors it: the combine's all-to-all of output
gradients before the experts' backward, the dispatch's after it. The all-to-all carries
``f x T x k x h x bytes`` per rank each way (:func:`simulator.costs.moe.dispatch_bytes_per_token`);
the ``allgather`` dispatcher all-gathers the ep group's T x h tokens and reduce-scatters the
outputs instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from simulator.costs.moe import RoutingImbalance, routing_imbalance
from simulator.scenario.spec import ModelSpec, Scenario
from simulator.workload.model import Kernel, Shard, _gemm, _memory

__all__ = ["MoeShape", "moe_shape", "moe_mlp_forward", "with_moe_mlp", "imbalance_of", "EXPERT_KERNELS"]

# the routed experts' kernels: the imbalance scales these, the all-to-alls sit around them
EXPERT_KERNELS = ("experts.fc1", "experts.act", "experts.fc2")


@dataclass(frozen=True)
class MoeShape:
    """What one MoE layer pass needs: the routed tokens' factor and the dispatcher."""

    ep: int
    etp: int
    factor: float  # busiest EP rank's routed tokens over the balanced share
    dispatcher: str
    overlap: bool


def imbalance_of(scenario: Scenario) -> RoutingImbalance:
    """The routing-skew model for the scenario's micro-batch (costs/moe.py)."""
    m, par, r = scenario.model, scenario.parallelism, scenario.training.moe_routing
    tokens = scenario.training.micro_batch * m.seq_len / par.cp
    hist = None if r.histogram is None else tuple(r.histogram)
    return _imbalance(m.experts, par.ep, tokens, m.top_k, r.skew, r.seed, r.samples, hist, m.capacity_factor)


@lru_cache(maxsize=64)
def _imbalance(experts: int, ep: int, tokens: float, top_k: int, skew: float, seed: int, samples: int,
               histogram: tuple[float, ...] | None, capacity_factor: float | None) -> RoutingImbalance:
    return routing_imbalance(experts=experts, ep=ep, tokens=tokens, top_k=top_k, skew=skew, seed=seed, samples=samples,
                             histogram=None if histogram is None else list(histogram), capacity_factor=capacity_factor)


def moe_shape(scenario: Scenario) -> MoeShape:
    par = scenario.parallelism
    return MoeShape(par.ep, par.expert_tp, imbalance_of(scenario).factor, par.moe.dispatcher, par.moe.overlap_ep_comm)


def moe_mlp_forward(model: ModelSpec, shard: Shard, moe: MoeShape) -> list[Kernel]:
    """The kernels replacing fc1 / act / fc2 in an MoE layer's forward (module docstring)."""
    e, h, T = shard.elem, model.hidden, shard.tokens
    n_up = 2 if model.mlp == "swiglu" else 1
    routed = T * model.top_k * moe.factor
    fe = model.expert_ffn / moe.etp
    act = (n_up + 1) * e
    kernels = [
        _gemm("router", T, model.experts, h, e, "mlp", shard.gemm_precision),
        _memory("permute", 2 * T * model.top_k * h * e, "mlp", (T * model.top_k, h)),
    ]
    if model.shared_experts:
        fs = model.shared_experts * model.expert_ffn / shard.tp
        kernels += [_gemm("shared.fc1", T, n_up * fs, h, e, "mlp", shard.gemm_precision),
                    _memory("shared.act", T * fs * act, "mlp", (T, fs)),
                    _gemm("shared.fc2", T, h, fs, e, "mlp", shard.gemm_precision)]
    kernels += [
        _gemm("experts.fc1", routed, n_up * fe, h, e, "mlp", shard.gemm_precision),
        _memory("experts.act", routed * fe * act, "mlp", (routed, fe)),
        _gemm("experts.fc2", routed, h, fe, e, "mlp", shard.gemm_precision),
        _memory("unpermute", 2 * T * model.top_k * h * e, "mlp", (T * model.top_k, h)),
    ]
    return kernels


def with_moe_mlp(fwd: list[Kernel], model: ModelSpec, shard: Shard, moe: MoeShape) -> list[Kernel]:
    """A block's forward kernels with the dense fc1 / act / fc2 replaced by the MoE MLP's."""
    i = next(n for n, k in enumerate(fwd) if (k.of or k.name) == "fc1")
    j = max(n for n, k in enumerate(fwd) if (k.of or k.name) == "fc2") + 1
    return [*fwd[:i], *moe_mlp_forward(model, shard, moe), *fwd[j:]]
