"""From a scenario and its simulated step to the goodput of a whole run: the job's failure
rates, the checkpoint's size and cost, the restarts, the optimal interval and the expected
wall-clock, ETTR and cost (the formulas: :mod:`simulator.costs.goodput`).

* Failure rates add up over the job's components (independent, exponential): GPUs x 1/gpu_mtbf
  + nodes x 1/node_mtbf + scale-out NIC links (nodes x NICs per node) x 1/link_mtbf are hardware
  failures (a node leaves the job); nodes x 1/software_mtbf only restart it.
* Checkpoint bytes: every parameter's 16-bit (or fp32) copy plus its optimizer states, the
  project's model-state accounting (:func:`simulator.costs.memory.model_state_bytes_per_param`:
  2 + 12 bytes per parameter for mixed-precision Adam); gradients are not saved. Every node
  writes its share, as Megatron's distributed checkpoint does by default (fully parallel save,
  NVIDIA/Megatron-LM@d98e8a64 megatron/training/arguments.py:1766-1777), so a write takes
  bytes / min(store bandwidth, nodes x per-node bandwidth); a restart reads it the same way.
* Asynchronous checkpoints stop training only for each GPU's copy of its own states (the
  largest simulated rank's parameters + optimizer bytes) to host memory over PCIe; the write
  goes on behind the following steps, and a failure in that window loses one interval more
  (``write_s`` of :func:`~simulator.costs.goodput.replay`; on average ``write_s`` per failure).
* Hot spares: the nodes out for repair are Poisson with mean hardware-rate x repair_time (an
  M/G/inf queue), so a hardware failure finds no free spare with probability P(N >= spares) and
  then waits requeue_time; with ``elastic`` it goes on instead, and the data-parallel replicas of
  the nodes out (E[max(0, N - spares)]) are missing: throughput x (1 - those replicas / dp).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from simulator.costs.goodput import (
    RunTime,
    daly_interval_s,
    expected_run,
    poisson_at_least,
    poisson_excess,
    young_interval_s,
)
from simulator.costs.memory import model_state_bytes_per_param
from simulator.errors import ScenarioError
from simulator.scenario.reliability import ReliabilitySpec

__all__ = ["GoodputInputs", "GoodputEstimate", "inputs_for", "estimate", "checkpoint_bytes"]


def checkpoint_bytes(params: float, precision: str, optimizer: str) -> float:
    """Bytes of one checkpoint: parameters plus optimizer states (no gradients, no fp8 weight copies)."""
    per = model_state_bytes_per_param(precision, optimizer)
    return params * (per.params + per.optimizer)


@dataclass(frozen=True)
class GoodputInputs:
    """What the goodput of a run depends on, in SI units (one scenario, one simulated step)."""

    spec: ReliabilitySpec
    nodes: int
    gpus_per_node: int
    nics_per_node: int
    dp: int
    replicas_per_node: float  # data-parallel replicas a lost node takes out (at least 1)
    step_time_s: float
    tokens_per_step: float
    checkpoint_bytes: float
    snapshot_bytes_per_gpu: float
    snapshot_bandwidth_bytes_per_s: float
    node_type: str

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def scaled(self, nodes: int) -> GoodputInputs:
        """The same job on ``nodes`` nodes by adding or removing data-parallel replicas (weak
        scaling: the step time and the checkpoint stay, tokens per step follow dp)."""
        dp = max(1, round(self.dp * nodes / self.nodes))
        return replace(self, nodes=nodes, dp=dp, tokens_per_step=self.tokens_per_step * dp / self.dp)


def inputs_for(scenario: Any, result: Any) -> GoodputInputs:
    """The goodput inputs of a validated scenario with a ``reliability`` section (or the
    defaults) and its simulated :class:`~simulator.results.result.Result`."""
    spec = scenario.reliability or ReliabilitySpec()
    cluster, par = scenario.cluster, scenario.parallelism
    size = spec.checkpoint.size
    if size is None:
        size = checkpoint_bytes(result.params, scenario.training.precision, scenario.training.optimizer)
    snapshot = max(m.params_bytes + m.optimizer_bytes for m in result.memory)
    bandwidth = spec.checkpoint.snapshot_bandwidth or cluster.node_type.pcie.x16_bytes_per_s
    model_parallel = par.tp * par.pp * par.cp
    return GoodputInputs(
        spec=spec, nodes=cluster.n_nodes, gpus_per_node=cluster.gpus_in_node, nics_per_node=cluster.node_type.nics.count,
        dp=scenario.dp, replicas_per_node=max(1.0, cluster.gpus_in_node / model_parallel),
        step_time_s=result.step_time_s, tokens_per_step=float(scenario.tokens_per_step), checkpoint_bytes=size,
        snapshot_bytes_per_gpu=snapshot, snapshot_bandwidth_bytes_per_s=bandwidth, node_type=cluster.node_type.name)


@dataclass(frozen=True)
class GoodputEstimate:
    """The expected goodput of a run (and, with trials, the Monte-Carlo spread)."""

    tokens: float
    steps: int
    step_time_s: float
    hardware_mtbf_s: float
    software_mtbf_s: float
    job_mtbf_s: float
    checkpoint_bytes: float
    write_s: float
    read_s: float
    checkpoint_s: float  # training stops this long per checkpoint
    interval_s: float
    interval_steps: int
    interval_rule: str
    young_interval_s: float
    daly_interval_s: float
    restart_hardware_s: float
    restart_software_s: float
    spare_missing_probability: float
    throughput_factor: float
    run: RunTime
    nodes_paid: int
    usd_per_node_hour: float | None
    notes: tuple[str, ...] = ()
    spread: dict[str, dict[str, float]] | None = None

    @property
    def wall_s(self) -> float:
        return self.run.wall_s

    @property
    def ideal_s(self) -> float:
        """The run's failure-free wall-clock on the whole cluster: steps x simulated step time."""
        return self.steps * self.step_time_s

    @property
    def ettr(self) -> float:
        """Effective training time ratio: the failure-free time over the expected wall-clock (with
        ``elastic``, the steps run at reduced dp count as time lost, not as productive time)."""
        return self.ideal_s / self.wall_s if self.wall_s > 0 else 1.0

    @property
    def cost_usd(self) -> float | None:
        if self.usd_per_node_hour is None:
            return None
        return self.wall_s / 3600.0 * self.nodes_paid * self.usd_per_node_hour

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k not in ("run", "notes", "spread")}
        run = self.run
        data.update(wall_s=self.wall_s, ettr=self.ettr, cost_usd=self.cost_usd, failures=run.failures,
                    planned_interruptions=run.planned,
                    ideal_s=self.ideal_s,
                    breakdown={"productive_s": run.productive_s, "checkpoint_s": run.checkpoint_s,
                               "lost_s": run.lost_s, "restart_s": run.restart_s},
                    notes=list(self.notes), spread=self.spread)
        return data


