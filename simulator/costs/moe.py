"""Mixture-of-experts arithmetic (pure functions): expert parameter counts, the token
dispatcher's bytes, expert capacity, and the routing-skew model.

Parameters of one MoE layer's MLP (Megatron-Core ``MoELayer``: router, ``experts``,
``shared_experts``; megatron/core/transformer/moe/moe_layer.py at d98e8a6):

* router: ``h x E`` (``TopKRouter.weight`` of shape [E, h], router.py; no bias);
* each routed and each shared expert: ``n_mats x h x F_e`` (SwiGLU: gate, up, down, n_mats = 3;
  GELU: 2), F_e = ``expert_ffn_hidden``.

Total parameters count every expert; *active* parameters, those a token's forward multiplies
by, count top-k routed experts plus the shared ones and the router. Model FLOPs use the
active count (6 x N_active per token): the convention of the Result.

Token dispatch (``alltoall``, Megatron-Core ``MoEAlltoAllTokenDispatcher``, token_dispatcher.py:
705 and 864 at d98e8a6): each token's hidden state is sent once per selected expert and its
output sent back, so per token and direction ``hidden x top_k x bytes`` leave the rank (a
share ``1/ep`` of which stays on the rank itself); forward dispatch + combine move twice that,
and the backward repeats both.

Routing skew: per micro-batch the experts' shares p of the routed tokens are the given
histogram or a draw from a symmetric Dirichlet(alpha = 1/skew) (skew 0: p = 1/E exactly);
expert e receives ``p_e x N`` of the ``N = tokens x top_k`` routed tokens (expected counts, no
sampling noise), capped at ``ep x capacity`` when a capacity factor is set (each of the ep
source ranks drops above its capacity, moe_utils.py:1051 ``get_capacity(num_tokens * topk, E,
cf)``). An EP rank's load is the sum over its ``E/ep`` experts; the busiest rank's load over
the balanced load ``N / ep`` is the factor by which the expert GEMMs, and the largest
all-to-all message, exceed perfect balance.

DeepEP's normal kernels (``deepep`` dispatcher; https://github.com/deepseek-ai/DeepEP at
0aaa674, README "Performance"; DeepSeek-V3 report, arXiv:2412.19437 §3.2.2) send a token once
per destination *rank* (not once per expert), and across nodes once per destination *node*
over RDMA, to the GPU of the same local index, which forwards it over NVLink to the node's
other destination ranks. With uniform routing (experts drawn without replacement) a token
reaches a set of ``m`` of the ``E`` experts with probability ``1 - C(E - m, k) / C(E, k)``
(:func:`deepep_fanout`). Node-limited routing (each token's experts on at most ``M`` nodes,
DeepSeek-V3's M = 4) draws the k experts among the ``M x E / nodes`` experts of M chosen nodes.
Bytes per token: fp8 dispatch carries the hidden state in 1 byte per element plus one fp32
scale per 128 elements, ``h + h / 128 x 4`` (DeepEP tests/test_internode.py at 499ec88:
``fp8_factor = (1 + 4 / 128) / 2`` of bf16); the combine and bf16 dispatch ``2 h``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["expert_params", "moe_mlp_params", "dispatch_bytes_per_token", "expert_capacity", "RoutingImbalance",
           "deepep_token_bytes", "hit_probability", "deepep_fanout",
           "routing_imbalance", "expert_state_shards", "SeedSpread", "spread_over_seeds"]


def expert_params(hidden: int, expert_ffn: int, mlp: str) -> int:
    """Parameters of one expert: n_mats x h x F_e (SwiGLU 3, GELU 2; no biases, as in every MoE preset)."""
    return (3 if mlp == "swiglu" else 2) * hidden * expert_ffn


def moe_mlp_params(*, hidden: int, experts: int, top_k: int, shared: int, expert_ffn: int, mlp: str) -> tuple[int, int]:
    """(total, active) parameters of one MoE layer's MLP: router + experts (module docstring)."""
    one = expert_params(hidden, expert_ffn, mlp)
    router = hidden * experts
    return router + (experts + shared) * one, router + (top_k + shared) * one


def dispatch_bytes_per_token(hidden: int, top_k: int, elem_bytes: int) -> float:
    """Bytes one token sends in one direction (dispatch, or combine): h x top_k x bytes."""
    return float(hidden * top_k * elem_bytes)


