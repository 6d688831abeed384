"""Rank placement and process groups.

Ranks are placed node-major (rank r on GPU r: node r // gpus_per_node). The parallel axes
nest with tp innermost, then cp, pp and dp outermost (Megatron-Core's default order
"tp-cp-ep-dp-pp" keeps tp innermost too; we put pp inside dp so that a pipeline's stages
are consecutive nodes and each data-parallel replica is a contiguous block of ranks):

    rank = tp_i + tp * (cp_i + cp * (pp_i + pp * dp_i))

so a TP group is ``tp`` consecutive ranks (one node when tp <= GPUs per node). Sharded
data parallelism splits the dp axis: MiCS / HSDP partition (shard) groups are
``shard_group_size`` consecutive dp indices, replication groups take the same index across
partition groups (DeepSpeed ``_generate_mics_config``). Context-parallel ranks hold the same
parameters, so gradients are reduced over dp x cp (Megatron's ``dp_cp`` group) and shard
groups include the cp ranks (as torchtitan's ``dp_shard_cp`` mesh). The ``embedding`` group
joins the first and last pipeline stage, which both hold the tied embedding matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal

__all__ = ["Mesh", "Axis"]

Axis = Literal["tp", "cp", "pp", "dp", "dp_cp", "dp_shard", "dp_replicate", "tp_cp", "embedding", "world"]


@dataclass(frozen=True)
class Mesh:
    tp: int
    cp: int
    pp: int
    dp: int
    shard_group_size: int | None = None  # hsdp / mics partition group size along dp

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def slice_size(self) -> int:
        """Ranks of one data-parallel replica (tp * cp * pp)."""
        return self.tp * self.cp * self.pp

    def coords(self, rank: int) -> tuple[int, int, int, int]:
        """(tp_i, cp_i, pp_i, dp_i) of a rank."""
        tp_i, rest = rank % self.tp, rank // self.tp
        cp_i, rest = rest % self.cp, rest // self.cp
        pp_i, dp_i = rest % self.pp, rest // self.pp
        return tp_i, cp_i, pp_i, dp_i

    def rank(self, tp_i: int, cp_i: int, pp_i: int, dp_i: int) -> int:
        return tp_i + self.tp * (cp_i + self.cp * (pp_i + self.pp * dp_i))

    def stage(self, rank: int) -> int:
        return self.coords(rank)[2]

    def group(self, rank: int, axis: Axis) -> tuple[int, ...]:
        """The ranks of ``rank``'s process group along ``axis``, in axis order."""
        t, c, p, d = self.coords(rank)
        if axis == "tp":
            return tuple(self.rank(i, c, p, d) for i in range(self.tp))
        if axis == "cp":
            return tuple(self.rank(t, i, p, d) for i in range(self.cp))
        if axis == "tp_cp":
            return tuple(self.rank(i, j, p, d) for j in range(self.cp) for i in range(self.tp))
        if axis == "pp":
            return tuple(self.rank(t, c, i, d) for i in range(self.pp))
        if axis == "dp":
            return tuple(self.rank(t, c, p, i) for i in range(self.dp))
        if axis == "dp_cp":
            return tuple(self.rank(t, j, p, i) for i in range(self.dp) for j in range(self.cp))
        if axis == "dp_shard":
            # a partition (shard) group: shard_group_size consecutive dp indices, and every cp rank
            size = self.shard_group_size or self.dp
            start = d - d % size
            return tuple(self.rank(t, j, p, i) for i in range(start, start + size) for j in range(self.cp))
        if axis == "dp_replicate":
            size = self.shard_group_size or self.dp
            return tuple(self.rank(t, c, p, i) for i in range(d % size, self.dp, size))
        if axis == "embedding":
            first, last = self.rank(t, c, 0, d), self.rank(t, c, self.pp - 1, d)
            return (first,) if first == last else (first, last)
        if axis == "world":
            return tuple(range(self.world))
        raise ValueError(f"unknown axis {axis!r}")

    @cached_property
    def stage_representatives(self) -> tuple[int, ...]:
        """One rank per pipeline stage (tp_i = cp_i = dp_i = 0)."""
        return tuple(self.rank(0, 0, p, 0) for p in range(self.pp))
