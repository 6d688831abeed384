"""Symmetry reduction: which ranks are simulated and whom each one stands for.

With ``sim.symmetry: auto`` one rank per pipeline stage is simulated: all ranks of a stage
do identical work on a healthy, uniform cluster. Each collective a simulated rank issues
stands for the same collective of every *sibling* in its block of nodes (the smallest block
of whole nodes holding whole data-parallel replicas, ``lcm(slice, gpus_per_node)`` ranks),
so their traffic still loads the network; the engine averages link classes over the
blocks (:class:`simulator.engine.LinkClasses`), which splits a class whose members differ.
``off`` simulates every rank and joins each collective across its members.

This module is the one place that decides it: the workload asks it for the simulated ranks,
siblings and the groups a collective stands for; ``run.py`` asks it for the block size. It
never averages ranks that differ: given a ``rank_key`` (what makes a rank's work its own, e.g.
a straggler's slowdown), ranks of one stage with different keys switch the reduction off and
every rank is simulated (``reason`` says why); ``off_reason`` switches it off for a perturbation
no rank key expresses (jitter draws, degraded links: :mod:`simulator.perturbation`). Link
classes whose members differ are split by the engine (:mod:`simulator.engine.link_classes`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from simulator.cluster.mesh import Mesh
from simulator.units import MiB

__all__ = ["Symmetry", "block_ranks", "SMALL_COLLECTIVE_BYTES"]

# Below this size a collective is latency-bound; its siblings' copies are not placed on links.
SMALL_COLLECTIVE_BYTES = 1 * MiB


def block_ranks(mesh: Mesh, gpus_per_node: int) -> int:
    """Ranks of the smallest block of whole nodes that holds whole data-parallel replicas (and
    whole expert-parallel groups: ``ep*etp`` consecutive ranks of a stage, so ``lcm(ep*etp, tp*cp) /
    (tp*cp)`` replicas). With pp outermost (Megatron-Core's order) a replica spans the whole
    world: one block, so every link is its own class and a phase standing for a stage's copies
    loads thousands of them (the flow model handles such loads by array operations,
    :mod:`simulator.engine.network.components`). A block within each stage would fold those
    copies, but it changes how the mean-field tier loads are summed (m translates of a group
    added as one ``m * w`` instead of m times ``w``): not the same doubles."""
    if mesh.pp_outermost:
        return mesh.world
    replicas = math.lcm(mesh.ep * mesh.etp, mesh.tp * mesh.cp) // (mesh.tp * mesh.cp)
    return math.lcm(mesh.slice_size * replicas, gpus_per_node)


@dataclass
class Symmetry:
    """Simulated ranks, their siblings and the process groups their collectives stand for."""

    mesh: Mesh
    gpus_per_node: int
    requested: bool
    rank_key: Callable[[int], Hashable] | None = None
    off_reason: str | None = None  # a perturbation that no rank key expresses (a degraded link): reduction off
    enabled: bool = field(init=False)
    reason: str = field(init=False)
    block: int = field(init=False)
    _instances: dict[tuple[int, str], tuple[tuple[int, ...], ...]] = field(init=False, default_factory=dict)
    _siblings: dict[int, list[int]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.block = block_ranks(self.mesh, self.gpus_per_node)
        self.enabled = self.requested
        self.reason = "one rank per pipeline stage stands for its stage" if self.requested else "symmetry: off"
        if self.requested and self.off_reason is not None:
            self.enabled = False
            self.reason = self.off_reason
        elif self.requested and self.rank_key is not None:
            different = self._first_difference(self.rank_key)
            if different is not None:
                self.enabled = False
                self.reason = different

    def _first_difference(self, key: Callable[[int], Hashable]) -> str | None:
        """Why the ranks of some stage cannot share one simulation, or None if none differ."""
        seen: dict[int, tuple[int, Hashable]] = {}
        for rank in range(self.mesh.world):
            stage, mine = self.mesh.stage(rank), key(rank)
            first = seen.setdefault(stage, (rank, mine))
            if first[1] != mine:
                return (f"ranks {first[0]} and {rank} of stage {stage} differ ({first[1]!r} vs {mine!r}): "
                        "every rank is simulated")
        return None

    @property
    def block_ranks(self) -> int | None:
        """The block the engine averages link classes over (None: every rank simulated)."""
        return self.block if self.enabled else None

    def simulated_ranks(self) -> tuple[int, ...]:
        if self.enabled:
            return self.mesh.stage_representatives
        return tuple(range(self.mesh.world))

    def represents(self, ranks: tuple[int, ...]) -> dict[int, int]:
        """How many real ranks each simulated rank stands for."""
        return {r: self.mesh.world // len(ranks) for r in ranks}

    def siblings(self, rank: int) -> list[int]:
        """Ranks of ``rank``'s block that share its stage and so do identical work, ascending
        (the data-parallel replicas of the block, with every tp/cp rank of each)."""
        if not self.enabled:
            return [rank]
        found = self._siblings.get(rank)
        if found is None:
            m = self.mesh
            stage = m.stage(rank)
            if m.pp_outermost:  # the block is the world: every rank of the stage
                found = self._siblings[rank] = sorted(m.stage_ranks(rank))
                return found
            slice_size = m.slice_size
            replicas = max(1, self.block // slice_size)
            first = (rank // slice_size) * slice_size
            found = [r for r in range(first, first + replicas * slice_size) if m.stage(r) == stage]
            self._siblings[rank] = found
        return found

    def instances(self, rank: int, group_name: str) -> tuple[tuple[int, ...], ...]:
        """The distinct ``group_name`` groups of ``rank``'s siblings, its own first."""
        key = (rank, group_name)
        found = self._instances.get(key)
        if found is None:
            own = self.mesh.group(rank, group_name)
            groups = {own: None}
            for sib in self.siblings(rank):
                groups.setdefault(self.mesh.group(sib, group_name), None)
            found = self._instances[key] = tuple(groups)
        return found

    def comm_instances(self, rank: int, group_name: str, total_bytes: float) -> tuple[tuple[int, ...], ...]:
        """Groups whose identical traffic one collective stands for. Latency-bound collectives
        (under ``SMALL_COLLECTIVE_BYTES``, e.g. a gradient-norm all-reduce) put negligible load
        on links: only the issuing group's flows are placed."""
        if total_bytes < SMALL_COLLECTIVE_BYTES:
            return (self.mesh.group(rank, group_name),)
        return self.instances(rank, group_name)
