"""Collectives as data: the flows each algorithm puts on the graph for one process group.

A :class:`CollectivePlan` is a sequence of phases; each phase is a set of point-to-point
flows that run together (the engine couples them: a ring step waits for its slowest
neighbour, so all flows of a phase progress at one rate). Flow weights are bytes per byte
of the collective's size D (nccl-tests' convention: the full vector for all-reduce, the
total output for all-gather, the total input for reduce-scatter, the bytes each rank sends
for all-to-all).

Algorithms (shared/REFERENCE.md §1):

* ``ring``: NCCL's rings. Across nodes, one channel per member GPU of a node; channel c
  starts each node's segment at its c-th member, so every member's NIC carries one
  channel's node-boundary crossing (the ring's bus bandwidth is the node's NIC bandwidth).
  Each ring edge carries 2(N-1)/N * D/C for all-reduce, (N-1)/N * D/C for AG/RS.
  NVLink meshes (p3) use Hamiltonian cycles over the NVLink bricks, one channel each.
* ``tree``: NCCL's double binary tree (all-reduce, several nodes): a chain inside each
  node, a binary tree over the nodes' head GPUs, the mirrored tree on odd channels; every
  edge carries D/C up (reduce) and D/C down (broadcast), pipelined.
* ``nvls``: NVLink SHARP all-reduce inside an NVSwitch node: each GPU sends and receives D.
* ``hierarchical``: two-level; all-reduce = intra-node RS, inter-node AR per local rank on
  D/g, intra-node AG; all-gather = inter-node AG then intra-node AG (MiCS's hierarchical
  parameter gather); reduce-scatter = intra-node RS then inter-node RS.
* ``direct``: all-to-all (every pair at once) and point-to-point.
* ``chain``: pipelined broadcast along a ring from the root.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, replace
from functools import cached_property
from itertools import pairwise

import numpy as np

from simulator.cluster.graph import ClusterGraph
from simulator.cluster.routing import Router
from simulator.costs.collectives import CollectiveShape, NcclModel, PhaseShape
from simulator.scenario.hardware import nccl_constants

__all__ = ["Flow", "PhasePlan", "CollectivePlan", "CollectivePlanner", "nccl_model", "OPS", "ALGORITHMS"]

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "p2p", "d2h", "h2d")
ALGORITHMS = ("ring", "tree", "nvls", "hierarchical", "direct", "chain")


def nccl_model() -> NcclModel:
    c = nccl_constants()
    return NcclModel(
        base_latency={k: dict(v) for k, v in c.base_latency.items()},
        hop_latency={k: {a: dict(p) for a, p in v.items()} for k, v in c.hop_latency.items()},
        nvls_latency=c.nvls_latency,
        nvls_efficiency=c.nvls_efficiency,
        protocol_bandwidth={k: dict(v) for k, v in c.protocol_bandwidth.items()},
        ll_max_bytes=c.ll_max_bytes,
        ll128_max_bytes=c.ll128_max_bytes,
        ring_plateau_factor=c.ring_plateau_factor,
        tree_correction={k: tuple(v) for k, v in c.tree_correction.items()},
        simple_step_bytes=c.simple_step_bytes,
    )


@dataclass(frozen=True, slots=True)
class Flow:
    src: int  # global GPU index
    dst: int
    weight: float  # bytes per byte of D


@dataclass(frozen=True)
class PhasePlan:
    flows: tuple[Flow, ...]
    steps: int
    inter_steps: int
    link_weights: tuple[tuple[int, float], ...]  # (link id, bytes per byte of D)
    intra_class: str
    net_latency_s: float
    ppn: int
    nodes: int
    channels: int = 1
    channel_net_bytes_per_s: float = 0.0
    intra_latency_s: float = 0.0

    def seconds_per_byte(self, cluster: ClusterGraph) -> float:
        links = cluster.links
        return max((w / links[i].capacity_bytes_per_s for i, w in self.link_weights), default=0.0)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Link ids and weights as arrays."""
        return self._arrays

    @cached_property
    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        ids = np.fromiter((i for i, _ in self.link_weights), dtype=np.int64, count=len(self.link_weights))
        w = np.fromiter((x for _, x in self.link_weights), dtype=float, count=len(self.link_weights))
        return ids, w


