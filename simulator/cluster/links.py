"""Links and vertices of the cluster graph, and node interiors held once.

:class:`Link` and :class:`Vertex` are the graph's records (re-exported by
:mod:`simulator.cluster.graph`). A 16,384-GPU cluster of DGX A100 holds 2,048 identical node interiors (58 links and 17
vertices each: 118,784 links). When node 1 is node 0 renamed (``builders._renamed``), the
graph can keep node 0's interior as a *template* and derive any node's from it on demand:
node ``k``'s link of slot ``s`` is link id ``k * L + s`` (L = links per interior), named
``n{k}.`` + the template's name after ``n0.``, with the template's kind, rates, latency,
tier and rail. That is exactly the id, name and fields that copying node 0 into every node
gives (:meth:`simulator.cluster.graph.ClusterGraph.copy_node`), so every route, plan and
load computed on a replicated graph is the one computed on the copied graph, to the bit
(``tests/test_cluster_replicated.py``).

Links added after the interiors (the scale-out fabric's NIC cables and switch links) are
kept in a plain list after them (:class:`LinkTable` ``tail``), and vertices added after them
in a plain dict (:class:`VertexTable` ``extra``).

Reading every link or vertex (iteration, ``len``) still works: it derives each in id order
(the order the copied graph lists them in); the simulate path never needs that
(:class:`simulator.engine.LinkClasses` and the router derive what they need from the
template), :mod:`simulator.cluster.describe` and the networkx view do.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping
from typing import Literal, NamedTuple, overload

import numpy as np

from simulator.catalog import LinkKind

__all__ = ["Link", "Vertex", "VertexKind", "LinkTable", "VertexTable", "split_name"]

VertexKind = Literal["gpu", "nvswitch", "pcie", "cpu", "nic", "leaf", "spine", "switch"]


class Link(NamedTuple):
    """One direction of a physical link (a named tuple: hundreds of thousands are built).

    ``capacity_bytes_per_s`` is what NCCL-style traffic can use: the line rate times the
    transport's efficiency (protocol overhead). ``tier`` groups links of the same role
    (``nvlink``, ``pcie``, ``host``, ``nic-up``, ``nic-down``, ``leaf-up``, ``spine-down``).
    """

    id: int
    src: str
    dst: str
    kind: LinkKind
    bandwidth_bytes_per_s: float
    efficiency: float
    latency_s: float
    tier: str
    rail: int | None = None
    node: int | None = None  # owning node (node-internal and NIC links); None for switch-to-switch
    slot: int = 0  # position among its node's links: equal slots are the same link on every node

    @property
    def capacity_bytes_per_s(self) -> float:
        return self.bandwidth_bytes_per_s * self.efficiency


class Vertex(NamedTuple):
    name: str
    kind: VertexKind
    node: int | None  # the node it belongs to; None for fabric switches
    local: str  # name within the node (``gpu3``), or the fabric name
    socket: int | None = None  # CPU socket (for node-internal vertices)
    switch: int | None = None  # PCIe switch index (GPUs and NICs)


def split_name(name: str) -> tuple[int, str] | None:
    """(node, local name) of a node vertex name ``n{k}.{local}``, else None (a switch)."""
    if not name.startswith("n"):
        return None
    head, dot, local = name.partition(".")
    if not dot or not head[1:].isdigit():
        return None
    return int(head[1:]), local


class LinkTable:
    """``links[id]`` of a cluster whose ``nodes`` interiors are node 0's ``template`` renamed,
    followed by ``tail`` (links added after the interiors; ids ``nodes * L + i``).

    Reads derive a link from its id; writes (a fault or a measured profile rewriting a link)
    are kept in ``changed`` and read back from there."""

    def __init__(self, template: list[Link], nodes: int) -> None:
        self.template = template
        self.per_node = len(template)
        self.nodes = nodes
        self.interior = nodes * self.per_node  # ids below this are node interiors
        self.tail: list[Link] = []
        self.changed: dict[int, Link] = {}
        # the template's names after the node prefix (``n0.``), split once
        self._locals = [(link.src[3:], link.dst[3:]) for link in template]
        self._kept: tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]] | None = None

    def __len__(self) -> int:
        return self.interior + len(self.tail)

    def interior_link(self, node: int, slot: int) -> Link:
        """Node ``node``'s interior link of slot ``slot`` (from the template)."""
        t = self.template[slot]
        if node == 0:
            return t
        src, dst = self._locals[slot]
        prefix = f"n{node}."
        return Link(node * self.per_node + slot, prefix + src, prefix + dst, t.kind, t.bandwidth_bytes_per_s,
                    t.efficiency, t.latency_s, t.tier, t.rail, node, t.slot)

    @overload
    def __getitem__(self, index: int) -> Link: ...

    @overload
    def __getitem__(self, index: slice) -> list[Link]: ...

    def __getitem__(self, index: int | slice) -> Link | list[Link]:
        if index.__class__ is not int:
            if isinstance(index, slice):
                start, stop, step = index.indices(len(self))
                if start >= self.interior and step == 1 and not self.changed:  # within the tail: its own slice
                    return self.tail[start - self.interior:max(start, stop) - self.interior]
                return [self[i] for i in range(start, stop, step)]
            index = operator.index(index)
        if self.changed and index in self.changed:
            return self.changed[index]
        if index >= self.interior:
            return self.tail[index - self.interior]
        if index < 0:
            return self[index + len(self)] if index >= -len(self) else self.tail[index - len(self)]
        node, slot = divmod(index, self.per_node)
        return self.interior_link(node, slot)

    def _columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
        """(template kind codes, template capacities, tail kind codes, tail capacities, the
        kinds the codes stand for), kept until the tail grows."""
        kept = self._kept
        if kept is None or kept[0] != len(self.tail):
            kinds = [[link.kind for link in part] for part in (self.template, self.tail)]
            names = {kind: i for i, kind in enumerate(dict.fromkeys(kinds[0] + kinds[1]))}  # first seen first
            codes = [list(map(names.__getitem__, part)) for part in kinds]
            # capacity_bytes_per_s without its property call per link (10^5 of them): the same product
            capacity = [np.array([link.bandwidth_bytes_per_s * link.efficiency for link in part], dtype=float)
                        for part in (self.template, self.tail)]
            kept = self._kept = (len(self.tail), np.array(codes[0], dtype=np.int64), capacity[0],
                                 np.array(codes[1], dtype=np.int64), capacity[1], list(names))
        return kept[1], kept[2], kept[3], kept[4], kept[5]

    def kinds(self, ids: np.ndarray) -> set[str]:
        """The kinds of links ``ids`` (an array of ids), without deriving each link."""
        if self.changed:
            return {self[i].kind for i in ids.tolist()}
        inner_codes, _, tail_codes, _, names = self._columns()
        inner = ids < self.interior
        found = np.union1d(inner_codes[ids[inner] % max(1, self.per_node)], tail_codes[ids[~inner] - self.interior])
        return {names[c] for c in found.tolist()}

    def capacities(self, ids: np.ndarray) -> np.ndarray:
        """``capacity_bytes_per_s`` of links ``ids`` (an array of ids), without deriving each link."""
        if self.changed:
            return np.array([self[i].capacity_bytes_per_s for i in ids.tolist()], dtype=float)
        _, inner_capacity, _, tail_capacity, _ = self._columns()
        out = np.empty(len(ids))
        inner = ids < self.interior
        out[inner] = inner_capacity[ids[inner] % max(1, self.per_node)]
        out[~inner] = tail_capacity[ids[~inner] - self.interior]
        return out

    def __setitem__(self, index: int, link: Link) -> None:
        if not 0 <= index < len(self) or link.id != index:
            raise IndexError(f"link {index} (id {link.id}) is not a link of this cluster")
        self.changed[index] = link

    def __iter__(self) -> Iterator[Link]:
        for i in range(len(self)):
            yield self[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LinkTable | list):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like the list it stands for

    def append(self, link: Link) -> None:
        self.tail.append(link)

    def copy(self) -> list[Link]:
        """Every link, derived (a plain list, for a scratch graph that rewrites links)."""
        return list(self)