def _transfer_s(nbytes: float, store: float | None, per_node: float | None, nodes: int) -> float:
    caps = [c for c in (store, per_node * nodes if per_node else None) if c]
    return nbytes / min(caps) if caps else 0.0


def estimate(inputs: GoodputInputs, tokens: float, *, usd_per_node_hour: float | None = None,
             interval_s: float | None = None) -> GoodputEstimate:
    """Expected wall-clock, ETTR and cost of training ``tokens`` (Daly's complete model, split
    into productive steps, checkpoint writes, lost work and restarts)."""
    spec, ck = inputs.spec, inputs.spec.checkpoint
    hw_rate = (inputs.gpus / spec.gpu_mtbf + inputs.nodes / spec.node_mtbf
               + inputs.nodes * inputs.nics_per_node / spec.link_mtbf)
    sw_rate = inputs.nodes / spec.software_mtbf
    rate = hw_rate + sw_rate
    mtbf = 1.0 / rate if rate > 0 else math.inf
    write = _transfer_s(inputs.checkpoint_bytes, ck.storage_write_bandwidth, ck.write_bandwidth_per_node, inputs.nodes)
    read = _transfer_s(inputs.checkpoint_bytes, ck.storage_read_bandwidth, ck.read_bandwidth_per_node, inputs.nodes)
    blocking = inputs.snapshot_bytes_per_gpu / inputs.snapshot_bandwidth_bytes_per_s if ck.asynchronous else write
    notes: list[str] = []
    out_mean = hw_rate * spec.repair_time
    missing = poisson_at_least(out_mean, spec.hot_spares)
    factor = 1.0
    restart_sw = spec.restart_time + read
    if spec.elastic:
        factor = 1.0 - poisson_excess(out_mean, spec.hot_spares) * inputs.replicas_per_node / inputs.dp
        if factor <= 0.0:
            raise ScenarioError(f"elastic: on average {out_mean:.1f} nodes are out for repair, more than the "
                                f"{inputs.dp} data-parallel replicas", field="reliability.elastic")
        restart_hw = restart_sw
    else:
        restart_hw = restart_sw + missing * spec.requeue_time
    steps = math.ceil(tokens / inputs.tokens_per_step)
    step_s = inputs.step_time_s / factor
    work = steps * step_s
    # no failures: no checkpoint needed; a free checkpoint (C = 0): every step
    young = young_interval_s(blocking, mtbf) if math.isfinite(mtbf) else math.inf
    daly = daly_interval_s(blocking, mtbf) if math.isfinite(mtbf) else math.inf
    chosen = interval_s if interval_s is not None else ck.interval
    rule = "given" if chosen is not None else ck.interval_rule
    if chosen is None:
        chosen = daly if ck.interval_rule == "daly" else young
    if ck.asynchronous and chosen < write:
        notes.append(f"interval raised to the asynchronous write time ({write:.0f} s): one write at a time")
        chosen = write
    interval_steps = max(1, min(steps, math.ceil(chosen / step_s - 1e-9))) if math.isfinite(chosen) else steps
    interval = interval_steps * step_s
    run = expected_run(work, interval, blocking, mtbf, [(hw_rate, restart_hw), (sw_rate, restart_sw)],
                       extra_lost_s=write if ck.asynchronous else 0.0, planned_mtbf_s=spec.planned_mtbf,
                       planned_restart_s=restart_sw)
    return GoodputEstimate(
        tokens=tokens, steps=steps, step_time_s=inputs.step_time_s,
        hardware_mtbf_s=1.0 / hw_rate if hw_rate else math.inf, software_mtbf_s=1.0 / sw_rate if sw_rate else math.inf,
        job_mtbf_s=mtbf, checkpoint_bytes=inputs.checkpoint_bytes, write_s=write, read_s=read, checkpoint_s=blocking,
        interval_s=interval, interval_steps=interval_steps, interval_rule=rule, young_interval_s=young,
        daly_interval_s=daly, restart_hardware_s=restart_hw, restart_software_s=restart_sw,
        spare_missing_probability=missing, throughput_factor=factor, run=run,
        nodes_paid=inputs.nodes + spec.hot_spares, usd_per_node_hour=usd_per_node_hour, notes=tuple(notes))
