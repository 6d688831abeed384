"""The discrete-event engine: runs a :class:`~simulator.ir.Program` on simpy.

Bookkeeping is "busy-until" and callback driven (no simpy process or Resource per task):
each (rank, stream) is an in-order queue with a cursor; a task starts when it is at its
stream's cursor and its dependency count has reached zero. Compute tasks end after their
duration; communication tasks join their peers (same ``join`` key) and hand the transfer
to the network model (:class:`~simulator.engine.network.NetworkModel`). Task start and end times are the
engine's output ("record, don't render"): results and traces are derived from them.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np
from simpy.core import EmptySchedule

from simulator import limits
from simulator.costs.overlap import compute_rate
from simulator.engine.comm import CommResolver, Resolved
from simulator.engine.network import NetworkModel
from simulator.ir import Program, is_host_copy

__all__ = ["Engine", "EngineRun"]


@dataclass
class EngineRun:
    """What one engine run produced."""

    start_s: np.ndarray  # per task
    end_s: np.ndarray
    resolved: dict[int, Resolved]  # task id -> the communication it ran
    network: NetworkModel
    makespan_s: float
    events: int


@dataclass(eq=False)  # compared by identity: one entry per running task
class _Running:
    """A compute task in progress: remaining work (seconds at full speed) and its current rate."""

    task_ids: list[int]
    work: float
    since: float
    rate: float
    version: int = 0


class Engine:
    """Runs a program; ``slowdown`` is how much longer compute takes while a collective of the
    same GPU is in flight (NCCL kernels take SMs and memory bandwidth); a collective with its own
    ``CommOp.sm_slowdown`` (DeepEP's kernels on their SMs) brings that instead, and beside
    several the largest applies. ``durations`` (per
    task) replaces the tasks' own durations: each rank's compute speed and jitter
    (:mod:`simulator.workload.perturb`); compute tasks that start together (one ``join``)
    end together, at the pace of the slowest."""

    def __init__(self, program: Program, resolver: CommResolver, network: NetworkModel, *, slowdown: float = 0.0,
                 durations: list[float] | None = None) -> None:
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
        # streams by index: a task's stream, each stream's queue and cursor (no tuple hashing per event)
        index_of = {key: i for i, key in enumerate(self.queues)}
        self._queue = list(self.queues.values())
        self._cursor = [0] * len(self._queue)
        self._stream = [index_of[(t.rank, t.stream)] for t in program.tasks]
        self._join = [t.join for t in program.tasks]
        self._joined = [False] * n  # arrived at its join, waiting for its peers
        self.arrived: dict[Hashable, list[int]] = {}
        self.resolved: dict[int, Resolved] = {}
        self.events = 0
        self.slowdown = slowdown
        self.in_flight: dict[int, int] = {}
        # the in-flight collectives that bring their own slowdown (DeepEP's SMs), per rank
        self.own_slowdowns: dict[int, list[float]] = {}
        self._slowed = slowdown > 0 or any(t.comm is not None and t.comm.sm_slowdown for t in program.tasks)
        self.running: dict[int, list[_Running]] = {}  # rank -> compute tasks in progress
        self.durations = durations if durations is not None else [t.duration_s for t in program.tasks]

    # -- running -------------------------------------------------------------------------

    def run(self) -> EngineRun:
        for stream in range(len(self._queue)):
            self._try_head(stream)
        self._run_events()
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

    def _run_events(self) -> None:
        """``env.run()`` with a bound: at most ``engine_events`` simpy events
        (:mod:`simulator.limits`), so a program whose events multiply (flows re-timed at every
        start and end) stops with a clear error instead of running for hours."""
        step = self.env.step
        budget = limits.get("engine_events")
        try:
            for _ in range(budget):
                step()
        except EmptySchedule:
            return
        raise limits.exceeded("engine_events", budget + 1, what="engine events of this run (stopped there)")

    def _try_head(self, stream: int) -> None:
        queue = self._queue[stream]
        index = self._cursor[stream]
        if index < len(queue):
            task_id = queue[index]
            if self.pending[task_id] == 0 and self.start[task_id] < 0 and not self._joined[task_id]:
                self._ready(task_id)

    def _ready(self, task_id: int) -> None:
        join = self._join[task_id]
        if join is None:
            self._begin([task_id])
            return
        members = self.arrived.setdefault(join, [])
        members.append(task_id)
        self._joined[task_id] = True
        if len(members) == self.program.join_size[join]:
            del self.arrived[join]
            self._begin(members)

    def _begin(self, task_ids: list[int]) -> None:
        now = self.env.now
        self.events += 1
        for t in task_ids:
            self.start[t] = now
        lead = self.program.tasks[task_ids[0]]
        if lead.comm is None:
            durations = self.durations
            duration = durations[task_ids[0]] if len(task_ids) == 1 else max(durations[t] for t in task_ids)
            if lead.category == "compute" and duration > 0 and self._slowed:
                self._start_compute(task_ids, duration)
                return
            timeout = self.env.timeout(duration)
            timeout.callbacks.append(lambda _e: self._finish(task_ids))
            return
        resolved = self.resolver.resolve(lead.comm)
        for t in task_ids:
            self.resolved[t] = resolved
        if not is_host_copy(lead.comm.op):  # copy engines, not SMs
            for t in task_ids:
                self._comm_started(self.program.tasks[t].rank, lead.comm.sm_slowdown)
        self.network.transfer(resolved, lambda: self._finish(task_ids))

    # -- compute slowed by collectives in flight on the same GPU --------------------------------

    def _rate(self, rank: int) -> float:
        """Compute speed beside the rank's collectives in flight: the largest of their slowdowns
        (the run's for NCCL's, their own for those that bring one)."""
        count = self.in_flight.get(rank, 0)
        own = self.own_slowdowns.get(rank)
        if not own:
            return compute_rate(self.slowdown, count > 0)
        slowdown = max(max(own), self.slowdown if count > len(own) else 0.0)
        return compute_rate(slowdown, True)

    def _start_compute(self, task_ids: list[int], duration: float) -> None:
        rank = self.program.tasks[task_ids[0]].rank
        run = _Running(task_ids, duration, self.env.now, self._rate(rank))
        self.running.setdefault(rank, []).append(run)
        self._schedule_compute(rank, run)

    def _schedule_compute(self, rank: int, run: _Running) -> None:
        run.version += 1
        version = run.version
        timeout = self.env.timeout(run.work / run.rate)
        timeout.callbacks.append(lambda _e: self._compute_done(rank, run, version))

    def _compute_done(self, rank: int, run: _Running, version: int) -> None:
        if run.version != version:
            return
        self.running[rank].remove(run)
        self._finish(run.task_ids)

    def _rate_changed(self, rank: int) -> None:
        now = self.env.now
        rate = self._rate(rank)
        for run in self.running.get(rank, ()):
            run.work = max(0.0, run.work - (now - run.since) * run.rate)
            run.since = now
            run.rate = rate
            self._schedule_compute(rank, run)

    def _comm_started(self, rank: int, own: float | None = None) -> None:
        count = self.in_flight.get(rank, 0)
        if own:
            before = self._rate(rank)
            self.in_flight[rank] = count + 1
            self.own_slowdowns.setdefault(rank, []).append(own)
            if self._rate(rank) != before:
                self._rate_changed(rank)
            return
        self.in_flight[rank] = count + 1
        if (count == 0 and self.slowdown > 0) or self.own_slowdowns.get(rank):
            self._rate_changed(rank)

    def _comm_ended(self, rank: int, own: float | None = None) -> None:
        before = self._rate(rank) if own or self.own_slowdowns.get(rank) else None
        count = self.in_flight[rank] - 1
        self.in_flight[rank] = count
        if own:
            self.own_slowdowns[rank].remove(own)
        if before is not None:
            if self._rate(rank) != before:
                self._rate_changed(rank)
        elif count == 0 and self.slowdown > 0:
            self._rate_changed(rank)

    def _finish(self, task_ids: list[int]) -> None:
        now = self.env.now
        tasks = self.program.tasks
        lead = tasks[task_ids[0]]
        if lead.comm is not None and not is_host_copy(lead.comm.op):
            for t in task_ids:
                self._comm_ended(tasks[t].rank, lead.comm.sm_slowdown)
        end, cursor, stream_of, pending, dependents = self.end, self._cursor, self._stream, self.pending, self.dependents
        touched: list[int] = []
        for t in task_ids:
            end[t] = now
            stream = stream_of[t]
            cursor[stream] += 1
            touched.append(stream)
            for d in dependents[t]:
                pending[d] -= 1
                if pending[d] == 0:
                    touched.append(stream_of[d])
        # _try_head of each touched stream, inlined (the engine's most frequent call)
        queues, start, joined = self._queue, self.start, self._joined
        for stream in touched:
            queue = queues[stream]
            index = cursor[stream]
            if index < len(queue):
                task_id = queue[index]
                if pending[task_id] == 0 and start[task_id] < 0 and not joined[task_id]:
                    self._ready(task_id)
