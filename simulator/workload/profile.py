"""The compute profile a simulation uses: a measured one (``cluster.calibration``) or the
built-in tables for the GPU, turned into the pure :class:`~simulator.costs.compute.ComputeProfile`."""

from __future__ import annotations

from pathlib import Path

from simulator.costs.compute import ComputeProfile, EfficiencyCurve
from simulator.errors import ScenarioError
from simulator.scenario.calibration import CurveSpec, builtin_profile_path, load_profile_spec
from simulator.scenario.hardware import GpuSpec

__all__ = ["compute_profile"]


def _curves(table: dict[str, CurveSpec]) -> dict[str, EfficiencyCurve]:
    return {k: EfficiencyCurve(tuple(v.log10_flops), tuple(v.efficiency)) for k, v in table.items()}


def compute_profile(gpu: GpuSpec, calibration: str | None) -> ComputeProfile:
    """The compute profile for ``gpu``: the measured one at ``calibration`` or the built-in."""
    path = Path(calibration) if calibration else builtin_profile_path(gpu.name)
    if not path.is_file():
        raise ScenarioError(f"no compute profile for GPU {gpu.name!r} at {path}", field="cluster.calibration")
    spec = load_profile_spec(str(path))
    peaks = {p: v for p in ("fp32", "tf32", "fp16", "bf16", "fp8") if (v := gpu.peak_flops_per_s(p))}  # type: ignore[arg-type]
    peaks.update(spec.peak_flops)
    name = str(path) if calibration else f"builtin:{gpu.name}"
    return ComputeProfile(
        name=name,
        peak_flops_per_s=peaks,
        memory_bandwidth_bytes_per_s=spec.memory_bandwidth_bytes_per_s or gpu.memory_bandwidth_bytes_per_s,
        gemm=_curves(spec.gemm),
        attention_fwd=_curves(spec.attention_fwd),
        attention_bwd=_curves(spec.attention_bwd),
        memory_efficiency=spec.memory_efficiency,
        launch_overhead_s=spec.launch_overhead_s,
        calibrated=spec.calibrated,
        source="; ".join(spec.sources) if spec.sources else str(spec.metadata.get("source", "")),
    )
