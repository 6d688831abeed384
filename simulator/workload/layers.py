"""Emitting the units of one pass (forward or backward of a chunk) as tasks.

Each unit's layer steps come from the in-layer passes (:mod:`simulator.workload.parallel`),
timed once per (kind, phase), each pass bounded below by the host time to issue its kernels
(:mod:`simulator.costs.host`). Without fusion every step is a task: compute steps on the
compute stream, TP/CP collectives on their streams, joined across the group's simulated
members. With fusion (:mod:`simulator.workload.fusion`) a run of units between two strategy
hooks is one compute task with its inner timeline.

Zero-bubble schedules (DualPipe) split a backward in two phases: ``bwd_input`` (every backward
step without its weight-gradient GEMMs) and ``bwd_weight`` (those GEMMs, run later); the
stored activations, and those a recomputing backward rebuilt, are freed after the second (:func:`~simulator.workload.steps.split_weight_grads`).
:meth:`LayerEmitter.emit_iter` yields each compute task as it is emitted, so that the pipeline
can interleave two passes step by step (an overlapped forward and backward).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from simulator.costs.compute import ComputeProfile
from simulator.ir import FusedLayers, MemDelta, TaskInfo
from simulator.scenario.spec import Scenario
from simulator.scenario.training import recompute_modules_of
from simulator.workload.activations import ActivationSizes, shard_of
from simulator.workload.emitter import RankEmitter
from simulator.workload.fusion import CommTime, Job, Macro, fuse, job_label
from simulator.workload.layout import Chunk, ModelLayout
from simulator.workload.moe import moe_shape
from simulator.workload.parallel import layer_steps
from simulator.workload.steps import CommStep, ComputeStep, LayerSpec, TimedStep, split_weight_grads, timed

__all__ = ["LayerEmitter"]


class LayerEmitter:
    """Times layer steps and emits units as tasks (see the module docstring)."""

    def __init__(self, scenario: Scenario, layout: ModelLayout, profile: ComputeProfile, *, fuse_layers: bool,
                 comm_time: CommTime, groups: dict[str, tuple[int, ...]], overlap_slowdown: float,
                 join_group: Callable[[int, str], tuple[int, ...]], symmetric: bool) -> None:
        self.sc = scenario
        self.layout = layout
        self.profile = profile
        self.shard = shard_of(scenario)
        self.activations = ActivationSizes.of(scenario)
        self.fuse_layers = fuse_layers
        self.comm_time = comm_time
        self.groups = groups
        self.overlap_slowdown = overlap_slowdown
        self.join_group = join_group
        self.symmetric = symmetric
        self.host = scenario.training.host.costs()
        self._steps: dict[tuple[str, str, bool], list[TimedStep]] = {}
        self._macros: dict[tuple[str, tuple[int, ...]], Macro] = {}
        self._macro_tasks: dict[tuple[str, tuple[int, ...]], tuple[str, FusedLayers, int]] = {}

    # layer programs (cached) ----------------------------------------------------------------

    def steps(self, kind: str, phase: str, moe: bool = False) -> list[TimedStep]:
        """The timed steps of one unit kind (embedding, block, logits) in one phase (``moe``: an MoE block)."""
        key = (kind, phase, moe)
        found = self._steps.get(key)
        if found is None and phase in ("bwd_input", "bwd_weight"):
            split = split_weight_grads(self.steps(kind, "bwd", moe))
            self._steps[(kind, "bwd_input", moe)], self._steps[(kind, "bwd_weight", moe)] = split
            return split[phase == "bwd_weight"]
        if found is None:
            par, train = self.sc.parallelism, self.sc.training
            spec = LayerSpec(self.sc.model, self.shard, kind, phase, tp_overlap=par.tp_overlap,
                             comm_overlap=par.tp_comm_overlap, cp_comm=par.cp_comm, cp_kv_heads=par.cp_kv_heads,
                             recompute=train.recompute if kind == "block" and phase == "bwd" else "none",
                             recompute_modules=recompute_modules_of(train),
                             moe=moe_shape(self.sc) if moe else None)
            # the micro-batch's host work (data loader, inputs) precedes its first layer
            per_mb = self.host.microbatch_s if (kind, phase) == ("embedding", "fwd") else 0.0
            found = self._steps[key] = timed(layer_steps(spec), self.profile, train.precision,
                                             self.shard.attention_kernel, self.host, per_mb)
        return found

    def jobs(self, unit: int, phase: str) -> list[Job]:
        """The layer passes of a unit in execution order (a block under full recomputation
        replays its forward first), with the activation bytes each allocates and frees."""
        kind, layer = self.layout.unit_kind(unit)
        moe = kind == "block" and self.sc.model.is_moe_layer(layer)
        stored = self.activations.stored(kind, moe)
        if phase == "fwd":  # a transient (the loss's logits and their copy) from the start, kept part at the end
            transient = self.activations.forward_transient(kind)
            held = self.activations.forward_working_set(kind, moe)  # a block's working set, beside what it keeps
            return [Job(kind, "fwd", layer, self.steps(kind, "fwd", moe), transient, stored - transient, held)]
        # a deferred weight-gradient pass frees what the block stored and what its backward rebuilt
        rebuilt = self.activations.rebuilt_bytes(kind, moe)
        if phase == "bwd_weight":
            return [Job(kind, "wgrad", layer, self.steps(kind, phase, moe), 0.0, -(stored + rebuilt))]
        jobs = []
        if kind == "block" and self.sc.training.recompute == "full":
            jobs.append(Job(kind, "recompute", layer, self.steps(kind, "fwd", moe), 0.0, 0.0))
        workspace = self.activations.workspace(kind, moe)
        kept = stored + rebuilt if phase == "bwd_input" else 0.0
        jobs.append(Job(kind, "bwd", layer, self.steps(kind, phase, moe), workspace, -(workspace + stored - kept)))
        return jobs

    # emission ----------------------------------------------------------------------------------

    def emit(self, emit: RankEmitter[Any], chunk: Chunk, units: tuple[int, ...], phase: str, mb: int,
             deps: list[int]) -> int:
        """Emit a run of units (one unit unless fused); returns the task the next one follows."""
        last = -1
        for task in self.emit_iter(emit, chunk, units, phase, mb, deps):
            last = task
        return last

    def emit_iter(self, emit: RankEmitter[Any], chunk: Chunk, units: tuple[int, ...], phase: str, mb: int,
                  deps: list[int]) -> Iterator[int]:
        """:meth:`emit`, yielding each compute task as it is emitted (the last one is the task
        the next one follows)."""
        if self.fuse_layers:
            yield self._emit_macro(emit, chunk, units, phase, mb, deps)
            return
        for job in self.jobs(units[0], phase):
            last = -1
            for last in self._emit_steps(emit, job, mb, chunk, deps):
                yield last
            deps = [last]

    def _emit_steps(self, emit: RankEmitter[Any], job: Job, mb: int, chunk: Chunk, deps: list[int]) -> Iterator[int]:
        """Emit one layer's steps as tasks, yielding each compute task (the last one last)."""
        label = job_label(job.kind, job.phase, job.layer)
        layer, phase = job.layer, job.phase
        pending_overlap: int | None = None
        last = -1
        n_compute = sum(1 for s in job.steps if isinstance(s.step, ComputeStep))
        seen = 0
        for step_timed in job.steps:
            step = step_timed.step
            if isinstance(step, CommStep):
                group = step.axis if step.axis in ("cp", "ep", "etp", "tp_ep") else "tp"
                comm = emit.emitter.comm_op(emit.rank, step.op, group, step.nbytes,  # type: ignore[arg-type]
                                            algorithm=step.algorithm, sm_slowdown=step.sm_slowdown)
                join = (group, comm.group, mb, chunk.index, layer, phase, step.name)
                tid = emit.task(group, step.name, group, comm=comm, join=join, deps=list(deps),
                                info=TaskInfo(phase=phase, mb=mb, layer=layer))
                if step.overlap:
                    pending_overlap = tid
                else:
                    deps = [tid]
                continue
            seen += 1
            mem: list[MemDelta] = []
            if seen == 1 and job.mem_start:
                mem.append(MemDelta(False, job.mem_start, "activations"))
            if seen == 1 and job.held:
                mem.append(MemDelta(False, job.held, "activations"))
            if seen == n_compute and job.mem_end:  # with a working set: while it is live (see Job)
                mem.append(MemDelta(False, job.mem_end, "activations", step_timed.duration_s / 2) if job.held
                           else MemDelta(True, job.mem_end, "activations"))
            if seen == n_compute and job.held:
                mem.append(MemDelta(True, -job.held, "activations"))
            tid = emit.compute(f"{label}.{step.name}", step_timed.duration_s, list(deps), mem=tuple(mem),
                               info=TaskInfo(phase=phase, mb=mb, layer=layer, chunk=chunk.index,
                                             flops=step_timed.flops, kernels=step_timed.kernels))
            deps = [tid] + ([pending_overlap] if pending_overlap is not None else [])
            pending_overlap = None
            last = tid
            yield tid
        # a trailing overlapped collective must finish before the next layer
        if pending_overlap is not None:
            yield emit.compute(f"{label}.join", 0.0, [last, pending_overlap])

    def _macro(self, units: tuple[int, ...], phase: str) -> Macro:
        """The fused run of ``units`` in ``phase``, built once per run of units (its parts name
        and number their own layers; micro-batches and symmetric ranks share it)."""
        key = (phase, units)
        found = self._macros.get(key)
        if found is None:
            jobs = [job for u in units for job in self.jobs(u, phase)]
            found = self._macros[key] = fuse(jobs, self.comm_time, self.groups, self.overlap_slowdown)
        return found

    def _macro_task(self, units: tuple[int, ...], phase: str, macro: Macro) -> tuple[str, FusedLayers, int]:
        """The name, inner timeline and first layer of a fused run's tasks: one of each per run of
        units, shared by its micro-batches and ranks (every rank's tasks when all are simulated)."""
        key = (phase, units)
        found = self._macro_tasks.get(key)
        if found is None:
            first_kind, first_layer = self.layout.unit_kind(units[0])
            last_kind, last_layer = self.layout.unit_kind(units[-1])
            name = f"{phase}.{first_kind}{'' if first_layer < 0 else first_layer}"
            if len(units) > 1:
                name += f"..{last_kind}{'' if last_layer < 0 else last_layer}"
            fused = FusedLayers((units[0], units[-1]), macro.compute_s, macro.comm_s, macro.exposed_s, macro.parts,
                                macro.duration_s)
            found = self._macro_tasks[key] = (name, fused, first_layer)
        return found

    def _emit_macro(self, emit: RankEmitter[Any], chunk: Chunk, units: tuple[int, ...], phase: str, mb: int,
                    deps: list[int]) -> int:
        macro = self._macro(units, phase)
        name, fused, first_layer = self._macro_task(units, phase, macro)
        join = None
        if not self.symmetric and macro.has_comm:
            join = ("layers", self.join_group(emit.rank, "tp_cp"), mb, chunk.index, phase, units[0])
        info = TaskInfo(phase=phase, mb=mb, layer=first_layer, chunk=chunk.index, flops=macro.flops, fused=fused)
        return emit.compute(name, macro.duration_s, deps, mem=macro.mem, info=info, join=join)