@dataclass(frozen=True)
class CollectivePlan:
    op: str
    algorithm: str
    gpus: tuple[int, ...]
    phases: tuple[PhasePlan, ...]
    ll128_ok: bool

    @property
    def nranks(self) -> int:
        return len(self.gpus)

    def shape(self, cluster: ClusterGraph) -> CollectiveShape:
        return CollectiveShape(
            op=self.op,
            algorithm=self.algorithm,
            nranks=self.nranks,
            ll128_ok=self.ll128_ok,
            phases=tuple(
                PhaseShape(p.seconds_per_byte(cluster), p.steps, p.inter_steps, p.intra_class, p.net_latency_s,
                           p.ppn, p.nodes, p.channels, p.channel_net_bytes_per_s, p.intra_latency_s)
                for p in self.phases
            ),
        )


class CollectivePlanner:
    """Builds (and caches) collective plans for process groups on one cluster."""

    def __init__(self, cluster: ClusterGraph, router: Router) -> None:
        self.cluster = cluster
        self.router = router
        self._plans: dict[tuple[str, str, tuple[int, ...]], CollectivePlan] = {}
        self._ring_cache: dict[tuple[int, ...], list[tuple[tuple[int, ...], float]]] = {}

    @cached_property
    def model(self) -> NcclModel:
        return nccl_model()

    # -- public ----------------------------------------------------------------------------

    def candidates(self, op: str, gpus: tuple[int, ...]) -> list[str]:
        """Algorithms NCCL could pick for this op and placement (the tuner chooses among them)."""
        if op in ("p2p", "all_to_all", "d2h", "h2d"):
            return ["direct"]
        if op == "broadcast":
            return ["chain"]
        nodes = self._by_node(gpus)
        algos = ["ring"]
        if op == "all_reduce":
            if len(nodes) > 1:
                algos.append("tree")
            elif self.cluster.node_type.intra_node.nvls and self.cluster.gpu.nvlink and len(gpus) > 2:
                algos.append("nvls")
        return algos

    def plan(self, op: str, algorithm: str, gpus: tuple[int, ...]) -> CollectivePlan:
        key = (op, algorithm, gpus)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._build(op, algorithm, gpus)
        return plan

    # -- structure -------------------------------------------------------------------------

    def _by_node(self, gpus: tuple[int, ...]) -> dict[int, list[int]]:
        g = self.cluster.gpus_per_node
        nodes: dict[int, list[int]] = defaultdict(list)
        for gpu in gpus:
            nodes[gpu // g].append(gpu)
        return {n: sorted(members) for n, members in sorted(nodes.items())}

    def _uniform(self, nodes: dict[int, list[int]]) -> int | None:
        sizes = {len(m) for m in nodes.values()}
        return sizes.pop() if len(sizes) == 1 else None

    def _rings(self, gpus: tuple[int, ...]) -> list[tuple[tuple[int, ...], float]]:
        """Ring channels (order, share of the data) for a group."""
        found = self._ring_cache.get(gpus)
        if found is not None:
            return found
        nodes = self._by_node(gpus)
        ppn = self._uniform(nodes)
        rings: list[tuple[tuple[int, ...], float]]
        if len(nodes) == 1:
            members = next(iter(nodes.values()))
            cycles = self._nvlink_cycles(members) if self.cluster.node_type.intra_node.kind == "nvlink-mesh" else []
            rings = [(c, 1.0 / len(cycles)) for c in cycles] if cycles else [(tuple(members), 1.0)]
        elif ppn is None:
            rings = [(tuple(sorted(gpus)), 1.0)]
        else:
            # the intra-node segment follows NVLink where the node is a mesh (NCCL's rings do)
            g = self.cluster.gpus_per_node
            first = next(iter(nodes.values()))
            cycles = self._nvlink_cycles(first) if self.cluster.node_type.intra_node.kind == "nvlink-mesh" else []
            local = [x % g for x in (cycles[0] if cycles else first)]
            rings = []
            for c in range(ppn):
                order: list[int] = []
                for node in nodes:
                    rotated = local[c:] + local[:c]
                    order += [node * g + i for i in rotated]
                rings.append((tuple(order), 1.0 / ppn))
        self._ring_cache[gpus] = rings
        return rings

    def _nvlink_cycles(self, members: list[int]) -> list[tuple[int, ...]]:
        """Directed Hamiltonian cycles over NVLink bricks, each brick direction used once."""
        if len(members) < 2:
            return []
        g = self.cluster.gpus_per_node
        node = members[0] // g
        capacity: dict[tuple[int, int], int] = {}
        for a in members:
            for b in members:
                if a != b:
                    link = self.cluster.link_between(f"n{node}.gpu{a % g}", f"n{node}.gpu{b % g}")
                    if link is not None:
                        bricks = round(link.bandwidth_bytes_per_s / (self.cluster.node_type.intra_node.link_bandwidth_bytes_per_s or link.bandwidth_bytes_per_s))
                        capacity[(a, b)] = max(1, bricks)
        if len(members) == 2:
            a, b = members
            return [(a, b)] * capacity.get((a, b), 0) if capacity.get((a, b)) else []
        cycles: list[tuple[int, ...]] = []
        while len(cycles) < 16:
            cycle = self._hamiltonian(members, capacity)
            if cycle is None:
                break
            cycles.append(cycle)
            for u, v in zip(cycle, cycle[1:] + cycle[:1], strict=True):
                capacity[(u, v)] -= 1
        return cycles

    @staticmethod
    def _hamiltonian(members: list[int], capacity: dict[tuple[int, int], int]) -> tuple[int, ...] | None:
        start = members[0]
        n = len(members)
        path = [start]
        seen = {start}

        def extend() -> bool:
            if len(path) == n:
                return capacity.get((path[-1], start), 0) > 0
            for nxt in members:
                if nxt not in seen and capacity.get((path[-1], nxt), 0) > 0:
                    path.append(nxt)
                    seen.add(nxt)
                    if extend():
                        return True
                    path.pop()
                    seen.discard(nxt)
            return False

        return tuple(path) if extend() else None

    # -- plans -----------------------------------------------------------------------------

    def _build(self, op: str, algorithm: str, gpus: tuple[int, ...]) -> CollectivePlan:
        if len(gpus) != len(set(gpus)):
            raise ValueError(f"a process group lists a GPU twice: {gpus}")
        nodes = self._by_node(gpus)
        n, k = len(gpus), len(nodes)
        ppn = self._uniform(nodes) or max(len(m) for m in nodes.values())
        phases: list[PhasePlan]
        if op in ("d2h", "h2d"):
            route = self.router.route_to_host(gpus[0]) if op == "d2h" else self.router.route_from_host(gpus[0])
            phases = [PhasePlan((Flow(gpus[0], gpus[0], 1.0),), 1, 0, route.links, "pcie", 0.0, 1, 1)]
        elif n == 1:
            phases = []
        elif algorithm == "ring":
            phases = [self._ring_phase(op, gpus, nodes)]
        elif algorithm == "tree":
            phases = [self._tree_phase(gpus, nodes)]
        elif algorithm == "nvls":
            factor = (self.cluster.gpu.nvlink.nccl_efficiency if self.cluster.gpu.nvlink else 1.0) / self.model.nvls_efficiency
            members = sorted(gpus)
            flows = [Flow(a, b, factor) for a, b in zip(members, members[1:] + members[:1], strict=True)]
            phases = [self._phase(flows, steps=1, inter_steps=0, ppn=ppn, nodes=1)]
        elif algorithm == "hierarchical":
            phases = self._hierarchical(op, nodes)
        elif algorithm == "direct":
            if op == "p2p":
                flows = [Flow(gpus[0], gpus[1], 1.0)]
            else:
                flows = [Flow(a, b, 1.0 / n) for a in gpus for b in gpus if a != b]
            phases = [self._phase(flows, steps=1, inter_steps=1 if k > 1 else 0, ppn=ppn, nodes=k)]
        elif algorithm == "chain":
            order = self._rings(gpus)[0][0]
            flows = [Flow(a, b, 1.0) for a, b in pairwise(order)]
            phases = [self._phase(flows, steps=n - 1, inter_steps=k - 1, ppn=ppn, nodes=k)]
        else:
            raise ValueError(f"unknown collective algorithm {algorithm!r}")
        ll128 = all(self._ll128_ok(p) for p in phases)
        return CollectivePlan(op, algorithm, gpus, tuple(phases), ll128)

    def _ring_factor(self, op: str, n: int) -> tuple[float, int]:
        if op == "all_reduce":
            return 2 * (n - 1) / n, 2 * (n - 1)
        if op in ("all_gather", "reduce_scatter"):
            return (n - 1) / n, n - 1
        raise ValueError(f"ring does not implement {op}")

    def _ring_phase(self, op: str, gpus: tuple[int, ...], nodes: dict[int, list[int]]) -> PhasePlan:
        n, k = len(gpus), len(nodes)
        per_edge, steps = self._ring_factor(op, n)
        flows = []
        for order, share in self._rings(gpus):
            for a, b in zip(order, order[1:] + order[:1], strict=True):
                flows.append(Flow(a, b, per_edge * share))
        inter = (2 * (k - 1) if op == "all_reduce" else k - 1) if k > 1 else 0
        ppn = self._uniform(nodes) or max(len(m) for m in nodes.values())
        return self._phase(flows, steps=steps, inter_steps=inter, ppn=ppn, nodes=k)

    def _tree_phase(self, gpus: tuple[int, ...], nodes: dict[int, list[int]]) -> PhasePlan:
        node_ids = list(nodes)
        k = len(node_ids)
        ppn = self._uniform(nodes) or max(len(m) for m in nodes.values())
        channels = max(2, ppn)
        trees = (self._btree(k), [(k - 1 - c, k - 1 - p) for c, p in self._btree(k)])
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
        phase = self._phase(flows, steps=2 * (ppn - 1 + math.ceil(math.log2(k))),
                            inter_steps=2 * math.ceil(math.log2(k)), ppn=ppn, nodes=k)
        # one channel's share of a node's network bandwidth: the NICs the heads use, over the channels
        nic_links = {i for i, _ in phase.link_weights if self.cluster.links[i].tier == "nic-up"
                     and self.cluster.links[i].node == node_ids[0]}
        node_bw = sum(self.cluster.links[i].capacity_bytes_per_s for i in nic_links)
        return replace(phase, channels=channels, channel_net_bytes_per_s=node_bw / channels if node_bw else 0.0)

    @staticmethod
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

    def _hierarchical(self, op: str, nodes: dict[int, list[int]]) -> list[PhasePlan]:
        ppn = self._uniform(nodes)
        if ppn is None:
            raise ValueError("hierarchical collectives need the same number of group members on every node")
        k = len(nodes)
        members = list(nodes.values())
        rails = [tuple(m[j] for m in members) for j in range(ppn)]

        def intra(kind: str) -> PhasePlan:
            per_edge, steps = self._ring_factor(kind, ppn) if ppn > 1 else (0.0, 0)
            flows = []
            if ppn > 1:
                for m in members:
                    for order, share in self._rings(tuple(m)):
                        flows += [Flow(a, b, per_edge * share) for a, b in zip(order, order[1:] + order[:1], strict=True)]
            return self._phase(flows, steps=steps, inter_steps=0, ppn=ppn, nodes=1)

        def inter(kind: str) -> PhasePlan:
            per_edge, steps = self._ring_factor(kind, k) if k > 1 else (0.0, 0)
            flows = [Flow(a, b, per_edge / ppn) for r in rails for a, b in zip(r, r[1:] + r[:1], strict=True)] if k > 1 else []
            return self._phase(flows, steps=steps, inter_steps=steps, ppn=1, nodes=k)

        if op == "all_reduce":
            phases = [intra("reduce_scatter"), inter("all_reduce"), intra("all_gather")]
        elif op == "all_gather":
            phases = [inter("all_gather"), intra("all_gather")]
        elif op == "reduce_scatter":
            phases = [intra("reduce_scatter"), inter("reduce_scatter")]
        else:
            raise ValueError(f"hierarchical does not implement {op}")
        return [p for p in phases if p.flows]

    def _phase(self, flows: list[Flow], *, steps: int, inter_steps: int, ppn: int, nodes: int) -> PhasePlan:
        weights: dict[int, float] = defaultdict(float)
        net_latency = 0.0
        intra_class = "nvlink"
        for f in flows:
            route = self.router.route(f.src, f.dst)
            for link_id, frac in route.links:
                weights[link_id] += f.weight * frac
            if route.hop_class == "net":
                net_latency = max(net_latency, route.latency_s)
            elif route.hop_class == "pcie":
                intra_class = "pcie"
        if self.cluster.node_type.intra_node.kind == "pcie":
            intra_class = "pcie"
        return PhasePlan(
            flows=tuple(flows),
            steps=steps,
            inter_steps=inter_steps,
            link_weights=tuple(sorted(weights.items())),
            intra_class=intra_class,
            net_latency_s=net_latency,
            ppn=ppn,
            nodes=nodes,
            intra_latency_s=self.cluster.intra_hop_latency_s,
        )

    def _ll128_ok(self, phase: PhasePlan) -> bool:
        kinds = {self.cluster.links[i].kind for i, _ in phase.link_weights}
        allowed = {"nvlink", "infiniband"}
        if phase.nodes > 1:
            allowed |= {"pcie"}  # GPU-NIC PCIe hops on InfiniBand nodes (NCCL: paths up to PXB)
            return kinds <= allowed and self.cluster.transport_kind == "infiniband"
        return kinds <= allowed
