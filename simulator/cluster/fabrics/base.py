"""The fabric interface and its registry: how a scale-out network is built and routed.

A fabric kind is a :class:`Fabric` subclass registered under the scenario's
``cluster.fabric.kind`` tag (:data:`FABRICS`). For one cluster, :func:`build_fabric`
instantiates it with the validated fabric spec, lets it add its switches and links to the
:class:`~simulator.cluster.graph.ClusterGraph` (after the node interiors exist), and keeps it
on ``cluster.scale_out``; the router then asks it for the fabric links between two NICs.

The fabric owns everything it knows about its own wiring (which switch a NIC is cabled to,
spine lists, torus coordinates); the graph only holds vertices and links.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np

from simulator.cluster.graph import ClusterGraph, LinkRow

__all__ = ["Fabric", "FabricPath", "NicRef", "FABRICS", "register_fabric", "build_fabric", "nic_params", "add_nic_link",
           "add_nic_links"]

NicRef = tuple[int, int]  # (node, NIC index within the node)
FabricPath = tuple[list[int], float]  # (link ids in order, fraction of the bytes taking them)


class Fabric(ABC):
    """One scale-out network of one cluster.

    Lifecycle: constructed with its spec, :meth:`build` once on a cluster whose nodes are
    built, then :meth:`paths` any number of times (cached by the implementation if it wants).
    Link ids returned by :meth:`paths` index ``cluster.links``.
    """

    def __init__(self, spec: Any) -> None:
        self.spec = spec

    @abstractmethod
    def build(self, cluster: ClusterGraph) -> None:
        """Add the fabric's vertices and links (NIC cabling included) to ``cluster``."""

    @abstractmethod
    def paths(self, cluster: ClusterGraph, src: NicRef, dst: NicRef, flow: int, seed: int) -> list[FabricPath]:
        """Fabric links from NIC ``src`` to NIC ``dst`` of another node, as alternatives whose
        fractions sum to 1. ``flow`` numbers the parallel flows of one connection and ``seed``
        is the simulation seed (for hashed multipath); deterministic fabrics ignore both.
        The first alternative's links set the route's latency."""

    def period_nodes(self, cluster: ClusterGraph) -> int | None:
        """The least T such that moving every node by T (modulo the node count) maps the fabric
        onto itself and every path onto the moved pair's path (:meth:`shift_links`); None:
        no such T is known (the default), so routes are computed pair by pair."""
        return None

    def shift_links(self, cluster: ClusterGraph, ids: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """The fabric links ``ids`` moved by ``nodes`` nodes each (multiples of :meth:`period_nodes`)."""
        raise NotImplementedError(f"{type(self).__name__} has no translation period")

    def bisection_estimate_bytes_per_s(self, cluster: ClusterGraph, node_nic_bytes_per_s: float) -> float:
        """One-direction bisection bandwidth for fabrics too large for an exact max flow:
        by default half the nodes' NIC bandwidth (a non-blocking fabric)."""
        return (cluster.n_nodes // 2) * node_nic_bytes_per_s

    def diagram(self, cluster: ClusterGraph) -> list[str]:
        """Lines of text drawing the fabric for ``dtsim topo`` (empty: nothing to draw)."""
        return []


F = TypeVar("F", bound=type[Fabric])

FABRICS: dict[str, type[Fabric]] = {}


def register_fabric(kind: str) -> Callable[[F], F]:
    """Class decorator: register a :class:`Fabric` under ``kind`` (a ``cluster.fabric.kind`` tag)."""

    def register(cls: F) -> F:
        FABRICS[kind] = cls
        return cls

    return register


def build_fabric(cluster: ClusterGraph, spec: Any) -> Fabric:
    """Instantiate the fabric registered for ``spec.kind``, build it on ``cluster``, return it."""
    try:
        cls = FABRICS[spec.kind]
    except KeyError:
        raise ValueError(f"no fabric registered for kind {spec.kind!r} (known: {', '.join(sorted(FABRICS))})") from None
    fabric = cls(spec)
    fabric.build(cluster)
    return fabric


def nic_params(cluster: ClusterGraph) -> tuple[float, float, float]:
    """(bandwidth B/s, efficiency, latency s) of each NIC: the node type's, unless the fabric
    spec overrides them; the efficiency falls back to the transport's."""
    fabric = cluster.fabric
    nics = cluster.node_type.nics
    bw = fabric.nic_bandwidth_bytes_per_s or nics.bandwidth_bytes_per_s
    same_transport = fabric.transport is None or fabric.transport == nics.transport
    eff = fabric.efficiency or (nics.efficiency if same_transport else None) or cluster.transport.efficiency
    lat = fabric.latency_s if fabric.latency_s is not None else cluster.transport.latency_s
    return bw, eff, lat


def add_nic_links(cluster: ClusterGraph, cables: Iterable[tuple[str, str, int | None, int]]) -> None:
    """Cable each ``(nic, switch, rail, node of the NIC)`` as :func:`add_nic_link` does, in
    order (the same links, ids and slots), in one pass over the graph."""
    bw, eff, lat = nic_params(cluster)
    kind = cluster.transport_kind
    up_lat = lat + cluster.transport.switch_latency_s
    rows: list[LinkRow] = []
    for nic, switch, rail, node in cables:
        rows.append((nic, switch, kind, bw, eff, up_lat, "nic-up", rail, node))  # type: ignore[arg-type]
        rows.append((switch, nic, kind, bw, eff, 0.0, "nic-down", rail, node))  # type: ignore[arg-type]
    cluster.add_links(rows)


def add_nic_link(cluster: ClusterGraph, nic: str, switch: str, rail: int | None) -> tuple[int, int]:
    """Cable ``nic`` to ``switch``: an uplink carrying the transport's per-message latency
    plus one switch traversal, and a zero-latency downlink. Returns (uplink id, downlink id)."""
    bw, eff, lat = nic_params(cluster)
    kind = cluster.transport_kind
    # the transport's per-message latency is charged once, on the sending NIC's uplink
    cluster.add_link(nic, switch, kind=kind, bandwidth_bytes_per_s=bw, efficiency=eff,  # type: ignore[arg-type]
                     latency_s=lat + cluster.transport.switch_latency_s, tier="nic-up", rail=rail, both_ways=False)
    cluster.add_link(switch, nic, kind=kind, bandwidth_bytes_per_s=bw, efficiency=eff,  # type: ignore[arg-type]
                     latency_s=0.0, tier="nic-down", rail=rail, both_ways=False)
    return len(cluster.links) - 2, len(cluster.links) - 1
