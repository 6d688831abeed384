"""Measured collectives override the links they exercised (``dtsim calibrate --comm N``).

A profile's ``comm`` section holds, per collective, an alpha-beta fit ``t = alpha + D * beta``
measured with N local processes (torch.distributed: NCCL on N GPUs of one machine, gloo on
its CPU), D in nccl-tests' convention. Local processes only exercise the path between the
devices of one node, so this module recalibrates exactly that path of the cluster graph:

1. **Which links.** The ring the simulator would run for the same collective on the first
   ``n = min(N, GPUs per node)`` GPUs of node 0 is planned on the uncalibrated graph; the
   links it loads name the tiers the measurement exercised (``nvlink`` on NVSwitch and
   NVLink-mesh nodes; ``pcie`` / ``pcie-host`` / ``host`` between PCIe-only GPUs). Every
   link of those tiers, in every node, is recalibrated (the nodes are identical).
2. **Bandwidth.** The measured bus bandwidth ``busbw = f(N) / beta`` (nccl-tests
   ``doc/PERFORMANCE.md``: f = 2(N-1)/N for all-reduce, (N-1)/N for all-gather and
   reduce-scatter) is compared with the bus bandwidth of the simulator's ring,
   ``f(n) / beta_model`` (``beta_model``: the ring's seconds per byte on the busiest link,
   Simple protocol). Those links' capacity (line rate x efficiency) is multiplied by the
   ratio: the efficiency changes, and the line rate too when the efficiency would pass 1.
   The geometric mean of the ratios of all measured collectives is used.
3. **Latency.** NCCL's model charges ``base + steps * hop`` for a ring on one node
   (``simulator.costs.collectives``). The measured per-step latency ``(alpha - base) / steps(N)``
   minus the model's per-step latency becomes
   :attr:`~simulator.cluster.graph.ClusterGraph.intra_hop_latency_s`, an extra latency the
   planner adds to every intra-node step of every collective (the arithmetic mean over the
   measured collectives, bounded so no step latency turns negative). ``base`` and the hop are
   those of the protocol the tuner picks for the smallest messages, which set the intercept.

With this, the simulator reproduces the measured fit for the measured collective and rank
count (to within the model's protocol switching), and every other collective on those links
inherits the measured bandwidth and latency. Inter-node links keep their catalog values: a
single-machine measurement says nothing about the network.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from simulator.cluster.collectives import CollectivePlanner, nccl_model
from simulator.cluster.graph import ClusterGraph
from simulator.cluster.routing import Router
from simulator.costs.collectives import (
    CollectiveShape,
    NcclModel,
    bus_bandwidth_factor,
    collective_latency_s,
    protocols_for,
)
from simulator.scenario.calibration import CommFit, load_profile_spec

__all__ = ["CommOverride", "comm_override", "apply_comm_override", "apply_comm_profile", "COMM_OPS"]

COMM_OPS = ("all_reduce", "all_gather", "reduce_scatter")


@dataclass(frozen=True)
class CommOverride:
    """What a set of measured fits changes on a cluster graph.

    ``capacity_scale``: factor on the capacity of every link whose tier is in ``tiers``;
    ``intra_hop_latency_s``: extra latency per intra-node collective step (may be negative,
    never below minus the smallest modelled hop); ``ops``: the collectives that contributed.
    """

    tiers: tuple[str, ...]
    capacity_scale: float
    intra_hop_latency_s: float
    ops: tuple[str, ...]


def _ring_steps(op: str, n: int) -> int:
    return 2 * (n - 1) if op == "all_reduce" else n - 1


def _min_latency(model: NcclModel, shape: CollectiveShape) -> tuple[float, str]:
    """Latency of the cheapest protocol the tuner offers for a tiny message, and its name."""
    return min((collective_latency_s(model, shape, p, 8.0), p) for p in protocols_for(model, shape, 8.0))


def comm_override(cluster: ClusterGraph, fits: dict[str, CommFit]) -> CommOverride | None:
    """The override the measured ``fits`` imply for ``cluster`` (None when nothing applies:
    no usable fit, or nodes with a single GPU, which have no intra-node path)."""
    n = cluster.gpus_per_node
    usable = {op: fit for op, fit in fits.items() if op in COMM_OPS}
    if n < 2 or not usable:
        return None
    model = nccl_model()
    planner = CollectivePlanner(cluster, Router(cluster))
    tiers: set[str] = set()
    log_scales: list[float] = []
    extras: list[float] = []
    min_hop = math.inf
    for op, fit in sorted(usable.items()):
        group = tuple(range(min(fit.ranks, n)))
        plan = planner.plan(op, "ring", group)
        shape = plan.shape(cluster)
        beta_model = sum(p.seconds_per_byte for p in shape.phases)
        if beta_model <= 0 or fit.beta_s_per_byte <= 0:
            continue
        tiers |= {cluster.links[i].tier for p in plan.phases for i, _ in p.link_weights}
        busbw_fit = bus_bandwidth_factor(op, fit.ranks) / fit.beta_s_per_byte
        busbw_model = bus_bandwidth_factor(op, len(group)) / beta_model
        log_scales.append(math.log(busbw_fit / busbw_model))
        latency, protocol = _min_latency(model, shape)
        base = model.base_latency["ring"][protocol]
        per_step_fit = (fit.alpha_s - base) / _ring_steps(op, fit.ranks)
        per_step_model = (latency - base) / _ring_steps(op, len(group))
        extras.append(per_step_fit - per_step_model)
        intra_class = shape.phases[0].intra_class
        min_hop = min(min_hop, min(model.hop_latency[intra_class]["ring"].values()))
    if not log_scales:
        return None
    extra = max(sum(extras) / len(extras), -min_hop)
    return CommOverride(tuple(sorted(tiers)), math.exp(sum(log_scales) / len(log_scales)), extra,
                        tuple(sorted(usable)))


def apply_comm_override(cluster: ClusterGraph, override: CommOverride) -> None:
    """Rescale the capacity of the override's link tiers and set the intra-node step latency,
    in place (before any router or planner is built on ``cluster``)."""
    for i, link in enumerate(cluster.links):
        if link.tier not in override.tiers:
            continue
        capacity = link.capacity_bytes_per_s * override.capacity_scale
        if capacity <= link.bandwidth_bytes_per_s:
            cluster.links[i] = replace(link, efficiency=capacity / link.bandwidth_bytes_per_s)
        else:
            cluster.links[i] = replace(link, bandwidth_bytes_per_s=capacity, efficiency=1.0)
    cluster.intra_hop_latency_s = override.intra_hop_latency_s


def apply_comm_profile(cluster: ClusterGraph, profile_path: str) -> CommOverride | None:
    """Apply the comm fits of the profile at ``profile_path`` to ``cluster`` (nothing when
    the profile has none); returns what was applied."""
    spec = load_profile_spec(profile_path)
    if not spec.comm:
        return None
    override = comm_override(cluster, dict(spec.comm))
    if override is not None:
        apply_comm_override(cluster, override)
        cluster.description += f"; intra-node links calibrated from {profile_path}"
    return override
