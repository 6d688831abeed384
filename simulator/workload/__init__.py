"""Workload stage: model description, parallel strategies, schedules -> per-rank task DAGs.

``build_workload(scenario, profile, ...)`` (:mod:`.builder`) orchestrates: the layout
(:mod:`.layout`), in-layer parallelisms (:mod:`.parallel`), data-parallel strategies
(:mod:`.data_parallel`), pipeline schedules and emission (:mod:`.pipeline`), symmetry
(:mod:`.symmetry`) and fused layers (:mod:`.fusion`), all emitting through the narrow
:mod:`.emitter` into the typed program of :mod:`simulator.ir`.
"""

from simulator.ir import CommOp, MemDelta, Program, ProgramBuilder, Task
from simulator.workload.builder import CUDA_CONTEXT_BYTES, Workload, build_workload, overlap_slowdown
from simulator.workload.profile import compute_profile
from simulator.workload.symmetry import block_ranks

__all__ = ["Workload", "build_workload", "overlap_slowdown", "block_ranks", "compute_profile", "CUDA_CONTEXT_BYTES",
           "CommOp", "MemDelta", "Program", "ProgramBuilder", "Task"]
