"""Degraded and failed links (``faults.links``) applied to a built cluster graph, before routing.

Each :class:`~simulator.scenario.faults.LinkFault` names links with a selector
(:func:`~simulator.scenario.faults.parse_selector`); every selected link (each direction is
its own link) keeps ``bandwidth_factor`` of its bandwidth and gains ``latency_add`` of
latency; faults selecting the same link multiply their factors and add their latencies. A
factor of 0 is a failed link: the router leaves it out (another path inside the node, another
NIC of the GPU, another spine), and a pair of GPUs with no path left is an error naming the
field (:class:`NoPathError`). A selector matching no link is an error naming its field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from simulator.cluster.graph import ClusterGraph, Link
from simulator.cluster.routing import NoPathError
from simulator.errors import ScenarioError
from simulator.scenario.faults import LinkFault, LinkSelector

__all__ = ["apply_link_faults", "PerturbedLink", "selected_links", "NoPathError"]

_INDEX = {"leaf": re.compile(r"(?:^|\.)leaf(\d+)$"), "spine": re.compile(r"(?:^|\.)spine(\d+)$"),
          "gpu": re.compile(r"^n\d+\.gpu(\d+)$"), "nic": re.compile(r"^n\d+\.nic(\d+)$")}


@dataclass(frozen=True)
class PerturbedLink:
    """A link a fault changed: its id, label, the factor and latency added, the faults naming it."""

    link_id: int
    label: str
    bandwidth_factor: float
    latency_add_s: float
    faults: tuple[int, ...]


def _index(name: str, key: str) -> int | None:
    match = _INDEX[key].search(name)
    return int(match.group(1)) if match else None


def _matches(cluster: ClusterGraph, link: Link, selector: LinkSelector) -> bool:
    for key, values in selector.items():
        if key == "kind":
            ok = link.kind in values
        elif key == "tier":
            ok = link.tier in values
        elif key == "node":
            ok = link.node in values
        elif key == "rail":
            ok = link.rail in values
        elif key == "nic":  # the NIC's cable: one end the NIC, the other a switch outside the node
            ends = ((link.src, link.dst), (link.dst, link.src))
            ok = any(_index(a, "nic") in values and cluster.vertices[b].node is None for a, b in ends)
        else:  # gpu, leaf, spine: either end is that vertex
            ok = any(_index(end, key) in values for end in (link.src, link.dst))
        if not ok:
            return False
    return True


def selected_links(cluster: ClusterGraph, fault: LinkFault) -> list[int]:
    """Ids of the links ``fault``'s selector names."""
    selector = fault.selector
    return [link.id for link in cluster.links if _matches(cluster, link, selector)]


def apply_link_faults(cluster: ClusterGraph, faults: list[LinkFault]) -> list[PerturbedLink]:
    """Change the selected links of ``cluster`` in place; the changed links, by id."""
    factor: dict[int, float] = {}
    latency: dict[int, float] = {}
    named: dict[int, list[int]] = {}
    for i, fault in enumerate(faults):
        ids = selected_links(cluster, fault)
        if not ids:
            raise ScenarioError(f"{fault.select!r} matches no link of this cluster ({cluster.n_nodes} nodes of "
                                f"{cluster.node_type.name}, {cluster.fabric_kind} fabric)", field=f"faults.links[{i}].select")
        for link_id in ids:
            factor[link_id] = factor.get(link_id, 1.0) * fault.bandwidth_factor
            latency[link_id] = latency.get(link_id, 0.0) + fault.latency_add
            named.setdefault(link_id, []).append(i)
    out = []
    for link_id in sorted(named):
        link = cluster.links[link_id]
        cluster.links[link_id] = link._replace(bandwidth_bytes_per_s=link.bandwidth_bytes_per_s * factor[link_id],
                                               latency_s=link.latency_s + latency[link_id])
        if factor[link_id] == 0:
            cluster.dead_links.add(link_id)
        if link.node is not None:
            cluster.perturbed_nodes.add(link.node)
        out.append(PerturbedLink(link_id, f"{link.src}->{link.dst}", factor[link_id], latency[link_id],
                                 tuple(named[link_id])))
    return out
