"""Graph builders: one for each kind of node interior and one for each fabric.

Each builder adds vertices and links to a :class:`ClusterGraph`; ``NODE_BUILDERS`` and
``FABRIC_BUILDERS`` are the registries keyed by the scenario's ``Literal`` tags, so a new
kind of node or fabric touches two places: its function here and its tag.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from simulator.cluster.comm_profile import apply_comm_profile
from simulator.cluster.graph import ClusterGraph, Vertex
from simulator.scenario import hardware
from simulator.scenario.spec import ClusterSpec, FabricSpec

__all__ = ["build_cluster", "NODE_BUILDERS", "FABRIC_BUILDERS", "INTER_SOCKET_BYTES_PER_S"]

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
    pcie_eff = hardware.transport("pcie").efficiency
    pcie_lat = hardware.transport("pcie").switch_latency_s
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


def _nic_params(cluster: ClusterGraph) -> tuple[float, float, float]:
    fabric = cluster.fabric
    nics = cluster.node_type.nics
    bw = fabric.nic_bandwidth_bytes_per_s or nics.bandwidth_bytes_per_s
    same_transport = fabric.transport is None or fabric.transport == nics.transport
    eff = fabric.efficiency or (nics.efficiency if same_transport else None) or cluster.transport.efficiency
    lat = fabric.latency_s if fabric.latency_s is not None else cluster.transport.latency_s
    return bw, eff, lat


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


NODE_BUILDERS: dict[str, Callable[[ClusterGraph, int], None]] = {
    "nvswitch": build_nvswitch_node,
    "nvlink-mesh": build_nvlink_mesh_node,
    "pcie": build_pcie_node,
}

# ----------------------------------------------------------------------------------------
# fabrics


def _nic_link(cluster: ClusterGraph, nic: str, switch: str, rail: int | None) -> None:
    bw, eff, lat = _nic_params(cluster)
    kind = cluster.transport_kind
    # the transport's per-message latency is charged once, on the sending NIC's uplink
    cluster.add_link(nic, switch, kind=kind, bandwidth_bytes_per_s=bw, efficiency=eff,  # type: ignore[arg-type]
                     latency_s=lat + cluster.transport.switch_latency_s, tier="nic-up", rail=rail, both_ways=False)
    cluster.add_link(switch, nic, kind=kind, bandwidth_bytes_per_s=bw, efficiency=eff,  # type: ignore[arg-type]
                     latency_s=0.0, tier="nic-down", rail=rail, both_ways=False)
    cluster.nic_leaf[nic] = switch


def build_single_switch(cluster: ClusterGraph, fabric: FabricSpec) -> None:
    """Every NIC on one non-blocking switch (small clusters, or an idealised fabric).

    ::

        node0.nic* ──┐
        node1.nic* ──┼── switch
        nodeN.nic* ──┘
    """
    if cluster.n_nodes == 1:
        return
    cluster.add_vertex(Vertex("switch", "switch", None, "switch"))
    for node in range(cluster.n_nodes):
        for nic in cluster.nics_of_node(node):
            _nic_link(cluster, nic, "switch", None)


def _leaf_geometry(cluster: ClusterGraph, fabric: FabricSpec, nics_per_node_per_leaf: int) -> tuple[int, int, int]:
    down_ports = max(1, fabric.switch_radix // 2)
    per_leaf = fabric.nodes_per_leaf or max(1, down_ports // max(1, nics_per_node_per_leaf))
    leaves = math.ceil(cluster.n_nodes / per_leaf)
    spines = fabric.spines or down_ports
    return per_leaf, leaves, spines


def _add_spines(cluster: ClusterGraph, fabric: FabricSpec, leaves: list[str], down_bw: float, spines: int,
                rail: int | None = None) -> None:
    """Connect each leaf to every spine; uplinks carry down_bw / oversubscription in total."""
    _, eff, _ = _nic_params(cluster)
    kind = cluster.transport_kind
    up_each = down_bw / fabric.oversubscription / spines
    names = [f"spine{j}" for j in range(spines)]
    for name in names:
        if name not in cluster.vertices:
            cluster.add_vertex(Vertex(name, "spine", None, name))
    for leaf in leaves:
        for name in names:
            cluster.add_link(leaf, name, kind=kind, bandwidth_bytes_per_s=up_each, efficiency=eff,  # type: ignore[arg-type]
                             latency_s=cluster.transport.switch_latency_s, tier="leaf-up", reverse_tier="spine-down",
                             rail=rail)
        cluster.leaf_spines[leaf] = names


def build_fat_tree(cluster: ClusterGraph, fabric: FabricSpec) -> None:
    """Two-level leaf/spine Clos: nodes under leaf switches, every leaf linked to every spine.

    ::

                  spine0   spine1  ...  spineS        uplink capacity per leaf =
                  ╱    ╲  ╱    ╲                      downlink capacity / oversubscription
              leaf0      leaf1      ...  leafL
             ╱  │  ╲    ╱  │  ╲
          node0 ...    nodeK ...                      all NICs of a node on its leaf
    """
    nics = cluster.node_type.nics.count
    per_leaf, n_leaves, spines = _leaf_geometry(cluster, fabric, nics)
    leaves = [f"leaf{i}" for i in range(n_leaves)]
    for leaf in leaves:
        cluster.add_vertex(Vertex(leaf, "leaf", None, leaf))
    for node in range(cluster.n_nodes):
        for nic in cluster.nics_of_node(node):
            _nic_link(cluster, nic, leaves[node // per_leaf], None)
    if n_leaves > 1:
        bw, _, _ = _nic_params(cluster)
        _add_spines(cluster, fabric, leaves, per_leaf * nics * bw, spines)


def build_rail_optimized(cluster: ClusterGraph, fabric: FabricSpec) -> None:
    """NIC i of every node on rail-leaf i (NVIDIA's rail-optimised design); spines join rails.

    ::

              spine0  ...  spineS                 same-rail traffic: one leaf hop;
             ╱     ╲      ╱     ╲                 cross-rail traffic: through a spine
        rail0.leaf0  rail1.leaf0  ... railR.leaf0
          │  │  │      │  │  │
        n0.nic0 n1.nic0 n0.nic1 n1.nic1 ...
    """
    nics = cluster.node_type.nics.count
    per_leaf, n_groups, spines = _leaf_geometry(cluster, fabric, 1)
    bw, _, _ = _nic_params(cluster)
    all_leaves: list[str] = []
    for rail in range(nics):
        leaves = [f"rail{rail}.leaf{g}" for g in range(n_groups)]
        for leaf in leaves:
            cluster.add_vertex(Vertex(leaf, "leaf", None, leaf))
        for node in range(cluster.n_nodes):
            _nic_link(cluster, f"n{node}.nic{rail}", leaves[node // per_leaf], rail)
        all_leaves += leaves
    if len(all_leaves) > 1:
        _add_spines(cluster, fabric, all_leaves, per_leaf * bw, spines)


FABRIC_BUILDERS: dict[str, Callable[[ClusterGraph, FabricSpec], None]] = {
    "single-switch": build_single_switch,
    "fat-tree": build_fat_tree,
    "rail-optimized": build_rail_optimized,
}


def build_cluster(spec: ClusterSpec) -> ClusterGraph:
    """Build the whole cluster graph for a validated :class:`ClusterSpec` (with the intra-node
    links recalibrated when ``spec.calibration`` holds measured collectives)."""
    node_type = spec.node_type
    transport_kind = spec.fabric.transport or node_type.nics.transport
    cluster = ClusterGraph(
        node_type=node_type,
        gpu=spec.gpu_spec,
        n_nodes=spec.n_nodes,
        gpus_per_node=spec.gpus_in_node,
        transport_kind=transport_kind,
        transport=hardware.transport(transport_kind),
        fabric=spec.fabric,
    )
    build_node = NODE_BUILDERS[node_type.intra_node.kind]
    for node in range(spec.n_nodes):
        build_node(cluster, node)
    FABRIC_BUILDERS[spec.fabric.kind](cluster, spec.fabric)
    cluster.description = (
        f"{spec.n_nodes} x {node_type.name} ({spec.gpus_in_node} x {cluster.gpu.name}), "
        f"{transport_kind} {spec.fabric.kind}"
        + (f" {spec.fabric.oversubscription:g}:1" if spec.fabric.oversubscription != 1 else "")
    )
    if spec.calibration is not None:  # measured collectives override the intra-node links
        apply_comm_profile(cluster, spec.calibration)
    return cluster
