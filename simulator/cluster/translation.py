"""Routes by translation: a flow's route as its moved representative's, links moved back.

When moving every node by T (modulo the node count) maps the cluster onto itself and every
route onto the moved pair's route, the route from GPU a to GPU b is the route from a - tT to
b - tT with each link moved by tT nodes. A :class:`Translation` holds that T (the fabric's
:meth:`~simulator.cluster.fabrics.Fabric.period_nodes`) and moves link ids: a node interior
link by its id (``node * L + slot`` on a replicated graph), a fabric link as its fabric says.

:func:`route_terms` gives a phase's flat (link id, fraction) list, flows in order and each
route's links in the order the router lists them, computing only routes whose source lies in
the first T nodes: a data-parallel ring over every block of nodes asks the same few routes at
any cluster size. The list is the one routing every flow gives, element for element, so the
per-link sums over it are equal to the bit. Held only for a healthy replicated graph (no
failed or changed link, no perturbed node) whose fabric has a period; otherwise None and
every flow is routed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from simulator.cluster.collective_plan import CollectivePlan, PhasePlan
from simulator.cluster.graph import ClusterGraph
from simulator.cluster.links import Link, LinkTable
from simulator.cluster.routing import Route, Router

__all__ = ["Translation", "route_terms", "move_plan"]


class _Flow(Protocol):
    @property
    def src(self) -> int: ...

    @property
    def dst(self) -> int: ...


class Translation:
    """Moving nodes by multiples of ``period_nodes``: a symmetry of ``cluster`` and its routes."""

    def __init__(self, cluster: ClusterGraph, period_nodes: int, per_node: int) -> None:
        self.cluster = cluster
        self.period_nodes = period_nodes
        self._per_node = per_node  # node n's interior links are ids n * per_node + slot
        self._interior = per_node * cluster.n_nodes

    @classmethod
    def of(cls, cluster: ClusterGraph) -> Translation | None:
        """The cluster's translation, or None where routes must be computed pair by pair."""
        links, fabric = cluster.links, cluster.scale_out
        if ((isinstance(links, LinkTable) and links.changed) or cluster.dead_links or cluster.perturbed_nodes
                or fabric is None or cluster.n_nodes < 2):
            return None
        per_node = links.per_node if isinstance(links, LinkTable) else _copied_interiors(cluster)
        period = fabric.period_nodes(cluster)
        if per_node is None or period is None or cluster.n_nodes % period:
            return None
        return cls(cluster, period, per_node)

    def shift(self, ids: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """Link ``ids[i]`` moved by ``nodes[i]`` nodes (multiples of the period)."""
        n = self.cluster.n_nodes
        out = ids.copy()
        inner = ids < self._interior
        node, slot = np.divmod(ids[inner], self._per_node)
        out[inner] = ((node + nodes[inner]) % n) * self._per_node + slot
        fabric = ~inner
        if fabric.any():
            assert self.cluster.scale_out is not None
            out[fabric] = self.cluster.scale_out.shift_links(self.cluster, ids[fabric], nodes[fabric])
        return out


def _copied_interiors(cluster: ClusterGraph) -> int | None:
    """Links per node where a graph built link by link holds the node interiors first, node
    by node, each node's as node 0's renamed (the builder copies node 0 when node 1 is its
    copy), checked on node 0, 1 and the last; else None."""
    links, n = cluster.links, cluster.n_nodes
    per_node = next((i for i, link in enumerate(links) if link.node != 0), len(links))
    if per_node == 0 or len(links) < n * per_node:
        return None
    for node in (1, n - 1):
        for slot in range(per_node):
            a, b = links[slot], links[node * per_node + slot]
            if (b.node != node or b.slot != a.slot or b.src.split(".", 1)[1:] != a.src.split(".", 1)[1:]
                    or b.dst.split(".", 1)[1:] != a.dst.split(".", 1)[1:] or _physics(a) != _physics(b)):
                return None
    if len(links) > n * per_node and links[n * per_node].tier != "nic-up":
        return None  # the interiors are not followed by the fabric's first cable
    return per_node


def _physics(link: Link) -> tuple[object, ...]:
    return link.kind, link.bandwidth_bytes_per_s, link.efficiency, link.latency_s, link.tier


def route_terms(router: Router, translation: Translation | None,
                flows: Sequence[_Flow]) -> tuple[list[Route], np.ndarray, np.ndarray, list[int]]:
    """The routes the flows take, up to translation (their hop classes and latencies: a moved
    route's are its representative's), and the flat link ids and fractions of every flow's
    route (flows in order) with each route's length: what ``router.route`` of every flow
    lists, computing only the routes of flows that start in the first period."""
    route_of = router.route
    if translation is None or max((f.src for f in flows), default=0) < translation.period_nodes * router.cluster.gpus_per_node:
        routes = [route_of(f.src, f.dst) for f in flows]
        pairs = [pair for r in routes for pair in r.links]
        counts = [len(r.links) for r in routes]
        if not pairs:
            return routes, np.zeros(0, dtype=np.int64), np.zeros(0), counts
        all_ids, all_fracs = zip(*pairs, strict=True)
        return routes, np.array(all_ids, dtype=np.int64), np.array(all_fracs), counts
    g = translation.cluster.gpus_per_node
    period, world = translation.period_nodes * g, translation.cluster.world_size
    src = np.fromiter((f.src for f in flows), dtype=np.int64, count=len(flows))
    dst = np.fromiter((f.dst for f in flows), dtype=np.int64, count=len(flows))
    moves = src // period
    # each flow's representative pair (source in the first period), routed once per distinct pair
    pair_keys = (src - moves * period) * world + (dst - moves * period) % world
    keys, which = np.unique(pair_keys, return_inverse=True)
    unique = [route_of(int(k) // world, int(k) % world) for k in keys.tolist()]
    lengths = np.array([len(r.links) for r in unique], dtype=np.int64)
    counts_array = lengths[which]
    counts = counts_array.tolist()
    total = int(counts_array.sum())
    if not total:
        return unique, np.zeros(0, dtype=np.int64), np.zeros(0), counts
    flat = [pair for r in unique for pair in r.links]
    unique_ids = np.array([i for i, _ in flat], dtype=np.int64)
    unique_fracs = np.array([w for _, w in flat])
    # term j of flow k is term j of its pair's route: gather from the routes' concatenation
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    starts = np.concatenate(([0], np.cumsum(counts_array)[:-1]))
    gather = np.arange(total) + np.repeat(offsets[which] - starts, counts_array)
    ids, fracs = unique_ids[gather], unique_fracs[gather]
    moved = np.repeat(moves * translation.period_nodes, counts_array)
    if moved.any():
        ids = translation.shift(ids, moved)
        # the router lists a route between nodes by link id and one inside a node along its
        # path (moving keeps that order: one node's links keep their slots); re-sort the former
        flow = np.repeat(np.arange(len(flows)), counts_array)
        between = np.repeat(np.array([r.hop_class == "net" for r in unique])[which], counts_array)
        key = np.where(between, ids, np.arange(total) - np.repeat(starts, counts_array))
        order = np.lexsort((key, flow))
        ids, fracs = ids[order], fracs[order]
    return unique, ids, fracs, counts


def move_plan(plan: CollectivePlan, translation: Translation, shift_gpus: int, gpus: tuple[int, ...]) -> CollectivePlan:
    """``plan`` (of ``gpus`` less ``shift_gpus``, every one at least 0) moved to ``gpus``: by
    whole periods and without wrapping round, so the groups' nodes keep their order, each
    algorithm lays out the same flows moved, and each link's sum adds the same terms in the
    same order: the plan built for ``gpus`` itself, to the bit."""
    nodes = shift_gpus // translation.cluster.gpus_per_node
    phases = []
    for phase in plan.phases:
        ids, sums = phase.arrays()
        moved = translation.shift(ids, np.full(len(ids), nodes, dtype=np.int64))
        order = np.argsort(moved, kind="stable")
        used, sums = moved[order], sums[order]
        new = PhasePlan(
            flows=(), steps=phase.steps, inter_steps=phase.inter_steps,
            link_weights=(), intra_class=phase.intra_class, net_latency_s=phase.net_latency_s, ppn=phase.ppn, nodes=phase.nodes,
            channels=phase.channels, channel_net_bytes_per_s=phase.channel_net_bytes_per_s,
            intra_latency_s=phase.intra_latency_s, net_staged_bytes=phase.net_staged_bytes,
            net_staged_bytes_per_s=phase.net_staged_bytes_per_s, net_message_s=phase.net_message_s)
        # link_weights: (used[i], sums[i]) pairs, flows: the phase's moved, each made when read
        phases.append(new.adopt(used, sums).moved(phase.flows, shift_gpus))
    return CollectivePlan(plan.op, plan.algorithm, gpus, tuple(phases), plan.ll128_ok)
