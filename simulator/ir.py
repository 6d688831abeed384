"""The stage-neutral typed program: what the workload stage emits and the engine runs.

Per-rank task DAGs (a :class:`Program`).

Each task runs on one stream of one simulated rank. Streams are in-order (like CUDA
streams): a task starts when it is at the head of its stream *and* all its dependencies
(on any stream or rank) have finished. Communication tasks carry a :class:`CommOp`; the
tasks of one collective on different simulated ranks share a ``join`` key and start
together once all of them are ready (point-to-point transfers join sender and receiver).

Memory is part of the DAG: a task lists the bytes it allocates (+) or frees (-) at its
start or end, by category; the results stage turns those into per-rank timelines.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, get_args

from simulator import limits

__all__ = ["CommOp", "MemDelta", "KernelInfo", "FusedPart", "FusedLayers", "TaskInfo", "Task", "Program", "ProgramBuilder", "STREAMS", "OpName", "HOST_COPY_OPS",
           "COLLECTIVE_OPS", "is_host_copy", "op_name"]

# stream names, one per kind of work (compute, and one per communication group kind)
STREAMS = ("compute", "tp", "cp", "ep", "pp", "dp", "shard", "offload")

# what a communication task does: a collective over its group, a point-to-point transfer, or
# a copy between the GPU and its host (copy engines, not SMs: it does not slow compute)
OpName = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "p2p", "d2h", "h2d"]
HOST_COPY_OPS: frozenset[str] = frozenset({"d2h", "h2d"})
COLLECTIVE_OPS: tuple[str, ...] = tuple(o for o in get_args(OpName) if o not in HOST_COPY_OPS and o != "p2p")


def op_name(value: str) -> OpName:
    """``value`` as an :data:`OpName`; ValueError naming the known ones otherwise."""
    if value not in get_args(OpName):
        raise ValueError(f"unknown communication op {value!r} (known: {', '.join(get_args(OpName))})")
    return value  # type: ignore[return-value]


def is_host_copy(op: str) -> bool:
    """A GPU <-> host copy (runs on copy engines: no compute slowdown, host links)."""
    return op in HOST_COPY_OPS


@dataclass(frozen=True, slots=True)
class CommOp:
    """A collective (or point-to-point transfer) as issued by one simulated rank.

    ``group`` is the process group of the issuing rank (global ranks). ``instances`` are all
    the groups whose identical traffic this operation stands for under symmetry reduction
    (the issuing group first); the engine puts all of their flows on the network.
    ``nbytes`` is the size of one collective (nccl-tests convention); ``count`` of them run
    back to back on the stream.
    """

    op: OpName
    group: tuple[int, ...]
    nbytes: float
    axis: str  # tp | cp | pp | dp | shard | replicate | offload | world
    instances: tuple[tuple[int, ...], ...] = ()
    algorithm: str | None = None  # None: NCCL-like choice by size and topology
    count: int = 1  # back-to-back repeats of the same collective (e.g. DDP buckets ready together)
    sm_slowdown: float | None = None  # compute slowdown beside it, its own (DeepEP's SMs); None: the run's

    def all_instances(self) -> tuple[tuple[int, ...], ...]:
        return self.instances or (self.group,)


@dataclass(frozen=True, slots=True)
class MemDelta:
    at_end: bool  # True: at the task's end; False: at its start plus ``offset_s``
    nbytes: float  # + allocate, - free
    category: str  # params | grads | optimizer | activations | buffers | other
    offset_s: float = 0.0


class KernelInfo(NamedTuple):
    """One GPU kernel of a compute task, for traces: ``kind`` gemm | attention | memory | cast,
    its FLOPs and HBM bytes, ``shape`` (a GEMM's ``MxNxK`` for [M, K] x [K, N]; fused
    attention's block sequence length, head dim and masked share; the tensor a memory-bound or
    cast kernel sweeps, ``TxH elements``) and ``time_s``, its modelled time in the
    task (roofline time, stretched with its step when the host is the slower stage)."""

    name: str
    kind: str
    flops: float
    nbytes: float
    shape: str
    time_s: float


class FusedPart(NamedTuple):
    """One kernel or collective inside a fused compute task, at ``offset_s`` from its start.

    ``category`` is ``compute`` or the collective's group kind (tp, cp); ``op``, ``nbytes``
    and ``ranks`` describe a collective ("" / 0 / 1 for kernels), ``algorithm`` and
    ``protocol`` the one the tuner chose for it. ``layer`` (-1: embedding or output layer)
    and ``phase`` (fwd | bwd | recompute) are those of the layer pass the part belongs to;
    ``flops`` and ``kernels`` those of a compute step.
    """

    name: str
    category: str
    offset_s: float
    duration_s: float
    op: str
    nbytes: float
    ranks: int
    layer: int = -1
    phase: str = ""
    flops: float = 0.0
    kernels: tuple[KernelInfo, ...] = ()
    algorithm: str | None = None
    protocol: str | None = None


@dataclass(frozen=True, slots=True)
class FusedLayers:
    """The inner timeline of a fused run of units (one compute task): unit range, compute and
    collective seconds by group kind (in flight, and on the critical path), and the parts."""

    units: tuple[int, int]
    compute_s: float
    comm_s: dict[str, float]
    exposed_s: dict[str, float]
    parts: tuple[FusedPart, ...]
    nominal_s: float  # the timeline's length before any slowdown from collectives beside it


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """What a task is, for the results and traces (None: not applicable).

    ``phase`` fwd | bwd | recompute | optimizer; ``mb`` micro-batch; ``layer`` transformer
    layer (-1 embedding); ``chunk`` virtual pipeline stage; ``flops`` of a compute task;
    ``params`` an optimizer step's parameters; ``group`` the mesh group of a strategy's
    collective; ``src``/``dst``/``src_chunk``/``dst_chunk`` and ``role`` of a pipeline transfer;
    ``fused`` the inner timeline of a fused run of layers; ``fused_from`` the fused task a
    slice was expanded from; ``kernels`` the GPU kernels of a compute task (for traces).
    """

    phase: str | None = None
    mb: int | None = None
    layer: int | None = None
    chunk: int | None = None
    flops: float | None = None
    params: float | None = None
    group: str | None = None
    src: int | None = None
    dst: int | None = None
    src_chunk: int | None = None
    dst_chunk: int | None = None
    role: Literal["send", "recv"] | None = None
    fused: FusedLayers | None = None
    fused_from: str | None = None
    kernels: tuple[KernelInfo, ...] = ()

    def extra_args(self) -> dict[str, Any]:
        """The fields a trace shows beyond phase, micro-batch, layer, chunk and FLOPs, by
        their trace names, in a fixed order."""
        out: dict[str, Any] = {}
        for name, key in (("params", "params"), ("group", "axis"), ("src", "src"), ("dst", "dst"),
                          ("src_chunk", "src_chunk"), ("dst_chunk", "dst_chunk"), ("fused_from", "fused")):
            value = getattr(self, name)
            if value is not None:
                out[key] = value
        return out


@dataclass(slots=True)
class Task:
    id: int
    rank: int
    stream: str
    name: str
    category: str
    duration_s: float = 0.0
    comm: CommOp | None = None
    join: Hashable | None = None
    deps: list[int] = field(default_factory=list)
    mem: tuple[MemDelta, ...] = ()
    info: TaskInfo | None = None


@dataclass
class Program:
    """Tasks of the simulated ranks, plus what the engine needs to run them."""

    tasks: list[Task]
    ranks: tuple[int, ...]  # simulated ranks
    represents: dict[int, int]  # simulated rank -> how many real ranks behave like it
    join_size: dict[Hashable, int]
    initial_memory: dict[int, dict[str, float]]  # rank -> category -> bytes at t = 0
    # the joins numbered in order of first use: per task its join's number (-1: none), per
    # number the join's size (what the engine looks up per task, without hashing join keys);
    # None: the engine numbers them itself
    join_of: list[int] | None = None
    join_sizes: list[int] | None = None

    def streams(self) -> dict[tuple[int, str], list[int]]:
        order: dict[tuple[int, str], list[int]] = {}
        for task in self.tasks:
            order.setdefault((task.rank, task.stream), []).append(task.id)
        return order


class ProgramBuilder:
    """Appends tasks in issue order; join keys are counted as tasks using them are added."""

    def __init__(self) -> None:
        self.tasks: list[Task] = []
        self._join_number: dict[Hashable, int] = {}  # join key -> its number (order of first use)
        self._join_sizes: list[int] = []  # per join number: tasks using it so far
        self._join_of: list[int] = []  # per task: its join's number, -1 for none
        self.max_tasks = limits.get("tasks")  # a program this large is refused while it is built

    @property
    def join_size(self) -> dict[Hashable, int]:
        """Tasks per join key so far."""
        sizes = self._join_sizes
        return {key: sizes[number] for key, number in self._join_number.items()}

    def add(
        self,
        rank: int,
        stream: str,
        name: str,
        category: str,
        *,
        duration_s: float = 0.0,
        comm: CommOp | None = None,
        join: Hashable | None = None,
        deps: list[int] | tuple[int, ...] = (),
        mem: tuple[MemDelta, ...] = (),
        info: TaskInfo | None = None,
    ) -> int:
        task = Task(len(self.tasks), rank, stream, name, category, duration_s, comm, join,
                    [d for d in deps if d is not None], mem, info)
        self.append(task)
        return task.id

    def append(self, task: Task) -> None:
        """Append a task whose ``id`` is its position (``len(tasks)`` before the call)."""
        if len(self.tasks) >= self.max_tasks:
            raise limits.exceeded("tasks", len(self.tasks) + 1, what="tasks of the simulated program (building "
                                  "stopped there; the count grows with layers x micro-batches x simulated ranks)")
        self.tasks.append(task)
        if task.join is None:
            self._join_of.append(-1)
            return
        number = self._join_number.get(task.join)
        if number is None:
            number = self._join_number[task.join] = len(self._join_sizes)
            self._join_sizes.append(1)
        else:
            self._join_sizes[number] += 1
        self._join_of.append(number)

    def build(
        self, ranks: tuple[int, ...], represents: dict[int, int], initial_memory: dict[int, dict[str, float]]
    ) -> Program:
        return Program(self.tasks, ranks, represents, self.join_size, initial_memory, list(self._join_of),
                       list(self._join_sizes))
