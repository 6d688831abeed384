"""Routing: which links a transfer between two GPUs crosses, and in what fractions.

* Inside a node: the path of least 1/bandwidth that never transits another GPU or a NIC
  (GPUs cannot forward NVLink traffic; without a direct link, peers talk over PCIe/host).
  On torus nodes (Trainium on NeuronLink) devices forward for each other and device-to-device
  routes follow dimension order (:func:`simulator.cluster.fabrics.torus.dimension_order_hops`).
  Nodes are identical, so the path is computed once per (local src, local dst) and shifted.
* Between nodes: GPU -> its NICs (the ones on its PCIe switch, else its socket, else all;
  traffic is split evenly over them, as NCCL spreads channels over a GPU's NICs) -> fabric
  -> the destination GPU's NICs -> GPU.
* In the fabric, the cluster's scale-out :class:`~simulator.cluster.fabrics.Fabric` gives
  the links between two NICs (leaf/spine multipath policies, torus dimension order, ...).

A :class:`Route` is a tuple of ``(link_id, fraction)``: the fraction of the transfer's bytes
that crosses the link. Routes are cached.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from simulator.cluster.fabrics.torus import dimension_order_hops
from simulator.cluster.graph import ClusterGraph

__all__ = ["Route", "Router", "HopClass"]

HopClass = str  # "nvlink" | "pcie" | "net"

# one NIC pair of a route between nodes: source NIC, destination NIC, the slots from the GPU up
# to the source NIC and from the destination NIC down to the GPU, their latency
_Pair = tuple[int, int, tuple[int, ...], tuple[int, ...], float]

# device-to-device link kinds: a path made only of these is in the "nvlink" hop class
DEVICE_LINK_KINDS = frozenset({"nvlink", "neuronlink"})


@dataclass(frozen=True, slots=True)
class Route:
    links: tuple[tuple[int, float], ...]
    hop_class: HopClass
    latency_s: float


class Router:
    """Cached routes over one :class:`ClusterGraph`."""

    def __init__(self, cluster: ClusterGraph, seed: int = 0) -> None:
        self.cluster = cluster
        self.seed = seed
        self._node_base = self._node_link_bases()
        self._gpu_nics = {i: self._nics_for_gpu(i) for i in range(cluster.gpus_per_node)}
        self._routes: dict[tuple[int, int], Route] = {}
        self._intra_cache: dict[tuple[str, str], tuple[tuple[int, ...], HopClass, float]] = {}
        self._pair_cache: dict[tuple[int, int], list[_Pair]] = {}
        self._local_cache: dict[tuple[int, int], tuple[list[tuple[int, float]], list[tuple[int, float]]]] = {}

    # -- helpers -------------------------------------------------------------------------

    def _node_link_bases(self) -> list[dict[int, int]]:
        """For each node: slot -> link id (slots line up across nodes)."""
        bases: list[dict[int, int]] = [dict() for _ in range(self.cluster.n_nodes)]
        for link in self.cluster.links:
            if link.node is not None:
                bases[link.node][link.slot] = link.id
        return bases

    def _nics_for_gpu(self, local: int) -> tuple[int, ...]:
        c = self.cluster
        gpu = c.vertices[f"n0.gpu{local}"]
        nics = [c.vertices[f"n0.nic{j}"] for j in range(c.node_type.nics.count)]
        same_switch = [j for j, v in enumerate(nics) if v.switch == gpu.switch and v.socket == gpu.socket]
        if same_switch and c.node_type.pcie.switches > 0:
            return tuple(same_switch)
        same_socket = [j for j, v in enumerate(nics) if v.socket == gpu.socket]
        return tuple(same_socket or range(len(nics)))

    def _torus_slots(self, src_local: str, dst_local: str) -> list[int] | None:
        """Dimension-order path between two devices of a torus node as link slots (None when
        the node is no torus, an end is no device, or a hop's link is absent)."""
        c = self.cluster
        intra = c.node_type.intra_node
        if intra.kind != "torus" or intra.dims is None or not (src_local.startswith("gpu") and dst_local.startswith("gpu")):
            return None
        here = int(src_local[3:])
        slots = []
        for nxt in dimension_order_hops(here, int(dst_local[3:]), intra.dims):
            link = c.link_between(f"n0.gpu{here}", f"n0.gpu{nxt}")
            if link is None:
                return None
            slots.append(link.slot)
            here = nxt
        return slots

    def _intra_offsets(self, src_local: str, dst_local: str) -> tuple[tuple[int, ...], HopClass, float]:
        """Least-1/bandwidth path from n0.src to n0.dst as link slots; GPUs/NICs only at the ends
        (torus nodes: dimension order between devices)."""
        c = self.cluster
        torus = self._torus_slots(src_local, dst_local)
        if torus is not None:
            return self._slots_info(torus)
        src, dst = f"n0.{src_local}", f"n0.{dst_local}"
        best: dict[str, float] = {src: 0.0}
        prev: dict[str, int] = {}
        heap = [(0.0, src)]
        while heap:
            cost, v = heapq.heappop(heap)
            if v == dst:
                break
            if cost > best.get(v, float("inf")):
                continue
            if v != src and c.vertices[v].kind in ("gpu", "nic"):
                continue
            for link in c.out_links(v):
                w = c.vertices[link.dst]
                if w.node != 0:
                    continue
                new = cost + 1.0 / link.capacity_bytes_per_s
                if new < best.get(link.dst, float("inf")):
                    best[link.dst] = new
                    prev[link.dst] = link.id
                    heapq.heappush(heap, (new, link.dst))
        if dst not in prev:
            raise ValueError(f"no path from {src} to {dst} inside a node")
        path: list[int] = []
        v = dst
        while v != src:
            link = c.links[prev[v]]
            path.append(link.slot)
            v = link.src
        path.reverse()
        return self._slots_info(path)

    def _slots_info(self, path: list[int]) -> tuple[tuple[int, ...], HopClass, float]:
        """(slots, hop class, latency) of a node-internal path given as link slots of node 0."""
        c = self.cluster
        kinds = {c.links[self._node_base[0][s]].kind for s in path}
        hop = "nvlink" if kinds <= DEVICE_LINK_KINDS else "pcie"
        latency = sum(c.links[self._node_base[0][s]].latency_s for s in path)
        return tuple(path), hop, latency

    def _intra(self, src_local: str, dst_local: str) -> tuple[tuple[int, ...], HopClass, float]:
        key = (src_local, dst_local)
        found = self._intra_cache.get(key)
        if found is None:
            found = self._intra_cache[key] = self._intra_offsets(src_local, dst_local)
        return found

    def _shift(self, slots: tuple[int, ...], node: int) -> list[int]:
        base = self._node_base[node]
        return [base[s] for s in slots]

    # -- the route -----------------------------------------------------------------------

    def route(self, src_gpu: int, dst_gpu: int) -> Route:
        """The links from GPU ``src_gpu`` to GPU ``dst_gpu`` (global GPU indices), cached."""
        key = (src_gpu, dst_gpu)
        found = self._routes.get(key)
        if found is None:
            found = self._routes[key] = self._compute_route(src_gpu, dst_gpu)
        return found

    def _compute_route(self, src_gpu: int, dst_gpu: int) -> Route:
        c = self.cluster
        g = c.gpus_per_node
        sn, sl = divmod(src_gpu, g)
        dn, dl = divmod(dst_gpu, g)
        if src_gpu == dst_gpu:
            return Route((), "nvlink", 0.0)
        if sn == dn:
            slots, hop, latency = self._intra(f"gpu{sl}", f"gpu{dl}")
            return Route(tuple((link_id, 1.0) for link_id in self._shift(slots, sn)), hop, latency)
        weights: dict[int, float] = {}
        flows = c.transport.flows_per_connection if c.transport.multipath == "ecmp" else 1
        pairs = self._nic_pairs(sl, dl)
        share = 1.0 / len(pairs)
        src_base, dst_base = self._node_base[sn], self._node_base[dn]
        latency = 0.0
        scale_out, seed = c.scale_out, self.seed
        if scale_out is None:
            raise ValueError("the cluster graph has no scale-out fabric built")
        split = self._split_route(sl, dl, sn, dn, pairs, flows, src_base, dst_base)
        if split is not None:
            return split
        for p, (a, b, up_slots, down_slots, intra_lat) in enumerate(pairs):
            for slot in up_slots:
                link_id = src_base[slot]
                weights[link_id] = weights.get(link_id, 0.0) + share
            for slot in down_slots:
                link_id = dst_base[slot]
                weights[link_id] = weights.get(link_id, 0.0) + share
            src_nic, dst_nic = (sn, a), (dn, b)
            for f in range(flows):
                alternatives = scale_out.paths(c, src_nic, dst_nic, f + p * flows, seed)
                if p == 0 and f == 0:  # the first pair's first flow sets the latency
                    latency = intra_lat + sum(c.links[i].latency_s for i in alternatives[0][0])
                for links, frac in alternatives:
                    add = share * frac / flows
                    for link_id in links:
                        weights[link_id] = weights.get(link_id, 0.0) + add
        return Route(tuple(sorted(weights.items())), "net", latency)

    def _split_route(self, sl: int, dl: int, sn: int, dn: int, pairs: list[_Pair], flows: int,
                     src_base: dict[int, int], dst_base: dict[int, int]) -> Route | None:
        """The route between nodes summed in three parts that share no link: the source node's
        links (summed once per (sl, dl), shifted to node sn), the destination node's (to dn)
        and the fabric's. Each link's sum is the general one's, term by term in the same order,
        so the route is the same to the bit; None when a fabric link is also a node link."""
        src_part, dst_part = self._local_parts(sl, dl, pairs)
        c = self.cluster
        scale_out, seed = c.scale_out, self.seed
        assert scale_out is not None
        share = 1.0 / len(pairs)
        fabric: dict[int, float] = {}
        latency = 0.0
        for p, (a, b, _, _, intra_lat) in enumerate(pairs):
            for f in range(flows):
                alternatives = scale_out.paths(c, (sn, a), (dn, b), f + p * flows, seed)
                if p == 0 and f == 0:
                    latency = intra_lat + sum(c.links[i].latency_s for i in alternatives[0][0])
                for links, frac in alternatives:
                    add = share * frac / flows
                    for link_id in links:
                        fabric[link_id] = fabric.get(link_id, 0.0) + add
        items = [(src_base[s], w) for s, w in src_part] + [(dst_base[s], w) for s, w in dst_part]
        if not fabric.keys().isdisjoint(i for i, _ in items):
            return None
        items += fabric.items()
        return Route(tuple(sorted(items)), "net", latency)

    def _local_parts(self, sl: int, dl: int, pairs: list[_Pair]) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
        """(slot, bytes per byte) on the source and the destination node of a route from local
        GPU sl to local GPU dl of another node, summed as the general route sums them (cached)."""
        key = (sl, dl)
        found = self._local_cache.get(key)
        if found is None:
            share = 1.0 / len(pairs)
            src: dict[int, float] = {}
            dst: dict[int, float] = {}
            for _, _, up_slots, down_slots, _ in pairs:
                for slot in up_slots:
                    src[slot] = src.get(slot, 0.0) + share
                for slot in down_slots:
                    dst[slot] = dst.get(slot, 0.0) + share
            found = self._local_cache[key] = (list(src.items()), list(dst.items()))
        return found

    def _nic_pairs(self, sl: int, dl: int) -> list[_Pair]:
        """How a flow from local GPU sl to local GPU dl of another node splits over NIC pairs."""
        key = (sl, dl)
        found = self._pair_cache.get(key)
        if found is None:
            src_nics, dst_nics = self._gpu_nics[sl], self._gpu_nics[dl]
            found = []
            for p in range(max(len(src_nics), len(dst_nics))):
                a, b = src_nics[p % len(src_nics)], dst_nics[p % len(dst_nics)]
                up, _, up_lat = self._intra(f"gpu{sl}", f"nic{a}")
                down, _, down_lat = self._intra(f"nic{b}", f"gpu{dl}")
                found.append((a, b, up, down, up_lat + down_lat))
            self._pair_cache[key] = found
        return found

    def route_to_host(self, gpu: int) -> Route:
        """GPU to its own CPU socket (host memory), for offload traffic."""
        c = self.cluster
        node, local = divmod(gpu, c.gpus_per_node)
        socket = c.vertices[f"n0.gpu{local}"].socket or 0
        slots, _, latency = self._intra(f"gpu{local}", f"cpu{socket}")
        return Route(tuple((i, 1.0) for i in self._shift(slots, node)), "pcie", latency)

    def route_from_host(self, gpu: int) -> Route:
        c = self.cluster
        node, local = divmod(gpu, c.gpus_per_node)
        socket = c.vertices[f"n0.gpu{local}"].socket or 0
        slots, _, latency = self._intra(f"cpu{socket}", f"gpu{local}")
        return Route(tuple((i, 1.0) for i in self._shift(slots, node)), "pcie", latency)