def deepep_token_bytes(hidden: int, fp8: bool, elem_bytes: int = 2) -> float:
    """Bytes of one token's hidden state on DeepEP's wire: fp8 ``h + h / 128 x 4`` (1-byte
    elements and an fp32 scale per 128), else ``h x elem_bytes`` (bf16: 2; module docstring)."""
    return hidden + hidden / 128 * 4 if fp8 else float(hidden * elem_bytes)


def hit_probability(pool: int, owned: float, top_k: int) -> float:
    """Probability that ``top_k`` experts drawn without replacement from ``pool`` include at
    least one of ``owned`` of them: ``1 - C(pool - owned, k) / C(pool, k)`` (1 when k > pool - owned)."""
    rest = pool - round(owned)
    if top_k > rest:
        return 1.0
    return 1.0 - math.comb(rest, top_k) / math.comb(pool, top_k)


def deepep_fanout(experts: int, top_k: int, ranks: int, nodes: int, max_nodes: int | None) -> tuple[float, float]:
    """(P(a token reaches a given rank), P(it reaches a given node)) of the ``ranks`` of an EP
    group spread evenly over ``nodes``, under uniform routing, limited to ``max_nodes`` nodes per
    token when set (module docstring)."""
    if max_nodes is None or max_nodes >= nodes:
        chosen, pool = 1.0, experts
    else:
        chosen, pool = max_nodes / nodes, max_nodes * experts // nodes
    return (chosen * hit_probability(pool, experts / ranks, top_k),
            chosen * hit_probability(pool, experts / nodes, top_k))


def expert_capacity(tokens: float, experts: int, top_k: int, capacity_factor: float) -> int:
    """Tokens one expert accepts from one source rank: ceil(tokens x top_k / E x cf) (Megatron-Core get_capacity)."""
    return math.ceil(tokens * top_k / experts * capacity_factor)


@dataclass(frozen=True)
class RoutingImbalance:
    """The routing-skew model's answer: the busiest EP rank's load over the balanced load."""

    factor: float  # mean over the draws of max_rank_load / (N / ep)
    spread: float  # standard deviation of that ratio over the draws
    dropped_fraction: float  # routed tokens dropped above capacity (mean over draws)
    samples: int


def routing_imbalance(*, experts: int, ep: int, tokens: float, top_k: int, skew: float, seed: int, samples: int,
                      histogram: list[float] | None = None, capacity_factor: float | None = None) -> RoutingImbalance:
    """Per-draw busiest EP rank load over the balanced load (module docstring). ``tokens`` are one
    source rank's tokens of one micro-batch; every one of the ep source ranks routes alike."""
    routed = tokens * top_k * ep  # routed tokens arriving at the ep group's experts
    balanced = routed / ep
    cap = None if capacity_factor is None else ep * expert_capacity(tokens, experts, top_k, capacity_factor)
    if histogram is not None or skew == 0:
        shares = np.asarray([histogram if histogram is not None else [1.0 / experts] * experts], dtype=float)
    else:
        rng = np.random.default_rng(seed)
        shares = rng.dirichlet(np.full(experts, 1.0 / skew), size=samples)
    counts = shares * routed
    kept = counts if cap is None else np.minimum(counts, cap)
    per_rank = kept.reshape(len(shares), ep, experts // ep).sum(axis=2)
    ratio = per_rank.max(axis=1) / balanced
    dropped = np.maximum(0.0, 1.0 - kept.sum(axis=1) / routed)
    return RoutingImbalance(float(ratio.mean()), float(ratio.std()), float(dropped.mean()), len(shares))


@dataclass(frozen=True)
class SeedSpread:
    """The imbalance factor of ``seeds`` routing draws (one per seed, each the mean over its
    micro-batch samples): their mean and 10th / 90th percentiles (linear interpolation between
    the sorted values, numpy's default: position q x (seeds - 1))."""

    seeds: int
    mean: float
    p10: float
    p90: float


def spread_over_seeds(factors: list[float]) -> SeedSpread:
    """:class:`SeedSpread` of per-seed factors."""
    arr = np.asarray(factors, dtype=float)
    return SeedSpread(len(factors), float(arr.mean()), float(np.percentile(arr, 10)), float(np.percentile(arr, 90)))


def expert_state_shards(sharded: float, unsharded: float, edp: int) -> float:
    """An expert state the data-parallel strategy shards (``sharded < unsharded``) is sharded over
    the expert data-parallel group instead (Megatron-Core's distributed optimizer shards expert
    parameters over expert_data_parallel_group); an unsharded (or offloaded, 0) one is kept."""
    if 0.0 < sharded < unsharded:
        return unsharded / edp
    return sharded
