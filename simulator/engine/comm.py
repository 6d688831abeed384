"""From a :class:`~simulator.workload.tasks.CommOp` to network phases on link classes.

The collective's algorithm and protocol are chosen as NCCL's tuner does (least modelled
time for the issuing group alone), its flows come from the cluster's collective plans, and
its load is summed over every instance it stands for (symmetry reduction) and mapped onto
link classes.
"""

from __future__ import annotations

import math

import numpy as np

from simulator.cluster.collectives import CollectivePlan, CollectivePlanner
from simulator.cluster.graph import ClusterGraph
from simulator.costs.collectives import Choice, NcclModel, bandwidth_factor, choose_algorithm
from simulator.engine.lowering import PhaseLoad, Resolved
from simulator.workload.tasks import CommOp

__all__ = ["LinkClasses", "CommResolver", "Resolved"]


class LinkClasses:
    """Links grouped into classes that carry identical load under symmetry.

    ``block_nodes`` None: one class per link. Otherwise links inside (or cabled to) node n
    are keyed by (n mod block_nodes, slot): the same link in every block of nodes, where
    every block is a translate of the simulated one; ``block_of`` says which block a link
    is in, so the load of each copy can be tracked and the busiest copy bounds the rate.
    Switch-to-switch links are keyed by their tier (and rail) and share the load of all
    blocks evenly (mean field).
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


class CommResolver:
    def __init__(
        self,
        cluster: ClusterGraph,
        planner: CollectivePlanner,
        classes: LinkClasses,
        model: NcclModel,
        *,
        block_ranks: int | None,
    ) -> None:
        self.cluster = cluster
        self.planner = planner
        self.classes = classes
        self.model = model
        self.block_ranks = block_ranks
        self.world = cluster.world_size
        self._units: dict[tuple[object, ...], list[tuple[np.ndarray, np.ndarray, float]]] = {}
        self._choices: dict[tuple[object, ...], Choice] = {}
        self._resolved: dict[tuple[object, ...], Resolved] = {}
        cap = cluster.transport.per_flow_cap_bytes_per_s
        self._net_cap = cap * cluster.transport.flows_per_connection if cap else math.inf

    # -- symmetry ------------------------------------------------------------------------

    def multiplicity(self, group: tuple[int, ...]) -> int:
        """How many distinct translates of ``group`` the simulated block stands for."""
        if self.block_ranks is None:
            return 1
        blocks = self.world // self.block_ranks
        members = set(group)
        for k in range(1, blocks):
            if blocks % k:
                continue
            shift = k * self.block_ranks
            if {(r + shift) % self.world for r in group} == members:
                return k
        return blocks

    # -- resolution ----------------------------------------------------------------------

    def choose(self, comm: CommOp) -> Choice:
        key = (comm.op, comm.algorithm, comm.group, comm.nbytes)
        choice = self._choices.get(key)
        if choice is None:
            algos = [comm.algorithm] if comm.algorithm else self.planner.candidates(comm.op, comm.group)
            shapes = [self.planner.plan(comm.op, a, comm.group).shape(self.cluster) for a in algos]
            choice = self._choices[key] = choose_algorithm(self.model, shapes, comm.nbytes)
        return choice

    def resolve(self, comm: CommOp) -> Resolved:
        key = (comm.op, comm.algorithm, comm.all_instances(), comm.nbytes, comm.count)
        found = self._resolved.get(key)
        if found is not None:
            return found
        found = self._resolved[key] = self._resolve(comm)
        return found

    def _resolve(self, comm: CommOp) -> Resolved:
        if (len(comm.group) <= 1 and comm.op not in ("d2h", "h2d")) or comm.nbytes <= 0:
            return Resolved([], None, "none", "none", 0.0)
        choice = self.choose(comm)
        algorithm, protocol = choice.shape.algorithm, choice.protocol
        units = self._unit_phases(comm.op, algorithm, comm.all_instances())
        factor = bandwidth_factor(self.model, algorithm, protocol, comm.nbytes)
        phases: list[PhaseLoad] = []
        alone = 0.0
        for i, (classes, flows, b_unit) in enumerate(units):
            latency = choice.latency_s * comm.count if i == len(units) - 1 else 0.0
            crosses_net = bool(np.any(np.isin(classes, self._net_classes)))
            load = PhaseLoad(classes, flows, b_unit * comm.nbytes * comm.count / factor, latency,
                             self._net_cap if crosses_net else math.inf)
            phases.append(load)
            rate = min(float(np.min(self.classes.capacity[classes] / flows)), load.rate_cap)
            alone += load.bytes_per_flow / rate + latency
        return Resolved(phases, choice, algorithm, protocol, alone)

    @property
    def _net_classes(self) -> np.ndarray:
        found = getattr(self, "_net_classes_cache", None)
        if found is None:
            net = [self.classes.class_of[link.id] for link in self.cluster.links
                   if link.kind in ("infiniband", "efa", "ethernet-tcp")]
            found = np.unique(np.array(net, dtype=np.int64))
            self._net_classes_cache = found
        return found

    def _unit_phases(
        self, op: str, algorithm: str, instances: tuple[tuple[int, ...], ...]
    ) -> list[tuple[np.ndarray, np.ndarray, float]]:
        """Per phase: classes, flows per class (per unit of D), heaviest flow's bytes per byte.

        Each instance stands for its ``m`` distinct translates across the blocks of nodes.
        A node-link class tracks the load of each of its copies (one per block): the
        instance's own loads, summed over its translates (a shift of B/m blocks each), and
        the busiest copy is the class's load. Tier classes take the mean over their links.
        """
        key = (op, algorithm, instances)
        found = self._units.get(key)
        if found is not None:
            return found
        plans: list[CollectivePlan] = [self.planner.plan(op, algorithm, g) for g in instances]
        classes = self.classes
        blocks = classes.blocks
        n_classes = len(classes)
        result = []
        for index in range(len(plans[0].phases)):
            tier = np.zeros(n_classes)
            copies = np.zeros((0, blocks))
            copy_rows: dict[int, int] = {}
            b_unit = max(f.weight for f in plans[0].phases[index].flows)
            for plan in plans:
                phase = plan.phases[index]
                if not phase.link_weights:
                    continue
                m = self.multiplicity(plan.gpus)
                ids, w = phase.arrays()
                cls = classes.class_of[ids]
                blk = classes.block_of[ids]
                on_tier = blk < 0
                if on_tier.any():
                    np.add.at(tier, cls[on_tier], w[on_tier] * m / classes.size[cls[on_tier]])
                node = ~on_tier
                if not node.any():
                    continue
                own_cls, inverse = np.unique(cls[node], return_inverse=True)
                own = np.zeros((len(own_cls), blocks))
                np.add.at(own, (inverse, blk[node]), w[node])
                if m > 1:  # add the instance's translates: shifts of blocks / m
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
            result.append((nz, weights[nz] / b_unit, b_unit))
        self._units[key] = result
        return result
