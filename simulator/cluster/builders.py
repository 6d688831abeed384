"""Graph builders: one for each kind of node interior, and the whole cluster.

Each node builder adds vertices and links to a :class:`ClusterGraph`; ``NODE_BUILDERS`` is the
registry keyed by the node file's ``intra_node.kind`` tag, so a new kind of node touches two
places: its function here and its tag. Scale-out fabrics live in
:mod:`simulator.cluster.fabrics` (a builder and a router each, registered by ``fabric.kind``).
"""

from __future__ import annotations

from collections.abc import Callable

from simulator import limits
from simulator.catalog import Catalog, default_catalog
from simulator.cluster.comm_profile import apply_comm_profile
from simulator.cluster.fabrics import build_fabric
from simulator.cluster.fabrics.torus import neighbours
from simulator.cluster.graph import ClusterGraph, Link, Vertex
from simulator.scenario.spec import ClusterSpec

__all__ = ["build_cluster", "check_cluster_limits", "NODE_BUILDERS", "INTER_SOCKET_BYTES_PER_S"]

# CPU socket to socket (Intel UPI / AMD xGMI), one direction. Two to three UPI links of
# 10.4 GT/s x 2 bytes (20.8 GB/s each) on the Xeon platforms of these nodes; estimate.
INTER_SOCKET_BYTES_PER_S = 40e9


