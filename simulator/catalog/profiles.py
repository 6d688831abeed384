"""Compute (and communication) profiles: the YAML format.

A profile holds the efficiency tables of the roofline compute model for one GPU (and,
when measured with ``dtsim calibrate --comm``, alpha-beta fits of collectives). Built-in
profiles live in ``topologies/calibration/builtin/<gpu>.yaml``; a scenario selects a
measured one with ``cluster.calibration: PATH``. :meth:`simulator.catalog.Catalog.profile`
loads them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from simulator.fields import FlopRate, Fraction, Frozen, Rate, Seconds

__all__ = ["CurveSpec", "CommFit", "ProfileSpec"]


class CurveSpec(Frozen):
    log10_flops: list[float] = Field(min_length=1)
    efficiency: list[Fraction] = Field(min_length=1)


class CommFit(Frozen):
    """alpha-beta fit of one collective measured with torch.distributed: t = alpha + n * beta."""

    alpha_s: Seconds = Field(alias="alpha")
    beta_s_per_byte: float = Field(alias="beta", ge=0)
    ranks: int = Field(ge=2)
    backend: str
    bus_bandwidth_bytes_per_s: Rate | None = Field(None, alias="bus_bandwidth")


class ProfileSpec(Frozen):
    kind: Literal["dtsim-compute-profile"] = "dtsim-compute-profile"
    version: int = 1
    gpu: str | None = Field(None, description="catalog GPU the tables describe (None: a CPU or other device)")
    device: str | None = None
    calibrated: bool = False
    memory_bandwidth_bytes_per_s: Rate | None = Field(None, alias="memory_bandwidth")
    memory_efficiency: Fraction = 0.85
    launch_overhead_s: Seconds = Field(4e-6, alias="launch_overhead")
    sustained_compute_fraction: Fraction = Field(
        1.0, description="tensor-core throughput in a long training run relative to the tables' short benchmarks")
    peak_flops: dict[str, FlopRate] = Field(default_factory=dict)
    gemm: dict[str, CurveSpec]
    attention_fwd: dict[str, CurveSpec]
    attention_bwd: dict[str, CurveSpec]
    comm: dict[str, CommFit] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    closed_loop: dict[str, Any] = Field(default_factory=dict)
    sources: list[str] = Field(default_factory=list)
