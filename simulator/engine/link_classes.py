"""Link classes under symmetry reduction, and how a phase's load folds onto them.

Without symmetry reduction (``block_nodes`` None) every link is its own class. With it,
the cluster's nodes form blocks of ``block_nodes``, each a translate of the simulated one,
and the simulated ranks' traffic stands in for every block's:

* a link inside (or cabled to) node n sits at *position* (n mod block_nodes, slot): the
  same link of every block; ``block_of`` says which block a link is in, so the load of
  each copy can be tracked and the busiest copy bounds the rate;
* a switch-to-switch link sits at position (tier, rail, bandwidth) and shares the load of
  all blocks evenly with the other links there (mean field).

The links at one position form one class when they are alike (same kind, line rate,
efficiency and latency). Where they are not (a degraded cable, a slower NIC in one node),
the position splits into one class per kind of link, so every class is uniform: a copy's
load lands on the class of the link it actually crosses, and a slow member bounds the
rate instead of being silently represented by the first member's capacity.
"""

from __future__ import annotations

import operator

import numpy as np

from simulator.cluster.graph import ClusterGraph
from simulator.cluster.links import LinkTable
from simulator.engine.lowering import CommPhase

__all__ = ["LinkClasses"]


class LinkClasses:
    """Links grouped into classes that carry identical load under symmetry.

    Precondition: ``cluster.links[i].id == i`` (the graph's flat link list).

    ``class_of[link id]``: its class; ``members[c]``: the link ids of class c;
    ``capacity[c]``: bytes/s of every member; ``size[c]``: members in the class;
    ``position_of[link id]``: its position; ``uniform``: no position had to split.
    """

    def __init__(self, cluster: ClusterGraph, block_nodes: int | None) -> None:
        n_links = len(cluster.links)
        if block_nodes is None:  # every link its own position and class (link ids are list indices)
            class_of = np.arange(n_links, dtype=np.int64)
            block_of = np.full(n_links, -1, dtype=np.int64)
            members = [[i] for i in range(n_links)]
            class_position = list(range(n_links))
            n_positions = n_links
        else:
            positions: dict[object, int] = {}
            classes: dict[object, int] = {}
            class_position = []
            class_list: list[int] = []
            block_list: list[int] = []
            links = cluster.links
            start = 0
            if isinstance(links, LinkTable) and not links.changed and links.nodes % block_nodes == 0:
                # replicated interiors (ids node * L + slot): the first block's keys in id order
                # are new, every later block's repeat them, so the class of an interior link is
                # (node % block_nodes) * L + slot; the loop below then sees only what follows
                start, per_node = links.interior, links.per_node
                for node in range(block_nodes):
                    for slot in range(per_node):
                        link = links.interior_link(node, slot)
                        first: tuple[object, ...] = ("n", node, slot, _physics(link))
                        classes[first] = positions[first[:-1]] = len(class_position)
                        class_position.append(len(class_position))
                ids = np.arange(start, dtype=np.int64)
                node_of = ids // per_node
                class_list = ((node_of % block_nodes) * per_node + ids % per_node).tolist()
                block_list = (node_of // block_nodes).tolist()
            for link in links[start:] if start else links:  # hot with 10^5 links: one key and one lookup per link
                key: tuple[object, ...]
                if link.node is not None:
                    key = ("n", link.node % block_nodes, link.slot, _physics(link))
                    block_list.append(link.node // block_nodes)
                else:
                    key = ("t", link.tier, link.rail, link.bandwidth_bytes_per_s, _physics(link))
                    block_list.append(-1)
                index = classes.get(key)
                if index is None:  # a new class; its position is the key without the physics
                    index = classes[key] = len(class_position)
                    class_position.append(positions.setdefault(key[:-1], len(positions)))
                class_list.append(index)
            class_of = np.array(class_list, dtype=np.int64)
            by_class = np.argsort(class_of, kind="stable")
            ends = np.cumsum(np.bincount(class_of, minlength=len(class_position))).tolist()
            flat = by_class.tolist()  # one conversion, then slices (a class each)
            members = [flat[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
            block_of = np.array(block_list, dtype=np.int64)
            n_positions = len(positions)
        position_of = np.array(class_position, dtype=np.int64)[class_of]
        self.class_of = class_of
        self.block_of = block_of
        self.position_of = position_of
        self.blocks = cluster.n_nodes // block_nodes if block_nodes else 1
        self.members = members
        self.size = np.array([len(m) for m in members], dtype=float)
        self.capacity = np.array([cluster.links[m[0]].capacity_bytes_per_s for m in members])
        self.capacity.flags.writeable = False  # shared by every run on a cached cluster
        self.block_nodes = block_nodes
        self.cluster = cluster
        self._kind_classes: dict[frozenset[str], np.ndarray] = {}
        # every position one class: classes are positions (indices equal), the common case
        self.uniform = len(members) == n_positions
        self._position_size = np.bincount(position_of, minlength=n_positions).astype(float)
        self._class_position = np.array(class_position, dtype=np.int64)
        # class of each position's link in each block (-1: none there), where positions split
        self._class_at = np.full((0 if self.uniform else n_positions, self.blocks), -1, dtype=np.int64)
        if not self.uniform:
            on_node = block_of >= 0
            self._class_at[position_of[on_node], block_of[on_node]] = class_of[on_node]

    def __len__(self) -> int:
        return len(self.members)

    def classes_of_kinds(self, kinds: frozenset[str]) -> np.ndarray:
        """The classes whose links are of one of ``kinds``, ascending (kept: link classes
        outlive a run when their cluster is cached, :mod:`simulator.cluster.cache`)."""
        found = self._kind_classes.get(kinds)
        if found is None:  # a class's links share their kind (it is part of their physics)
            links = self.cluster.links
            found = np.array([c for c, m in enumerate(self.members) if links[m[0]].kind in kinds], dtype=np.int64)
            self._kind_classes[kinds] = found
        return found

    def label(self, index: int) -> str:
        link = self.cluster.links[self.members[index][0]]
        more = f" (+{len(self.members[index]) - 1} alike)" if len(self.members[index]) > 1 else ""
        return f"{link.src}->{link.dst}{more}"

    # -- folding a phase's load ----------------------------------------------------------

    def fold(self, phase: CommPhase) -> tuple[np.ndarray, np.ndarray, float]:
        """The classes ``phase`` loads, flows per class, and its heaviest flow's bytes per byte of D.

        Each group stands for its ``multiplicity`` m distinct translates across the blocks of
        nodes. A node-link position tracks the load of each of its copies (one per block):
        the group's own loads, summed over its translates (a shift of blocks/m blocks each);
        a class's load is its busiest copy. A tier position spreads its load evenly over its
        links (mean field), and each class there carries that per-link load. Flows per class
        = load / the heaviest flow's bytes (all per byte of D).
        """
        blocks = self.blocks
        tier = np.zeros(len(self._position_size))
        copies = np.zeros((0, blocks))
        copy_rows: dict[int, int] = {}
        b_unit = phase.heaviest_bytes_per_byte
        for group in phase.groups:
            if not len(group.link_ids):
                continue
            m = group.multiplicity
            ids, w = group.link_ids, group.link_bytes_per_byte
            pos = self.position_of[ids]
            blk = self.block_of[ids]
            on_tier = blk < 0
            if on_tier.any():
                np.add.at(tier, pos[on_tier], w[on_tier] * m / self._position_size[pos[on_tier]])
            node = ~on_tier
            if not node.any():
                continue
            own_pos, inverse = np.unique(pos[node], return_inverse=True)
            own = np.zeros((len(own_pos), blocks))
            np.add.at(own, (inverse, blk[node]), w[node])
            if m > 1:  # add the group's translates: shifts of blocks / m
                stride = blocks // m
                own = np.tile(own.reshape(len(own_pos), m, stride).sum(axis=1), (1, m))
            rows = []
            for p in own_pos.tolist():
                row = copy_rows.get(p)
                if row is None:
                    row = copy_rows[p] = len(copy_rows)
                rows.append(row)
            if len(copy_rows) > copies.shape[0]:
                copies = np.vstack([copies, np.zeros((len(copy_rows) - copies.shape[0], blocks))])
            copies[np.array(rows)] += own
        weights = tier if self.uniform else tier[self._class_position]
        if copy_rows:
            order = np.fromiter(copy_rows.keys(), dtype=np.int64, count=len(copy_rows))
            loads = copies[np.fromiter(copy_rows.values(), dtype=np.int64, count=len(copy_rows))]
            if self.uniform:  # class index = position index
                weights[order] += loads.max(axis=1)
            else:  # each copy loads the class its link is in; a class bears its busiest copy
                at = self._class_at[order]
                there = at >= 0
                np.maximum.at(weights, at[there], loads[there])
        nz = np.nonzero(weights > 0)[0]
        flows = weights[nz] / b_unit
        nz.flags.writeable = flows.flags.writeable = False  # kept across runs (LoweringMemo): never edited
        return nz, flows, b_unit


# what must be equal for links to share a class: kind, line rate, efficiency, latency
_physics = operator.attrgetter("kind", "bandwidth_bytes_per_s", "efficiency", "latency_s")