def _pcie_attach(index: int, count: int, switches: int) -> int:
    """Spread ``count`` devices evenly over ``switches`` (device i -> switch)."""
    if switches <= 0:
        return 0
    if count >= switches:
        return index * switches // count
    return index * (switches // count)


def _add_host(cluster: ClusterGraph, node: int) -> None:
    """CPU sockets, PCIe switches, GPU and NIC attachment: common to every node kind."""
    spec = cluster.node_type
    pcie = spec.pcie
    pcie_bw = pcie.x16_bytes_per_s
    pcie_eff = cluster.pcie_transport.efficiency
    pcie_lat = cluster.pcie_transport.switch_latency_s
    sockets = pcie.cpu_sockets
    n = f"n{node}"
    for s in range(sockets):
        cluster.add_vertex(Vertex(f"{n}.cpu{s}", "cpu", node, f"cpu{s}", socket=s))
    for s in range(1, sockets):
        cluster.add_link(f"{n}.cpu0", f"{n}.cpu{s}", kind="host", bandwidth_bytes_per_s=INTER_SOCKET_BYTES_PER_S,
                         efficiency=pcie_eff, latency_s=pcie_lat, tier="host")
    attach_points: list[str] = []
    if pcie.switches > 0:
        for k in range(pcie.switches):
            socket = k * sockets // pcie.switches
            name = f"{n}.pcie{k}"
            cluster.add_vertex(Vertex(name, "pcie", node, f"pcie{k}", socket=socket, switch=k))
            cluster.add_link(name, f"{n}.cpu{socket}", kind="pcie", bandwidth_bytes_per_s=pcie_bw,
                             efficiency=pcie_eff, latency_s=pcie_lat, tier="pcie-host")
            attach_points.append(name)
    else:
        attach_points = [f"{n}.cpu{s}" for s in range(sockets)]
    gpus = cluster.gpus_per_node
    for i in range(gpus):
        k = _pcie_attach(i, spec.gpus, len(attach_points))
        point = attach_points[k]
        socket = cluster.vertices[point].socket or 0
        cluster.add_vertex(Vertex(f"{n}.gpu{i}", "gpu", node, f"gpu{i}", socket=socket, switch=k))
        cluster.add_link(f"{n}.gpu{i}", point, kind="pcie", bandwidth_bytes_per_s=pcie_bw, efficiency=pcie_eff,
                         latency_s=pcie_lat, tier="pcie")
    nics = spec.nics
    for j in range(nics.count):
        k = _pcie_attach(j, nics.count, len(attach_points))
        point = attach_points[k]
        socket = cluster.vertices[point].socket or 0
        cluster.add_vertex(Vertex(f"{n}.nic{j}", "nic", node, f"nic{j}", socket=socket, switch=k))
        cluster.add_link(f"{n}.nic{j}", point, kind="pcie", bandwidth_bytes_per_s=pcie_bw, efficiency=pcie_eff,
                         latency_s=pcie_lat, tier="pcie-nic")


def build_nvswitch_node(cluster: ClusterGraph, node: int) -> None:
    """8 (or 16) GPUs, each with one NVLink port into a non-blocking NVSwitch fabric.

    ::

        gpu0 ─┐           ┌─ gpu4      every GPU: one link of its full NVLink bandwidth
        gpu1 ─┤  NVSwitch ├─ gpu5      per direction into the switch plane;
        gpu2 ─┤  (nvsw)   ├─ gpu6      GPUs also hang off PCIe switches with the NICs
        gpu3 ─┘           └─ gpu7
    """
    _add_host(cluster, node)
    nvlink = cluster.gpu.nvlink
    assert nvlink is not None, f"{cluster.gpu.name} has no NVLink for an NVSwitch node"
    sw = f"n{node}.nvsw"
    cluster.add_vertex(Vertex(sw, "nvswitch", node, "nvsw"))
    for i in range(cluster.gpus_per_node):
        cluster.add_link(f"n{node}.gpu{i}", sw, kind="nvlink", bandwidth_bytes_per_s=nvlink.bandwidth_bytes_per_s,
                         efficiency=nvlink.nccl_efficiency, latency_s=0.0, tier="nvlink")


def build_nvlink_mesh_node(cluster: ClusterGraph, node: int) -> None:
    """GPUs joined point to point by NVLink bricks (the DGX-1 / p3 hybrid cube mesh).

    ::

        gpu0 ══ gpu3 ─ gpu1          two quads, each fully linked (some pairs with two
          ║  ╲    ╱    ║             bricks); gpu i linked to gpu i+4 across the quads.
        gpu4 ─ gpu7 ══ gpu5          GPUs without a direct link talk over PCIe / the host.
    """
    _add_host(cluster, node)
    intra = cluster.node_type.intra_node
    nvlink = cluster.gpu.nvlink
    assert intra.nvlink_pairs is not None and intra.link_bandwidth_bytes_per_s is not None
    eff = nvlink.nccl_efficiency if nvlink else 0.8
    for a, b, bricks in intra.nvlink_pairs:
        if a >= cluster.gpus_per_node or b >= cluster.gpus_per_node:
            continue
        cluster.add_link(f"n{node}.gpu{a}", f"n{node}.gpu{b}", kind="nvlink",
                         bandwidth_bytes_per_s=bricks * intra.link_bandwidth_bytes_per_s, efficiency=eff,
                         latency_s=0.0, tier="nvlink")


def build_pcie_node(cluster: ClusterGraph, node: int) -> None:
    """GPUs without NVLink: all GPU-to-GPU traffic crosses PCIe switches or the CPU root.

    ::

        gpu0  gpu1  gpu2  gpu3        (g5: GPUs on the CPU root ports; peer traffic
          └─────┴──┬──┴─────┘          goes through the root complex, the NIC too)
                  cpu0 ── nic0
    """
    _add_host(cluster, node)


def build_torus_node(cluster: ClusterGraph, node: int) -> None:
    """Devices on a 2D/3D torus of point-to-point links (AWS trn1: 16 Trainium chips on
    NeuronLink-v2 in a 4 x 4 torus); devices forward traffic for each other, routes follow
    dimension order (:mod:`simulator.cluster.fabrics.torus`).

    ::

        ╔═ gpu0 ══ gpu1 ══ gpu2 ══ gpu3 ═╗     each device linked to its 4 neighbours
           ║       ║       ║       ║           (rows and columns wrap around), one link of
        ╔═ gpu4 ══ gpu5 ══ gpu6 ══ gpu7 ═╗     ``link_bandwidth`` per direction each;
           ...                                 host, PCIe and NICs as on every node
    """
    _add_host(cluster, node)
    intra = cluster.node_type.intra_node
    assert intra.dims is not None and intra.link_bandwidth_bytes_per_s is not None
    eff = intra.link_efficiency or 1.0
    gpus = cluster.gpus_per_node
    for a in range(gpus):
        for b in neighbours(a, intra.dims):
            if a < b < gpus:
                cluster.add_link(f"n{node}.gpu{a}", f"n{node}.gpu{b}", kind="neuronlink",
                                 bandwidth_bytes_per_s=intra.link_bandwidth_bytes_per_s, efficiency=eff,
                                 latency_s=0.0, tier="neuronlink")


NODE_BUILDERS: dict[str, Callable[[ClusterGraph, int], None]] = {
    "nvswitch": build_nvswitch_node,
    "nvlink-mesh": build_nvlink_mesh_node,
    "pcie": build_pcie_node,
    "torus": build_torus_node,
}

def _build_nodes(cluster: ClusterGraph, build_node: Callable[[ClusterGraph, int], None], n_nodes: int,
                 replicated: bool = False) -> None:
    """Every node's interior. Nodes are alike (the router relies on it too): nodes 0 and 1 are
    built, and when node 1 is node 0 renamed, the others are copied from node 0
    (:meth:`ClusterGraph.copy_node`), or with ``replicated`` every node is held as node 0's
    copy without building it (:meth:`ClusterGraph.replicate_nodes`); otherwise each is built."""
    shapes = []
    for node in range(min(2, n_nodes)):
        v0, l0 = len(cluster.vertices), len(cluster.links)
        build_node(cluster, node)
        shapes.append((list(cluster.vertices.values())[v0:], cluster.links[l0:]))
    if replicated and n_nodes > 1 and _renamed(shapes[0], shapes[1]):
        cluster.replicate_nodes(n_nodes)
    elif n_nodes > 2 and _renamed(shapes[0], shapes[1]):
        vertices, links = shapes[0]
        for node in range(2, n_nodes):
            cluster.copy_node(vertices, links, node)
    else:
        for node in range(2, n_nodes):
            build_node(cluster, node)


def _renamed(first: tuple[list[Vertex], list[Link]], second: tuple[list[Vertex], list[Link]]) -> bool:
    """Whether node 1's vertices and links are node 0's under the prefix ``n1.`` (the same
    kinds, rates, tiers, slots, in the same order), every name inside its node."""
    (v0, l0), (v1, l1) = first, second
    if len(v0) != len(v1) or len(l0) != len(l1):
        return False
    for a, b in zip(v0, v1, strict=True):
        if not (a.name.startswith("n0.") and b.name == "n1." + a.name[3:] and a.node == 0 and b.node == 1
                and (a.kind, a.local, a.socket, a.switch) == (b.kind, b.local, b.socket, b.switch)):
            return False
    for x, y in zip(l0, l1, strict=True):
        if not (x.src.startswith("n0.") and x.dst.startswith("n0.") and y.src == "n1." + x.src[3:]
                and y.dst == "n1." + x.dst[3:] and x.node == 0 and y.node == 1 and x[3:9] == y[3:9]
                and x.slot == y.slot):
            return False
    return True


def check_cluster_limits(spec: ClusterSpec) -> None:
    """The cluster within the node and GPU limits (:mod:`simulator.limits`), else a ScenarioError."""
    limits.check("nodes", spec.n_nodes, what="cluster nodes", field="cluster.nodes")
    limits.check("world_size", spec.world_size, what=f"GPUs ({spec.n_nodes:,} nodes x {spec.gpus_in_node} GPUs)",
                 field="cluster.nodes")


def build_cluster(spec: ClusterSpec, catalog: Catalog | None = None, *, replicated: bool = False) -> ClusterGraph:
    """Build the whole cluster graph for a validated :class:`ClusterSpec` (with the intra-node
    links recalibrated when ``spec.calibration`` holds measured collectives). Transports and
    NCCL constants come from ``catalog`` (default: :func:`~simulator.catalog.default_catalog`),
    read once here. ``replicated``: hold identical node interiors once, derived on demand
    (:meth:`ClusterGraph.replicate_nodes`; the same graph, read link by link), for a cluster
    that no fault rewrites."""
    check_cluster_limits(spec)
    catalog = catalog or default_catalog()
    node_type = spec.node_type
    transport_kind = spec.fabric.transport or node_type.nics.transport
    # the node's own NIC variant (p5's EFAv2) unless the scenario swaps the transport
    variant = node_type.nics.transport_variant if transport_kind == node_type.nics.transport else None
    cluster = ClusterGraph(
        node_type=node_type,
        gpu=spec.gpu_spec,
        n_nodes=spec.n_nodes,
        gpus_per_node=spec.gpus_in_node,
        transport_kind=transport_kind,
        transport=catalog.transport(variant or transport_kind),
        fabric=spec.fabric,
        pcie_transport=catalog.transport("pcie"),
        nccl=catalog.nccl,
    )
    _build_nodes(cluster, NODE_BUILDERS[node_type.intra_node.kind], spec.n_nodes, replicated)
    cluster.scale_out = build_fabric(cluster, spec.fabric)
    cluster.description = (
        f"{spec.n_nodes} x {node_type.name} ({spec.gpus_in_node} x {cluster.gpu.name}), "
        f"{transport_kind} {spec.fabric.label}"
    )
    if spec.calibration is not None:  # measured collectives override the intra-node links
        apply_comm_profile(cluster, spec.calibration)
    return cluster
