"""From a :class:`~simulator.ir.CommOp` to what a network model runs.

The collective's algorithm and protocol are chosen as NCCL's tuner does (least modelled
time for the issuing group alone); its flows come from the cluster's collective plans,
lowered into a typed description that keeps every phase's step structure
(:mod:`simulator.engine.lowering`) for every group the operation stands for (symmetry
reduction); that description is folded onto link classes (:mod:`simulator.engine.link_classes`)
into the per-class loads the flow and analytical models run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from simulator.cluster.collectives import CollectivePlanner
from simulator.cluster.graph import ClusterGraph
from simulator.costs.collectives import Choice, NcclModel, bandwidth_factor, choose_algorithm
from simulator.costs.nccl_env import NcclTuning
from simulator.engine.link_classes import LinkClasses
from simulator.engine.lowering import CommLowering, CommPhase, PhaseLoad, Resolved, lower_plans
from simulator.ir import CommOp

__all__ = ["LinkClasses", "CommResolver", "Resolved", "LoweringMemo"]

_NET_KINDS = frozenset({"infiniband", "efa", "ethernet-tcp"})  # links whose flows a TCP-like per-flow cap limits


@dataclass
class LoweringMemo:
    """Lowered step structures and their folds onto link classes, by (op, algorithm, groups).

    They depend only on the cluster, its link classes and the symmetry block, never on a
    run's sizes or tuning, so one memo may serve every run on one cluster and block
    (:mod:`simulator.cluster.cache` keeps it with the cluster)."""

    lowered: dict[tuple[object, ...], tuple[CommPhase, ...]] = field(default_factory=dict)
    units: dict[tuple[object, ...], list[tuple[np.ndarray, np.ndarray, float]]] = field(default_factory=dict)


class CommResolver:
    """Resolves communication operations on one cluster (cached: a program repeats them).

    ``block_ranks``: ranks per block of identical replicas under symmetry reduction (None: off).
    ``tuning``: what ``NCCL_ALGO`` / ``NCCL_PROTO`` leave the tuner (None: NCCL's defaults).
    ``memo``: lowerings kept from earlier runs with the same cluster, classes and block.
    """

    def __init__(
        self,
        cluster: ClusterGraph,
        planner: CollectivePlanner,
        classes: LinkClasses,
        model: NcclModel,
        *,
        block_ranks: int | None,
        tuning: NcclTuning | None = None,
        memo: LoweringMemo | None = None,
    ) -> None:
        self.cluster = cluster
        self.planner = planner
        self.classes = classes
        self.model = model
        self.block_ranks = block_ranks
        self.tuning = tuning or NcclTuning()
        self.world = cluster.world_size
        memo = memo or LoweringMemo()
        self._lowered = memo.lowered
        self._units = memo.units
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
            algos = self._algorithms(comm)
            shapes = [self.planner.plan(comm.op, a, comm.group).shape(self.cluster) for a in algos]
            protocols = self.tuning.protocols(comm.op)
            try:
                choice = self._choices[key] = choose_algorithm(self.model, shapes, comm.nbytes, protocols)
            except ValueError:
                limited = sorted({p for s in shapes for p in s.protocols})
                plugin = ("" if set(limited) >= {"LL", "LL128", "Simple"} else
                          f"; {self.cluster.node_type.name}'s network plugin allows only {'/'.join(limited)}")
                raise ValueError(
                    f"NCCL_PROTO={self.tuning.proto}: no enabled protocol runs {comm.op} of {comm.nbytes:.0f} B by "
                    f"{'/'.join(algos)} (dtsim offers LL up to {self.model.ll_max_bytes:.0f} B across nodes, LL128 up to "
                    f"{self.model.ll128_max_bytes:.0f} B on NVLink/InfiniBand paths, NVLS Simple only{plugin})") from None
        return choice

    def _algorithms(self, comm: CommOp) -> list[str]:
        """The algorithms the tuner chooses among: the forced one, or NCCL's candidates for the
        group narrowed by ``NCCL_ALGO``; one the topology cannot run is an error."""
        group = comm.group
        if comm.algorithm:
            reason = self.planner.unrunnable(comm.op, comm.algorithm, group)
            if reason:
                raise ValueError(f"{comm.algorithm} cannot run here: {reason}")
            return [comm.algorithm]
        enabled = self.tuning.algorithms(comm.op)
        if enabled is None:
            candidates = self.planner.candidates(comm.op, group)
            return candidates if self.tuning.nvls_enable else [a for a in candidates if a not in ("nvls", "nvls_tree")]
        order: list[str] = [a for a in ("ring", "chain", "tree", "nvls", "nvls_tree") if a in enabled]
        why = {a: self.planner.unrunnable(comm.op, a, group) for a in order}
        for nvls in ("nvls", "nvls_tree"):
            if not self.tuning.nvls_enable and nvls in why:
                why[nvls] = "NCCL_NVLS_ENABLE=0"
        algos = [a for a in order if why[a] is None]
        if not algos:
            reasons = "; ".join(f"{a}: {why[a]}" for a in order)
            unmodelled = ", ".join(self.tuning.unmodelled(comm.op))
            raise ValueError(f"NCCL_ALGO={self.tuning.algo}: no enabled algorithm can run {comm.op} here"
                             + (f" ({reasons})" if reasons else "")
                             + (f"; {unmodelled} not modelled by dtsim" if unmodelled else ""))
        return algos

    def resolve(self, comm: CommOp) -> Resolved:
        key = (comm.op, comm.algorithm, comm.all_instances(), comm.nbytes, comm.count)
        found = self._resolved.get(key)
        if found is not None:
            return found
        found = self._resolved[key] = self._resolve(comm)
        return found

    def lower(self, op: str, algorithm: str, instances: tuple[tuple[int, ...], ...]) -> tuple[CommPhase, ...]:
        """The step structure of ``op`` by ``algorithm`` over ``instances`` (per byte of D)."""
        key = (op, algorithm, instances)
        found = self._lowered.get(key)
        if found is None:
            plans = [self.planner.plan(op, algorithm, g) for g in instances]
            found = self._lowered[key] = lower_plans(plans, [self.multiplicity(p.gpus) for p in plans])
        return found

    def _resolve(self, comm: CommOp) -> Resolved:
        if (len(comm.group) <= 1 and comm.op not in ("d2h", "h2d")) or comm.nbytes <= 0:
            return Resolved([], None, "none", "none", 0.0)
        choice = self.choose(comm)
        algorithm, protocol = choice.shape.algorithm, choice.protocol
        instances = comm.all_instances()
        units = self._unit_loads(comm.op, algorithm, instances)
        factor = bandwidth_factor(self.model, algorithm, protocol, comm.nbytes)
        lowering = CommLowering(comm.op, algorithm, protocol, comm.nbytes, comm.count, factor,
                                choice.latency_s * comm.count, self.lower(comm.op, algorithm, instances))
        phases: list[PhaseLoad] = []
        alone = 0.0
        for i, (classes, flows, b_unit) in enumerate(units):
            latency = lowering.latency_s if i == len(units) - 1 else 0.0
            crosses_net = bool(np.any(np.isin(classes, self._net_classes)))
            load = PhaseLoad(classes, flows, b_unit * comm.nbytes * comm.count / factor, latency,
                             self._net_cap if crosses_net else math.inf)
            phases.append(load)
            rate = min(float(np.min(self.classes.capacity[classes] / flows)), load.rate_cap)
            alone += load.bytes_per_flow / rate + latency
        return Resolved(phases, choice, algorithm, protocol, alone, lowering)

    def _unit_loads(
        self, op: str, algorithm: str, instances: tuple[tuple[int, ...], ...]
    ) -> list[tuple[np.ndarray, np.ndarray, float]]:
        """Per phase: classes, flows per class, heaviest flow's bytes per byte of D (cached)."""
        key = (op, algorithm, instances)
        found = self._units.get(key)
        if found is None:
            found = self._units[key] = [self.classes.fold(p) for p in self.lower(op, algorithm, instances)]
        return found

    @property
    def _net_classes(self) -> np.ndarray:
        """Classes of network links (where the transport's per-flow cap applies)."""
        return self.classes.classes_of_kinds(_NET_KINDS)
