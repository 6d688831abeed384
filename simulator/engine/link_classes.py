"""Link classes under symmetry reduction, and how a phase's load folds onto them.

Without symmetry reduction (``block_nodes`` None) every link is its own class. With it,
the cluster's nodes form blocks of ``block_nodes``, each a translate of the simulated one,
and the simulated ranks' traffic stands in for every block's:

* a link inside (or cabled to) node n sits at *position* (n mod block_nodes, slot): the
  same link of every block; ``block_of`` says which block a link is in, so the load of
  each copy can be tracked and the busiest copy bounds the rate;
* a switch-to-switch link sits at position (tier, rail, bandwidth) and shares the load of
  all blocks evenly with the other links there (mean field).

The links at one position form one class.
"""

from __future__ import annotations

import numpy as np

from simulator.cluster.graph import ClusterGraph
from simulator.engine.lowering import CommPhase

__all__ = ["LinkClasses"]


class LinkClasses:
    """Links grouped into classes that carry identical load under symmetry.

    ``class_of[link id]``: its class; ``members[c]``: the link ids of class c;
    ``capacity[c]``: bytes/s of one member; ``size[c]``: members in the class.
    """

    def __init__(self, cluster: ClusterGraph, block_nodes: int | None) -> None:
        keys: dict[object, int] = {}
        class_of = np.empty(len(cluster.links), dtype=np.int64)
        block_of = np.full(len(cluster.links), -1, dtype=np.int64)
        members: list[list[int]] = []
        for link in cluster.links:
            key: object
            if block_nodes is None:
                key = link.id
            elif link.node is not None:
                key = ("n", link.node % block_nodes, link.slot)
                block_of[link.id] = link.node // block_nodes
            else:
                key = ("t", link.tier, link.rail, link.bandwidth_bytes_per_s)
            index = keys.get(key)
            if index is None:
                index = keys[key] = len(members)
                members.append([])
            members[index].append(link.id)
            class_of[link.id] = index
        self.class_of = class_of
        self.block_of = block_of
        self.blocks = cluster.n_nodes // block_nodes if block_nodes else 1
        self.members = members
        self.size = np.array([len(m) for m in members], dtype=float)
        self.capacity = np.array([cluster.links[m[0]].capacity_bytes_per_s for m in members])
        self.block_nodes = block_nodes
        self.cluster = cluster

    def __len__(self) -> int:
        return len(self.members)

    def label(self, index: int) -> str:
        link = self.cluster.links[self.members[index][0]]
        more = f" (+{len(self.members[index]) - 1} alike)" if len(self.members[index]) > 1 else ""
        return f"{link.src}->{link.dst}{more}"

    # -- folding a phase's load ----------------------------------------------------------

    def fold(self, phase: CommPhase) -> tuple[np.ndarray, np.ndarray, float]:
        """The classes ``phase`` loads, flows per class, and its heaviest flow's bytes per byte of D.

        Each group stands for its ``multiplicity`` m distinct translates across the blocks of
        nodes. A node-link class tracks the load of each of its copies (one per block): the
        group's own loads, summed over its translates (a shift of blocks/m blocks each), and
        the busiest copy is the class's load. Tier classes take the mean over their links.
        Flows per class = load / the heaviest flow's bytes (all per byte of D).
        """
        blocks = self.blocks
        tier = np.zeros(len(self))
        copies = np.zeros((0, blocks))
        copy_rows: dict[int, int] = {}
        b_unit = phase.heaviest_bytes_per_byte
        for group in phase.groups:
            if not len(group.link_ids):
                continue
            m = group.multiplicity
            ids, w = group.link_ids, group.link_bytes_per_byte
            cls = self.class_of[ids]
            blk = self.block_of[ids]
            on_tier = blk < 0
            if on_tier.any():
                np.add.at(tier, cls[on_tier], w[on_tier] * m / self.size[cls[on_tier]])
            node = ~on_tier
            if not node.any():
                continue
            own_cls, inverse = np.unique(cls[node], return_inverse=True)
            own = np.zeros((len(own_cls), blocks))
            np.add.at(own, (inverse, blk[node]), w[node])
            if m > 1:  # add the group's translates: shifts of blocks / m
                stride = blocks // m
                own = np.tile(own.reshape(len(own_cls), m, stride).sum(axis=1), (1, m))
            rows = []
            for c in own_cls.tolist():
                row = copy_rows.get(c)
                if row is None:
                    row = copy_rows[c] = len(copy_rows)
                rows.append(row)
            if len(copy_rows) > copies.shape[0]:
                copies = np.vstack([copies, np.zeros((len(copy_rows) - copies.shape[0], blocks))])
            copies[np.array(rows)] += own
        weights = tier
        if copy_rows:
            order = np.fromiter(copy_rows.keys(), dtype=np.int64, count=len(copy_rows))
            weights[order] += copies[np.fromiter(copy_rows.values(), dtype=np.int64, count=len(copy_rows))].max(axis=1)
        nz = np.nonzero(weights > 0)[0]
        return nz, weights[nz] / b_unit, b_unit
