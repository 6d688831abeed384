"""Tori: points of a 2D or 3D grid, each linked to its neighbours along every dimension, with
wraparound; dimension-order routing.

The pure helpers (coordinates, neighbours, dimension-order hops, a Hamiltonian "snake" order)
serve both the scale-out :class:`Torus` fabric (nodes on a torus, ``fabric: {kind: torus,
dims: [x, y]}``) and node interiors that are tori (16 Trainium chips on NeuronLink in a
trn1.32xlarge, :func:`simulator.cluster.builders.build_torus_node`).

Points are numbered row-major: for dims ``[x, y]`` point ``i`` sits at ``(i // y, i % y)``.
Dimension-order routing moves along dimension 0 until its coordinate matches, then dimension 1,
..., each time the shorter way round the ring (the positive direction on a tie).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from simulator.cluster.fabrics.base import Fabric, FabricPath, NicRef, add_nic_link, nic_params, register_fabric
from simulator.cluster.graph import ClusterGraph, Vertex

__all__ = ["Torus", "coords_of", "index_of", "neighbours", "dimension_order_hops", "snake_order", "torus_grid"]


def coords_of(index: int, dims: Sequence[int]) -> tuple[int, ...]:
    """Row-major coordinates of point ``index`` (the last dimension varies fastest)."""
    out = []
    for size in reversed(dims):
        index, c = divmod(index, size)
        out.append(c)
    return tuple(reversed(out))


def index_of(coords: Sequence[int], dims: Sequence[int]) -> int:
    index = 0
    for c, size in zip(coords, dims, strict=True):
        index = index * size + c % size
    return index


def neighbours(index: int, dims: Sequence[int]) -> list[int]:
    """Distinct neighbours of a point: +1 and -1 along each dimension, wrapping around (a
    dimension of size 2 gives one neighbour, of size 1 none)."""
    here = coords_of(index, dims)
    out: list[int] = []
    for d, size in enumerate(dims):
        for step in (1, -1):
            c = list(here)
            c[d] = (c[d] + step) % size
            j = index_of(c, dims)
            if j != index and j not in out:
                out.append(j)
    return out


def dimension_order_hops(src: int, dst: int, dims: Sequence[int]) -> list[int]:
    """The points visited after ``src`` on the dimension-order route to ``dst`` (ends with dst)."""
    here = list(coords_of(src, dims))
    goal = coords_of(dst, dims)
    hops: list[int] = []
    for d, size in enumerate(dims):
        forward = (goal[d] - here[d]) % size
        step = 1 if forward <= size - forward else -1
        while here[d] != goal[d]:
            here[d] = (here[d] + step) % size
            hops.append(index_of(here, dims))
    return hops


def snake_order(dims: Sequence[int]) -> list[int]:
    """A boustrophedon visit of every point (row 0 forward, row 1 backward, ...): consecutive
    points are neighbours, and the last is a wraparound neighbour of the first when dims[0] is
    even, so rings laid out in this order use torus links only."""
    if len(dims) == 1:
        return list(range(dims[0]))
    inner = snake_order(dims[1:])
    block = math.prod(dims[1:])
    order: list[int] = []
    for i in range(dims[0]):
        order += [i * block + j for j in (inner if i % 2 == 0 else inner[::-1])]
    return order


def torus_grid(dims: Sequence[int], name: str) -> list[str]:
    """Text drawing of a 2D torus of ``name{i}`` points (3D: one grid per plane)."""
    if len(dims) == 3:
        block = dims[1] * dims[2]
        lines: list[str] = []
        for plane in range(dims[0]):
            lines.append(f"plane {plane} of {dims[0]} (planes joined point to point, wrapping):")
            lines += _grid2(dims[1:], name, plane * block)
        return lines
    return _grid2(dims, name, 0)


def _grid2(dims: Sequence[int], name: str, base: int) -> list[str]:
    rows, cols = (dims[0], dims[1]) if len(dims) == 2 else (1, dims[0])
    width = max(len(f"{name}{base + rows * cols - 1}"), 3)
    lines = []
    for r in range(rows):
        cells = [f"{name}{base + r * cols + c}".center(width) for c in range(cols)]
        lines.append("╔═ " + " ══ ".join(cells) + " ═╗ (row wraps)")
        if r < rows - 1:
            lines.append("   " + "    ".join("║".center(width) for _ in range(cols)))
    lines.append("   " + "    ".join("↕".center(width) for _ in range(cols)) + "   (columns wrap)")
    return lines


@register_fabric("torus")
class Torus(Fabric):
    """Nodes on a 2D/3D torus (``dims``), each with a router that its NICs are cabled to.

    ::

        ┌──────────────────────────────┐      every router linked to its 2 x len(dims)
        └─ t0 ══ t1 ══ t2 ══ t3 ──┘    │      neighbours (wraparound); a NIC reaches the
           ║     ║     ║     ║         │      fabric through its node's router; routes go
           t4 ══ t5 ══ t6 ══ t7  ...  ─┘      dimension 0 first, then 1 (then 2)

    Link bandwidth, one direction: ``link_bandwidth``, else the node's NIC bandwidth divided
    over its 2 x len(dims) torus ports (injection = the sum of the ports). Each router hop
    costs the transport's switch latency; the transport's message latency is charged once on
    the sending NIC's uplink, as in the switched fabrics.
    """

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self.nic_link: dict[NicRef, tuple[int, int]] = {}  # (node, nic) -> (uplink, downlink)

    @property
    def dims(self) -> list[int]:
        return list(self.spec.dims)

    @staticmethod
    def router(node: int) -> str:
        return f"torus{node}"

    def link_bandwidth_bytes_per_s(self, cluster: ClusterGraph) -> float:
        if self.spec.link_bandwidth_bytes_per_s:
            return float(self.spec.link_bandwidth_bytes_per_s)
        bw, _, _ = nic_params(cluster)
        return bw * cluster.node_type.nics.count / (2 * len(self.dims))

    def build(self, cluster: ClusterGraph) -> None:
        if math.prod(self.dims) != cluster.n_nodes:
            raise ValueError(f"a torus of dims {self.dims} holds {math.prod(self.dims)} nodes, not {cluster.n_nodes}")
        for node in range(cluster.n_nodes):
            name = self.router(node)
            cluster.add_vertex(Vertex(name, "switch", None, name))
        for node in range(cluster.n_nodes):
            for j, nic in enumerate(cluster.nics_of_node(node)):
                self.nic_link[(node, j)] = add_nic_link(cluster, nic, self.router(node), None)
        _, eff, _ = nic_params(cluster)
        bw = self.link_bandwidth_bytes_per_s(cluster)
        for node in range(cluster.n_nodes):
            for other in neighbours(node, self.dims):
                a, b = self.router(node), self.router(other)
                if cluster.link_between(a, b) is None:
                    cluster.add_link(a, b, kind=cluster.transport_kind,  # type: ignore[arg-type]
                                     bandwidth_bytes_per_s=bw, efficiency=eff,
                                     latency_s=cluster.transport.switch_latency_s, tier="torus")

    def paths(self, cluster: ClusterGraph, src: NicRef, dst: NicRef, flow: int, seed: int) -> list[FabricPath]:
        up, _ = self.nic_link[src]
        _, down = self.nic_link[dst]
        links = [up]
        here = src[0]
        for nxt in dimension_order_hops(src[0], dst[0], self.dims):
            links.append(cluster.link_id(self.router(here), self.router(nxt)))
            here = nxt
        links.append(down)
        return [(links, 1.0)]

    def bisection_estimate_bytes_per_s(self, cluster: ClusterGraph, node_nic_bytes_per_s: float) -> float:
        """Cut across the largest dimension: N / d links cross each of the two cuts (one cut
        when d = 2, where the wraparound link is the same link)."""
        d = max(self.dims)
        crossing = (cluster.n_nodes // d) * (2 if d > 2 else 1)
        return crossing * self.link_bandwidth_bytes_per_s(cluster)

    def diagram(self, cluster: ClusterGraph) -> list[str]:
        head = (f"scale-out torus {' x '.join(map(str, self.dims))} of node routers, "
                f"{len(neighbours(0, self.dims))} neighbours each, dimension-order routing:")
        return [head, *torus_grid(self.dims, "torus")]
