"""Collective algorithms, registered by name: each turns one process group into phases of flows.

:data:`ALGORITHMS` maps an algorithm's name to its planner function; the
:class:`~simulator.cluster.collectives.CollectivePlanner` looks algorithms up here (and the CLI
lists them from here), so a new algorithm is one function plus one :func:`register_algorithm`.
A planner function receives the planner (for the cluster, ring orders and phase assembly),
the op, the group's GPUs and the group split by node, and returns the phases. Descriptions of
each algorithm: :mod:`simulator.cluster.collectives` (shared/REFERENCE.md §1).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from itertools import pairwise
from typing import Protocol

from simulator.cluster.collective_plan import Flow, PhasePlan
from simulator.cluster.graph import ClusterGraph
from simulator.costs.collectives import NcclModel, ring_steps, wire_factor
from simulator.costs.moe import deepep_fanout

__all__ = ["ALGORITHMS", "AlgorithmPlanner", "PlannerView", "register_algorithm", "ring_factor", "planner_of",
           "deepep_algorithm"]

Group = dict[int, list[int]]  # node -> the group's GPUs on it, sorted


class PlannerView(Protocol):
    """What an algorithm may ask of the planner."""

    cluster: ClusterGraph

    @property
    def model(self) -> NcclModel: ...

    def rings(self, gpus: tuple[int, ...]) -> list[tuple[tuple[int, ...], float]]: ...

    def uniform(self, nodes: Group) -> int | None: ...

    def phase(self, flows: list[Flow], *, steps: int, inter_steps: int, ppn: int, nodes: int,
              channels: int = 1) -> PhasePlan: ...


AlgorithmPlanner = Callable[[PlannerView, str, tuple[int, ...], Group], list[PhasePlan]]

ALGORITHMS: dict[str, AlgorithmPlanner] = {}


def register_algorithm(name: str) -> Callable[[AlgorithmPlanner], AlgorithmPlanner]:
    """Decorator: register a planner function under ``name``."""

    def register(fn: AlgorithmPlanner) -> AlgorithmPlanner:
        ALGORITHMS[name] = fn
        return fn

    return register


def planner_of(name: str) -> AlgorithmPlanner | None:
    """The planner of an algorithm name: a registered one, or ``deepep/E/k/M`` (DeepEP with
    routing, :func:`deepep_algorithm`); None for an unknown name."""
    base, _, args = name.partition("/")
    planner = ALGORITHMS.get(base)
    if not args or base != "deepep":
        return planner if not args else None
    experts, top_k, max_nodes = (int(a) for a in args.split("/"))

    def routed(p: PlannerView, op: str, gpus: tuple[int, ...], nodes: Group) -> list[PhasePlan]:
        return plan_deepep(p, op, gpus, nodes, (experts, top_k, max_nodes or None))

    return routed


def deepep_algorithm(experts: int, top_k: int, max_nodes: int | None) -> str:
    """The algorithm name of DeepEP's dispatch or combine for a router of ``experts`` routed
    experts, ``top_k`` per token, at most ``max_nodes`` nodes per token (None: no limit)."""
    return f"deepep/{experts}/{top_k}/{max_nodes or 0}"


def ring_factor(op: str, n: int) -> tuple[float, int]:
    """(bytes per ring edge per byte of D, steps) of a ring over n ranks."""
    if op not in ("all_reduce", "all_gather", "reduce_scatter"):
        raise ValueError(f"ring does not implement {op}")
    return wire_factor(op, n), ring_steps(op, n)


def _ppn(p: PlannerView, nodes: Group) -> int:
    return p.uniform(nodes) or max(len(m) for m in nodes.values())


@register_algorithm("ring")
def plan_ring(p: PlannerView, op: str, gpus: tuple[int, ...], nodes: Group) -> list[PhasePlan]:
    """One ring per channel (:meth:`CollectivePlanner.rings`); each edge carries the ring factor."""
    n, k = len(gpus), len(nodes)
    per_edge, steps = ring_factor(op, n)
    flows = []
    for order, share in p.rings(gpus):
        for a, b in zip(order, order[1:] + order[:1], strict=True):
            flows.append(Flow(a, b, per_edge * share))
    inter = (2 * (k - 1) if op == "all_reduce" else k - 1) if k > 1 else 0
    return [p.phase(flows, steps=steps, inter_steps=inter, ppn=_ppn(p, nodes), nodes=k, channels=len(p.rings(gpus)))]


def _btree(k: int) -> list[tuple[int, int]]:
    """Edges (child, parent) of a balanced binary tree over positions 0..k-1 (in-order)."""
    edges: list[tuple[int, int]] = []

    def build(lo: int, hi: int, parent: int | None) -> None:
        if lo > hi:
            return
        mid = (lo + hi + 1) // 2
        if parent is not None:
            edges.append((mid, parent))
        build(lo, mid - 1, mid)
        build(mid + 1, hi, mid)

    build(0, k - 1, None)
    return edges


@register_algorithm("tree")
def plan_tree(p: PlannerView, op: str, gpus: tuple[int, ...], nodes: Group) -> list[PhasePlan]:
    """NCCL's double binary tree over the nodes' head GPUs, chains inside the nodes."""
    node_ids = list(nodes)
    k = len(node_ids)
    ppn = _ppn(p, nodes)
    channels = max(2, ppn)
    trees = (_btree(k), [(k - 1 - c, k - 1 - q) for c, q in _btree(k)])
    flows: list[Flow] = []
    share = 1.0 / channels
    for c in range(channels):
        heads = {}
        for i, node in enumerate(node_ids):
            members = nodes[node]
            r = c % len(members)
            chain = members[r:] + members[:r]
            heads[i] = chain[0]
            for a, b in pairwise(chain):
                flows += [Flow(b, a, share), Flow(a, b, share)]
        for child, parent in trees[c % 2]:
            flows += [Flow(heads[child], heads[parent], share), Flow(heads[parent], heads[child], share)]
    phase = p.phase(flows, steps=2 * (ppn - 1 + math.ceil(math.log2(k))),
                    inter_steps=2 * math.ceil(math.log2(k)), ppn=ppn, nodes=k)
    # one channel's share of a node's network bandwidth: the NICs the heads use, over the channels
    links = p.cluster.links
    ups = {i for i in p.cluster.node_link_ids(node_ids[0]) if links[i].tier == "nic-up"}  # the first node's
    nic_links = {i for i in phase.arrays()[0].tolist() if i in ups}  # (in the weights' order: the sum's order)
    node_bw = sum(links[i].capacity_bytes_per_s for i in nic_links)
    # its arrays carried over, its (link, weight) pairs still made only when read
    return [replace(phase, link_weights=(), channels=channels,
                    channel_net_bytes_per_s=node_bw / channels if node_bw else 0.0).adopt(*phase.arrays())]


@register_algorithm("nvls")
def plan_nvls(p: PlannerView, op: str, gpus: tuple[int, ...], nodes: Group) -> list[PhasePlan]:
    """NVLink SHARP all-reduce inside an NVSwitch node: each GPU sends and receives D."""
    return [p.phase(_nvls_flows(p, sorted(gpus)), steps=1, inter_steps=0, ppn=_ppn(p, nodes), nodes=1)]


def _nvls_flows(p: PlannerView, members: list[int]) -> list[Flow]:
    """One node's NVLink SHARP reduction: each member sends and receives D through the switch,
    at the measured NVLS fraction of line rate (weights scaled by nccl_efficiency / nvls_efficiency,
    the links carrying NCCL's)."""
    nvlink = p.cluster.gpu.nvlink
    factor = (nvlink.nccl_efficiency if nvlink else 1.0) / p.model.nvls_efficiency
    return [Flow(a, b, factor) for a, b in zip(members, members[1:] + members[:1], strict=True)]


@register_algorithm("nvls_tree")
def plan_nvls_tree(p: PlannerView, op: str, gpus: tuple[int, ...], nodes: Group) -> list[PhasePlan]:
    """NCCL's NVLSTree all-reduce across NVSwitch nodes, one pipelined phase: NVLink SHARP
    reduces (and multicasts back) inside each node while each local GPU carries its 1/ppn slice
    over a binary tree of the nodes (the mirrored tree for odd local ranks), up and down
    (NVIDIA/nccl v2.20.3-1 src/device/all_reduce.h:482-560, RunWorkElement NCCL_ALGO_NVLS_TREE:
    warps scatter into the switch, reduce a head's slice, send it up the tree and multicast
    what comes down, all at once on successive chunks)."""
    ppn = p.uniform(nodes)
    if ppn is None:
        raise ValueError("nvls_tree needs the same number of group members on every node")
    node_ids = list(nodes)
    k = len(node_ids)
    flows: list[Flow] = []
    for members in nodes.values():
        flows += _nvls_flows(p, members)
    trees = (_btree(k), [(k - 1 - c, k - 1 - q) for c, q in _btree(k)])
    for j in range(ppn):
        for child, parent in trees[j % 2]:
            a, b = nodes[node_ids[child]][j], nodes[node_ids[parent]][j]
            flows += [Flow(a, b, 1.0 / ppn), Flow(b, a, 1.0 / ppn)]
    levels = math.ceil(math.log2(k))
    phase = p.phase(flows, steps=2 * levels, inter_steps=2 * levels, ppn=ppn, nodes=k)
    links = p.cluster.links
    ups = {i for i in p.cluster.node_link_ids(node_ids[0]) if links[i].tier == "nic-up"}
    node_bw = sum(links[i].capacity_bytes_per_s for i in phase.arrays()[0].tolist() if i in ups)
    return [replace(phase, link_weights=(), channels=ppn,
                    channel_net_bytes_per_s=node_bw / ppn if node_bw else 0.0).adopt(*phase.arrays())]


@register_algorithm("hierarchical")
def plan_hierarchical(p: PlannerView, op: str, gpus: tuple[int, ...], nodes: Group) -> list[PhasePlan]:
    """Two levels: rings inside the nodes, rings across the nodes per local rank."""
    ppn = p.uniform(nodes)
    if ppn is None:
        raise ValueError("hierarchical collectives need the same number of group members on every node")
    k = len(nodes)
    members = list(nodes.values())
    rails = [tuple(m[j] for m in members) for j in range(ppn)]

    def intra(kind: str) -> PhasePlan:
        per_edge, steps = ring_factor(kind, ppn) if ppn > 1 else (0.0, 0)
        flows = []
        if ppn > 1:
            for m in members:
                for order, share in p.rings(tuple(m)):
                    flows += [Flow(a, b, per_edge * share) for a, b in zip(order, order[1:] + order[:1], strict=True)]
        return p.phase(flows, steps=steps, inter_steps=0, ppn=ppn, nodes=1)

    def inter(kind: str) -> PhasePlan:
        per_edge, steps = ring_factor(kind, k) if k > 1 else (0.0, 0)
        flows = [Flow(a, b, per_edge / ppn) for r in rails for a, b in zip(r, r[1:] + r[:1], strict=True)] if k > 1 else []
        return p.phase(flows, steps=steps, inter_steps=steps, ppn=1, nodes=k)

    if op == "all_reduce":
        phases = [intra("reduce_scatter"), inter("all_reduce"), intra("all_gather")]
    elif op == "all_gather":
        phases = [inter("all_gather"), intra("all_gather")]
    elif op == "reduce_scatter":
        phases = [intra("reduce_scatter"), inter("reduce_scatter")]
    else:
        raise ValueError(f"hierarchical does not implement {op}")
    return [q for q in phases if q.flows]


@register_algorithm("direct")
def plan_direct(p: PlannerView, op: str, gpus: tuple[int, ...], nodes: Group) -> list[PhasePlan]:
    """Point-to-point (first GPU to second) or all-to-all (every pair at once), routed as the
    router routes (dimension order on tori)."""
    n, k = len(gpus), len(nodes)
    if op == "p2p":
        flows = [Flow(gpus[0], gpus[1], 1.0)]
    else:
        flows = [Flow(a, b, 1.0 / n) for a in gpus for b in gpus if a != b]
    return [p.phase(flows, steps=1, inter_steps=1 if k > 1 else 0, ppn=_ppn(p, nodes), nodes=k)]


@register_algorithm("chain")
def plan_chain(p: PlannerView, op: str, gpus: tuple[int, ...], nodes: Group) -> list[PhasePlan]:
    """Pipelined broadcast along the first ring from the root."""
    n, k = len(gpus), len(nodes)
    order = p.rings(gpus)[0][0]
    flows = [Flow(a, b, 1.0) for a, b in pairwise(order)]
    return [p.phase(flows, steps=n - 1, inter_steps=k - 1, ppn=_ppn(p, nodes), nodes=k)]


def plan_deepep(p: PlannerView, op: str, gpus: tuple[int, ...], nodes: Group,
                routing: tuple[int, int, int | None] | None = None) -> list[PhasePlan]:
    """DeepEP's normal dispatch / combine (all-to-all), one pipelined phase: inside a node
    straight over NVLink; to another node once over RDMA to the member with the same local
    index there, which forwards over NVLink to that node's other members (DeepEP README at
    0aaa674; arXiv:2412.19437 §3.2.2). DeepEP overlaps the RDMA sends and the NVLink forwarding
    (chunked), so both hops share one phase. Plain ``deepep``: D is what a rank sends, D/n to
    every member (node share g/n over RDMA); with ``routing`` (experts, top-k, node limit), D
    is the rank's tokens once and each member / node receives D times the chance a token
    reaches it (:func:`simulator.costs.moe.deepep_fanout`). The NVLink hops run at the GPU's
    measured ``nvlink.deepep_efficiency`` of line rate where it has one (H800): their weights
    are scaled by nccl_efficiency / deepep_efficiency, since the links carry NCCL's."""
    if op != "all_to_all":
        raise ValueError(f"deepep implements all_to_all, not {op}")
    ppn = p.uniform(nodes)
    if ppn is None:
        raise ValueError("deepep needs the same number of group members on every node (its RDMA peer has the "
                         "sender's local index)")
    n, k = len(gpus), len(nodes)
    nvlink = p.cluster.gpu.nvlink
    # DeepEP's NVLink hops reach their own measured fraction of line rate, the links NCCL's
    nv = nvlink.nccl_efficiency / nvlink.deepep_efficiency if nvlink and nvlink.deepep_efficiency else 1.0
    if routing is None:
        to_rank, to_node = 1.0 / n, ppn / n
    else:
        experts, top_k, max_nodes = routing
        to_rank, to_node = deepep_fanout(experts, top_k, n, k, max_nodes)
    flows: list[Flow] = []
    for node, members in nodes.items():
        for i, a in enumerate(members):
            for other, dests in nodes.items():
                if other == node:
                    flows += [Flow(a, b, to_rank * nv) for b in dests if b != a]
                    continue
                peer = dests[i]
                flows.append(Flow(a, peer, to_node))
                flows += [Flow(peer, b, to_rank * nv) for b in dests if b != peer]
    return [p.phase(flows, steps=1, inter_steps=1 if k > 1 else 0, ppn=ppn, nodes=k)]


register_algorithm("deepep")(plan_deepep)
