"""The narrow interface through which strategies and the pipeline emit tasks.

An :class:`Emitter` owns the program being built and knows the mesh and the symmetry
reduction; :meth:`Emitter.rank` opens a :class:`RankEmitter` for one simulated rank, which
tracks the rank's last compute task and carries the data-parallel strategy's typed state.
Strategies see only a ``RankEmitter``: compute, collective, point-to-point, host copy,
memory marker and optimizer step. They never see the builder.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from simulator.cluster.mesh import Mesh
from simulator.ir import CommOp, KernelInfo, MemDelta, OpName, ProgramBuilder, Task, TaskInfo
from simulator.workload.symmetry import Symmetry

__all__ = ["Collective", "Emitter", "RankEmitter", "GROUP_STREAM"]

S = TypeVar("S")

# the communication stream (and CommOp.axis) of each mesh group's collectives
GROUP_STREAM: dict[str, str] = {"tp": "tp", "cp": "cp", "pp": "pp", "dp": "dp", "dp_shard": "shard",
                                "dp_replicate": "dp", "tp_cp": "tp", "world": "dp", "ep": "ep",
                                "edp": "dp", "etp": "ep", "tp_ep": "ep", "dualpipe_mirror": "pp"}


@dataclass(frozen=True)
class Collective:
    """A collective over the issuing rank's mesh group ``group``, as a strategy asks for it.

    ``nbytes`` is one collective's size (nccl-tests convention); ``count`` of them run back
    to back. ``key`` tells this collective apart from the others of the same name on the same
    group (the engine joins the group's members on it). ``mem`` changes memory at its start or
    end; ``category`` is its group kind in the breakdown (default: the stream).
    """

    name: str
    op: OpName
    group: str
    nbytes: float
    stream: str
    key: Hashable
    count: int = 1
    algorithm: str | None = None
    mem: tuple[MemDelta, ...] = ()
    category: str | None = None


class Emitter:
    """Builds one :class:`~simulator.ir.Program`; see the module docstring."""

    def __init__(self, mesh: Mesh, symmetry: Symmetry, optimizer_time_s: Callable[[float], float],
                 optimizer_kernels: Callable[[float], tuple[KernelInfo, ...]] | None = None,
                 memory_kernel: Callable[[str, float, float], KernelInfo] | None = None) -> None:
        self.mesh = mesh
        self.symmetry = symmetry
        self.program = ProgramBuilder()
        self.optimizer_time_s = optimizer_time_s
        self.optimizer_kernels = optimizer_kernels
        # memory_kernel(name, bytes, elements): a memory-bound pass over a buffer, timed
        self.memory_kernel = memory_kernel

    def rank(self, rank: int, state: S) -> RankEmitter[S]:
        return RankEmitter(self, rank, self.mesh.stage(rank), state)

    def comm_op(self, rank: int, op: OpName, group: str, nbytes: float, *, algorithm: str | None = None,
                count: int = 1, sm_slowdown: float | None = None) -> CommOp:
        """``rank``'s collective on its ``group``, standing for its siblings' identical ones."""
        ranks = self.mesh.group(rank, group)
        instances = self.symmetry.comm_instances(rank, group, nbytes * count)
        return CommOp(op, ranks, nbytes, GROUP_STREAM.get(group, group), instances, algorithm, count, sm_slowdown)


@dataclass
class RankEmitter(Generic[S]):
    """Emits the tasks of one simulated rank (see the module docstring)."""

    emitter: Emitter
    rank: int
    stage: int
    state: S
    last_compute: int = -1
    finished: bool = False

    @property
    def mesh(self) -> Mesh:
        return self.emitter.mesh

    def siblings(self) -> list[int]:
        return self.emitter.symmetry.siblings(self.rank)

    def task(self, stream: str, name: str, category: str, *, duration_s: float = 0.0, comm: CommOp | None = None,
             join: Hashable | None = None, deps: list[int] | tuple[int, ...] = (), mem: tuple[MemDelta, ...] = (),
             info: TaskInfo | None = None) -> int:
        """Append one task of this rank (the low-level form the others use)."""
        program = self.emitter.program
        task = Task(len(program.tasks), self.rank, stream, name, category, duration_s, comm, join,
                    [d for d in deps if d is not None], mem, info)
        program.append(task)
        return task.id

    def compute(self, name: str, duration_s: float, deps: list[int], *, mem: tuple[MemDelta, ...] = (),
                info: TaskInfo | None = None, join: Hashable | None = None) -> int:
        """A kernel (or fused run of kernels) on the compute stream; becomes the last compute."""
        task = self.task("compute", name, "compute", duration_s=duration_s, deps=deps, mem=mem, info=info, join=join)
        self.last_compute = task
        return task

    def collective(self, c: Collective, deps: list[int]) -> int:
        """A collective on this rank's ``c.group``, joined with its members on ``c.key``."""
        comm = self.emitter.comm_op(self.rank, c.op, c.group, c.nbytes, count=c.count, algorithm=c.algorithm)
        join = (c.group, comm.group, c.name, c.key)
        return self.task(c.stream, c.name, c.category or c.stream, comm=comm, join=join, deps=deps, mem=c.mem,
                         info=TaskInfo(group=c.group))

    def host_copy(self, name: str, op: OpName, nbytes: float, deps: list[int]) -> int:
        """A copy between this GPU and its host (d2h / h2d) on the offload stream."""
        instances = tuple((x,) for x in self.siblings())
        comm = CommOp(op, (self.rank,), nbytes, "offload", instances, "direct")
        return self.task("offload", name, "offload", comm=comm, deps=deps)

    def marker(self, name: str, deps: list[int], mem: tuple[MemDelta, ...]) -> int:
        """A zero-time task that applies memory changes when its dependencies are done."""
        return self.task("mem", name, "marker", deps=deps, mem=mem)

    def memory_pass(self, name: str, nbytes: float, elements: float, deps: list[int]) -> int:
        """A memory-bound kernel moving ``nbytes`` over a buffer of ``elements`` on the compute
        stream (a framework's pass over its gradient buffer); without a timer it takes no time."""
        make = self.emitter.memory_kernel
        kernel = make(name, nbytes, elements) if make is not None else None
        info = TaskInfo(phase="optimizer", kernels=(kernel,) if kernel else ())
        return self.compute(name, kernel.time_s if kernel else 0.0, deps, info=info)

    def optimizer(self, deps: list[int], n_params: float, *, name: str = "optimizer",
                  mem: tuple[MemDelta, ...] = ()) -> int:
        """The optimizer step over ``n_params`` local parameters (memory bound)."""
        duration = self.emitter.optimizer_time_s(n_params)
        kernels = self.emitter.optimizer_kernels(n_params) if self.emitter.optimizer_kernels is not None else ()
        info = TaskInfo(phase="optimizer", params=n_params, flops=sum(k.flops for k in kernels) if kernels else None,
                        kernels=kernels)
        return self.compute(name, duration, deps, mem=mem, info=info)
