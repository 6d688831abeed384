"""Measurements -> a profile mapping in the ``ProfileSpec`` format, and writing it as YAML.

:func:`build_profile` applies the fits of :mod:`simulator.calibrate.fit`:

* ``peak_flops[dtype]``: the catalog GPU's dense peak for the dtype when the device is a
  catalog GPU (efficiency is then achieved / datasheet peak, like the built-in tables); for
  a CPU or an unknown GPU, which have no datasheet peak here, the best GEMM rate measured
  (so the best measured GEMM has efficiency 1, and MFU-like ratios mean "of what this
  device reached").
* ``gemm`` / ``attention_fwd`` / ``attention_bwd``: efficiency tables over log10 FLOPs.
* ``memory_bandwidth``: the catalog HBM bandwidth for a catalog GPU, else the fastest
  memory-bound kernel measured (on a CPU often a cache-resident one);
  ``memory_efficiency``: the achieved bandwidth of the block's own memory-bound ops (norms,
  dropout + residual adds, activation; forward and backward, each as often as the block
  runs it: total bytes the simulator charges / total time) over ``memory_bandwidth``. One
  number serves every memory-bound kernel of the model, so it is fitted to the mix a
  training step runs; the stream copy/add and the optimizer step are kept in the metadata
  (on CPUs an activation function is compute-bound and far from the copy rate).
* ``launch_overhead``: the median time of a one-element kernel issued back to back.

Quantities are written with units (``"1.02 us"``, ``"25.3 GB/s"``, ``"190.2 GFLOP/s"``), as in
the built-in profiles; every raw measurement goes into ``metadata.measurements``.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from simulator import units
from simulator.calibrate.device import DeviceInfo
from simulator.calibrate.fit import achieved_rate, compute_seconds, efficiency_curve
from simulator.calibrate.kernels import AttentionPoint, BlockOpPoint, GemmPoint, MemoryPoint
from simulator.calibrate.timing import Timing
from simulator.catalog import GpuSpec
from simulator.scenario.calibration import ProfileSpec

__all__ = ["build_profile", "write_profile", "validate_profile"]


def _gemm_peak(points: list[GemmPoint], launch_s: float, gpu: GpuSpec | None, dtype: str) -> tuple[float, str]:
    if gpu is not None:
        peak = gpu.peak_flops_per_s(dtype)  # type: ignore[arg-type]
        if peak:
            return peak, f"{gpu.name} datasheet dense {dtype} peak"
    best = max(achieved_rate(p.flops, p.timing.median_s, launch_s) for p in points)
    return best, "best GEMM rate measured (no datasheet peak for this device)"


def build_profile(*, device: DeviceInfo, gpu: GpuSpec | None, dtype: str, launch: Timing, gemms: list[GemmPoint],
                  attention: list[AttentionPoint], block_ops: list[BlockOpPoint], memory: list[MemoryPoint],
                  metadata: dict[str, Any]) -> dict[str, Any]:
    """The profile mapping (without ``closed_loop`` and ``comm``, added by the caller)."""
    launch_s = launch.median_s
    peak, peak_source = _gemm_peak(gemms, launch_s, gpu, dtype)

    def eff(flops: float, t_s: float) -> float:
        return achieved_rate(flops, t_s, launch_s) / peak

    gemm_curve = efficiency_curve([(p.flops, eff(p.flops, p.timing.median_s)) for p in gemms])
    fwd_curve = efficiency_curve([(a.forward_flops, eff(a.forward_flops, a.forward.median_s)) for a in attention])
    bwd_curve = efficiency_curve([(a.backward_flops, eff(a.backward_flops, a.backward_s)) for a in attention])
    rates = [achieved_rate(m.nbytes, m.timing.median_s, launch_s) for m in memory]
    op_rates = [achieved_rate(op.forward_bytes, op.forward.median_s, launch_s) for op in block_ops]
    op_rates += [achieved_rate(op.backward_bytes, op.backward_s, launch_s) for op in block_ops]
    if gpu is not None:
        bandwidth, bandwidth_source = gpu.memory_bandwidth_bytes_per_s, f"{gpu.name} datasheet"
    else:
        bandwidth, bandwidth_source = max(rates + op_rates), "fastest memory-bound kernel measured"
    op_bytes = sum(op.count * (op.forward_bytes + op.backward_bytes) for op in block_ops)
    op_seconds = sum(op.count * (compute_seconds(op.forward.median_s, launch_s)
                                 + compute_seconds(op.backward_s, launch_s)) for op in block_ops)
    typical = op_bytes / op_seconds if op_seconds > 0 else statistics.median(rates)
    memory_efficiency = min(1.0, max(0.001, typical / bandwidth))
    measurements = {
        "launch": launch.as_dict(),
        "gemm": [{"m": p.shape.m, "n": p.shape.n, "k": p.shape.k, "flops": p.flops, **p.timing.as_dict(),
                  "efficiency": round(eff(p.flops, p.timing.median_s), 4)} for p in gemms],
        "attention": [{"batch": a.shape.batch, "heads": a.shape.heads, "seq": a.shape.seq,
                       "head_dim": a.shape.head_dim, "causal": a.shape.causal,
                       "forward_flops": a.forward_flops, "forward": a.forward.as_dict(),
                       "forward_backward": a.forward_backward.as_dict(), "backward_s": a.backward_s}
                      for a in attention],
        "memory": [{"kernel": m.name, "nbytes": m.nbytes, **m.timing.as_dict(),
                    "bytes_per_s": achieved_rate(m.nbytes, m.timing.median_s, launch_s)} for m in memory],
        "block_memory_ops": [{"op": op.name, "count": op.count, "forward_bytes": op.forward_bytes,
                              "forward": op.forward.as_dict(), "forward_backward": op.forward_backward.as_dict(),
                              "backward_s": op.backward_s} for op in block_ops],
    }
    return {
        "kind": "dtsim-compute-profile",
        "version": 1,
        "gpu": device.catalog_gpu,
        "device": f"{device.kind}: {device.name}",
        "calibrated": True,
        "memory_bandwidth": units.format_rate(bandwidth, 5),
        "memory_efficiency": round(memory_efficiency, 4),
        "launch_overhead": units.format_time(launch_s, 4),
        "peak_flops": {dtype: units.format_flop_rate(peak, 5)},
        "gemm": {dtype: gemm_curve},
        "attention_fwd": {dtype: fwd_curve},
        "attention_bwd": {dtype: bwd_curve},
        "comm": {},
        "metadata": {**metadata, "peak_flops_source": peak_source, "memory_bandwidth_source": bandwidth_source,
                     "measurements": measurements},
        "closed_loop": {},
        "sources": [f"measured with dtsim calibrate on {device.kind} {device.name} ({dtype})"],
    }


def validate_profile(profile: dict[str, Any]) -> ProfileSpec:
    """Check a profile mapping against the file format (pydantic ValidationError if wrong)."""
    return ProfileSpec.model_validate(profile)


def _yaml_node(value: Any, flow: bool = False) -> Any:
    if isinstance(value, dict):
        node = CommentedMap()
        for k, v in value.items():
            node[k] = _yaml_node(v, flow=k in ("log10_flops", "efficiency"))
        return node
    if isinstance(value, list | tuple):
        seq = CommentedSeq(_yaml_node(v) for v in value)
        if flow or all(not isinstance(v, dict | list | tuple) for v in value):
            seq.fa.set_flow_style()
        return seq
    return value


def write_profile(profile: dict[str, Any], path: str | Path) -> Path:
    """Validate ``profile`` and write it to ``path`` (parent folders created) as YAML."""
    validate_profile(profile)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    root = _yaml_node(profile)
    root.yaml_set_start_comment(
        "Compute profile measured by `dtsim calibrate` (see metadata). Use it in a scenario with\n"
        "cluster.calibration: PATH, or: dtsim run SCENARIO --set cluster.calibration=PATH (on a cluster of\n"
        "another GPU than the one measured, also cluster.calibration_other_device: true)")
    yaml = YAML()
    yaml.default_flow_style = False
    yaml.width = 120
    with path.open("w", encoding="utf-8") as f:
        yaml.dump(root, f)
    return path
