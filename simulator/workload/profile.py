"""The compute profile a simulation uses: a measured one (``cluster.calibration``) or the
built-in tables for the GPU, turned into the pure :class:`~simulator.costs.compute.ComputeProfile`.

The built-in profile of a GPU with published attention-kernel benchmarks
(``topologies/kernels/attention.yaml``) carries them; a measured profile does not (its attention
curves describe the kernel it measured)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from simulator.catalog import Catalog, GpuSpec, default_catalog
from simulator.costs.compute import ComputeProfile, EfficiencyCurve
from simulator.costs.dtypes import nearest_precision
from simulator.errors import ScenarioError
from simulator.fields import PRECISIONS
from simulator.scenario.calibration import CurveSpec, ProfileSpec, builtin_profile_path, load_profile_spec

__all__ = ["compute_profile", "profile_from_spec"]



def _curves(table: dict[str, CurveSpec]) -> dict[str, EfficiencyCurve]:
    return {k: EfficiencyCurve(tuple(v.log10_flops), tuple(v.efficiency)) for k, v in table.items()}


def compute_profile(gpu: GpuSpec, calibration: str | None, catalog: Catalog | None = None) -> ComputeProfile:
    """The compute profile for ``gpu``: the measured one at ``calibration`` or the built-in
    (looked up in ``catalog``, default the default catalog)."""
    path = Path(calibration) if calibration else builtin_profile_path(gpu.name, catalog)
    if not path.is_file():
        raise ScenarioError(f"no compute profile for GPU {gpu.name!r} at {path}", field="cluster.calibration")
    spec = load_profile_spec(str(path), catalog)
    name = str(path) if calibration else f"builtin:{gpu.name}"
    profile = profile_from_spec(spec, gpu, name)
    if calibration or spec.calibrated:
        return profile
    kernels = (catalog or default_catalog()).attention_kernels.rates(gpu.name)
    return replace(profile, attention_kernels=kernels)


def profile_from_spec(spec: ProfileSpec, gpu: GpuSpec | None, name: str) -> ComputeProfile:
    """Turn a profile file's contents into a :class:`ComputeProfile`.

    A profile of a catalog GPU (``spec.gpu`` set) starts from ``gpu``'s datasheet peaks and
    HBM bandwidth; the profile's own ``peak_flops`` and ``memory_bandwidth`` override them.
    A profile measured on a device outside the catalog (``spec.gpu`` None: a CPU, or a GPU
    dtsim does not know) describes that device alone: only its own peaks and bandwidth are
    used, and a precision it did not measure runs at the peak of the nearest one it did
    (fp16 <-> bf16, tf32 <-> fp32, fp8 -> bf16, else the first listed), as its efficiency
    tables do. ``gpu`` may be None only for such a profile.
    """
    peaks: dict[str, float] = {}
    if spec.gpu is not None and gpu is not None:
        peaks = {p: v for p in PRECISIONS if (v := gpu.peak_flops_per_s(p))}  # type: ignore[arg-type]
    peaks.update(spec.peak_flops)
    if spec.gpu is None:
        if not spec.peak_flops:
            raise ScenarioError("a profile that names no catalog gpu needs peak_flops", field="peak_flops", file=name)
        for precision in PRECISIONS:
            if precision not in peaks:
                alias = nearest_precision(precision)  # a precision a measured profile lacks
                peaks[precision] = spec.peak_flops[alias] if alias in spec.peak_flops else next(
                    iter(spec.peak_flops.values()))
    bandwidth = spec.memory_bandwidth_bytes_per_s
    if bandwidth is None:
        if gpu is None or spec.gpu is None:
            raise ScenarioError("a profile that names no catalog gpu needs memory_bandwidth", field="memory_bandwidth",
                                file=name)
        bandwidth = gpu.memory_bandwidth_bytes_per_s
    return ComputeProfile(
        name=name,
        peak_flops_per_s=peaks,
        memory_bandwidth_bytes_per_s=bandwidth,
        gemm=_curves(spec.gemm),
        attention_fwd=_curves(spec.attention_fwd),
        attention_bwd=_curves(spec.attention_bwd),
        memory_efficiency=spec.memory_efficiency,
        launch_overhead_s=spec.launch_overhead_s,
        sustained_compute_fraction=spec.sustained_compute_fraction,
        calibrated=spec.calibrated,
        source="; ".join(spec.sources) if spec.sources else str(spec.metadata.get("source", "")),
    )
