"""The discrete-event engine: runs a :class:`~simulator.workload.tasks.Program` on simpy.

Bookkeeping is "busy-until" and callback driven (no simpy process or Resource per task):
each (rank, stream) is an in-order queue with a cursor; a task starts when it is at its
stream's cursor and its dependency count has reached zero. Compute tasks end after their
duration; communication tasks join their peers (same ``join`` key) and hand the transfer
to the :class:`~simulator.engine.network.Network`. Task start and end times are the
engine's output ("record, don't render"): results and traces are derived from them.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from simulator.engine.comm import CommResolver, Resolved
from simulator.engine.network import Network
from simulator.workload.tasks import Program

__all__ = ["Engine", "EngineRun"]


@dataclass
class EngineRun:
    """What one engine run produced."""

    start_s: np.ndarray  # per task
    end_s: np.ndarray
    resolved: dict[int, Resolved]  # task id -> the communication it ran
    network: Network
    makespan_s: float
    events: int


class Engine:
    def __init__(self, program: Program, resolver: CommResolver, network: Network) -> None:
        self.program = program
        self.resolver = resolver
        self.network = network
        self.env = network.env
        n = len(program.tasks)
        self.start: list[float] = [-1.0] * n
        self.end: list[float] = [-1.0] * n
        self.pending = [len(t.deps) for t in program.tasks]
        self.dependents: list[list[int]] = [[] for _ in range(n)]
        for task in program.tasks:
            for d in task.deps:
                self.dependents[d].append(task.id)
        self.queues = program.streams()
        self.cursor = {key: 0 for key in self.queues}
        self.stream_of = [(t.rank, t.stream) for t in program.tasks]
        self.arrived: dict[Hashable, list[int]] = {}
        self.resolved: dict[int, Resolved] = {}
        self.events = 0

    # -- running -------------------------------------------------------------------------

    def run(self) -> EngineRun:
        for key in self.queues:
            self._try_head(key)
        self.env.run()
        end = np.array(self.end)
        unfinished = end < 0
        if unfinished.any():
            first = int(np.argmax(unfinished))
            task = self.program.tasks[first]
            raise RuntimeError(
                f"deadlock: {int(unfinished.sum())} tasks never ran, first {task.name!r} on rank {task.rank} "
                f"stream {task.stream} (join {task.join!r})"
            )
        makespan = float(end.max()) if len(end) else 0.0
        return EngineRun(np.array(self.start), end, self.resolved, self.network, makespan, self.events)

    def _try_head(self, key: tuple[int, str]) -> None:
        queue = self.queues[key]
        index = self.cursor[key]
        if index >= len(queue):
            return
        task_id = queue[index]
        if self.pending[task_id] == 0 and self.start[task_id] < 0 and not self._waiting(task_id):
            self._ready(task_id)

    def _waiting(self, task_id: int) -> bool:
        join = self.program.tasks[task_id].join
        return join is not None and task_id in self.arrived.get(join, ())

    def _ready(self, task_id: int) -> None:
        task = self.program.tasks[task_id]
        if task.join is None:
            self._begin([task_id])
            return
        members = self.arrived.setdefault(task.join, [])
        members.append(task_id)
        if len(members) == self.program.join_size[task.join]:
            del self.arrived[task.join]
            self._begin(members)

    def _begin(self, task_ids: list[int]) -> None:
        now = self.env.now
        self.events += 1
        for t in task_ids:
            self.start[t] = now
        lead = self.program.tasks[task_ids[0]]
        if lead.comm is None:
            timeout = self.env.timeout(lead.duration_s)
            timeout.callbacks.append(lambda _e: self._finish(task_ids))
            return
        resolved = self.resolver.resolve(lead.comm)
        for t in task_ids:
            self.resolved[t] = resolved
        self.network.transfer(resolved.phases, lambda: self._finish(task_ids))

    def _finish(self, task_ids: list[int]) -> None:
        now = self.env.now
        touched: list[tuple[int, str]] = []
        for t in task_ids:
            self.end[t] = now
            key = self.stream_of[t]
            self.cursor[key] += 1
            touched.append(key)
            for d in self.dependents[t]:
                self.pending[d] -= 1
                if self.pending[d] == 0:
                    touched.append(self.stream_of[d])
        for key in touched:
            self._try_head(key)
