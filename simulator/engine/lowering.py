"""Lowering of one communication operation onto the cluster, as typed data.

A :class:`~simulator.ir.CommOp` is lowered in two stages:

1. :func:`lower_plans` turns the collective plans of every process group the operation
   stands for (``CommOp.all_instances()``, the issuing group first; see
   :mod:`simulator.cluster.collectives`) into :class:`CommPhase` values. Each keeps the
   phase's *step structure*: which point-to-point flows run (source and destination GPU),
   how many bytes each moves per byte of the collective's size D, in how many sequential
   steps (a ring all-reduce over n GPUs: 2(n-1) steps of D/(n*C) bytes per edge and
   channel, Patarasuk & Yuan 2009), and the links those flows cross. This does not depend
   on D, so it is cached per (op, algorithm, groups).
2. :class:`CommLowering` binds D, the repeat count, the protocol and the fixed latency: the
   whole description a chunked or packet-level network model needs.

The flow and analytical network models do not need steps: they take a phase as one
entity whose load on each link class is folded from this description
(:meth:`simulator.engine.link_classes.LinkClasses.fold`) into a :class:`PhaseLoad`.
:class:`Resolved` carries both to the network model, so a new model picks what it needs
without any change to the engine core.

Units: bytes, seconds, bytes/s; "per byte" means per byte of D (nccl-tests convention).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from simulator.cluster.collective_plan import CollectivePlan, Flow, PhasePlan
from simulator.costs.collectives import Choice

__all__ = ["Flow", "GroupPhase", "CommPhase", "CommLowering", "PhaseLoad", "Resolved", "lower_plans"]


class _GroupFlows:
    """``GroupPhase.flows``: the tuple given, or, for a group made by :meth:`GroupPhase.of`, its
    plan phase's flows read on first use (a translated group's flows are made on first read,
    :meth:`simulator.cluster.collective_plan.PhasePlan.moved`, and only the issuing group's are read)."""

    def __get__(self, obj: GroupPhase | None, owner: type | None = None) -> tuple[Flow, ...]:
        if obj is None:
            raise AttributeError("flows")
        found = obj.__dict__["_flows"]
        if isinstance(found, PhasePlan):
            found = obj.__dict__["_flows"] = found.flows
        return found  # type: ignore[no-any-return]

    def __set__(self, obj: GroupPhase, value: tuple[Flow, ...]) -> None:
        obj.__dict__["_flows"] = value


@dataclass(frozen=True)
class GroupPhase:
    """One phase of one process group's collective.

    ``steps``: sequential algorithm steps of the phase (ring all-reduce 2(n-1), all-gather
    and reduce-scatter n-1, tree 2(ppn-1+ceil(log2 k)) pipelined, direct 1).
    ``multiplicity``: how many translates of ``gpus`` this group stands for under symmetry
    reduction (1 without it). ``flows``: the point-to-point flows (source and destination
    GPU, ``weight`` = bytes over the whole phase per byte of D, protocol overhead not
    included; host copies have ``src == dst``). ``link_ids`` / ``link_bytes_per_byte``:
    every link the flows cross and the bytes per byte of D it carries (multipath fractions
    included).
    """

    gpus: tuple[int, ...]
    multiplicity: int
    steps: int
    flows: tuple[Flow, ...]
    link_ids: np.ndarray
    link_bytes_per_byte: np.ndarray

    @classmethod
    def of(cls, gpus: tuple[int, ...], multiplicity: int, phase: PhasePlan) -> GroupPhase:
        """The group phase of plan phase ``phase``; its flows read from ``phase`` when first asked."""
        ids, weights = phase.arrays()
        group = cls(gpus, multiplicity, phase.steps, (), ids, weights)
        group.__dict__["_flows"] = phase
        return group

    def step_bytes_per_byte(self, flow: Flow) -> float:
        """Bytes ``flow`` moves in one step, per byte of D: its phase bytes over the steps.

        Exact for rings (every step sends one chunk of D/(n*C) per edge); for pipelined
        trees and chains it is the mean step of the pipeline."""
        return flow.weight / self.steps if self.steps else flow.weight


# installed after the dataclass is made, so the field stays required (no class-level default)
setattr(GroupPhase, "flows", _GroupFlows())  # noqa: B010


@dataclass(frozen=True)
class CommPhase:
    """One phase of an operation across every group it stands for; phases run in order."""

    groups: tuple[GroupPhase, ...]  # the issuing group first

    @property
    def steps(self) -> int:
        """Sequential steps of the issuing group's phase."""
        return self.groups[0].steps

    @property
    def heaviest_bytes_per_byte(self) -> float:
        """Bytes per byte of D of the issuing group's heaviest flow (the phase's pace setter)."""
        return max(f.weight for f in self.groups[0].flows)


@dataclass(frozen=True)
class CommLowering:
    """A communication operation, fully lowered: per-phase step structure plus its size.

    ``nbytes``: D, the size of one collective (nccl-tests convention); ``count`` of them run
    back to back. ``protocol_efficiency``: fraction of link bandwidth the protocol delivers
    (wire bytes = payload / efficiency; NCCL's LL moves 8 bytes per 4 of payload).
    ``latency_s``: fixed time of the ``count`` collectives, paid after the last phase's bytes.
    """

    op: str
    algorithm: str
    protocol: str
    nbytes: float
    count: int
    protocol_efficiency: float
    latency_s: float
    phases: tuple[CommPhase, ...]

    def wire_bytes(self, bytes_per_byte: float) -> float:
        """Bytes on the wire for a flow moving ``bytes_per_byte`` per byte of D, all repeats."""
        return bytes_per_byte * self.nbytes * self.count / self.protocol_efficiency

    def step_wire_bytes(self, phase: int, flow: Flow, group: int = 0) -> float:
        """Bytes on the wire ``flow`` (of group ``group`` in phase ``phase``) moves per step."""
        return self.wire_bytes(self.phases[phase].groups[group].step_bytes_per_byte(flow))


@dataclass(frozen=True)
class PhaseLoad:
    """One phase folded onto link classes: what the flow and analytical models run.

    ``classes``/``flows``: the link classes it crosses and how many of its flows (fractional
    under multipath spraying or symmetry averaging) cross each; ``bytes_per_flow``: bytes
    its heaviest flow moves (protocol overhead included); ``latency_s``: fixed time added
    after the bytes; ``rate_cap``: per-flow rate limit in bytes/s (TCP), ``inf`` if none.
    """

    classes: np.ndarray
    flows: np.ndarray
    bytes_per_flow: float
    latency_s: float
    rate_cap: float = float("inf")


@dataclass(frozen=True)
class Resolved:
    """A communication operation ready for a network model.

    ``phases``: folded per-class loads, run in order; ``lowering``: the step structure they
    were folded from (None for an operation that moves nothing); ``alone_s``: its time with
    the network to itself (closed form over the folded loads).
    """

    phases: list[PhaseLoad]
    choice: Choice | None
    algorithm: str
    protocol: str
    alone_s: float
    lowering: CommLowering | None = None


def lower_plans(plans: Sequence[CollectivePlan], multiplicity: Sequence[int]) -> tuple[CommPhase, ...]:
    """The step structure of ``plans`` (one per group, the issuing group first), per byte of D.

    Every plan must have as many phases as the first (the groups are translates of one another).
    """
    phases = []
    for index in range(len(plans[0].phases)):
        groups = []
        for plan, m in zip(plans, multiplicity, strict=True):
            groups.append(GroupPhase.of(plan.gpus, m, plan.phases[index]))
        phases.append(CommPhase(tuple(groups)))
    return tuple(phases)
