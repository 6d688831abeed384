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
from simulator.errors import ScenarioError

__all__ = ["Route", "Router", "HopClass", "NoPathError"]

HopClass = str  # "nvlink" | "pcie" | "net"

# one NIC pair of a route between nodes: source NIC, destination NIC, the slots from the GPU up
# to the source NIC and from the destination NIC down to the GPU, their latency
_Pair = tuple[int, int, tuple[int, ...], tuple[int, ...], float]

# device-to-device link kinds: a path made only of these is in the "nvlink" hop class
DEVICE_LINK_KINDS = frozenset({"nvlink", "neuronlink"})


class NoPathError(ScenarioError):
    """Failed links (``faults.links``) leave two GPUs, or a GPU and its host, without any path."""


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
        self._node_base: dict[int, list[int]] = {}  # node -> its link ids by slot, filled as routes need them
        self._gpu_nics = {i: self._nics_for_gpu(i) for i in range(cluster.gpus_per_node)}
        self._routes: dict[tuple[int, int], Route] = {}
        self._intra_cache: dict[tuple[int, str, str], tuple[tuple[int, ...], HopClass, float]] = {}
        self._pair_cache: dict[tuple[int, int, int, int, bool],
                               list[tuple[int, int, tuple[int, ...], tuple[int, ...], float]]] = {}
        # nodes route alike, so a healthy reference node's paths serve them all; a node with a
        # perturbed link (simulator/cluster/faults.py) has its own
        self._reference = next((n for n in range(cluster.n_nodes) if n not in cluster.perturbed_nodes), 0)
        self._local_cache: dict[tuple[int, int], tuple[list[tuple[int, float]], list[tuple[int, float]]]] = {}
        self._latency: dict[int, float] = {}  # link id -> its latency, as paths ask
        self._local_pairs: dict[tuple[int, int], list[_Pair]] = {}  # (sl, dl) -> the NIC pairs of _local_cache's parts
        # hashed flows per connection (ECMP spreads a connection's flows; other policies one)
        self._flows = cluster.transport.flows_per_connection if cluster.transport.multipath == "ecmp" else 1

    # -- helpers -------------------------------------------------------------------------

    def _base(self, node: int) -> list[int]:
        """``node``'s link ids by slot (slots line up across nodes), kept."""
        found = self._node_base.get(node)
        if found is None:
            found = self._node_base[node] = self.cluster.node_link_ids(node)
        return found

    def _nics_for_gpu(self, local: int) -> tuple[int, ...]:
        c = self.cluster
        gpu = c.vertices[f"n0.gpu{local}"]
        nics = [c.vertices[f"n0.nic{j}"] for j in range(c.node_type.nics.count)]
        same_switch = [j for j, v in enumerate(nics) if v.switch == gpu.switch and v.socket == gpu.socket]
        if same_switch and c.node_type.pcie.switches > 0:
            return tuple(same_switch)
        same_socket = [j for j, v in enumerate(nics) if v.socket == gpu.socket]
        return tuple(same_socket or range(len(nics)))

    def _torus_slots(self, src_local: str, dst_local: str, node: int) -> list[int] | None:
        """Dimension-order path between two devices of a torus node as link slots (None when
        the node is no torus, an end is no device, or a hop's link is absent)."""
        c = self.cluster
        intra = c.node_type.intra_node
        if intra.kind != "torus" or intra.dims is None or not (src_local.startswith("gpu") and dst_local.startswith("gpu")):
            return None
        here = int(src_local[3:])
        slots = []
        for nxt in dimension_order_hops(here, int(dst_local[3:]), intra.dims):
            link = c.link_between(f"n{node}.gpu{here}", f"n{node}.gpu{nxt}")
            if link is None or link.id in c.dead_links:
                return None
            slots.append(link.slot)
            here = nxt
        return slots

    def _intra_offsets(self, src_local: str, dst_local: str, node: int) -> tuple[tuple[int, ...], HopClass, float]:
        """Least-1/bandwidth path from src to dst inside ``node`` as link slots; GPUs/NICs only at
        the ends (torus nodes: dimension order between devices); failed links left out."""
        c = self.cluster
        torus = self._torus_slots(src_local, dst_local, node)
        if torus is not None:
            return self._slots_info(torus, node)
        src, dst = f"n{node}.{src_local}", f"n{node}.{dst_local}"
        dead = c.dead_links
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
                if w.node != node or link.id in dead:
                    continue
                new = cost + 1.0 / link.capacity_bytes_per_s
                if new < best.get(link.dst, float("inf")):
                    best[link.dst] = new
                    prev[link.dst] = link.id
                    heapq.heappush(heap, (new, link.dst))
        if dst not in prev:
            if dead:
                raise NoPathError(f"failed links leave no path from {src} to {dst}", field="faults.links")
            raise ValueError(f"no path from {src} to {dst} inside a node")
        path: list[int] = []
        v = dst
        while v != src:
            link = c.links[prev[v]]
            path.append(link.slot)
            v = link.src
        path.reverse()
        return self._slots_info(path, node)

    def _slots_info(self, path: list[int], node: int) -> tuple[tuple[int, ...], HopClass, float]:
        """(slots, hop class, latency) of a path given as link slots of ``node``."""
        c = self.cluster
        base = self._base(node)
        kinds = {c.links[base[s]].kind for s in path}
        hop = "nvlink" if kinds <= DEVICE_LINK_KINDS else "pcie"
        latency = sum(c.links[base[s]].latency_s for s in path)
        return tuple(path), hop, latency

    def _own(self, node: int) -> int:
        """The node whose links ``node``'s internal paths are computed on."""
        return node if node in self.cluster.perturbed_nodes else self._reference

    def _intra(self, src_local: str, dst_local: str, node: int) -> tuple[tuple[int, ...], HopClass, float]:
        key = (self._own(node), src_local, dst_local)
        found = self._intra_cache.get(key)
        if found is None:
            found = self._intra_cache[key] = self._intra_offsets(src_local, dst_local, key[0])
        return found

    def _shift(self, slots: tuple[int, ...], node: int) -> list[int]:
        base = self._base(node)
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
            slots, hop, latency = self._intra(f"gpu{sl}", f"gpu{dl}", sn)
            return Route(tuple((link_id, 1.0) for link_id in self._shift(slots, sn)), hop, latency)
        if not c.dead_links and not c.perturbed_nodes and (sl, dl) in self._local_cache:
            # a healthy pair of local GPUs seen before: its NIC pairs and local parts are kept
            split = self._split_route(sl, dl, sn, dn, self._local_pairs[(sl, dl)], self._flows, self._base(sn),
                                      self._base(dn))
            if split is not None:
                return split
        weights: dict[int, float] = {}
        flows = self._flows
        pairs = self._live_pairs(sn, sl, dn, dl, flows)
        share = 1.0 / len(pairs)
        src_base, dst_base = self._base(sn), self._base(dn)
        latency = 0.0
        if c.scale_out is None:
            raise ValueError("the cluster graph has no scale-out fabric built")
        if not c.dead_links and not c.perturbed_nodes:  # healthy nodes share their local parts
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
                alternatives = self._fabric_paths(src_nic, dst_nic, f + p * flows)
                if p == 0 and f == 0:  # the first pair's first flow sets the latency
                    latency = intra_lat + self._path_latency(alternatives[0][0])
                for links, frac in alternatives:
                    add = share * frac / flows
                    for link_id in links:
                        weights[link_id] = weights.get(link_id, 0.0) + add
        return Route(tuple(sorted(weights.items())), "net", latency)

    def _split_route(self, sl: int, dl: int, sn: int, dn: int, pairs: list[_Pair], flows: int,
                     src_base: list[int], dst_base: list[int]) -> Route | None:
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
                    latency = intra_lat + self._path_latency(alternatives[0][0])
                for links, frac in alternatives:
                    add = share * frac / flows
                    for link_id in links:
                        fabric[link_id] = fabric.get(link_id, 0.0) + add
        items = [(src_base[s], w) for s, w in src_part]
        items += [(dst_base[s], w) for s, w in dst_part]
        items += fabric.items()
        if len({i for i, _ in items}) < len(items):  # a fabric link is also a node link
            return None
        items.sort()
        return Route(tuple(items), "net", latency)

    def _path_latency(self, links: list[int]) -> float:
        """The summed latency of ``links`` (each link's latency kept: fabric paths repeat them)."""
        known = self._latency
        total: float = 0  # as sum() starts: 0 + the first latency is that latency, to the bit
        for i in links:
            lat = known.get(i)
            if lat is None:
                lat = known[i] = self.cluster.links[i].latency_s
            total += lat
        return total

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
            self._local_pairs[key] = pairs
        return found

    def _fabric_paths(self, src_nic: tuple[int, int], dst_nic: tuple[int, int], flow: int) -> list[tuple[list[int], float]]:
        """The scale-out fabric's paths between two NICs, less any crossing a failed link."""
        c = self.cluster
        assert c.scale_out is not None
        paths = c.scale_out.paths(c, src_nic, dst_nic, flow, self.seed)
        if not c.dead_links:
            return paths
        live = [(links, frac) for links, frac in paths if not c.dead_links.intersection(links)]
        total = sum(frac for _, frac in live)
        return [(links, frac / total) for links, frac in live]

    def _live_pairs(self, sn: int, sl: int, dn: int, dl: int, flows: int) -> list[tuple[int, int, tuple[int, ...], tuple[int, ...], float]]:
        """The NIC pairs a flow between two nodes uses; with failed links, those whose every
        hashed flow still has a path (NCCL leaves a NIC whose port is down)."""
        pairs = self._nic_pairs(sn, sl, dn, dl)
        if not self.cluster.dead_links:
            return pairs
        live: list[tuple[int, int, tuple[int, ...], tuple[int, ...], float]] = []
        for any_nic in (False, True):  # the GPU's own NICs, else any NIC of its node (across PCIe)
            candidates = self._nic_pairs(sn, sl, dn, dl, any_nic)
            live = [pair for p, pair in enumerate(candidates)
                    if all(self._fabric_paths((sn, pair[0]), (dn, pair[1]), f + p * flows) for f in range(flows))]
            if live:
                break
        if not live:
            raise NoPathError(f"failed links leave no path from GPU {sn * self.cluster.gpus_per_node + sl} to GPU "
                              f"{dn * self.cluster.gpus_per_node + dl} (node {sn} to node {dn})", field="faults.links")
        return live

    def _nic_pairs(self, sn: int, sl: int, dn: int, dl: int,
                   any_nic: bool = False) -> list[tuple[int, int, tuple[int, ...], tuple[int, ...], float]]:
        """How a flow from local GPU sl of node sn to local GPU dl of node dn splits over NIC
        pairs (``any_nic``: over every NIC of the two nodes, not only the GPUs' own)."""
        key = (self._own(sn), sl, self._own(dn), dl, any_nic)
        found = self._pair_cache.get(key)
        if found is None:
            every = tuple(range(self.cluster.node_type.nics.count))
            src_nics, dst_nics = (every, every) if any_nic else (self._gpu_nics[sl], self._gpu_nics[dl])
            found = []
            for p in range(max(len(src_nics), len(dst_nics))):
                a, b = src_nics[p % len(src_nics)], dst_nics[p % len(dst_nics)]
                up, _, up_lat = self._intra(f"gpu{sl}", f"nic{a}", sn)
                down, _, down_lat = self._intra(f"nic{b}", f"gpu{dl}", dn)
                found.append((a, b, up, down, up_lat + down_lat))
            self._pair_cache[key] = found
        return found

    def route_to_host(self, gpu: int) -> Route:
        """GPU to its own CPU socket (host memory), for offload traffic."""
        c = self.cluster
        node, local = divmod(gpu, c.gpus_per_node)
        socket = c.vertices[f"n0.gpu{local}"].socket or 0
        slots, _, latency = self._intra(f"gpu{local}", f"cpu{socket}", node)
        return Route(tuple((i, 1.0) for i in self._shift(slots, node)), "pcie", latency)

    def route_from_host(self, gpu: int) -> Route:
        c = self.cluster
        node, local = divmod(gpu, c.gpus_per_node)
        socket = c.vertices[f"n0.gpu{local}"].socket or 0
        slots, _, latency = self._intra(f"cpu{socket}", f"gpu{local}", node)
        return Route(tuple((i, 1.0) for i in self._shift(slots, node)), "pcie", latency)
