"""A lower bound of a candidate's step time, to take candidates best first and stop early.

Part of step 4 of the search (:mod:`simulator.search`): every candidate gets a lower bound
of its step time from its own compute and unhidden tensor-parallel traffic
(:func:`step_bound_s`, milliseconds), and the candidates are taken in order of that bound.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simulator.scenario import Scenario

__all__ = ["step_bound_s", "stage_passes", "bound_from_passes"]


def stage_passes(scenario: Scenario, profile: Any = None, workload: Any = None,
                 comm_s: Callable[[Any, int], float] | None = None,
                 nccl: Any = None) -> tuple[Any, list[float], list[float]]:
    """The workload of ``scenario`` (without its program) and, per pipeline stage, one
    micro-batch's forward and backward seconds through all its chunks: the layers' steps as
    the simulator costs them (:meth:`LayerEmitter.steps <simulator.workload.layers.LayerEmitter.steps>`;
    a second forward per layer under ``full`` recomputation, ``selective``'s replay is in the
    backward), the tensor- and context-parallel collectives that nothing overlaps charged
    their least possible time: every rank must receive ``(n-1)/n`` of the bytes through its
    NVLink (or PCIe) port, ``(n-1)/n * nbytes / port bandwidth``; or ``comm_s(step, n)``
    seconds when given (``n``: the step's group size). ``workload``: the scenario's, when
    already built; ``nccl``: the catalog's NCCL constants (default: the default catalog's)."""
    from simulator.workload import build_workload, compute_profile
    from simulator.workload.steps import CommStep

    par, cluster = scenario.parallelism, scenario.cluster
    if profile is None:
        profile = compute_profile(cluster.gpu_spec, cluster.calibration)
    builder = workload or build_workload(scenario, profile, gpus_per_node=cluster.gpus_in_node, nccl=nccl)
    layers = builder.layers
    gpu = cluster.gpu_spec
    port_bytes_per_s = max(gpu.nvlink.bandwidth_bytes_per_s if gpu.nvlink else 0.0,
                           cluster.node_type.pcie.x16_bytes_per_s)
    group = {"tp": par.tp, "cp": par.cp}

    def seconds(kind: str, phase: str) -> float:
        total = 0.0
        for timed in layers.steps(kind, phase):
            step = timed.step
            if isinstance(step, CommStep):
                n = group.get(step.axis, 1)
                if comm_s is not None:
                    total += comm_s(step, n)
                elif not step.overlap and n > 1:
                    total += (n - 1) / n * step.nbytes / port_bytes_per_s
            else:
                total += timed.duration_s
        return total

    fwd = {kind: seconds(kind, "fwd") for kind in ("embedding", "block", "logits")}
    bwd = {kind: seconds(kind, "bwd") for kind in ("embedding", "block", "logits")}
    if scenario.training.recompute == "full":
        bwd["block"] += fwd["block"]
    forward, backward = [], []  # per stage, one micro-batch through all its chunks
    for stage in range(par.pp):
        f = b = 0.0
        for chunk in builder.layout.chunks_of_stage(stage):
            units = [("block", len(chunk.layers) + chunk.mtp), ("embedding", int(chunk.embedding)),
                     ("logits", int(chunk.logits) + chunk.mtp)]  # a multi-token prediction layer: a block and logits
            f += sum(n * fwd[kind] for kind, n in units)
            b += sum(n * bwd[kind] for kind, n in units)
        forward.append(f)
        backward.append(b)
    return builder, forward, backward


def step_bound_s(scenario: Scenario, profile: Any = None) -> float:
    """A lower bound of the simulated step time, from the busiest pipeline stage's own work.

    Per micro-batch, a stage runs its layers' forward and backward passes
    (:func:`stage_passes`: compute as the simulator costs it, unhidden tensor- and
    context-parallel traffic at its least possible time). The step is at least ``m`` times
    that (``m / 2`` under DualPipe, whose micro-batches each pass one of a rank's two chunks);
    with 1F1B the first stage also waits, before its first backward, for micro-batch 0
    to go through the later stages and back, less the forwards it runs meanwhile. No other
    communication, bubble or the optimizer step: the simulated step is never shorter.
    """
    _, forward, backward = stage_passes(scenario, profile)
    return bound_from_passes(scenario, forward, backward)


def bound_from_passes(scenario: Scenario, forward: list[float], backward: list[float]) -> float:
    """:func:`step_bound_s` from the stages' passes (:func:`stage_passes`)."""
    par = scenario.parallelism
    m = scenario.micro_batches
    # a DualPipe rank takes half the micro-batches through each of its two chunks
    share = 0.5 if par.pipeline_schedule == "dualpipe" else 1.0
    bound = share * m * max(f + b for f, b in zip(forward, backward, strict=True))
    if par.pp > 1 and par.pipeline_schedule == "1f1b":
        # stage 0 runs p forwards, then waits for micro-batch 0's forward and backward through
        # every later stage before its first backward (Narayanan et al. 2021, Fig. 4)
        wait = sum(forward[1:]) + sum(backward[1:]) - (min(par.pp, m) - 1) * forward[0]
        bound = max(bound, m * (forward[0] + backward[0]) + max(0.0, wait))
    return bound
