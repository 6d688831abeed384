"""Switched fabrics: fat tree, rail-optimised, and a single switch.

Routing between two NICs: up to the source NIC's leaf; if the destination NIC hangs off the
same leaf, straight down; otherwise through spines chosen by the transport's multipath
policy: ``single`` (InfiniBand, D-mod-k: spine = destination NIC's global index mod spines),
``spray`` (EFA SRD: every spine, evenly), ``ecmp`` (TCP: each of the connection's flows
hashed onto one spine).
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np

from simulator.cluster.fabrics.base import Fabric, FabricPath, NicRef, add_nic_links, nic_params, register_fabric
from simulator.cluster.graph import ClusterGraph, LinkRow, Vertex

__all__ = ["LeafSpineFabric", "FatTree", "RailOptimized", "SingleSwitch"]


class LeafSpineFabric(Fabric):
    """NICs cabled to leaf switches; leaves joined by spines (none when there is one leaf)."""

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self.nic_leaf: dict[str, str] = {}  # NIC vertex -> the switch it is cabled to
        self.leaf_spines: dict[str, list[str]] = {}  # leaf -> its spines
        self._nic_cache: dict[NicRef, tuple[int, int, str]] = {}
        self._spine_cache: dict[tuple[str, str], list[tuple[int, int]]] = {}
        self._up_cache: dict[str, list[int]] = {}  # leaf -> its link to each of its spines
        self._down_cache: dict[str, dict[str, int]] = {}  # leaf -> spine -> the spine's link down to it
        # the wiring's layout, for translations (:meth:`period_nodes`): the first cable's id, the
        # nodes on each leaf, whether cables run rail by rail (else node by node), the first
        # leaf-spine link's id, the leaves and the spines of each
        self._first_cable: int | None = None
        self._per_leaf = 0
        self._rail_major = False
        self._first_spine = 0
        self._leaves = 1
        self._spine_count = 0

    # -- building --------------------------------------------------------------------------

    def _cable(self, cluster: ClusterGraph, cables: list[tuple[str, str, int | None, int]]) -> None:
        """Cable each (NIC, its switch, rail, node), in order."""
        if self._first_cable is None:
            self._first_cable = len(cluster.links)
        add_nic_links(cluster, cables)
        self.nic_leaf.update((nic, switch) for nic, switch, _, _ in cables)

    def _geometry(self, cluster: ClusterGraph, nics_per_node_per_leaf: int) -> tuple[int, int, int]:
        """(nodes per leaf, leaves, spines) for ``switch_radix`` ports, half facing down."""
        spec = self.spec
        down_ports = max(1, spec.switch_radix // 2)
        per_leaf = spec.nodes_per_leaf or max(1, down_ports // max(1, nics_per_node_per_leaf))
        leaves = math.ceil(cluster.n_nodes / per_leaf)
        spines = spec.spines or down_ports
        return per_leaf, leaves, spines

    def _add_spines(self, cluster: ClusterGraph, leaves: list[str], down_bw: float, spines: int,
                    rail: int | None = None) -> None:
        """Connect each leaf to every spine; uplinks carry down_bw / oversubscription in total."""
        _, eff, _ = nic_params(cluster)
        kind = cluster.transport_kind
        up_each = down_bw / self.spec.oversubscription / spines
        names = [f"spine{j}" for j in range(spines)]
        for name in names:
            if name not in cluster.vertices:
                cluster.add_vertex(Vertex(name, "spine", None, name))
        lat = cluster.transport.switch_latency_s
        self._first_spine, self._leaves, self._spine_count = len(cluster.links), len(leaves), spines
        rows: list[LinkRow] = []
        for leaf in leaves:  # each leaf to each spine, then back: add_link's two directions
            for name in names:
                rows.append((leaf, name, kind, up_each, eff, lat, "leaf-up", rail, None))  # type: ignore[arg-type]
                rows.append((name, leaf, kind, up_each, eff, lat, "spine-down", rail, None))  # type: ignore[arg-type]
            self.leaf_spines[leaf] = names
        cluster.add_links(rows)

    def period_nodes(self, cluster: ClusterGraph) -> int | None:
        """Whole leaves of nodes (leaf i onto leaf i + 1, a spine's links along), enough of them
        that D-mod-k picks the same spine (the destination NIC's index moves by a multiple of
        the spines); one node on one switch; None under ECMP (a hash of the NIC names) or
        with a partly filled leaf."""
        n, policy = cluster.n_nodes, cluster.transport.multipath
        if type(self).build not in _OWN_BUILDS:  # a subclass wiring its own way: layout unknown
            return None
        if self._first_cable is None or not self._spine_count:
            return 1 if self._first_cable is not None else None
        per_leaf = min(self._per_leaf, n)  # one leaf (per rail) holding every node: any shift keeps it
        if policy == "ecmp" or n % per_leaf:
            return None
        nics, spines = cluster.node_type.nics.count, self._spine_count
        period = per_leaf * (1 if policy == "spray" else spines // math.gcd(per_leaf * nics, spines))
        return period if n % period == 0 else None

    def shift_links(self, cluster: ClusterGraph, ids: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """Cables follow their node; a leaf-spine link moves by whole leaves (ids as built:
        each NIC's up and down cable, node by node or rail by rail; each leaf's links to its
        spines, up and down, leaf by leaf)."""
        assert self._first_cable is not None
        n, nics = cluster.n_nodes, cluster.node_type.nics.count
        out = ids.copy()
        offset = ids - self._first_cable
        cable = (offset >= 0) & (offset < 2 * n * nics)
        pair, way = np.divmod(offset[cable], 2)
        moved = nodes[cable]
        if self._rail_major:
            rail, node = np.divmod(pair, n)
            out[cable] = self._first_cable + 2 * (rail * n + (node + moved) % n) + way
        else:
            node, nic = np.divmod(pair, nics)
            out[cable] = self._first_cable + 2 * (((node + moved) % n) * nics + nic) + way
        spine = ~cable
        if spine.any():
            pair, way = np.divmod(ids[spine] - self._first_spine, 2)
            leaf, index = np.divmod(pair, self._spine_count)
            groups = self._leaves // nics if self._rail_major else self._leaves  # leaves per rail
            rail, leaf = np.divmod(leaf, groups)
            leaf = (leaf + nodes[spine] // self._per_leaf) % groups
            out[spine] = self._first_spine + 2 * ((rail * groups + leaf) * self._spine_count + index) + way
        return out

    def bisection_estimate_bytes_per_s(self, cluster: ClusterGraph, node_nic_bytes_per_s: float) -> float:
        """Half the nodes' NIC bandwidth, reduced by the oversubscription."""
        half = cluster.n_nodes // 2
        return half * node_nic_bytes_per_s / getattr(self.spec, "oversubscription", 1.0)

    # -- routing ---------------------------------------------------------------------------

    def _nic(self, cluster: ClusterGraph, node: int, nic: int) -> tuple[int, int, str]:
        """(uplink id, downlink id, leaf) of a NIC, cached."""
        key = (node, nic)
        found = self._nic_cache.get(key)
        if found is None:
            name = f"n{node}.nic{nic}"
            leaf = self.nic_leaf[name]
            found = self._nic_cache[key] = (cluster.link_id(name, leaf), cluster.link_id(leaf, name), leaf)
        return found

    def _spines(self, cluster: ClusterGraph, leaf_a: str, leaf_b: str) -> list[tuple[int, int]]:
        """(leaf_a -> spine, spine -> leaf_b) link ids for every spine, cached per leaf pair."""
        key = (leaf_a, leaf_b)
        found = self._spine_cache.get(key)
        if found is None:
            found = self._spine_cache[key] = [(cluster.link_id(leaf_a, sp), cluster.link_id(sp, leaf_b))
                                              for sp in self.leaf_spines[leaf_a]]
        return found

    def _spine_pair(self, cluster: ClusterGraph, leaf_a: str, leaf_b: str, index: int) -> tuple[int, int]:
        """(leaf_a -> spine, spine -> leaf_b) link ids through leaf_a's ``index``-th spine: the
        ``index``-th entry of :meth:`_spines` without listing every spine of the pair."""
        ups = self._up_cache.get(leaf_a)
        if ups is None:
            ups = self._up_cache[leaf_a] = [cluster.link_id(leaf_a, sp) for sp in self.leaf_spines[leaf_a]]
        spine = self.leaf_spines[leaf_a][index]
        downs = self._down_cache.setdefault(leaf_b, {})
        down = downs.get(spine)
        if down is None:
            down = downs[spine] = cluster.link_id(spine, leaf_b)
        return ups[index], down

    def paths(self, cluster: ClusterGraph, src: NicRef, dst: NicRef, flow: int, seed: int) -> list[FabricPath]:
        nic_cache = self._nic_cache
        up, _, leaf_a = nic_cache.get(src) or self._nic(cluster, src[0], src[1])
        _, down, leaf_b = nic_cache.get(dst) or self._nic(cluster, dst[0], dst[1])
        if leaf_a == leaf_b:
            return [([up, down], 1.0)]
        policy = cluster.transport.multipath
        if cluster.dead_links:  # failed uplinks: traffic takes the spines still reachable both ways
            spines = [(a, b) for a, b in self._spines(cluster, leaf_a, leaf_b)
                      if a not in cluster.dead_links and b not in cluster.dead_links]
            if not spines:
                return []
            if policy == "spray":
                return [([up, a, b, down], 1.0 / len(spines)) for a, b in spines]
            if policy == "ecmp":
                key = f"{src[0]}.{src[1]}>{dst[0]}.{dst[1]}#{flow}@{seed}".encode()
                a, b = spines[zlib.crc32(key) % len(spines)]
            else:
                a, b = spines[(dst[0] * cluster.node_type.nics.count + dst[1]) % len(spines)]
            return [([up, a, b, down], 1.0)]
        if policy == "spray":
            spines = self._spines(cluster, leaf_a, leaf_b)
            share = 1.0 / len(spines)
            return [([up, a, b, down], share) for a, b in spines]
        count = len(self.leaf_spines[leaf_a])
        if policy == "ecmp":
            key = f"{src[0]}.{src[1]}>{dst[0]}.{dst[1]}#{flow}@{seed}".encode()
            index = zlib.crc32(key) % count
        else:  # single: D-mod-k on the destination port (the destination NIC's global index)
            index = (dst[0] * cluster.node_type.nics.count + dst[1]) % count
        ups = self._up_cache.get(leaf_a)
        downs = self._down_cache.get(leaf_b)
        if ups is None or downs is None or self.leaf_spines[leaf_a][index] not in downs:
            a, b = self._spine_pair(cluster, leaf_a, leaf_b, index)
        else:  # both links known: _spine_pair's answer without the call
            a, b = ups[index], downs[self.leaf_spines[leaf_a][index]]
        return [([up, a, b, down], 1.0)]


@register_fabric("single-switch")
class SingleSwitch(LeafSpineFabric):
    """Every NIC on one non-blocking switch (small clusters, or an idealised fabric).

    ::

        node0.nic* ──┐
        node1.nic* ──┼── switch
        nodeN.nic* ──┘
    """

    def build(self, cluster: ClusterGraph) -> None:
        if cluster.n_nodes == 1:
            return
        cluster.add_vertex(Vertex("switch", "switch", None, "switch"))
        self._cable(cluster, [(nic, "switch", None, node) for node in range(cluster.n_nodes)
                              for nic in cluster.nics_of_node(node)])


@register_fabric("fat-tree")
class FatTree(LeafSpineFabric):
    """Two-level leaf/spine Clos: nodes under leaf switches, every leaf linked to every spine.

    ::

                  spine0   spine1  ...  spineS        uplink capacity per leaf =
                  ╱    ╲  ╱    ╲                      downlink capacity / oversubscription
              leaf0      leaf1      ...  leafL
             ╱  │  ╲    ╱  │  ╲
          node0 ...    nodeK ...                      all NICs of a node on its leaf
    """

    def build(self, cluster: ClusterGraph) -> None:
        nics = cluster.node_type.nics.count
        per_leaf, n_leaves, spines = self._geometry(cluster, nics)
        self._per_leaf = per_leaf
        leaves = [f"leaf{i}" for i in range(n_leaves)]
        for leaf in leaves:
            cluster.add_vertex(Vertex(leaf, "leaf", None, leaf))
        self._cable(cluster, [(nic, leaves[node // per_leaf], None, node) for node in range(cluster.n_nodes)
                              for nic in cluster.nics_of_node(node)])
        if n_leaves > 1:
            bw, _, _ = nic_params(cluster)
            self._add_spines(cluster, leaves, per_leaf * nics * bw, spines)


@register_fabric("rail-optimized")
class RailOptimized(LeafSpineFabric):
    """NIC i of every node on rail-leaf i (NVIDIA's rail-optimised design); spines join rails.

    ::

              spine0  ...  spineS                 same-rail traffic: one leaf hop;
             ╱     ╲      ╱     ╲                 cross-rail traffic: through a spine
        rail0.leaf0  rail1.leaf0  ... railR.leaf0
          │  │  │      │  │  │
        n0.nic0 n1.nic0 n0.nic1 n1.nic1 ...
    """

    def build(self, cluster: ClusterGraph) -> None:
        nics = cluster.node_type.nics.count
        per_leaf, n_groups, spines = self._geometry(cluster, 1)
        self._per_leaf, self._rail_major = per_leaf, True
        bw, _, _ = nic_params(cluster)
        all_leaves: list[str] = []
        for rail in range(nics):
            leaves = [f"rail{rail}.leaf{g}" for g in range(n_groups)]
            for leaf in leaves:
                cluster.add_vertex(Vertex(leaf, "leaf", None, leaf))
            self._cable(cluster, [(f"n{node}.nic{rail}", leaves[node // per_leaf], rail, node)
                                  for node in range(cluster.n_nodes)])
            all_leaves += leaves
        if len(all_leaves) > 1:
            self._add_spines(cluster, all_leaves, per_leaf * bw, spines)


# the builds whose cable and spine-link layout :meth:`LeafSpineFabric.shift_links` reads
_OWN_BUILDS = (FatTree.build, RailOptimized.build, SingleSwitch.build)
