"""A lower bound of a candidate's step time, to take candidates best first and stop early.

Part of step 4 of the search (:mod:`simulator.search`): every candidate gets a lower bound
of its step time from its own compute and unhidden tensor-parallel traffic
(:func:`step_bound_s`, milliseconds), and the candidates are taken in order of that bound.
"""

from __future__ import annotations

from typing import Any

from simulator.scenario import Scenario

__all__ = ["step_bound_s"]


def step_bound_s(scenario: Scenario, profile: Any = None) -> float:
    """A lower bound of the simulated step time, from the busiest pipeline stage's own work.

    Per micro-batch, a stage runs its layers' forward and backward steps
    (:meth:`LayerEmitter.steps <simulator.workload.layers.LayerEmitter.steps>`, costed as the simulator costs them; a second forward per
    layer under ``full`` recomputation, ``selective``'s replay is in the backward). The
    tensor- and context-parallel collectives between those steps that nothing overlaps are
    charged their least possible time: every rank must receive ``(n-1)/n`` of the bytes
    through its NVLink (or PCIe) port, ``(n-1)/n * nbytes / port bandwidth``. The step is at
    least ``m`` times that; with 1F1B the first stage also waits, before its first backward,
    for micro-batch 0 to go through the later stages and back, less the forwards it runs
    meanwhile. No other communication, bubble or the optimizer step: the simulated step is
    never shorter.
    """
    from simulator.workload import build_workload, compute_profile
    from simulator.workload.steps import CommStep

    par, cluster = scenario.parallelism, scenario.cluster
    if profile is None:
        profile = compute_profile(cluster.gpu_spec, cluster.calibration)
    builder = build_workload(scenario, profile, gpus_per_node=cluster.gpus_in_node)
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
                if not step.overlap and n > 1:
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
            units = [("block", len(chunk.layers)), ("embedding", int(chunk.embedding)), ("logits", int(chunk.logits))]
            f += sum(n * fwd[kind] for kind, n in units)
            b += sum(n * bwd[kind] for kind, n in units)
        forward.append(f)
        backward.append(b)
    m = scenario.micro_batches
    bound = m * max(f + b for f, b in zip(forward, backward, strict=True))
    if par.pp > 1 and par.pipeline_schedule == "1f1b":
        # stage 0 runs p forwards, then waits for micro-batch 0's forward and backward through
        # every later stage before its first backward (Narayanan et al. 2021, Fig. 4)
        wait = sum(forward[1:]) + sum(backward[1:]) - (min(par.pp, m) - 1) * forward[0]
        bound = max(bound, m * (forward[0] + backward[0]) + max(0.0, wait))
    return bound
