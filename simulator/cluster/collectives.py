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
* ``nvls_tree``: NCCL's NVLSTree all-reduce across NVSwitch nodes: NVLink SHARP inside each
  node, pipelined with a binary tree over the nodes per local rank carrying D/ppn each way.
* ``hierarchical``: two-level; all-reduce = intra-node RS, inter-node AR per local rank on
  D/g, intra-node AG; all-gather = inter-node AG then intra-node AG (MiCS's hierarchical
  parameter gather); reduce-scatter = intra-node RS then inter-node RS.
* ``direct``: all-to-all (every pair at once) and point-to-point.
* ``chain``: pipelined broadcast along a ring from the root.
* ``deepep``: DeepEP's dispatch / combine all-to-all: NVLink inside a node, RDMA to the
  same-index GPU of another node then NVLink forwarding, in one pipelined phase;
  ``deepep/E/k/M`` sends each token once per destination rank and node under uniform routing
  of E experts, top-k, at most M nodes per token.

On torus nodes (Trainium on NeuronLink) the rings follow a boustrophedon ("snake") order over
torus neighbours, one channel each way round; point-to-point and all-to-all flows take the
router's dimension-order routes.

Algorithms are registered by name in :mod:`simulator.cluster.collective_algorithms`
(:data:`ALGORITHMS`); the plan data classes live in :mod:`simulator.cluster.collective_plan`.
"""

from __future__ import annotations

from collections import defaultdict
from functools import cached_property

import numpy as np

from simulator.cluster.collective_algorithms import ALGORITHMS, planner_of
from simulator.cluster.collective_plan import CollectivePlan, Flow, PhasePlan, nccl_model
from simulator.cluster.fabrics.torus import snake_order
from simulator.cluster.graph import ClusterGraph
from simulator.cluster.links import LinkTable
from simulator.cluster.routing import Router
from simulator.cluster.translation import Translation, move_plan, route_terms
from simulator.costs.collectives import NcclModel

__all__ = ["Flow", "PhasePlan", "CollectivePlan", "CollectivePlanner", "nccl_model", "OPS", "ALGORITHMS"]

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "p2p", "d2h", "h2d")


class CollectivePlanner:
    """Builds (and caches) collective plans for process groups on one cluster.

    ``translate``: build a phase from the routes of the flows in the cluster's first
    translation period, moved (:mod:`simulator.cluster.translation`; the same plans to the
    bit). Off, every flow is routed: the reference the tests compare against."""

    translate = True

    def __init__(self, cluster: ClusterGraph, router: Router) -> None:
        self.cluster = cluster
        self.router = router
        self._plans: dict[tuple[str, str, tuple[int, ...]], CollectivePlan] = {}
        self._ring_cache: dict[tuple[int, ...], list[tuple[tuple[int, ...], float]]] = {}
        self._by_node: dict[tuple[int, ...], dict[int, list[int]]] = {}
        self._routes_of: dict[tuple[tuple[int, int], ...],
                              tuple[bool, float, str, list[int], np.ndarray, np.ndarray, np.ndarray]] = {}

    @cached_property
    def translation(self) -> Translation | None:
        """The cluster's translation period, when it has one and ``translate`` is on (off: every
        flow routed, the reference the translated plans are tested against)."""
        return Translation.of(self.cluster) if self.translate else None

    @cached_property
    def model(self) -> NcclModel:
        return nccl_model(self.cluster.nccl)

    # -- public ----------------------------------------------------------------------------

    def candidates(self, op: str, gpus: tuple[int, ...]) -> list[str]:
        """Algorithms NCCL could pick for this op and placement (the tuner chooses among them)."""
        if op in ("p2p", "all_to_all", "d2h", "h2d"):
            return ["direct"]
        if op == "broadcast":
            return ["chain"]
        nodes = self.by_node(gpus)
        algos = ["ring"]
        if op == "all_reduce":
            if len(nodes) > 1:
                algos.append("tree")
                if self.unrunnable(op, "nvls_tree", gpus) is None:
                    algos.append("nvls_tree")
            elif self.unrunnable(op, "nvls", gpus) is None:
                algos.append("nvls")
        return algos

    def unrunnable(self, op: str, algorithm: str, gpus: tuple[int, ...]) -> str | None:
        """Why ``algorithm`` cannot run ``op`` on this group (None: it can). Only NCCL's own
        algorithms are checked (ring, tree, nvls, chain): NCCL runs Tree for all-reduce only,
        NVLS needs NVLink SHARP in an NVSwitch node (dtsim models it inside one node, more
        than two GPUs) and all-reduce; the others raise from their planner when they do not apply."""
        node = self.cluster.node_type
        if algorithm.split("/")[0] == "deepep":
            if op != "all_to_all":
                return f"deepep (DeepEP's dispatch / combine) implements all_to_all, not {op}"
            if len(self.by_node(gpus)) > 1 and self.cluster.transport_kind != "infiniband":
                return (f"DeepEP's internode kernels need InfiniBand RDMA (NVSHMEM; DeepEP README 'Network "
                        f"configurations'), and {node.name}'s NICs speak {self.cluster.transport_kind}")
        if algorithm == "ring" and op not in ("all_reduce", "all_gather", "reduce_scatter"):
            return f"dtsim's ring implements all_reduce, all_gather and reduce_scatter, not {op}"
        if algorithm == "chain" and op != "broadcast":
            return f"chain is dtsim's ring broadcast, not {op}"
        if algorithm == "tree" and op != "all_reduce":
            return f"NCCL's tree runs all_reduce only, not {op}"
        if algorithm == "nvls":
            if not (node.intra_node.nvls and self.cluster.gpu.nvlink):
                where = "its NVSwitch has none" if node.intra_node.kind == "nvswitch" else f"it has {node.intra_node.kind}"
                return f"NVLS needs NVLink SHARP (in-switch reduction) on an NVSwitch; a {node.name} node: {where}"
            if op != "all_reduce":
                return f"dtsim models NVLS for all_reduce only, not {op}"
            if len(self.by_node(gpus)) > 1:
                return "dtsim models NVLS inside one node only (NCCL's NVLSTree across nodes is not modelled)"
            if len(gpus) <= 2:
                return "NVLS needs more than two GPUs"
        if algorithm == "nvls_tree":
            nodes = self.by_node(gpus)
            if not (node.intra_node.nvls and self.cluster.gpu.nvlink):
                return f"NVLSTree needs NVLink SHARP (in-switch reduction) on an NVSwitch; a {node.name} node has none"
            if op != "all_reduce":
                return f"NCCL's NVLSTree runs all_reduce only, not {op}"
            if len(nodes) < 2:
                return "NVLSTree spans several nodes (NCCL disables it on one node: tuning.cc)"
            if len({len(m) for m in nodes.values()}) > 1 or min(len(m) for m in nodes.values()) <= 2:
                return "NVLSTree needs the same number (more than two) of group members on every node"
        return None

    def plan(self, op: str, algorithm: str, gpus: tuple[int, ...]) -> CollectivePlan:
        key = (op, algorithm, gpus)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._moved(op, algorithm, gpus) or self._build(op, algorithm, gpus)
        return plan

    def _moved(self, op: str, algorithm: str, gpus: tuple[int, ...]) -> CollectivePlan | None:
        """The plan of ``gpus`` as the plan of the group moved back by whole translation periods
        until its first GPU lies in the first, moved forward (None: no translation, host copies,
        or a group that does not move; a group the planner refuses is refused as itself)."""
        translation = self.translation
        if translation is None or op in ("d2h", "h2d") or len(gpus) < 2 or len(set(gpus)) != len(gpus):
            return None
        period = translation.period_nodes * self.cluster.gpus_per_node
        shift = min(gpus) // period * period
        if not shift:
            return None
        try:
            base = self.plan(op, algorithm, tuple(g - shift for g in gpus))
        except ValueError:
            return None
        return move_plan(base, translation, shift, gpus)

    # -- structure -------------------------------------------------------------------------

    def by_node(self, gpus: tuple[int, ...]) -> dict[int, list[int]]:
        """The group's GPUs by node, nodes and members ascending (kept: asked for every candidate
        algorithm and plan of a group; callers only read it)."""
        found = self._by_node.get(gpus)
        if found is None:
            g = self.cluster.gpus_per_node
            nodes: dict[int, list[int]] = defaultdict(list)
            for gpu in gpus:
                nodes[gpu // g].append(gpu)
            found = self._by_node[gpus] = {n: sorted(members) for n, members in sorted(nodes.items())}
        return found

    def uniform(self, nodes: dict[int, list[int]]) -> int | None:
        sizes = {len(m) for m in nodes.values()}
        return sizes.pop() if len(sizes) == 1 else None

    def rings(self, gpus: tuple[int, ...]) -> list[tuple[tuple[int, ...], float]]:
        """Ring channels (order, share of the data) for a group."""
        found = self._ring_cache.get(gpus)
        if found is not None:
            return found
        nodes = self.by_node(gpus)
        ppn = self.uniform(nodes)
        rings: list[tuple[tuple[int, ...], float]]
        if len(nodes) == 1:
            members = next(iter(nodes.values()))
            cycles = self._device_cycles(members)
            rings = [(c, 1.0 / len(cycles)) for c in cycles] if cycles else [(tuple(members), 1.0)]
        elif ppn is None:
            rings = [(tuple(sorted(gpus)), 1.0)]
        else:
            # the intra-node segment follows NVLink where the node is a mesh (NCCL's rings do)
            g = self.cluster.gpus_per_node
            first = next(iter(nodes.values()))
            cycles = self._device_cycles(first)
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

    def _device_cycles(self, members: list[int]) -> list[tuple[int, ...]]:
        """Ring orders that follow the node's device links (empty: the members in index order)."""
        kind = self.cluster.node_type.intra_node.kind
        if kind == "nvlink-mesh":
            return self._nvlink_cycles(members)
        if kind == "torus":
            return self._torus_cycles(members)
        return []

    def _torus_cycles(self, members: list[int]) -> list[tuple[int, ...]]:
        """The members in snake order over the node's torus, both ways round (two channels)."""
        dims = self.cluster.node_type.intra_node.dims
        if len(members) < 3 or not dims:
            return []
        g = self.cluster.gpus_per_node
        base = members[0] - members[0] % g
        wanted = {m - base for m in members}
        order = tuple(base + i for i in snake_order(dims) if i in wanted)
        return [order, order[::-1]]

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
        phases: list[PhasePlan]
        if op in ("d2h", "h2d"):
            route = self.router.route_to_host(gpus[0]) if op == "d2h" else self.router.route_from_host(gpus[0])
            phases = [PhasePlan((Flow(gpus[0], gpus[0], 1.0),), 1, 0, route.links, "pcie", 0.0, 1, 1)]
        elif len(gpus) == 1:
            phases = []
        else:
            planner = planner_of(algorithm)
            if planner is None:
                raise ValueError(f"unknown collective algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")
            phases = planner(self, op, gpus, self.by_node(gpus))
        ll128 = all(self._ll128_ok(p) for p in phases)
        return CollectivePlan(op, algorithm, gpus, tuple(phases), ll128)

    def phase(self, flows: list[Flow], *, steps: int, inter_steps: int, ppn: int, nodes: int,
              channels: int = 1) -> PhasePlan:
        """The phase of ``flows``: each link's bytes per byte of D summed over the flows' routes.

        The sum runs over one flat list (flows in order, each route's links in order) with
        ``np.bincount``, which adds sequentially in that order from 0.0: the same additions in
        the same order as a running per-link sum, so the weights are equal to the bit. On a
        cluster with a translation period the list is built from the routes of the flows in the
        first period, moved (:mod:`simulator.cluster.translation`): the same list."""
        crosses_net, net_latency, intra_class, counts, fracs, used, inverse = self._routed(flows)
        if self.cluster.node_type.intra_node.kind == "pcie":
            intra_class = "pcie"
        sums: np.ndarray = np.zeros(0)
        if len(used):
            terms = np.repeat(np.array([f.weight for f in flows]), counts) * fracs
            sums = np.bincount(inverse, weights=terms, minlength=len(used))
        plan = PhasePlan(
            flows=tuple(flows),
            steps=steps,
            inter_steps=inter_steps,
            link_weights=(),
            intra_class=intra_class,
            net_latency_s=net_latency,
            ppn=ppn,
            nodes=nodes,
            channels=channels,
            intra_latency_s=self.cluster.intra_hop_latency_s,
            net_staged_bytes=self.cluster.transport.staged_message_bytes if crosses_net else 0.0,
            net_staged_bytes_per_s=(self.cluster.transport.staged_copy_bytes_per_s or 0.0) if crosses_net else 0.0,
            net_message_s=self.cluster.transport.message_s if crosses_net else 0.0,
        )
        return plan.adopt(used, sums)  # link_weights: (used[i], sums[i]) pairs, made when read

    def _routed(self, flows: list[Flow]) -> tuple[bool, float, str, list[int], np.ndarray, np.ndarray, np.ndarray]:
        """What :meth:`phase` needs of the flows' routes, by their (source, destination) pairs in
        order (kept: a group's all-gather, reduce-scatter and all-reduce rings cross the same
        pairs): whether one crosses the network, the highest network latency, the intra-node
        class, each route's length, the flat fractions, and the distinct link ids with each
        term's index among them."""
        key = tuple([(f.src, f.dst) for f in flows])
        found = self._routes_of.get(key)
        if found is None:
            net_latency = 0.0
            crosses_net = False
            intra_class = "nvlink"
            routes, ids, fracs, counts = route_terms(self.router, self.translation, flows)
            for route in routes:
                if route.hop_class == "net":
                    crosses_net = True
                    net_latency = max(net_latency, route.latency_s)
                elif route.hop_class == "pcie":
                    intra_class = "pcie"
            used, inverse = np.unique(ids, return_inverse=True) if len(ids) else (np.zeros(0, dtype=np.int64), ids)
            for shared in (fracs, used, inverse):  # shared by the phases that cross these pairs: never edited
                shared.flags.writeable = False
            found = self._routes_of[key] = (crosses_net, net_latency, intra_class, counts, fracs, used, inverse)
        return found

    def _ll128_ok(self, phase: PhasePlan) -> bool:
        links, ids = self.cluster.links, phase.arrays()[0]
        kinds = links.kinds(ids) if isinstance(links, LinkTable) else {links[i].kind for i in ids.tolist()}
        allowed = {"nvlink", "infiniband"}
        if phase.nodes > 1:
            allowed |= {"pcie", self.cluster.transport_kind}  # GPU-NIC PCIe hops (NCCL: paths up to PXB)
            return kinds <= allowed and self.cluster.transport.ll128
        return kinds <= allowed
