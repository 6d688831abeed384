"""Sentences that make a run's surprising parts visible: the cluster's bandwidths, the effective
settings that decide overlap, why exposed communication dominates, and settings that do nothing.

``dtsim run`` and the HTML report print the same lines. Nothing here simulates: the "why"
lines read the critical rank's breakdown (``Result.breakdown``) and name the setting that
explains it.

* :func:`bandwidth_lines`: per-NIC and per-node scale-out bandwidth (``nic_bandwidth`` is per
  NIC) and the NVLink / PCIe bandwidth of one GPU, so that a unit mistake shows.
* :func:`overlap_settings`: the settings that decide whether gradient communication overlaps
  the backward pass, with their *effective* values (``zero.overlap_comm: null`` is DeepSpeed's
  "true for stage 3 only", printed as ``false`` for stages 1 and 2).
* :func:`why_lines`: one line for each kind of communication whose exposed time is at least
  :data:`WHY_SHARE` of the step, naming the setting responsible when one is.
* :func:`setting_notes`: settings that have no effect in this layout (``sequence_parallel``
  with tp 1).
"""

from __future__ import annotations

from typing import Any

from simulator import units

__all__ = ["WHY_SHARE", "bandwidth_lines", "overlap_settings", "why_lines", "setting_notes"]

WHY_SHARE = 0.25
"""Exposed communication of one kind at or above this fraction of the step time gets a "why" line."""

_STAGE_DEFAULT = {"zero1": False, "zero2": False, "zero3": True, "mics": True}  # DeepSpeed: True for stage 3 only
_KIND_NAMES = {"dp": "data-parallel gradient", "shard": "sharded-parameter", "tp": "tensor-parallel",
               "cp": "context-parallel", "pp": "pipeline send/recv", "offload": "optimizer offload"}


def _bits(rate_bytes_per_s: float) -> str:
    return units.format_rate(rate_bytes_per_s * units.BITS_PER_BYTE).replace("B/s", "b/s")


def bandwidth_lines(cluster: Any) -> list[str]:
    """Scale-out (per NIC and per node, one direction) and intra-node bandwidth of ``cluster``
    (a resolved :class:`~simulator.scenario.spec.ClusterSpec`)."""
    node = cluster.node_type
    per_nic = cluster.fabric.nic_bandwidth_bytes_per_s or node.nics.bandwidth_bytes_per_s
    count = node.nics.count
    lines = [f"scale-out: {count} NIC x {_bits(per_nic)} per NIC = {_bits(count * per_nic)} "
             f"({units.format_rate(count * per_nic)}) per node, each direction"]
    intra = node.intra_node
    gpu = cluster.gpu_spec
    if intra.kind == "nvswitch" and gpu.nvlink is not None:
        fast = f"NVLink {units.format_rate(gpu.nvlink.bandwidth_bytes_per_s)} per GPU (NVSwitch)"
    elif intra.kind in ("nvlink-mesh", "torus") and intra.link_bandwidth_bytes_per_s is not None:
        fast = f"{intra.kind} {units.format_rate(intra.link_bandwidth_bytes_per_s)} per link"
    else:
        fast = "no NVLink"
    pcie = f"PCIe gen{node.pcie.generation} x16 {units.format_rate(node.pcie.x16_bytes_per_s)}"
    lines.append(f"intra-node: {fast}; {pcie}, each direction")
    return lines


def _overlap_setting(scenario: Any) -> tuple[str, bool, str] | None:
    """(path, effective value, where it came from) of the setting that decides whether the
    gradient reduction overlaps the backward pass; None where no single switch does (FSDP)."""
    par = scenario.parallelism
    if par.sharding == "none":
        path = "parallelism.ddp.overlap"
        return path, par.ddp.overlap, _source_text(scenario, path, "PyTorch DDP default")
    if par.sharding in _STAGE_DEFAULT:
        path = "parallelism.zero.overlap_comm"
        value = par.zero.overlap_comm
        if value is None:
            stages = "stage 3" if _STAGE_DEFAULT[par.sharding] else "stages 1 and 2"
            return path, _STAGE_DEFAULT[par.sharding], f"DeepSpeed default for {stages}"
        return path, value, _source_text(scenario, path, "DeepSpeed default")
    return None


