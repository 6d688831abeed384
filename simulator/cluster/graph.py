"""The cluster graph: vertices (GPUs, switches, NICs, CPUs) and directed links.

A :class:`ClusterGraph` keeps its links in a flat list (``links[link_id]``) so the engine
can index loads by integer, plus the vertex metadata the router needs. The networkx
``DiGraph`` view (``cluster.graph``, every edge carrying its :class:`Link` as attribute
``link``) is built on first use, for analysis (bisection bandwidth) and for users.

Vertex names: ``n{node}.gpu{i}``, ``n{node}.nvsw``, ``n{node}.pcie{k}``, ``n{node}.cpu{s}``,
``n{node}.nic{j}``; fabric switches ``leaf{i}``, ``spine{j}``, ``rail{r}.leaf{g}``, ``switch``, ``torus{node}``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import networkx as nx
import numpy as np

from simulator.catalog import GpuSpec, LinkKind, NcclConstants, NodeTypeSpec, TransportSpec
from simulator.cluster.links import Link, LinkTable, Vertex, VertexKind, VertexTable, split_name
from simulator.scenario.fabric import FabricSpec

__all__ = ["Link", "Vertex", "ClusterGraph", "VertexKind", "ScaleOut", "LinkRow"]

# one direction of a link to add: (src, dst, kind, bandwidth B/s, efficiency, latency s, tier,
# rail, owning node): :meth:`ClusterGraph.add_links`
LinkRow = tuple[str, str, LinkKind, float, float, float, str, int | None, int | None]

@dataclass
class ClusterGraph:
    """Vertices, links and the per-GPU facts the rest of the simulator asks for."""

    node_type: NodeTypeSpec
    gpu: GpuSpec
    n_nodes: int
    gpus_per_node: int
    transport_kind: str
    transport: TransportSpec
    fabric: FabricSpec
    pcie_transport: TransportSpec  # PCIe efficiency and switch latency (the catalog's "pcie" entry)
    nccl: NcclConstants  # NCCL's cost-model constants from the catalog the cluster was built with
    vertices: dict[str, Vertex] | VertexTable = field(default_factory=dict)
    links: list[Link] | LinkTable = field(default_factory=list)
    _out: dict[str, list[int]] = field(default_factory=dict)
    _pair: dict[tuple[str, str], int] = field(default_factory=dict)
    _node_slots: dict[int, int] = field(default_factory=dict)
    # the built scale-out fabric (its own wiring state and NIC-to-NIC routing); None until built
    scale_out: ScaleOut | None = None
    description: str = ""
    # extra latency per intra-node collective step, on top of NCCL's hop constants; set from a
    # measured profile's comm fits (simulator.cluster.comm_profile), 0 without one
    intra_hop_latency_s: float = 0.0
    # links a fault failed (bandwidth 0: routes avoid them) and nodes with a perturbed link
    # (their internal routes are computed on their own links); simulator/cluster/faults.py
    dead_links: set[int] = field(default_factory=set)
    perturbed_nodes: set[int] = field(default_factory=set)
    # nodes held as copies of node 0 (:meth:`replicate_nodes`): node 0's out-lists and pair
    # index by local name, each later node's links added after the interiors (NIC cables) by
    # slot, and the first slot after the interior; None / empty / 0 when every node is built
    _template_out: dict[str, list[int]] | None = None
    _template_pair: dict[tuple[str, str], int] | None = None
    _tail_of_node: dict[int, list[int]] = field(default_factory=dict)
    _first_slot: int = 0
    _by_node: dict[int, list[int]] | None = None  # node -> its link ids by slot (built graphs)

    # -- construction --------------------------------------------------------------------

    def add_vertex(self, vertex: Vertex) -> None:
        self.vertices[vertex.name] = vertex
        self._out.setdefault(vertex.name, [])

    def add_link(
        self,
        src: str,
        dst: str,
        *,
        kind: LinkKind,
        bandwidth_bytes_per_s: float,
        efficiency: float,
        latency_s: float,
        tier: str,
        rail: int | None = None,
        both_ways: bool = True,
        reverse_tier: str | None = None,
    ) -> None:
        vertices = self.vertices
        if isinstance(vertices, VertexTable):
            owner = vertices.node_of(src)
            if owner is None:
                owner = vertices.node_of(dst)
        else:
            owner = vertices[src].node
            if owner is None:
                owner = vertices[dst].node
        self._add_one(src, dst, kind, bandwidth_bytes_per_s, efficiency, latency_s, tier, rail, owner)
        if both_ways:
            self._add_one(dst, src, kind, bandwidth_bytes_per_s, efficiency, latency_s, reverse_tier or tier, rail,
                          owner)

    def _add_one(self, a: str, b: str, kind: LinkKind, bandwidth: float, efficiency: float, latency: float,
                 tier: str, rail: int | None, owner: int | None) -> None:
        slot = 0
        link_id = len(self.links)
        if owner is not None:
            slot = self._node_slots.get(owner, self._first_slot)
            self._node_slots[owner] = slot + 1
            if self._template_out is not None:
                self._tail_of_node.setdefault(owner, []).append(link_id)
        self.links.append(Link(link_id, a, b, kind, bandwidth, efficiency, latency, tier, rail, owner, slot))
        self._out.setdefault(a, []).append(link_id)
        self._pair[(a, b)] = link_id

    def add_links(self, rows: Iterable[LinkRow]) -> None:
        """Add one direction of a link per row, in order: what :meth:`add_link` with
        ``both_ways=False`` adds for each, the owning node given by the caller (a fabric cabling
        thousands of NICs, without looking each end up)."""
        links, out, pair, slots = self.links, self._out, self._pair, self._node_slots
        first, tails = self._first_slot, self._tail_of_node if self._template_out is not None else None
        link_id = len(links)
        append = links.tail.append if isinstance(links, LinkTable) else links.append
        make = tuple.__new__  # Link(...) without its generated __new__'s argument handling: the same tuple
        for a, b, kind, bandwidth, efficiency, latency, tier, rail, owner in rows:
            slot = 0
            if owner is not None:
                slot = slots.get(owner, first)
                slots[owner] = slot + 1
                if tails is not None:
                    tails.setdefault(owner, []).append(link_id)
            append(make(Link, (link_id, a, b, kind, bandwidth, efficiency, latency, tier, rail, owner, slot)))
            out.setdefault(a, []).append(link_id)
            pair[(a, b)] = link_id
            link_id += 1

    def copy_node(self, vertices: list[Vertex], links: list[Link], node: int) -> None:
        """Add node ``node`` as a copy of a built node's ``vertices`` and ``links`` (in the
        order they were added; their names all start with that node's prefix, ``n{k}.``):
        the same vertices, links, slots and order as building it again, at a fraction of the
        cost (a 16,384-GPU cluster has 2,048 identical nodes)."""
        if not vertices:
            return
        cut = vertices[0].name.index(".") + 1
        prefix = f"n{node}."
        out = self._out
        for v in vertices:
            name = prefix + v.name[cut:]
            self.vertices[name] = Vertex(name, v.kind, node, v.local, v.socket, v.switch)
            out.setdefault(name, [])
        link_id = len(self.links)
        append, pair = self.links.append, self._pair
        for k in links:
            a, b = prefix + k.src[cut:], prefix + k.dst[cut:]
            append(Link(link_id, a, b, k.kind, k.bandwidth_bytes_per_s, k.efficiency, k.latency_s, k.tier, k.rail,
                        node, k.slot))
            out[a].append(link_id)
            pair[(a, b)] = link_id
            link_id += 1
        if links:
            self._node_slots[node] = links[-1].slot + 1

    def replicate_nodes(self, n_nodes: int) -> None:
        """Hold nodes 0 .. ``n_nodes``-1 as copies of node 0 without building them
        (:mod:`simulator.cluster.links`): the same links, ids, names, slots and vertices as
        :meth:`copy_node` into every node gives, derived on demand. Only node interiors may
        have been built so far, node 0's first (ids 0 .. L-1), and every node must be node 0
        renamed (``builders._renamed``); links added later follow the interiors."""
        n_first = self._node_slots.get(0, 0)
        template = list(self.links[:n_first])
        if any(link.node != 0 for link in template) or any(link.node is None for link in self.links):
            raise ValueError("replicate_nodes needs node interiors only, node 0's first")
        vertices = [v for v in self.vertices.values() if v.node == 0]
        self._template_out = {v.local: list(self._out[v.name]) for v in vertices}
        self._template_pair = {(a[3:], b[3:]): i for (a, b), i in self._pair.items() if i < n_first}
        self.links = LinkTable(template, n_nodes)
        self.vertices = VertexTable(vertices, n_nodes)
        self._out, self._pair, self._node_slots = {}, {}, {}
        self._first_slot = n_first

    @property
    def replicated(self) -> bool:
        """Whether node interiors are held as copies of node 0 (:meth:`replicate_nodes`)."""
        return self._template_out is not None

    # -- queries -------------------------------------------------------------------------

    @property
    def fabric_kind(self) -> str:
        return self.fabric.kind

    @property
    def world_size(self) -> int:
        return self.n_nodes * self.gpus_per_node

    def gpu_vertex(self, gpu_index: int) -> str:
        node, local = divmod(gpu_index, self.gpus_per_node)
        return f"n{node}.gpu{local}"

    def node_of(self, gpu_index: int) -> int:
        return gpu_index // self.gpus_per_node

    def _pair_id(self, src: str, dst: str) -> int | None:
        found = self._pair.get((src, dst))
        if found is None and self._template_pair is not None:  # inside a replicated node
            a, b = split_name(src), split_name(dst)
            if a is not None and b is not None and a[0] == b[0] and 0 <= a[0] < self.n_nodes:
                local = self._template_pair.get((a[1], b[1]))
                if local is not None:
                    found = a[0] * self._first_slot + local
        return found

    def link_between(self, src: str, dst: str) -> Link | None:
        link_id = self._pair_id(src, dst)
        return None if link_id is None else self.links[link_id]

    def link_id(self, src: str, dst: str) -> int:
        """Id of the link from ``src`` to ``dst`` (KeyError when there is none)."""
        found = self._pair_id(src, dst)
        if found is None:
            raise KeyError((src, dst))
        return found

    def out_links(self, vertex: str) -> list[Link]:
        ids = self._out.get(vertex, [])
        if self._template_out is not None:
            where = split_name(vertex)
            if where is not None and 0 <= where[0] < self.n_nodes and where[1] in self._template_out:
                base = where[0] * self._first_slot
                ids = [base + i for i in self._template_out[where[1]]] + ids
        return [self.links[i] for i in ids]

    def node_link_ids(self, node: int) -> list[int]:
        """The ids of ``node``'s links (its interior and its NIC cables), indexed by slot:
        equal slots are the same link on every node."""
        if self._template_out is not None:
            base = node * self._first_slot
            return [base + s for s in range(self._first_slot)] + self._tail_of_node.get(node, [])
        if self._by_node is None:  # once, when every link has been added
            by_node: dict[int, dict[int, int]] = {}
            for link in self.links:
                if link.node is not None:
                    by_node.setdefault(link.node, {})[link.slot] = link.id
            self._by_node = {n: [slots[s] for s in range(len(slots))] for n, slots in by_node.items()}
        return self._by_node.get(node, [])

    def nics_of_node(self, node: int) -> list[str]:
        return [f"n{node}.nic{j}" for j in range(self.node_type.nics.count)]

    @cached_property
    def graph(self) -> nx.DiGraph:
        """A networkx view: vertices carry ``kind``/``node``; edges carry ``link`` and its fields."""
        g = nx.DiGraph()
        for v in self.vertices.values():
            g.add_node(v.name, kind=v.kind, node=v.node)
        for link in self.links:
            g.add_edge(
                link.src,
                link.dst,
                link=link,
                kind=link.kind,
                bandwidth_bytes_per_s=link.bandwidth_bytes_per_s,
                capacity_bytes_per_s=link.capacity_bytes_per_s,
                latency_s=link.latency_s,
            )
        return g


class ScaleOut(Protocol):
    """What the graph keeps of its scale-out fabric (a :class:`simulator.cluster.fabrics.Fabric`):
    the router asks it for paths between NICs, ``dtsim topo`` for its bisection and drawing."""

    def paths(self, cluster: ClusterGraph, src: tuple[int, int], dst: tuple[int, int], flow: int,
              seed: int) -> list[tuple[list[int], float]]: ...

    def bisection_estimate_bytes_per_s(self, cluster: ClusterGraph, node_nic_bytes_per_s: float) -> float: ...

    def diagram(self, cluster: ClusterGraph) -> list[str]: ...

    def period_nodes(self, cluster: ClusterGraph) -> int | None: ...

    def shift_links(self, cluster: ClusterGraph, ids: np.ndarray, nodes: np.ndarray) -> np.ndarray: ...
