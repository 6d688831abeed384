"""Trace rows: what the engine recorded, in plain records (the input of every result).

One :class:`Row` per executed task on a simulated rank; one :class:`LinkStat` per link
class. :class:`RunFacts` carries the plain numbers about the scenario and cluster that the
metrics need (the results stage imports nothing else from the simulator).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from simulator.ir import TaskInfo

__all__ = ["Row", "LazyMemRow", "CommRecord", "LinkStat", "RunFacts", "memory_key"]


@dataclass(frozen=True, slots=True)
class CommRecord:
    """The communication a row ran: ``op`` over ``ranks`` ranks (``group``: their global ranks),
    ``nbytes`` per collective (nccl-tests convention), ``count`` back to back, the algorithm and
    protocol the tuner chose, and ``alone_s``, its time alone on the network (None if unknown)."""

    op: str
    nbytes: float
    count: int = 1
    ranks: int = 1
    group: tuple[int, ...] | None = None
    algorithm: str | None = None
    protocol: str | None = None
    alone_s: float | None = None


@dataclass(frozen=True, slots=True)
class Row:
    rank: int
    stream: str
    name: str
    category: str  # compute | tp | cp | pp | dp | shard | offload
    start_s: float
    end_s: float
    info: TaskInfo | None = None
    mem: tuple[tuple[float, float, str], ...] = ()  # (time_s, delta_bytes, category)
    comm: CommRecord | None = None
    join: str | None = None  # tasks of one collective / p2p transfer share it (send -> recv arrows)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


_MEM_SLOT = Row.__dict__["mem"]  # the slot the dataclass made for ``Row.mem``


class LazyMemRow(Row):
    """A :class:`Row` whose memory changes are made when read, from offsets after its start
    and their bytes and categories (tuples shared by every row of the same task shape): a run
    without symmetry keeps 545k rows, and their ~6M ``(time, bytes, category)`` tuples made
    eagerly were half its memory. Reads, equality, hashing, ``repr`` and ``replace`` see the
    same fields as a plain :class:`Row` (``replace`` and pickling give a plain one)."""

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> Row:  # type: ignore[misc]
        return Row(*args, **kwargs)  # dataclasses.replace: a plain row with the fields given

    @classmethod
    def at(cls, rank: int, stream: str, name: str, category: str, start_s: float, end_s: float,
           info: TaskInfo | None, changes: tuple[tuple[float, ...], tuple[float, ...], tuple[str, ...]],
           comm: CommRecord | None, join: str | None) -> LazyMemRow:
        """The row; ``changes``: offsets after ``start_s``, bytes and categories."""
        row = object.__new__(cls)
        put = object.__setattr__
        put(row, "rank", rank)
        put(row, "stream", stream)
        put(row, "name", name)
        put(row, "category", category)
        put(row, "start_s", start_s)
        put(row, "end_s", end_s)
        put(row, "info", info)
        _MEM_SLOT.__set__(row, changes)
        put(row, "comm", comm)
        put(row, "join", join)
        return row

    @property  # type: ignore[override]
    def mem(self) -> tuple[tuple[float, float, str], ...]:
        offsets, nbytes, categories = _MEM_SLOT.__get__(self, Row)
        return tuple(zip(map(self.start_s.__add__, offsets), nbytes, categories, strict=True))

    def _fields(self) -> tuple[Any, ...]:
        return (self.rank, self.stream, self.name, self.category, self.start_s, self.end_s, self.info, self.mem,
                self.comm, self.join)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Row):
            return NotImplemented
        return self._fields() == (other.rank, other.stream, other.name, other.category, other.start_s, other.end_s,
                                  other.info, other.mem, other.comm, other.join)

    __hash__ = Row.__hash__

    def __reduce__(self) -> tuple[Any, ...]:
        return Row, self._fields()


def memory_key(row: Row) -> Any:
    """What ``row.mem`` is made from, without making it: rows with equal keys have equal
    changes (a :class:`LazyMemRow`'s start and shared offsets, bytes and categories; a plain
    row's changes themselves); None for a row without changes."""
    if type(row) is LazyMemRow:
        return (row.start_s, _MEM_SLOT.__get__(row, Row))
    return row.mem or None


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
    running beside it on the GPU, by a straggler's slowdown or by jitter: the engine runs the
    perturbed duration, ``nominal_s`` stays the unperturbed span); 1 for other tasks."""
    fused = row.info.fused if row.info is not None else None
    return row.duration_s / fused.nominal_s if fused is not None and fused.nominal_s else 1.0


def expand_fused(rows: list[Row]) -> list[Row]:
    """Rows with every fused run of layers replaced by its inner slices.

    The engine runs a chain of layers whose collectives are private to their group as one
    task; its ``info.fused.parts`` keep the inner timeline (:class:`~simulator.ir.FusedPart`).
    Kernels become compute rows on the task's stream, collectives rows on a stream named after
    their group (``tp``, ``cp``); offsets and durations are stretched with the task
    (:func:`stretch`). Each slice carries its own layer, phase (a full recomputation's forward
    is ``recompute``), FLOPs and kernels, and a collective its algorithm, protocol and time
    alone. The task's memory changes (absolute times) ride on its first slice, so memory
    timelines are unchanged.
    """
    out: list[Row] = []
    for row in rows:
        fused = row.info.fused if row.info is not None and row.category == "compute" else None
        if fused is None or not fused.parts:
            out.append(row)
            continue
        assert row.info is not None
        base = replace(row.info, flops=None, fused=None, fused_from=row.name)
        mem = row.mem
        scale = stretch(row)
        for part in fused.parts:
            # end from the part's end offset, so a slice that starts where the previous one
            # ended (offsets are cumulative sums) touches it exactly instead of overlapping
            # it by a rounding error (which drew a spurious second compute lane)
            start = row.start_s + part.offset_s * scale
            end = row.start_s + (part.offset_s + part.duration_s) * scale
            info = replace(base, layer=part.layer, phase=part.phase or base.phase)
            if part.op:
                comm = CommRecord(part.op, part.nbytes, 1, part.ranks, None, part.algorithm, part.protocol,
                                  part.duration_s)
                out.append(Row(row.rank, part.category, part.name, part.category, start, end, info, mem, comm))
            else:
                info = replace(info, flops=part.flops, kernels=part.kernels)
                out.append(Row(row.rank, row.stream, part.name, "compute", start, end, info, mem))
            mem = ()
    return out
