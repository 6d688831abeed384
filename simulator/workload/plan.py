"""Turn a scenario into the engine's :class:`~simulator.workload.tasks.Program`.

The builder walks each simulated rank's pipeline schedule (``schedules.py``) and emits, per
action, the layer steps of every model chunk (``tensor_parallel.py``), the pipeline
point-to-point transfers, the data-parallel strategy's collectives (``data_parallel.py``,
``sharding.py``), the optimizer step, and the memory each task allocates and frees.

Symmetry: with ``sim.symmetry: auto`` one rank per pipeline stage is simulated (all ranks
of a stage do identical work); each collective it issues stands for the same collective of
every sibling rank in its block of nodes (``instances``), so their traffic still loads the
network. ``off`` simulates every rank and joins collectives across their members.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from simulator.cluster.mesh import Axis, Mesh
from simulator.costs.compute import ComputeProfile
from simulator.costs.flops import ParamCounts, param_counts
from simulator.costs.memory import (
    embedding_activation_bytes,
    layer_activation_bytes,
    logits_activation_bytes,
    model_state_bytes_per_param,
)
from simulator.scenario.hardware import nccl_constants
from simulator.scenario.spec import Scenario
from simulator.units import GiB, MiB
from simulator.workload import sharding
from simulator.workload.data_parallel import Param
from simulator.workload.model import Shard, kernels_time_s, optimizer_kernel
from simulator.workload.schedules import Action, pipeline_schedule
from simulator.workload.tasks import CommOp, MemDelta, Program, ProgramBuilder
from simulator.workload.tensor_parallel import CommStep, ComputeStep, Step, block_steps, embedding_steps, logits_steps

__all__ = ["WorkloadBuilder", "ModelLayout", "Chunk", "CUDA_CONTEXT_BYTES", "block_ranks"]

# CUDA context, cuBLAS/cuDNN workspaces and allocator slack that no tensor accounts for.
# Estimate: ~0.5 GiB context on recent drivers plus workspaces; shows up in every rank's
# "other" memory so an OOM verdict is not optimistic.
CUDA_CONTEXT_BYTES = 1.0 * GiB

# Below this size a collective is latency-bound; its siblings' copies are not placed on links.
SMALL_COLLECTIVE_BYTES = 1 * MiB


def block_ranks(mesh: Mesh, gpus_per_node: int) -> int:
    """Ranks of the smallest block of whole nodes that holds whole data-parallel replicas."""
    return math.lcm(mesh.slice_size, gpus_per_node)


@dataclass(frozen=True)
class Chunk:
    """One virtual pipeline stage: a contiguous run of layers (plus embedding / logits)."""

    index: int
    layers: tuple[int, ...]
    embedding: bool
    logits: bool


@dataclass
class ModelLayout:
    scenario: Scenario
    counts: ParamCounts = field(init=False)
    chunks: list[Chunk] = field(init=False)
    _stage_params: dict[int, list[Param]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        m = self.scenario.model
        self.counts = param_counts(
            layers=m.layers, hidden=m.hidden, heads=m.heads, kv_heads=m.n_kv_heads, ffn_hidden=m.ffn,
            vocab=m.vocab, seq_len=m.seq_len, mlp=m.mlp, norm=m.norm, position_embedding=m.position_embedding,
            tied_embeddings=m.tied_embeddings, bias=m.bias,
        )
        counts = self.scenario.stage_layer_counts
        chunks, start = [], 0
        for i, n in enumerate(counts):
            chunks.append(Chunk(i, tuple(range(start, start + n)), i == 0, i == len(counts) - 1))
            start += n
        self.chunks = chunks

    def chunk_of(self, pp_rank: int, local_chunk: int) -> Chunk:
        return self.chunks[local_chunk * self.scenario.parallelism.pp + pp_rank]

    def chunks_of_stage(self, pp_rank: int) -> list[Chunk]:
        par = self.scenario.parallelism
        return [self.chunk_of(pp_rank, c) for c in range(par.virtual_stages)]

    def chunk_params(self, chunk: Chunk) -> list[Param]:
        """Parameters one tensor-parallel rank holds for ``chunk``, in definition order.

        Units: 0 = embedding, ``layer + 1`` = transformer block, ``layers + 1`` = final norm
        and output projection. Column-parallel weights and biases (qkv, fc1) and row-parallel
        weights (proj, fc2) are split by tp; row-parallel biases and norms are replicated;
        embeddings are vocab-parallel. With tied embeddings the last pipeline stage keeps its
        own copy of the matrix for the output projection (Megatron).
        """
        m, t = self.scenario.model, self.scenario.parallelism.tp
        d = m.head_dim
        norm = (2 if m.norm == "layernorm" else 1) * m.hidden
        n_up = 2 if m.mlp == "swiglu" else 1
        qkv_width = (m.heads + 2 * m.n_kv_heads) * d
        bias = 1 if m.bias else 0
        params: list[Param] = []
        if chunk.embedding:
            params.append(Param("embedding", self.counts.embedding // t + self.counts.position, 0))
        for layer in chunk.layers:
            u = layer + 1
            params += [
                Param(f"l{layer}.ln1", norm, u),
                Param(f"l{layer}.qkv", (m.hidden * qkv_width + bias * qkv_width) // t, u),
                Param(f"l{layer}.proj", m.hidden * m.hidden // t + bias * m.hidden, u),
                Param(f"l{layer}.ln2", norm, u),
                Param(f"l{layer}.fc1", (n_up * m.hidden * m.ffn + bias * n_up * m.ffn) // t, u),
                Param(f"l{layer}.fc2", m.hidden * m.ffn // t + bias * m.hidden, u),
            ]
        if chunk.logits:
            output = self.counts.output or (0 if chunk.embedding else self.counts.embedding)
            params.append(Param("final_norm+output", self.counts.final_norm + output // t, m.layers + 1))
        return params

    def params_of_chunk(self, chunk: Chunk) -> float:
        return float(sum(p.numel for p in self.chunk_params(chunk)))

    def stage_params(self, pp_rank: int) -> list[Param]:
        found = self._stage_params.get(pp_rank)
        if found is None:
            found = self._stage_params[pp_rank] = [p for c in self.chunks_of_stage(pp_rank) for p in self.chunk_params(c)]
        return found

    def params_of_stage(self, pp_rank: int) -> float:
        return sum(self.params_of_chunk(c) for c in self.chunks_of_stage(pp_rank))


@dataclass(frozen=True)
class Macro:
    """A fused run of layers: total time, inner split, trace parts and memory changes at offsets.

    A part is (name, category, offset_s, duration_s, op, nbytes, ranks): category ``compute``
    or the collective's group kind; ``op``/``nbytes``/``ranks`` describe collectives ("" / 0
    for kernels)."""

    duration_s: float
    compute_s: float
    comm_s: dict[str, float]
    exposed_s: dict[str, float]
    flops: float
    parts: tuple[tuple[str, str, float, float, str, float, int], ...]
    mem: tuple[MemDelta, ...]
    has_comm: bool


@dataclass(frozen=True)
class TimedStep:
    step: Step
    duration_s: float = 0.0
    flops: float = 0.0


class WorkloadBuilder:
    """Builds the Program for one scenario (see the module docstring)."""

    def __init__(self, scenario: Scenario, mesh: Mesh, profile: ComputeProfile, *, gpus_per_node: int,
                 symmetric: bool, comm_time: Callable[[str, tuple[int, ...], float], float] | None = None,
                 node_kind: str = "nvswitch") -> None:
        self.sc = scenario
        self.mesh = mesh
        self.profile = profile
        self.symmetric = symmetric
        self.layout = ModelLayout(scenario)
        self.gpus_per_node = gpus_per_node
        self.block = block_ranks(mesh, gpus_per_node)
        par, train = scenario.parallelism, scenario.training
        self.shard = Shard(batch=train.micro_batch, seq=scenario.model.seq_len, tp=par.tp, cp=par.cp,
                           sequence_parallel=par.sequence_parallel and par.tp > 1, flash=train.flash_attention,
                           precision=train.precision, flash_version=train.flash_attention_version)
        self.pb = ProgramBuilder()
        self._steps: dict[tuple[str, str], list[TimedStep]] = {}
        self._instances: dict[tuple[int, str], tuple[tuple[int, ...], ...]] = {}
        self._macros: dict[tuple[str, tuple[str, ...]], Macro] = {}
        self.strategy = sharding.strategy_for(scenario, mesh, self.layout)
        self.comm_time = comm_time or (lambda op, group, nbytes: 0.0)
        slowdown = scenario.sim.overlap_slowdown
        self.overlap_slowdown = nccl_constants().overlap_compute_slowdown if slowdown is None else slowdown
        self.node_kind = node_kind
        self.fuse_layers = comm_time is not None and self._layer_comm_private()

    def _layer_comm_private(self) -> bool:
        """True when the collectives inside layers (tp, cp) cross links no other traffic uses:
        the group sits in one NVSwitch node and every other group has at most one member per
        node. Then a layer's collectives can be costed alone and fused into its compute."""
        m, g = self.mesh, self.gpus_per_node
        if m.tp * m.cp == 1:
            return True
        if self.node_kind != "nvswitch" or any(r // g != 0 for r in m.group(0, "tp_cp")):
            return False
        for axis in ("dp_cp", "pp", "dp_shard", "dp_replicate", "embedding"):
            nodes = [r // g for r in m.group(0, axis)]  # type: ignore[arg-type]
            if len(nodes) != len(set(nodes)):
                return False
        return True

    # -- layer programs (cached) -----------------------------------------------------------

    def steps(self, kind: str, phase: str) -> list[TimedStep]:
        key = (kind, phase)
        found = self._steps.get(key)
        if found is None:
            found = self._steps[key] = self._timed(self._raw_steps(kind, phase))
        return found

    def _raw_steps(self, kind: str, phase: str) -> list[Step]:
        model, par, train = self.sc.model, self.sc.parallelism, self.sc.training
        if kind == "block":
            return block_steps(model, self.shard, phase, tp_overlap=par.tp_overlap, comm_overlap=par.tp_comm_overlap,
                               selective=train.recompute == "selective" and phase == "bwd")
        if kind == "embedding":
            return embedding_steps(model, self.shard, phase)
        return logits_steps(model, self.shard, phase)

    def _timed(self, steps: list[Step]) -> list[TimedStep]:
        out = []
        precision = self.sc.training.precision
        for step in steps:
            if isinstance(step, ComputeStep):
                duration = kernels_time_s(self.profile, list(step.kernels), precision, self.shard.flash_version)
                out.append(TimedStep(step, duration, sum(k.flops for k in step.kernels)))
            else:
                out.append(TimedStep(step))
        return out

    # -- memory sizes ----------------------------------------------------------------------

    @cached_property
    def activation_per_layer(self) -> float:
        m, par, train = self.sc.model, self.sc.parallelism, self.sc.training
        return layer_activation_bytes(
            seq=m.seq_len, batch=train.micro_batch, hidden=m.hidden, heads=m.heads, kv_heads=m.n_kv_heads,
            ffn_hidden=m.ffn, mlp=m.mlp, tp=par.tp, cp=par.cp, sequence_parallel=self.shard.sequence_parallel,
            recompute=train.recompute, flash_attention=train.flash_attention, dropout=m.dropout,
            act_bytes=self.shard.elem,
        )

    @cached_property
    def full_layer_activation(self) -> float:
        """A layer's activations without recomputation: what a recomputed layer holds while
        its backward runs."""
        m, par, train = self.sc.model, self.sc.parallelism, self.sc.training
        return layer_activation_bytes(
            seq=m.seq_len, batch=train.micro_batch, hidden=m.hidden, heads=m.heads, kv_heads=m.n_kv_heads,
            ffn_hidden=m.ffn, mlp=m.mlp, tp=par.tp, cp=par.cp, sequence_parallel=self.shard.sequence_parallel,
            recompute="none", flash_attention=train.flash_attention, dropout=m.dropout, act_bytes=self.shard.elem,
        )

    @cached_property
    def backward_workspace(self) -> float:
        """Transient bytes of one layer's backward: the gradients of its largest activations
        (the MLP intermediate and the layer input), plus the recomputed layer under ``full``."""
        m, e = self.sc.model, self.shard.elem
        ffn_width = (3 if m.mlp == "swiglu" else 2) * m.ffn / self.shard.tp
        grads = self.shard.tokens * (ffn_width + 2 * m.hidden) * e
        if self.sc.training.recompute == "full":
            grads += self.full_layer_activation
        return grads

    # -- symmetry --------------------------------------------------------------------------

    def simulated_ranks(self) -> tuple[int, ...]:
        if self.symmetric:
            return self.mesh.stage_representatives
        return tuple(range(self.mesh.world))

    def siblings(self, rank: int) -> list[int]:
        """Ranks of ``rank``'s block that share its stage and so do identical work."""
        if not self.symmetric:
            return [rank]
        m = self.mesh
        stage = m.stage(rank)
        replicas = max(1, self.block // m.slice_size)
        first_dp = m.coords(rank)[3]
        return [m.rank(t, c, stage, first_dp + d) for d in range(replicas) for c in range(m.cp) for t in range(m.tp)]

    def instances(self, rank: int, axis: Axis) -> tuple[tuple[int, ...], ...]:
        key = (rank, axis)
        found = self._instances.get(key)
        if found is None:
            own = self.mesh.group(rank, axis)
            groups = {own: None}
            for sib in self.siblings(rank):
                groups.setdefault(self.mesh.group(sib, axis), None)
            found = self._instances[key] = tuple(groups)
        return found

    def comm(self, rank: int, op: str, axis: Axis, nbytes: float, *, algorithm: str | None = None,
             count: int = 1) -> CommOp:
        """A collective of ``rank``'s ``axis`` group, standing for its siblings' identical ones.

        Latency-bound collectives (under ``SMALL_COLLECTIVE_BYTES``, e.g. a gradient-norm
        all-reduce) put negligible load on links: only the issuing group's flows are placed.
        """
        group = self.mesh.group(rank, axis)
        instances = (group,) if nbytes * count < SMALL_COLLECTIVE_BYTES else self.instances(rank, axis)
        return CommOp(op, group, nbytes, _stream_of_axis(axis), instances, algorithm, count)

    # -- building --------------------------------------------------------------------------

    def build(self) -> Program:
        ranks = self.simulated_ranks()
        for rank in ranks:
            self._emit_rank(rank)
        represents = {r: self.mesh.world // len(ranks) for r in ranks}
        initial = {r: self._initial_memory(r) for r in ranks}
        return self.pb.build(ranks, represents, initial)

    def _initial_memory(self, rank: int) -> dict[str, float]:
        stage = self.mesh.stage(rank)
        params = self.layout.params_of_stage(stage)
        per = model_state_bytes_per_param(self.sc.training.precision, self.sc.training.optimizer)
        states = self.strategy.model_states(stage, params, per)
        return {
            "params": states.params,
            "grads": states.grads,
            "optimizer": states.optimizer,
            "buffers": self.strategy.static_buffers(params),
            "other": CUDA_CONTEXT_BYTES,
        }

    def _emit_rank(self, rank: int) -> None:
        par = self.sc.parallelism
        stage = self.mesh.stage(rank)
        m = self.sc.micro_batches
        schedule = pipeline_schedule(par.pipeline_schedule, par.pp, stage, m, par.virtual_stages)
        last_b = {}
        for i, action in enumerate(schedule):
            if action.kind == "B":
                last_b[action.chunk] = i
        ctx = _RankContext(rank=rank, stage=stage)
        ctx.strategy_state = self.strategy.start_rank(self, rank)
        for i, action in enumerate(schedule):
            if action.kind == "F":
                self._forward(ctx, action)
            else:
                self._backward(ctx, action, last=(last_b[action.chunk] == i))
        self.strategy.finish_rank(self, ctx)
        ctx.finished = True

    # forward / backward of one chunk for one micro-batch

    def units_of(self, chunk: Chunk) -> list[int]:
        """Units of a chunk in forward order: 0 = embedding, layer + 1, layers + 1 = logits."""
        units = [0] if chunk.embedding else []
        units += [layer + 1 for layer in chunk.layers]
        if chunk.logits:
            units.append(self.sc.model.layers + 1)
        return units

    def _unit_kind(self, unit: int) -> tuple[str, int]:
        if unit == 0:
            return "embedding", -1
        if unit == self.sc.model.layers + 1:
            return "logits", self.sc.model.layers
        return "block", unit - 1

    def _forward(self, ctx: _RankContext, action: Action) -> None:
        chunk = self.layout.chunk_of(ctx.stage, action.chunk)
        mb = action.microbatch
        deps: list[int] = []
        if chunk.index > 0:
            deps.append(self._p2p_recv(ctx, chunk.index - 1, chunk.index, mb, "act"))
        deps = self._run_units(ctx, chunk, self.units_of(chunk), "fwd", mb, deps, last=False)
        if not chunk.logits:
            self._p2p_send(ctx, chunk.index, chunk.index + 1, mb, "act", deps)

    def _backward(self, ctx: _RankContext, action: Action, *, last: bool) -> None:
        chunk = self.layout.chunk_of(ctx.stage, action.chunk)
        mb = action.microbatch
        deps: list[int] = []
        if not chunk.logits:
            deps.append(self._p2p_recv(ctx, chunk.index + 1, chunk.index, mb, "grad"))
        deps = self._run_units(ctx, chunk, list(reversed(self.units_of(chunk))), "bwd", mb, deps, last=last)
        if not chunk.embedding:
            self._p2p_send(ctx, chunk.index, chunk.index - 1, mb, "grad", deps)

    def _run_units(self, ctx: _RankContext, chunk: Chunk, units: list[int], phase: str, mb: int, deps: list[int],
                   *, last: bool) -> list[int]:
        """Emit the units of one pass, fused into as few tasks as the strategy's hooks allow."""
        for group in self._groups(ctx, units, phase, last):
            for unit in group:
                deps = self.strategy.before(self, ctx, unit, phase, mb, deps)
            if self.fuse_layers:
                task = self._emit_macro(ctx, chunk, tuple(group), phase, mb, deps)
            else:
                task = self._emit_unit_steps(ctx, chunk, group[0], phase, mb, deps)
            deps = [task]
            for unit in group:
                self.strategy.after(self, ctx, unit, phase, mb, task, last=last)
        return deps

    def _groups(self, ctx: _RankContext, units: list[int], phase: str, last: bool) -> list[list[int]]:
        """Runs of units with no strategy hook between them (one unit each without fusion)."""
        if not self.fuse_layers:
            return [[u] for u in units]
        cut = self.strategy.boundary_units(ctx.stage, phase, last)
        groups: list[list[int]] = [[]]
        for unit in units:
            groups[-1].append(unit)
            if cut is None or unit in cut:
                groups.append([])
        return [g for g in groups if g]

    # -- one unit: its steps as separate tasks (TP collectives on the network) ----------------

    def _unit_jobs(self, unit: int, phase: str) -> list[tuple[str, str, int, list[TimedStep], float, float]]:
        """(kind, phase, layer, steps, bytes allocated at start, bytes changed at end) of a unit,
        in execution order (a block under full recomputation replays its forward first)."""
        kind, layer = self._unit_kind(unit)
        stored = {"embedding": self._embedding_activation, "logits": self._logits_activation,
                  "block": lambda: self.activation_per_layer}[kind]()
        if phase == "fwd":
            return [(kind, "fwd", layer, self.steps(kind, "fwd"), 0.0, stored)]
        jobs = []
        if kind == "block" and self.sc.training.recompute == "full":
            jobs.append((kind, "recompute", layer, self.steps(kind, "fwd"), 0.0, 0.0))
        workspace = self.backward_workspace if kind == "block" else 0.0
        jobs.append((kind, "bwd", layer, self.steps(kind, "bwd"), workspace, -(workspace + stored)))
        return jobs

    def _emit_unit_steps(self, ctx: _RankContext, chunk: Chunk, unit: int, phase: str, mb: int,
                         deps: list[int]) -> int:
        last = -1
        for kind, job_phase, layer, steps, mem_start, mem_end in self._unit_jobs(unit, phase):
            last = self._emit_steps(ctx, kind, job_phase, steps, mb, chunk, layer, deps, mem_start=mem_start,
                                    mem_end=mem_end)
            deps = [last]
        return last

    def _emit_steps(self, ctx: _RankContext, kind: str, phase: str, steps: list[TimedStep], mb: int, chunk: Chunk,
                    layer: int, deps: list[int], *, mem_start: float = 0.0, mem_end: float = 0.0) -> int:
        """Emit one layer's steps as tasks; returns the id of its last compute task."""
        rank = ctx.rank
        label = f"{'recompute.' if phase == 'recompute' else ''}{kind}{'' if layer < 0 else layer}"
        pending_overlap: int | None = None
        last = -1
        n_compute = sum(1 for s in steps if isinstance(s.step, ComputeStep))
        seen = 0
        for timed in steps:
            step = timed.step
            if isinstance(step, CommStep):
                axis: Axis = "cp" if step.axis == "cp" else "tp"
                comm = self.comm(rank, step.op, axis, step.nbytes)
                join = (axis, comm.group, mb, chunk.index, layer, phase, step.name)
                tid = self.pb.add(rank, axis, step.name, axis, comm=comm, join=join, deps=list(deps),
                                  meta={"mb": mb, "layer": layer, "phase": phase})
                if step.overlap:
                    pending_overlap = tid
                else:
                    deps = [tid]
                continue
            seen += 1
            mem: list[MemDelta] = []
            if seen == 1 and mem_start:
                mem.append(MemDelta(False, mem_start, "activations"))
            if seen == n_compute and mem_end:
                mem.append(MemDelta(True, mem_end, "activations"))
            tid = self.pb.add(rank, "compute", f"{label}.{step.name}", "compute", duration_s=timed.duration_s,
                              deps=list(deps), mem=tuple(mem),
                              meta={"mb": mb, "layer": layer, "phase": phase, "flops": timed.flops,
                                    "chunk": chunk.index})
            deps = [tid] + ([pending_overlap] if pending_overlap is not None else [])
            pending_overlap = None
            last = tid
        ctx.last_compute = last
        # a trailing overlapped collective must finish before the next layer
        if pending_overlap is not None:
            last = self.pb.add(rank, "compute", f"{label}.join", "compute", deps=[last, pending_overlap])
            ctx.last_compute = last
        return last

    # -- fused: a run of units as one task with its inner timeline ---------------------------

    def _emit_macro(self, ctx: _RankContext, chunk: Chunk, units: tuple[int, ...], phase: str, mb: int,
                    deps: list[int]) -> int:
        macro = self._macro(units, phase)
        first_kind, first_layer = self._unit_kind(units[0])
        last_kind, last_layer = self._unit_kind(units[-1])
        name = f"{phase}.{first_kind}{'' if first_layer < 0 else first_layer}"
        if len(units) > 1:
            name += f"..{last_kind}{'' if last_layer < 0 else last_layer}"
        join = None
        if not self.symmetric and macro.has_comm:
            join = ("layers", self.mesh.group(ctx.rank, "tp_cp"), mb, chunk.index, phase, units[0])
        meta = {"mb": mb, "phase": phase, "chunk": chunk.index, "layer": first_layer, "units": (units[0], units[-1]),
                "flops": macro.flops, "compute_s": macro.compute_s, "comm_s": macro.comm_s,
                "exposed_s": macro.exposed_s, "parts": macro.parts, "nominal_s": macro.duration_s}
        task = self.pb.add(ctx.rank, "compute", name, "compute", duration_s=macro.duration_s, deps=deps, join=join,
                           mem=macro.mem, meta=meta)
        ctx.last_compute = task
        return task

    def _macro(self, units: tuple[int, ...], phase: str) -> Macro:
        kinds = tuple(self._unit_kind(u)[0] for u in units)
        key = (phase, kinds)
        found = self._macros.get(key)
        if found is None:
            jobs = [job for u in units for job in self._unit_jobs(u, phase)]
            found = self._macros[key] = self._timeline(jobs)
        return found

    def _timeline(self, jobs: list[tuple[str, str, int, list[TimedStep], float, float]]) -> Macro:
        """Lay steps end to end; an overlapped collective runs beside the next compute step.

        Collectives here are private to their group (see ``_layer_comm_private``): their
        time alone on the network is their time, so the timeline is exact.
        """
        t = compute = flops = 0.0
        comm: dict[str, float] = {}
        exposed: dict[str, float] = {}
        parts: list[tuple[str, str, float, float, str, float, int]] = []
        mem: list[MemDelta] = []
        rep = self.mesh.stage_representatives[0]
        groups = {"tp": self.mesh.group(rep, "tp"), "cp": self.mesh.group(rep, "cp")}
        for kind, job_phase, layer, steps, mem_start, mem_end in jobs:
            label = f"{'recompute.' if job_phase == 'recompute' else ''}{kind}{'' if layer < 0 else layer}"
            if mem_start:
                mem.append(MemDelta(False, mem_start, "activations", t))
            pending: list[tuple[str, float]] = []
            for timed in steps:
                step = timed.step
                if isinstance(step, CommStep):
                    duration = self.comm_time(step.op, groups[step.axis], step.nbytes)
                    parts.append((f"{label}.{step.name}", step.axis, t, duration, step.op, step.nbytes,
                                  len(groups[step.axis])))
                    comm[step.axis] = comm.get(step.axis, 0.0) + duration
                    if step.overlap:
                        pending.append((step.axis, duration))
                    else:
                        t += duration
                        exposed[step.axis] = exposed.get(step.axis, 0.0) + duration
                    continue
                parts.append((f"{label}.{step.name}", "compute", t, timed.duration_s, "", 0.0, 1))
                compute += timed.duration_s
                flops += timed.flops
                longest_axis, longest = max(pending, key=lambda p: p[1], default=("tp", 0.0))
                segment = self._overlapped(timed.duration_s, longest)
                t += segment
                if longest > 0:  # the part of the segment that is not the kernel's own time
                    exposed[longest_axis] = exposed.get(longest_axis, 0.0) + segment - timed.duration_s
                pending = []
            for axis, d in pending:
                t += d
                exposed[axis] = exposed.get(axis, 0.0) + d
            if mem_end:
                mem.append(MemDelta(False, mem_end, "activations", t))
        return Macro(t, compute, comm, exposed, flops, tuple(parts), tuple(mem), bool(comm))

    def _embedding_activation(self) -> float:
        m, par = self.sc.model, self.sc.parallelism
        return embedding_activation_bytes(seq=m.seq_len, batch=self.sc.training.micro_batch, hidden=m.hidden,
                                          tp=par.tp, cp=par.cp, sequence_parallel=self.shard.sequence_parallel,
                                          dropout=m.dropout, act_bytes=self.shard.elem)

    def _logits_activation(self) -> float:
        m, par = self.sc.model, self.sc.parallelism
        return logits_activation_bytes(seq=m.seq_len, batch=self.sc.training.micro_batch, hidden=m.hidden,
                                       vocab=m.vocab, tp=par.tp, cp=par.cp,
                                       sequence_parallel=self.shard.sequence_parallel, act_bytes=self.shard.elem)

    def _overlapped(self, compute_s: float, comm_s: float) -> float:
        """A kernel of ``compute_s`` beside a collective of ``comm_s``: the kernel runs
        ``1 + overlap_slowdown`` times slower while the collective is in flight."""
        if comm_s <= 0:
            return compute_s
        slow = 1.0 + self.overlap_slowdown
        if compute_s * slow <= comm_s:
            return comm_s
        return comm_s + compute_s - comm_s / slow

    # pipeline point-to-point

    def _peer(self, rank: int, to_chunk: int) -> int:
        t, c, _, d = self.mesh.coords(rank)
        return self.mesh.rank(t, c, to_chunk % self.sc.parallelism.pp, d)

    def _p2p_bytes(self) -> float:
        m = self.sc.model
        return self.shard.norm_tokens * m.hidden * self.shard.elem

    def _p2p(self, ctx: _RankContext, src_chunk: int, dst_chunk: int, mb: int, what: str, *, sending: bool,
             deps: list[int]) -> int:
        rank = ctx.rank
        if sending:
            src, dst = rank, self._peer(rank, dst_chunk)
            pairs = tuple((x, self._peer(x, dst_chunk)) for x in self.siblings(rank))
        else:
            src, dst = self._peer(rank, src_chunk), rank
            pairs = tuple((self._peer(x, src_chunk), x) for x in self.siblings(rank))
        comm = CommOp("p2p", (src, dst), self._p2p_bytes(), "pp", pairs, "direct")
        t, c, _, d = self.mesh.coords(src)
        join: Hashable = ("pp", what, mb, src_chunk, dst_chunk, t, c, d)
        kind = "send" if sending else "recv"
        return self.pb.add(rank, f"pp.{kind}.{what}", f"{kind}.{what}", "pp", comm=comm, join=join, deps=deps,
                           meta={"mb": mb, "src": src, "dst": dst, "src_chunk": src_chunk, "dst_chunk": dst_chunk})

    def _p2p_send(self, ctx: _RankContext, src_chunk: int, dst_chunk: int, mb: int, what: str,
                  deps: list[int]) -> int:
        return self._p2p(ctx, src_chunk, dst_chunk, mb, what, sending=True, deps=deps)

    def _p2p_recv(self, ctx: _RankContext, src_chunk: int, dst_chunk: int, mb: int, what: str) -> int:
        posted = [ctx.last_compute] if ctx.last_compute >= 0 else []
        return self._p2p(ctx, src_chunk, dst_chunk, mb, what, sending=False, deps=posted)

    # optimizer

    def optimizer_task(self, ctx: _RankContext, deps: list[int], n_params: float, *, name: str = "optimizer",
                       mem: tuple[MemDelta, ...] = ()) -> int:
        kernel = optimizer_kernel(n_params, self.sc.training.precision, self.sc.training.optimizer)
        duration = kernels_time_s(self.profile, [kernel], self.sc.training.precision)
        task = self.pb.add(ctx.rank, "compute", name, "compute", duration_s=duration, deps=deps, mem=mem,
                           meta={"phase": "optimizer", "params": n_params})
        ctx.last_compute = task
        return task

    def marker(self, ctx: _RankContext, name: str, deps: list[int], mem: tuple[MemDelta, ...]) -> int:
        """A zero-time task that applies memory changes when its dependencies are done."""
        return self.pb.add(ctx.rank, "mem", name, "marker", deps=deps, mem=mem)


@dataclass
class _RankContext:
    rank: int
    stage: int
    last_compute: int = -1
    strategy_state: Any = None
    finished: bool = False


def _stream_of_axis(axis: str) -> str:
    return {"tp": "tp", "cp": "cp", "pp": "pp", "dp": "dp", "dp_shard": "shard", "dp_replicate": "dp",
            "tp_cp": "tp", "world": "dp"}.get(axis, axis)