class VertexTable(Mapping[str, Vertex]):
    """The vertices of ``nodes`` interiors that are node 0's ``template`` renamed, then ``extra``
    (switches, and anything added after the interiors), in the copied graph's order."""

    def __init__(self, template: list[Vertex], nodes: int) -> None:
        self.template = {v.local: v for v in template}
        self._order = list(self.template)
        self.nodes = nodes
        self.extra: dict[str, Vertex] = {}

    def __getitem__(self, name: str) -> Vertex:
        found = self.extra.get(name)
        if found is not None:
            return found
        where = split_name(name)
        if where is None or not 0 <= where[0] < self.nodes or where[1] not in self.template:
            raise KeyError(name)
        node, local = where
        v = self.template[local]
        return v if node == 0 else Vertex(name, v.kind, node, v.local, v.socket, v.switch)

    def node_of(self, name: str) -> int | None:
        """The node vertex ``name`` belongs to (None for a switch), without deriving the vertex."""
        found = self.extra.get(name)
        if found is not None:
            return found.node
        where = split_name(name)
        if where is None or not 0 <= where[0] < self.nodes or where[1] not in self.template:
            raise KeyError(name)
        return where[0]

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if name in self.extra:
            return True
        where = split_name(name)
        return where is not None and 0 <= where[0] < self.nodes and where[1] in self.template

    def __setitem__(self, name: str, vertex: Vertex) -> None:
        if name in self:
            raise ValueError(f"vertex {name} already exists")
        self.extra[name] = vertex

    def __iter__(self) -> Iterator[str]:
        for node in range(self.nodes):
            for local in self._order:
                yield f"n{node}.{local}"
        yield from self.extra

    def __len__(self) -> int:
        return self.nodes * len(self._order) + len(self.extra)
