"""A layer as a list of steps: compute steps (kernels on the compute stream) and the
collectives that in-layer parallelisms insert between them.

:func:`base_steps` is a layer with no in-layer parallelism: one compute step holding all its
kernels. The passes of :mod:`simulator.workload.parallel` (tensor, context) each rewrite the
step list; :class:`LayerSteps` caches the result per (unit kind, phase), timed with the
compute profile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from simulator.costs.compute import ComputeProfile
from simulator.scenario.spec import ModelSpec
from simulator.workload.model import (
    Kernel,
    Shard,
    backward_of,
    block_forward,
    embedding_forward,
    kernels_time_s,
    logits_forward,
)

__all__ = ["ComputeStep", "CommStep", "Step", "LayerSpec", "TimedStep", "base_steps", "attention_core"]

Phase = Literal["fwd", "bwd"]


@dataclass(frozen=True)
class ComputeStep:
    name: str
    kernels: tuple[Kernel, ...]


@dataclass(frozen=True)
class CommStep:
    name: str
    op: str
    nbytes: float
    overlap: bool = False  # runs concurrently with the next compute step
    axis: str = "tp"  # the mesh group: tp, or cp (context parallelism's key/value exchange)


Step = ComputeStep | CommStep


@dataclass(frozen=True)
class LayerSpec:
    """What an in-layer pass needs to know about the layer it rewrites."""

    model: ModelSpec
    shard: Shard
    kind: str  # embedding | block | logits
    phase: str  # fwd | bwd
    tp_overlap: bool = True
    comm_overlap: bool = False
    selective: bool = False  # selective recomputation: the backward re-runs the attention core


@dataclass(frozen=True)
class TimedStep:
    step: Step
    duration_s: float = 0.0
    flops: float = 0.0


def attention_core(fwd: list[Kernel]) -> list[Kernel]:
    """The attention core's kernels (fused attention, or scores/softmax/attn_v unfused)."""
    return [k for k in fwd if k.kind == "attention" or k.name in ("scores", "softmax", "attn_v")]


def base_steps(spec: LayerSpec) -> list[Step]:
    """The layer with no in-layer parallelism: one compute step of all its kernels."""
    model, shard = spec.model, spec.shard
    if spec.kind == "block":
        fwd = block_forward(model, shard)
        if spec.phase == "fwd":
            return [ComputeStep("fwd", tuple(fwd))]
        recompute = tuple(attention_core(fwd)) if spec.selective else ()
        return [ComputeStep("bwd", recompute + tuple(backward_of(fwd)))]
    if spec.kind == "embedding":
        fwd = embedding_forward(model, shard)
        return [ComputeStep("embedding", tuple(fwd))] if spec.phase == "fwd" else [
            ComputeStep("embedding.bwd", tuple(backward_of(fwd)))]
    fwd = logits_forward(model, shard)
    return [ComputeStep("logits", tuple(fwd))] if spec.phase == "fwd" else [
        ComputeStep("logits.bwd", tuple(backward_of(fwd)))]


def timed(steps: list[Step], profile: ComputeProfile, precision: str, attention_kernel: str) -> list[TimedStep]:
    """Each compute step with its roofline time and FLOPs; collectives untimed (the network's)."""
    out = []
    for step in steps:
        if isinstance(step, ComputeStep):
            duration = kernels_time_s(profile, list(step.kernels), precision, attention_kernel)
            out.append(TimedStep(step, duration, sum(k.flops for k in step.kernels)))
        else:
            out.append(TimedStep(step))
    return out
