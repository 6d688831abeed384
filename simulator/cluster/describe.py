"""Summaries of a cluster graph for ``dtsim topo``: link counts, injection and bisection bandwidth."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import networkx as nx

from simulator.cluster.fabrics.torus import neighbours, torus_grid
from simulator.cluster.graph import ClusterGraph

__all__ = ["LinkGroup", "TopologySummary", "summarize", "bisection_bandwidth", "diagram"]


@dataclass(frozen=True)
class LinkGroup:
    kind: str
    tier: str
    count: int
    bandwidth_bytes_per_s: float  # one direction, one link


@dataclass(frozen=True)
class TopologySummary:
    description: str
    gpus: int
    nodes: int
    gpu: str
    switches: int
    links: list[LinkGroup]
    nvlink_per_gpu_bytes_per_s: float
    network_per_gpu_bytes_per_s: float
    pcie_per_gpu_bytes_per_s: float
    bisection_bytes_per_s: float
    bisection_exact: bool
    diagram: tuple[str, ...] = ()  # text drawing of tori (node interior, fabric); empty otherwise


def summarize(cluster: ClusterGraph, *, exact_limit_nodes: int = 64) -> TopologySummary:
    groups: dict[tuple[str, str, float], int] = defaultdict(int)
    for link in cluster.links:
        groups[(link.kind, link.tier, link.bandwidth_bytes_per_s)] += 1
    links = [LinkGroup(k, t, n, bw) for (k, t, bw), n in sorted(groups.items())]
    gpu0 = "n0.gpu0"
    nvlink = sum(link.bandwidth_bytes_per_s for link in cluster.out_links(gpu0) if link.kind in ("nvlink", "neuronlink"))
    pcie = sum(link.bandwidth_bytes_per_s for link in cluster.out_links(gpu0) if link.kind == "pcie")
    nic_bw = sum(link.bandwidth_bytes_per_s for link in cluster.links
                 if link.tier == "nic-up" and link.node == 0)
    network = nic_bw / cluster.gpus_per_node
    exact = cluster.n_nodes <= exact_limit_nodes
    bisection = bisection_bandwidth(cluster) if exact else _bisection_estimate(cluster, nic_bw)
    switches = sum(1 for v in cluster.vertices.values() if v.kind in ("leaf", "spine", "switch", "nvswitch"))
    return TopologySummary(cluster.description, cluster.world_size, cluster.n_nodes, cluster.gpu.name, switches, links,
                           nvlink, network, pcie, bisection, exact, tuple(diagram(cluster)))


def diagram(cluster: ClusterGraph) -> list[str]:
    """Text drawings of the parts that are tori: a torus node interior, a torus fabric."""
    lines: list[str] = []
    intra = cluster.node_type.intra_node
    if intra.kind == "torus" and intra.dims:
        degree = len(neighbours(0, intra.dims))
        lines.append(f"inside each node: {' x '.join(map(str, intra.dims))} torus of {cluster.gpu.name} devices "
                     f"({degree} neighbours each, wraparound, dimension-order routing):")
        lines += torus_grid(intra.dims, "gpu")
    if cluster.scale_out is not None:
        lines += cluster.scale_out.diagram(cluster)
    return lines


def bisection_bandwidth(cluster: ClusterGraph) -> float:
    """Max flow from the first half of the GPUs to the second (by nodes; by GPUs in one node)."""
    g = cluster.graph.copy()
    gpus = [cluster.gpu_vertex(i) for i in range(cluster.world_size)]
    half = len(gpus) // 2
    if cluster.n_nodes > 1:
        half = (cluster.n_nodes // 2) * cluster.gpus_per_node
    if half == 0:
        return 0.0
    for gpu in gpus[:half]:
        g.add_edge("SOURCE", gpu)
    for gpu in gpus[half:]:
        g.add_edge(gpu, "SINK")
    for _, _, data in g.edges(data=True):
        if "bandwidth_bytes_per_s" in data:
            data["capacity"] = data["bandwidth_bytes_per_s"]
    value, _ = nx.maximum_flow(g, "SOURCE", "SINK", capacity="capacity")
    return float(value)


def _bisection_estimate(cluster: ClusterGraph, node_nic_bw: float) -> float:
    """Large fabrics: the fabric's own estimate (a switched fabric: half the nodes' NIC
    bandwidth, reduced by the oversubscription)."""
    if cluster.scale_out is None:
        return (cluster.n_nodes // 2) * node_nic_bw
    return cluster.scale_out.bisection_estimate_bytes_per_s(cluster, node_nic_bw)
