"""Compute time of one GPU operation: a roofline with measured efficiency tables.

    time = max(FLOPs / (peak * eff_flops(FLOPs)), bytes / (HBM bandwidth * eff_mem)) + launch

``eff_flops`` is a table per op class (GEMM, fused attention forward/backward) and
precision, interpolated in log10(FLOPs) and clamped at its ends: small kernels cannot fill
the GPU, large ones approach a ceiling below the datasheet peak. The tables are data (a
:class:`ComputeProfile`), loaded from ``topologies/calibration/``: built-in defaults per GPU
from published measurements, or a profile measured with ``dtsim calibrate``.

Fused attention on a GPU with published kernel benchmarks (``topologies/kernels/attention.yaml``,
:mod:`simulator.costs.attention`) runs at the named kernel's rate for its sequence length,
head dim and mask instead of the FLOP curve:

    time = max(FLOPs / (rate(kernel, seq, head_dim, causal, pass) * sustained_compute_fraction),
               bytes / (HBM bandwidth * eff_mem)) + launch
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from simulator.costs.attention import SPEED_WITHOUT_TABLE, AttentionShape, KernelRates
from simulator.costs.dtypes import nearest_precision
from simulator.costs.interp import interpolate_clamped

__all__ = ["EfficiencyCurve", "ComputeProfile", "gemm_time_s", "attention_time_s", "memory_time_s", "roofline_time_s"]


@dataclass(frozen=True)
class EfficiencyCurve:
    """Piecewise-linear efficiency in log10 of the work (FLOPs), clamped at both ends."""

    log10_flops: tuple[float, ...]
    efficiency: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.log10_flops) != len(self.efficiency) or not self.log10_flops:
            raise ValueError("an efficiency curve needs matching, non-empty flops and efficiency lists")
        if any(b <= a for a, b in zip(self.log10_flops, self.log10_flops[1:], strict=False)):
            raise ValueError("efficiency curve flops must increase")
        if any(not 0 < e <= 1 for e in self.efficiency):
            raise ValueError("efficiencies must be in (0, 1]")

    def __call__(self, flops: float) -> float:
        return interpolate_clamped(self.log10_flops, self.efficiency, math.log10(max(flops, 1.0)))

    def scaled(self, factor: float) -> EfficiencyCurve:
        return EfficiencyCurve(self.log10_flops, tuple(min(1.0, e * factor) for e in self.efficiency))


@dataclass(frozen=True)
class ComputeProfile:
    """Everything the compute model needs for one GPU: peaks, efficiency tables, overheads.

    ``gemm``, ``attention_fwd`` and ``attention_bwd`` map a precision to its curve; a
    precision missing from a table falls back to the ``bf16`` (else first) entry.
    ``attention_kernels`` holds the published fused-attention tables of the GPU by kernel name
    (empty for a GPU without them and for a measured profile, whose attention curves describe
    the kernel it measured).
    """

    name: str
    peak_flops_per_s: dict[str, float]
    memory_bandwidth_bytes_per_s: float
    gemm: dict[str, EfficiencyCurve]
    attention_fwd: dict[str, EfficiencyCurve]
    attention_bwd: dict[str, EfficiencyCurve]
    memory_efficiency: float = 0.8
    launch_overhead_s: float = 4e-6
    sustained_compute_fraction: float = 1.0
    calibrated: bool = False
    source: str = ""
    extra: dict[str, float] = field(default_factory=dict)
    attention_kernels: dict[str, KernelRates] = field(default_factory=dict)

    def peak(self, precision: str) -> float:
        peak = self.peak_flops_per_s.get(precision)
        if peak is None:
            raise KeyError(f"no {precision} peak in compute profile {self.name}")
        return peak

    @staticmethod
    def _pick(table: dict[str, EfficiencyCurve], precision: str) -> EfficiencyCurve:
        if precision in table:
            return table[precision]
        alias = nearest_precision(precision)
        if alias in table:
            return table[alias]
        return next(iter(table.values()))

    def gemm_efficiency(self, flops: float, precision: str) -> float:
        return self._pick(self.gemm, precision)(flops) * self.sustained_compute_fraction

    def attention_efficiency(self, flops: float, precision: str, backward: bool) -> float:
        table = self.attention_bwd if backward else self.attention_fwd
        return self._pick(table, precision)(flops) * self.sustained_compute_fraction

    @property
    def memory_bytes_per_s(self) -> float:
        return self.memory_bandwidth_bytes_per_s * self.memory_efficiency


def roofline_time_s(flops: float, nbytes: float, flop_rate: float, byte_rate: float, launch_s: float) -> float:
    """max(FLOPs / achieved FLOP rate, bytes / achieved byte rate) + launch overhead."""
    compute = flops / flop_rate if flops > 0 else 0.0
    memory = nbytes / byte_rate if nbytes > 0 else 0.0
    return max(compute, memory) + launch_s


def gemm_time_s(profile: ComputeProfile, m: float, n: float, k: float, precision: str, elem_bytes: float) -> float:
    """One GEMM (m x k) @ (k x n) in ``precision``; bytes are the three operands once."""
    flops = 2.0 * m * n * k
    nbytes = (m * k + k * n + m * n) * elem_bytes
    rate = profile.peak(precision) * profile.gemm_efficiency(flops, precision)
    return roofline_time_s(flops, nbytes, rate, profile.memory_bytes_per_s, profile.launch_overhead_s)


def attention_time_s(
    profile: ComputeProfile, flops: float, nbytes: float, precision: str, *, backward: bool,
    kernel: str = "fa2", shape: AttentionShape | None = None,
) -> float:
    """A fused attention ``kernel`` executing ``flops`` (the FlashAttention FLOP convention).

    With the kernel's published table on this GPU and the call's ``shape``, the FLOPs run at
    the table's rate x ``sustained_compute_fraction`` (the masked share at the causal rate);
    otherwise at the profile's FLOP-efficiency curve, as if the work were ``flops / speed``
    (:data:`~simulator.costs.attention.SPEED_WITHOUT_TABLE`: the kernel's speed relative to
    FlashAttention-2, which the curves describe).
    """
    rates = profile.attention_kernels.get(kernel)
    if rates is not None and shape is not None:
        compute_s = rates.time_s(flops, shape, backward=backward) / profile.sustained_compute_fraction
        rate = flops / compute_s if compute_s > 0 else 1.0
    else:
        work = flops / SPEED_WITHOUT_TABLE[kernel]
        rate = profile.peak(precision) * profile.attention_efficiency(work, precision, backward) * flops / work
    return roofline_time_s(flops, nbytes, rate, profile.memory_bytes_per_s, profile.launch_overhead_s)


def memory_time_s(profile: ComputeProfile, nbytes: float, kernels: int = 1) -> float:
    """Memory-bound kernels (norms, softmax, elementwise, optimizer) moving ``nbytes``."""
    return nbytes / profile.memory_bytes_per_s + kernels * profile.launch_overhead_s
