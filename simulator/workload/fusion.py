"""Fused layers: a run of units as one compute task with its inner timeline.

When the collectives inside layers (tp, cp) cross links no other traffic uses
(:func:`layer_comm_private`), a layer's collectives can be costed alone and laid out beside
its kernels in closed form, so a run of layers becomes one engine task instead of dozens.
:func:`fuse` lays the steps end to end; an overlapped collective runs beside the next compute
step, which is slowed as the engine would slow it (:func:`~simulator.costs.overlap.overlapped_time_s`).
The task keeps the inner timeline (:class:`~simulator.ir.FusedPart`) for traces and the
breakdown.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from simulator.cluster.mesh import Mesh
from simulator.costs.overlap import overlapped_kernel_time_s, overlapped_time_s
from simulator.ir import FusedPart, MemDelta
from simulator.workload.steps import CommStep, TimedStep

__all__ = ["Macro", "Job", "CommCost", "fuse", "layer_comm_private", "job_label"]


class CommCost(NamedTuple):
    """A collective alone on its links: its time, and the algorithm and protocol chosen for it
    (None: no choice was made, e.g. a group of one rank)."""

    time_s: float
    algorithm: str | None = None
    protocol: str | None = None


CommTime = Callable[[str, tuple[int, ...], float, str | None], CommCost]  # op, group, bytes, forced algorithm


@dataclass(frozen=True)
class Job:
    """One layer pass to run: its steps, and the activation bytes allocated at its start and
    changed at its end. ``phase`` is fwd, bwd or recompute (a full recomputation's forward).
    ``held``: a working set allocated at its start and freed at its end; with one, ``mem_end``
    changes halfway through the last compute step instead, while the set is still live (what
    a forward keeps is made before its temporaries are freed, so it never lands in their
    freed memory)."""

    kind: str
    phase: str
    layer: int
    steps: list[TimedStep]
    mem_start: float
    mem_end: float
    held: float = 0.0


def job_label(kind: str, phase: str, layer: int) -> str:
    return f"{'recompute.' if phase == 'recompute' else ''}{kind}{'' if layer < 0 else layer}"


@dataclass(frozen=True)
class Macro:
    """A fused run of layers: total time, inner split, trace parts and memory changes at offsets."""

    duration_s: float
    compute_s: float
    comm_s: dict[str, float]
    exposed_s: dict[str, float]
    flops: float
    parts: tuple[FusedPart, ...]
    mem: tuple[MemDelta, ...]
    has_comm: bool


def layer_comm_private(mesh: Mesh, gpus_per_node: int, node_kind: str) -> bool:
    """True when the collectives inside layers (tp, cp) cross links no other traffic uses:
    the group sits in one NVSwitch node and every other group has at most one member per
    node. Then a layer's collectives can be costed alone and fused into its compute."""
    g = gpus_per_node
    if mesh.tp * mesh.cp == 1:
        return True
    if node_kind != "nvswitch" or any(r // g != 0 for r in mesh.group(0, "tp_cp")):
        return False
    for group in ("dp_cp", "pp", "dp_shard", "dp_replicate", "embedding"):
        nodes = [r // g for r in mesh.group(0, group)]
        if len(nodes) != len(set(nodes)):
            return False
    return True


def fuse(jobs: list[Job], comm_time: CommTime, groups: dict[str, tuple[int, ...]], slowdown: float) -> Macro:
    """Lay steps end to end; an overlapped collective runs beside the next compute step.

    Collectives here are private to their group (see :func:`layer_comm_private`): their time
    alone on the network is their time, so the timeline is exact.
    """
    t = compute = flops = 0.0
    comm: dict[str, float] = {}
    exposed: dict[str, float] = {}
    parts: list[FusedPart] = []
    mem: list[MemDelta] = []
    for job in jobs:
        label = job_label(job.kind, job.phase, job.layer)
        if job.mem_start:
            mem.append(MemDelta(False, job.mem_start, "activations", t))
        if job.held:
            mem.append(MemDelta(False, job.held, "activations", t))
        last_compute_s = t
        pending: list[tuple[str, float]] = []
        for timed in job.steps:
            step = timed.step
            if isinstance(step, CommStep):
                cost = comm_time(step.op, groups[step.axis], step.nbytes, step.algorithm)
                duration = cost.time_s
                parts.append(FusedPart(f"{label}.{step.name}", step.axis, t, duration, step.op, step.nbytes,
                                       len(groups[step.axis]), job.layer, job.phase, algorithm=cost.algorithm,
                                       protocol=cost.protocol))
                comm[step.axis] = comm.get(step.axis, 0.0) + duration
                if step.overlap:
                    pending.append((step.axis, duration))
                else:
                    t += duration
                    exposed[step.axis] = exposed.get(step.axis, 0.0) + duration
                continue
            longest_axis, longest = max(pending, key=lambda p: p[1], default=("tp", 0.0))
            last_compute_s = t
            # the kernel's slice lasts as long as it runs, slowed while the collective beside it runs
            parts.append(FusedPart(f"{label}.{step.name}", "compute", t,
                                   overlapped_kernel_time_s(timed.duration_s, longest, slowdown), "", 0.0, 1,
                                   job.layer, job.phase, timed.flops, timed.kernels))
            compute += timed.duration_s
            flops += timed.flops
            segment = overlapped_time_s(timed.duration_s, longest, slowdown)
            t += segment
            if longest > 0:  # the part of the segment that is not the kernel's own time
                exposed[longest_axis] = exposed.get(longest_axis, 0.0) + segment - timed.duration_s
            pending = []
        for axis, d in pending:
            t += d
            exposed[axis] = exposed.get(axis, 0.0) + d
        if job.mem_end:
            mem.append(MemDelta(False, job.mem_end, "activations", (last_compute_s + t) / 2 if job.held else t))
        if job.held:
            mem.append(MemDelta(False, -job.held, "activations", t))
    return Macro(t, compute, comm, exposed, flops, tuple(parts), tuple(mem), bool(comm))
