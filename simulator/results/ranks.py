"""Which real ranks a simulated rank stands for, and how to name ranks for people.

With symmetry (``sim.symmetry: auto``) the engine simulates one rank per pipeline stage
(tp, cp and dp coordinates 0); it stands for every rank of its stage. Ranks are laid out
``rank = tp_i + tp * (cp_i + cp * (pp_i + pp * dp_i))`` (``cluster/mesh.py``), so the stage
of a rank is ``(rank // (tp * cp)) % pp``, and rank ``r`` sits on node ``r // gpus_per_node``,
local GPU ``r % gpus_per_node``.
"""

from __future__ import annotations

from collections.abc import Iterable

from simulator.errors import ScenarioError
from simulator.results.rows import RunFacts

__all__ = ["stage_of_rank", "represented_ranks", "select_ranks", "format_rank_ranges", "rank_label"]


def stage_of_rank(facts: RunFacts, rank: int) -> int:
    """Pipeline stage of global ``rank`` (mesh layout above)."""
    return (rank // (facts.tp * facts.cp)) % facts.pp


def represented_ranks(facts: RunFacts, rank: int) -> list[int] | None:
    """The global ranks simulated ``rank`` stands for (itself included), ascending.

    ``[rank]`` when it stands for itself only; all ranks of its stage when the simulation
    kept one rank per stage; None when the grouping is not one of those two (then only the
    count ``facts.represents[rank]`` is known).
    """
    count = facts.represents[rank]
    if count == 1:
        return [rank]
    if count * facts.pp == facts.world_size and len(facts.represents) == facts.pp:
        stage = facts.stage_of[rank]
        return [r for r in range(facts.world_size) if stage_of_rank(facts, r) == stage]
    return None


def select_ranks(facts: RunFacts, requested: Iterable[int] | None) -> list[int]:
    """The simulated ranks to show for the ``requested`` global ranks (all simulated ranks for None).

    A requested rank that was not simulated maps to the simulated rank standing for it.
    Raises :class:`ScenarioError` for a rank outside ``0 .. world_size - 1`` or one that no
    simulated rank stands for.
    """
    simulated = sorted(facts.represents)
    if requested is None:
        return simulated
    stand_in: dict[int, int] = {}
    for sim in simulated:
        for r in represented_ranks(facts, sim) or [sim]:
            stand_in.setdefault(r, sim)
    chosen: set[int] = set()
    for r in requested:
        if not 0 <= r < facts.world_size:
            raise ScenarioError(f"--trace-ranks: rank {r} is outside the cluster (ranks 0-{facts.world_size - 1})")
        if r not in stand_in:
            raise ScenarioError(f"--trace-ranks: rank {r} was not simulated and no simulated rank stands for it")
        chosen.add(stand_in[r])
    return sorted(chosen)


def format_rank_ranges(ranks: Iterable[int], limit: int = 6) -> str:
    """``0-1,4-5,8`` for ranks {0, 1, 4, 5, 8}; after ``limit`` ranges ``,…`` and the count."""
    values = sorted(set(ranks))
    ranges: list[tuple[int, int]] = []
    for r in values:
        if ranges and r == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], r)
        else:
            ranges.append((r, r))
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in ranges[:limit]]
    text = ",".join(parts)
    if len(ranges) > limit:
        text += f",… ({len(values)} ranks)"
    return text


def rank_label(facts: RunFacts, rank: int) -> str:
    """``rank 8 (node 1 GPU 0)``, with the ranks it stands for when there are others."""
    where = ""
    if facts.gpus_per_node > 0:
        where = f" (node {rank // facts.gpus_per_node} GPU {rank % facts.gpus_per_node})"
    text = f"rank {rank}{where}"
    count = facts.represents.get(rank, 1)
    if count > 1:
        stands = represented_ranks(facts, rank)
        text += f" for {count} ranks" + (f": stage {facts.stage_of[rank]}, ranks {format_rank_ranges(stands)}"
                                          if stands else "")
    return text
