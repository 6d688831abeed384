"""Measured collectives override the links they exercised (``dtsim calibrate --comm N``).

A profile's ``comm`` section holds, per collective, an alpha-beta fit ``t = alpha + D * beta``
measured with N local processes (torch.distributed: NCCL on N GPUs of one machine, gloo on
its CPU), D in nccl-tests' convention. Local processes only exercise the path between the
devices of one node, so this module recalibrates exactly that path of the cluster graph:

1. **Which links.** The ring the simulator would run for the same collective on the first
   ``n = min(N, GPUs per node)`` GPUs of node 0 is planned on the graph; the links it loads
   name the tiers the measurement exercised (``nvlink`` on NVSwitch and NVLink-mesh nodes;
   ``pcie`` / ``pcie-host`` / ``host`` between PCIe-only GPUs). Every link of those tiers,
   in every node, is recalibrated (the nodes are identical).
2. **Bandwidth.** The measured bus bandwidth ``busbw = f(N) / beta`` (nccl-tests
   ``doc/PERFORMANCE.md``: f = 2(N-1)/N for all-reduce, (N-1)/N for all-gather and
   reduce-scatter) is compared with the bus bandwidth of the simulator's ring,
   ``f(n) / beta_model`` (``beta_model``: the ring's seconds per byte on the busiest link,
   Simple protocol). Those links' capacity (line rate x efficiency) is multiplied by the
   ratio: the efficiency changes, and the line rate too when the efficiency would pass 1.
   With several measured collectives the geometric mean of their ratios is used. When the
   measured bandwidth is below what a detour offers (a gloo measurement applied to NVLink:
   the router would then send GPU-to-GPU traffic over PCIe, around the measurement), the
   ring is planned again on the recalibrated graph and the detour's tiers are recalibrated
   too, until the ring the router picks runs at the measured bus bandwidth.
3. **Latency.** NCCL's model charges ``base + steps * hop`` for a ring on one node
   (``simulator.costs.collectives``). The measured per-step latency ``(alpha - base) / steps(N)``
   minus the model's per-step latency becomes
   :attr:`~simulator.cluster.graph.ClusterGraph.intra_hop_latency_s`, an extra latency the
   planner adds to every intra-node step of every collective (the arithmetic mean over the
   measured collectives, bounded so no step latency turns negative). ``base`` and the hop are
   those of the protocol the tuner picks for the smallest messages, which set the intercept.

With one measured collective the simulator reproduces its fit for the measured rank count
(to within the model's protocol switching: LL / LL128 for mid-size messages); with several,
their geometric-mean bandwidth and mean per-step latency. Every other collective and rank
count on those links inherits them. Inter-node links (NIC, leaf, spine) keep their catalog
values: a single-machine measurement says nothing about the network. A recalibrated
``pcie`` tier is also the first hop from a GPU to its NIC, so on PCIe-only nodes network
transfers see the measured GPU-side bandwidth too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from simulator.catalog.profiles import COMM_OPS
from simulator.cluster.collectives import CollectivePlanner, nccl_model
from simulator.cluster.graph import ClusterGraph
from simulator.cluster.routing import Router
from simulator.costs.collectives import (
    CollectiveShape,
    NcclModel,
    bus_bandwidth_factor,
    collective_latency_s,
    protocols_for,
    ring_steps,
)
from simulator.scenario.calibration import CommFit, load_profile_spec

__all__ = ["CommOverride", "comm_override", "apply_comm_override", "apply_comm_profile", "COMM_OPS"]



@dataclass(frozen=True)
class CommOverride:
    """What a set of measured fits changes on a cluster graph.

    ``capacity_scale``: factor on the capacity of every link of each tier named;
    ``intra_hop_latency_s``: extra latency per intra-node collective step (may be negative,
    never below minus the smallest modelled hop); ``ops``: the collectives that contributed.
    """

    capacity_scale: dict[str, float]
    intra_hop_latency_s: float
    ops: tuple[str, ...]


def _min_latency(model: NcclModel, shape: CollectiveShape) -> tuple[float, str]:
    """Latency of the cheapest protocol the tuner offers for a tiny message, and its name."""
    return min((collective_latency_s(model, shape, p, 8.0), p) for p in protocols_for(model, shape, 8.0))


def _rescale(cluster: ClusterGraph, scales: dict[str, float]) -> None:
    """Multiply the capacity of every link of the named tiers (in place)."""
    for i, link in enumerate(cluster.links):
        factor = scales.get(link.tier)
        if factor is None:
            continue
        capacity = link.capacity_bytes_per_s * factor
        if capacity <= link.bandwidth_bytes_per_s:
            cluster.links[i] = link._replace(efficiency=capacity / link.bandwidth_bytes_per_s)
        else:
            cluster.links[i] = link._replace(bandwidth_bytes_per_s=capacity, efficiency=1.0)


def _rings(cluster: ClusterGraph, fits: dict[str, CommFit]) -> dict[str, tuple[CollectiveShape, set[str], int]]:
    """Per fit: the simulator's ring on the first min(N, g) GPUs of node 0 (shape, tiers, ranks)."""
    planner = CollectivePlanner(cluster, Router(cluster))
    out = {}
    for op, fit in fits.items():
        group = tuple(range(min(fit.ranks, cluster.gpus_per_node)))
        plan = planner.plan(op, "ring", group)
        tiers = {cluster.links[i].tier for p in plan.phases for i, _ in p.link_weights}
        out[op] = (plan.shape(cluster), tiers, len(group))
    return out


