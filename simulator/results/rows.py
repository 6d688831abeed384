"""Trace rows: what the engine recorded, in plain records (the input of every result).

One :class:`Row` per executed task on a simulated rank; one :class:`LinkStat` per link
class. :class:`RunFacts` carries the plain numbers about the scenario and cluster that the
metrics need (the results stage imports nothing else from the simulator).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Row", "LinkStat", "RunFacts"]


@dataclass(frozen=True, slots=True)
class Row:
    rank: int
    stream: str
    name: str
    category: str  # compute | tp | cp | pp | dp | shard | offload
    start_s: float
    end_s: float
    meta: dict[str, Any] | None = None
    mem: tuple[tuple[float, float, str], ...] = ()  # (time_s, delta_bytes, category)
    comm: dict[str, Any] | None = None  # op, bytes, group size, algorithm, protocol
    join: str | None = None  # tasks of one collective / p2p transfer share it (send -> recv arrows)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True)
class LinkStat:
    label: str
    kind: str
    tier: str
    capacity_bytes_per_s: float
    bytes: float  # carried by one link of the class
    members: int


@dataclass
class RunFacts:
    scenario_name: str
    scenario_hash: str
    simulator_version: str
    calibration: str
    world_size: int
    tp: int
    pp: int
    cp: int
    dp: int
    virtual_stages: int
    micro_batches: int
    global_batch: int
    seq_len: int
    params: int
    model_flops_per_step: float
    hardware_flops_per_step: float
    peak_flops_per_s: float
    precision: str
    gpu: str
    gpu_memory_bytes: float
    represents: dict[int, int]
    stage_of: dict[int, int]
    initial_memory: dict[int, dict[str, float]]
    flops_convention: str
    sharding: str
    schedule: str
    engine_events: int = 0
    network_entities: int = 0
    network_recomputations: int = 0
    symmetry: str = "auto"
    network_mode: str = "flow"
    gpus_per_node: int = 0  # rank r sits on node r // gpus_per_node, local GPU r % gpus_per_node (0: unknown)
    extra: dict[str, Any] = field(default_factory=dict)


def stretch(row: Row) -> float:
    """How much longer a fused task ran than its inner timeline (compute slowed by collectives
    running beside it on the GPU); 1 for other tasks."""
    nominal = (row.meta or {}).get("nominal_s")
    return row.duration_s / nominal if nominal else 1.0


def expand_fused(rows: list[Row]) -> list[Row]:
    """Rows with every fused run of layers replaced by its inner slices.

    The engine runs a chain of layers whose collectives are private to their group as one
    task; its ``meta["parts"]`` keeps the inner timeline: (name, category, offset_s,
    duration_s, op, nbytes, ranks). Kernels become compute rows on the task's stream,
    collectives rows on a stream named after their group (``tp``, ``cp``); offsets and durations
    are stretched with the task (:func:`stretch`). The task's memory changes (absolute times)
    ride on its first slice, so memory timelines are unchanged.
    """
    out: list[Row] = []
    for row in rows:
        parts = (row.meta or {}).get("parts") if row.category == "compute" else None
        if not parts:
            out.append(row)
            continue
        base = {k: v for k, v in (row.meta or {}).items()
                if k not in ("parts", "compute_s", "comm_s", "exposed_s", "flops", "units", "nominal_s")}
        base["fused"] = row.name
        mem = row.mem
        scale = stretch(row)
        for name, category, offset, duration, op, nbytes, ranks in parts:
            start = row.start_s + offset * scale
            duration *= scale
            if op:
                comm = {"op": op, "bytes": nbytes, "count": 1, "ranks": ranks, "algorithm": None, "protocol": None}
                out.append(Row(row.rank, category, name, category, start, start + duration, dict(base), mem, comm))
            else:
                out.append(Row(row.rank, row.stream, name, "compute", start, start + duration, dict(base), mem))
            mem = ()
    return out