def _source_text(scenario: Any, path: str, default: str) -> str:
    source = scenario.source_of(path)
    if source == "default":
        return default
    return "set in the scenario" if source == "scenario" else f"{source} profile"


def overlap_settings(scenario: Any) -> list[tuple[str, str, str]]:
    """(path, effective value as a file writes it, source) of the setting deciding gradient overlap,
    when the framework rows (``Scenario.framework_settings``) do not already show it with a value."""
    setting = _overlap_setting(scenario)
    if setting is None:
        return []
    path, value, source = setting
    shown = {p: v for p, v, _ in scenario.framework_settings()}
    if path in shown and shown[path] is not None:
        return []
    return [(path, "true" if value else "false", source)]


def why_lines(scenario: Any, breakdown: Any, step_time_s: float) -> list[str]:
    """Why the exposed communication of each kind at or above :data:`WHY_SHARE` of the step is
    exposed: the setting that keeps it off the backward pass, or that it outlasts the compute."""
    lines: list[str] = []
    if step_time_s <= 0:
        return lines
    par = scenario.parallelism
    for kind, exposed in breakdown.exposed_comm_s.items():
        share = exposed / step_time_s
        if share < WHY_SHARE:
            continue
        name = _KIND_NAMES.get(kind, kind)
        head = f"{name} communication is {100 * share:.0f}% of the step, exposed"
        reason = _reason(scenario, kind)
        if reason is None:
            in_flight = breakdown.comm_s.get(kind, exposed)
            reason = (f"it is in flight {units.format_time(in_flight)} against {units.format_time(breakdown.compute_s)} "
                      "of compute to hide behind: the links, not a setting, limit it")
            if kind == "tp" and par.tp > scenario.cluster.gpus_in_node:
                reason = f"tp {par.tp} spans nodes ({scenario.cluster.gpus_in_node} GPUs per node): it runs over the NICs"
        lines.append(f"{head}: {reason}")
    return lines


def _reason(scenario: Any, kind: str) -> str | None:
    par = scenario.parallelism
    if kind == "dp":
        setting = _overlap_setting(scenario)
        if setting is not None and not setting[1]:
            path, _, source = setting
            op = "all-reduce"
            if par.sharding != "none" and par.zero.gradient_reduction == "reduce_scatter":
                op = "reduce-scatter"
            return f"{op} not overlapped with the backward: {path.removeprefix('parallelism.')}=false ({source})"
    if kind == "tp" and 1 < par.tp <= scenario.cluster.gpus_in_node and not par.tp_comm_overlap:
        return ("collectives run between the GEMMs: parallelism.tp_comm_overlap=false "
                f"({_source_text(scenario, 'parallelism.tp_comm_overlap', 'dtsim default')})")
    if kind == "pp" and par.p2p_blocking:
        return (f"sends hold their rank: parallelism.p2p_blocking=true "
                f"({_source_text(scenario, 'parallelism.p2p_blocking', 'dtsim default')})")
    if kind == "offload" and par.offload_optimizer:
        return "optimizer states cross PCIe each step: parallelism.offload_optimizer=true"
    return None


def setting_notes(scenario: Any) -> list[str]:
    """Settings that have no effect in this layout."""
    par = scenario.parallelism
    notes = []
    if par.sequence_parallel and par.tp == 1:
        notes.append("parallelism.sequence_parallel=true has no effect with tp 1: sequence parallelism splits "
                     "the LayerNorm and dropout activations over the tensor-parallel group (Megatron-LM, "
                     "Korthikanti et al. 2022)")
    return notes
