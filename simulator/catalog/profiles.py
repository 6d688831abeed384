"""Compute (and communication) profiles: the YAML format.

A profile holds the efficiency tables of the roofline compute model for one GPU (and,
when measured with ``dtsim calibrate --comm``, alpha-beta fits of collectives). Built-in
profiles live in ``topologies/calibration/builtin/<gpu>.yaml``; a scenario selects a
measured one with ``cluster.calibration: PATH``. :meth:`simulator.catalog.Catalog.profile`
loads them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from simulator.fields import PRECISIONS, FlopRate, Fraction, Frozen, Rate, Seconds

__all__ = ["CurveSpec", "CommFit", "ProfileSpec", "COMM_OPS"]

# the collectives ``dtsim calibrate --comm`` measures and a profile's ``comm`` may hold
COMM_OPS = ("all_reduce", "all_gather", "reduce_scatter")


class CurveSpec(Frozen):
    """An efficiency curve: ``efficiency[i]`` at ``10 ** log10_flops[i]`` FLOPs, points in
    increasing order of size (read by a clamped piecewise-linear lookup)."""

    log10_flops: list[float] = Field(min_length=1)
    efficiency: list[Fraction] = Field(min_length=1)

    @model_validator(mode="after")
    def _points(self) -> CurveSpec:
        if len(self.log10_flops) != len(self.efficiency):
            raise ValueError(f"log10_flops has {len(self.log10_flops)} points but efficiency has "
                             f"{len(self.efficiency)}: every size needs one efficiency")
        if any(b <= a for a, b in zip(self.log10_flops, self.log10_flops[1:], strict=False)):
            raise ValueError("log10_flops must increase strictly from one point to the next")
        return self


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

    @field_validator("peak_flops", "gemm", "attention_fwd", "attention_bwd")
    @classmethod
    def _precisions(cls, table: dict[str, Any]) -> dict[str, Any]:
        return _only_known(table, PRECISIONS, "precision", "known")

    @field_validator("comm")
    @classmethod
    def _collectives(cls, fits: dict[str, CommFit]) -> dict[str, CommFit]:
        return _only_known(fits, COMM_OPS, "collective", "a profile measures")

    @property
    def measured_on(self) -> str:
        """The device the profile describes, as a person reads it (``cpu: Intel Xeon ...``, ``a100-40gb``)."""
        return self.device or self.gpu or "an unnamed device"


def _only_known(table: dict[str, Any], known: Any, what: str, lead: str) -> dict[str, Any]:
    """``table`` when every key is in ``known``, else a ValueError naming the first other key."""
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise ValueError(f"unknown {what} {unknown[0]!r} ({lead}: {', '.join(known)})")
    return table