def comm_override(cluster: ClusterGraph, fits: dict[str, CommFit], *, max_rounds: int = 4) -> CommOverride | None:
    """The override the measured ``fits`` imply for ``cluster`` (None when nothing applies:
    no usable fit, or nodes with a single GPU, which have no intra-node path). ``cluster``
    itself is not changed; see the module docstring for the method."""
    usable = {op: fit for op, fit in sorted(fits.items()) if op in COMM_OPS and fit.beta_s_per_byte > 0}
    if cluster.gpus_per_node < 2 or not usable:
        return None
    scratch = replace(cluster, links=list(cluster.links))
    scales: dict[str, float] = {}
    for _ in range(max_rounds):
        rings = _rings(scratch, usable)
        log_ratios = []
        for op, fit in usable.items():
            shape, _, n = rings[op]
            beta_model = sum(p.seconds_per_byte for p in shape.phases)
            busbw_fit = bus_bandwidth_factor(op, fit.ranks) / fit.beta_s_per_byte
            log_ratios.append(math.log(busbw_fit * beta_model / bus_bandwidth_factor(op, n)))
        ratio = math.exp(sum(log_ratios) / len(log_ratios))
        tiers = set().union(*(t for _, t, _ in rings.values()))
        if abs(ratio - 1.0) < 1e-9 and tiers <= set(scales):
            break
        _rescale(scratch, {t: ratio for t in tiers})
        for tier in tiers:
            scales[tier] = scales.get(tier, 1.0) * ratio
    model = nccl_model(cluster.nccl)
    rings = _rings(scratch, usable)
    extras = []
    min_hop = math.inf
    for op, fit in usable.items():
        shape, _, n = rings[op]
        latency, protocol = _min_latency(model, shape)
        base = model.base_latency["ring"][protocol]
        extras.append((fit.alpha_s - base) / ring_steps(op, fit.ranks) - (latency - base) / ring_steps(op, n))
        min_hop = min(min_hop, min(model.hop_latency[shape.phases[0].intra_class]["ring"].values()))
    extra = max(sum(extras) / len(extras), -min_hop)
    return CommOverride(scales, extra, tuple(usable))


def apply_comm_override(cluster: ClusterGraph, override: CommOverride) -> None:
    """Rescale the capacity of the override's link tiers and set the intra-node step latency,
    in place (before any router or planner is built on ``cluster``)."""
    _rescale(cluster, override.capacity_scale)
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
