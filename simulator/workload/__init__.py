"""Workload stage: model description, parallel strategies, schedules -> per-rank task DAGs."""

from simulator.workload.plan import WorkloadBuilder, block_ranks
from simulator.workload.profile import compute_profile
from simulator.workload.tasks import CommOp, MemDelta, Program, ProgramBuilder, Task

__all__ = ["WorkloadBuilder", "block_ranks", "compute_profile", "CommOp", "MemDelta", "Program", "ProgramBuilder",
           "Task"]
