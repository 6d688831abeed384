"""The discrete-event engine: runs a :class:`~simulator.ir.Program` on simpy.

Bookkeeping is "busy-until" and callback driven (no simpy process or Resource per task):
each (rank, stream) is an in-order queue with a cursor; a task starts when it is at its
stream's cursor and its dependency count has reached zero. Compute tasks end after their
duration; communication tasks join their peers (same ``join`` key) and hand the transfer
to the network model (:class:`~simulator.engine.network.NetworkModel`). Task start and end times are the
engine's output ("record, don't render"): results and traces are derived from them.

Everything a task's start and end look up is worked out once per run, by task index in
plain lists (its stream, its join as a number, its rank, whether it is a collective that
slows compute), so an event hashes no tuple and walks no task object: a run without
symmetry handles half a million tasks.
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
from simulator.ir import CommOp, Program, is_host_copy

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


@dataclass(eq=False, slots=True)  # compared by identity: one entry per running task
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
        tasks = program.tasks
        n = len(tasks)
        self.start: list[float] = [-1.0] * n
        self.end: list[float] = [-1.0] * n
        self.dependents: list[list[int]] = [[] for _ in range(n)]
        # per task (one pass): its dependency count, its stream (by index), its rank, its
        # duration, and whether it is a collective that takes SMs (counted per rank in flight)
        self.pending = pending = [0] * n
        self._stream = stream_of = [0] * n
        self._rank = rank_of = [0] * n
        self._holds_sms = holds_sms = [False] * n
        own_durations = [0.0] * n
        streams: dict[tuple[int, str], int] = {}
        self._queue: list[list[int]] = []  # per stream: its tasks in issue order
        queues, dependents = self._queue, self.dependents
        for task in tasks:
            t = task.id
            deps = task.deps
            pending[t] = len(deps)
            for d in deps:
                dependents[d].append(t)
            key = (task.rank, task.stream)
            s = streams.get(key)
            if s is None:
                s = streams[key] = len(queues)
                queues.append([])
            queues[s].append(t)
            stream_of[t] = s
            rank_of[t] = task.rank
            own_durations[t] = task.duration_s
            if task.comm is not None:
                holds_sms[t] = not is_host_copy(task.comm.op)
        # per task its join (by number, -1 none), per join its size
        if program.join_of is not None and program.join_sizes is not None and len(program.join_of) == n:
            self._join, self._join_size = program.join_of, program.join_sizes
        else:
            self._join, self._join_size = _number_joins(program)
        self._cursor = [0] * len(self._queue)
        self._arrived: list[list[int] | None] = [None] * len(self._join_size)  # per join: its tasks so far
        self._seen = [False] * n  # arrived at its stream's head ready (started, or waiting at its join)
        self.resolved: dict[int, Resolved] = {}
        self._resolved_comm: dict[int, tuple[CommOp, Resolved]] = {}  # id(operation) -> (it, its resolution)
        self.events = 0
        self.slowdown = slowdown
        size = max(rank_of, default=-1) + 1
        self._in_flight = [0] * size  # per rank: collectives in flight
        # the in-flight collectives that bring their own slowdown (DeepEP's SMs), per rank
        self.own_slowdowns: dict[int, list[float]] = {}
        self._slowed = slowdown > 0 or any(t.comm is not None and t.comm.sm_slowdown for t in program.tasks)
        self.running: dict[int, list[_Running]] = {}  # rank -> compute tasks in progress
        self._rate_alone = compute_rate(slowdown, False)
        self._rate_beside = compute_rate(slowdown, True)
        self.durations = durations if durations is not None else own_durations

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
            if self.pending[task_id] == 0 and not self._seen[task_id]:
                self._ready(task_id)

    def _ready(self, task_id: int) -> None:
        """``task_id`` is at its stream's head with its dependencies done: start it, or wait at
        its join until every task of the join is ready (then start them together, in the order
        they arrived)."""
        self._seen[task_id] = True
        join = self._join[task_id]
        if join < 0:
            self._begin([task_id])
            return
        members = self._arrived[join]
        if members is None:
            members = self._arrived[join] = [task_id]
        else:
            members.append(task_id)
        if len(members) == self._join_size[join]:
            self._arrived[join] = None
            self._begin(members)

    def _begin(self, task_ids: list[int]) -> None:
        now = self.env.now
        self.events += 1
        start = self.start
        for t in task_ids:
            start[t] = now
        lead = self.program.tasks[task_ids[0]]
        comm = lead.comm
        if comm is None:
            durations = self.durations
            duration = durations[task_ids[0]] if len(task_ids) == 1 else max([durations[t] for t in task_ids])
            if lead.category == "compute" and duration > 0 and self._slowed:
                self._start_compute(lead.rank, task_ids, duration)
                return
            self.env.timeout(duration).callbacks.append(lambda _e: self._finish(task_ids))
            return
        seen = self._resolved_comm.get(id(comm))  # operations are often shared by tasks (p2p per stage pair)
        if seen is not None and seen[0] is comm:
            resolved = seen[1]
        else:
            resolved = self.resolver.resolve(comm)
            self._resolved_comm[id(comm)] = (comm, resolved)  # keeps comm alive: its id is not reused
        resolved_of = self.resolved
        for t in task_ids:
            resolved_of[t] = resolved
        if self._holds_sms[task_ids[0]]:  # copy engines for host copies, not SMs
            in_flight, rank_of, slowdown, own_slowdowns = self._in_flight, self._rank, self.slowdown, self.own_slowdowns
            for t in task_ids:
                rank = rank_of[t]
                if comm.sm_slowdown:
                    self._comm_started(rank, comm.sm_slowdown)
                    continue
                count = in_flight[rank]
                in_flight[rank] = count + 1
                if (count == 0 and slowdown > 0) or rank in own_slowdowns:
                    self._rate_changed(rank)
        self.network.transfer(resolved, lambda: self._finish(task_ids))

    # -- compute slowed by collectives in flight on the same GPU --------------------------------

    def _rate(self, rank: int) -> float:
        """Compute speed beside the rank's collectives in flight: the largest of their slowdowns
        (the run's for NCCL's, their own for those that bring one)."""
        own = self.own_slowdowns.get(rank)
        if not own:
            return self._rate_beside if self._in_flight[rank] > 0 else self._rate_alone
        slowdown = max(max(own), self.slowdown if self._in_flight[rank] > len(own) else 0.0)
        return compute_rate(slowdown, True)

    def _start_compute(self, rank: int, task_ids: list[int], duration: float) -> None:
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
        runs = self.running.get(rank)
        if not runs:
            return
        now = self.env.now
        rate = self._rate(rank)
        for run in runs:
            run.work = max(0.0, run.work - (now - run.since) * run.rate)
            run.since = now
            run.rate = rate
            self._schedule_compute(rank, run)

    def _comm_started(self, rank: int, own: float) -> None:
        before = self._rate(rank)
        self._in_flight[rank] += 1
        self.own_slowdowns.setdefault(rank, []).append(own)
        if self._rate(rank) != before:
            self._rate_changed(rank)

    def _comm_ended(self, rank: int, own: float | None) -> None:
        """A collective ends on a rank with collectives that bring their own slowdown in flight
        (``own``: this one's, or None for an NCCL one): re-time its compute if the rate moved."""
        before = self._rate(rank)
        self._in_flight[rank] -= 1
        if own:
            owns = self.own_slowdowns[rank]
            owns.remove(own)
            if not owns:
                del self.own_slowdowns[rank]
        if self._rate(rank) != before:
            self._rate_changed(rank)

    def _finish(self, task_ids: list[int]) -> None:
        now = self.env.now
        if self._holds_sms[task_ids[0]]:
            in_flight, rank_of, slowdown, own_slowdowns = self._in_flight, self._rank, self.slowdown, self.own_slowdowns
            comm = self.program.tasks[task_ids[0]].comm
            sm_slowdown = comm.sm_slowdown if comm is not None else None
            for t in task_ids:
                rank = rank_of[t]
                if sm_slowdown or rank in own_slowdowns:
                    self._comm_ended(rank, sm_slowdown)
                    continue
                count = in_flight[rank] - 1
                in_flight[rank] = count
                if count == 0 and slowdown > 0:
                    self._rate_changed(rank)
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
        # _try_head and _ready of each touched stream, inlined (the engine's most frequent calls)
        queues, seen, join_of, arrived, join_size = self._queue, self._seen, self._join, self._arrived, self._join_size
        for stream in touched:
            queue = queues[stream]
            index = cursor[stream]
            if index < len(queue):
                task_id = queue[index]
                if pending[task_id] == 0 and not seen[task_id]:
                    seen[task_id] = True
                    join = join_of[task_id]
                    if join < 0:
                        self._begin([task_id])
                        continue
                    members = arrived[join]
                    if members is None:
                        members = arrived[join] = [task_id]
                    else:
                        members.append(task_id)
                    if len(members) == join_size[join]:
                        arrived[join] = None
                        self._begin(members)


def _number_joins(program: Program) -> tuple[list[int], list[int]]:
    """Per task its join's number (-1: none; numbered in order of first use), per number its size."""
    numbers: dict[Hashable, int] = {}
    join_of = [-1] * len(program.tasks)
    sizes: list[int] = []
    for task in program.tasks:
        if task.join is not None:
            j = numbers.get(task.join)
            if j is None:
                j = numbers[task.join] = len(sizes)
                sizes.append(program.join_size[task.join])
            join_of[task.id] = j
    return join_of, sizes
