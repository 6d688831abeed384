"""Attention-kernel benchmark tables: the YAML format of ``topologies/kernels/attention.yaml``.

The file holds published fused-attention throughput (TFLOP/s) per kernel family table (one GPU
it was measured on, or an estimate derived from another table), and maps each catalog GPU to a
table (with a dense-peak scale where the GPU was not measured). :meth:`AttentionKernelsSpec.rates`
turns the tables of one GPU into the pure :class:`~simulator.costs.attention.KernelRates` the
cost model uses.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from simulator.costs.attention import KernelRates, PassTable, complete
from simulator.fields import Frozen

__all__ = ["MaskTables", "PassSpec", "KernelTableSpec", "FamilyTableSpec", "GpuKernelsSpec", "AttentionKernelsSpec"]

TFLOP = 1e12


class MaskTables(Frozen):
    """TFLOP/s per head dim (one value per sequence length) with and without the causal mask."""

    non_causal: dict[int, list[float]] | None = None
    causal: dict[int, list[float]] | None = None


class PassSpec(Frozen):
    fwd: MaskTables | None = None
    bwd: MaskTables | None = None


class KernelTableSpec(Frozen):
    """One kernel's published tables, or a derivation (``derived_from`` another kernel x ``factor``)."""

    source: str = Field(min_length=1)
    fwd: MaskTables | None = None
    bwd: MaskTables | None = None
    derived_from: str | None = None
    factor: float = Field(1.0, gt=0)
    derived: str | None = Field(None, description="the rule that fills what was not published")
    timing: Literal["table", "kernels"] = Field(
        "table", description="kernels: the table is a reference; dtsim costs this path kernel by kernel")
    note: str | None = None
    seq_lens: list[int] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> KernelTableSpec:
        if (self.derived_from is None) == (self.fwd is None):
            raise ValueError("a kernel table gives either fwd (and bwd) rates or derived_from")
        return self


class FamilyTableSpec(Frozen):
    """The kernels measured on one GPU (or estimated from another table x ``factor``)."""

    measured_on: str = Field(min_length=1)
    source: str = Field(min_length=1)
    derived_from_table: str | None = None
    factor: float = Field(1.0, gt=0)
    kernels: dict[str, KernelTableSpec]


class GpuKernelsSpec(Frozen):
    table: str
    scale: float = Field(1.0, gt=0, description="dense-peak ratio to the GPU the table was measured on")
    note: str | None = None


class AttentionKernelsSpec(Frozen):
    kind: Literal["dtsim-attention-kernels"] = "dtsim-attention-kernels"
    version: int = 1
    seq_lens: list[int] = Field(min_length=2)
    tables: dict[str, FamilyTableSpec]
    gpus: dict[str, GpuKernelsSpec]
    without_table: str = ""

    @model_validator(mode="after")
    def _references(self) -> AttentionKernelsSpec:
        for gpu, entry in self.gpus.items():
            if entry.table not in self.tables:
                raise ValueError(f"gpus.{gpu}.table: unknown table {entry.table!r} (known: {', '.join(self.tables)})")
        for name, fam in self.tables.items():
            if fam.derived_from_table is not None and fam.derived_from_table not in self.tables:
                raise ValueError(f"tables.{name}.derived_from_table: unknown table {fam.derived_from_table!r}")
        return self

    def kernels_for(self, gpu: str) -> list[str]:
        """Kernel names with a timing table on ``gpu`` (empty when the GPU has no table)."""
        entry = self.gpus.get(gpu)
        if entry is None:
            return []
        return sorted(k for k, v in self.tables[entry.table].kernels.items() if v.timing == "table")

    def rates(self, gpu: str) -> dict[str, KernelRates]:
        """The timing tables of every kernel on ``gpu``, in FLOP/s, completed and scaled."""
        entry = self.gpus.get(gpu)
        if entry is None:
            return {}
        return {k: self._kernel(entry.table, k).scaled(entry.scale) for k in self.kernels_for(gpu)}

    def _kernel(self, table: str, kernel: str) -> KernelRates:
        fam = self.tables[table]
        spec = fam.kernels[kernel]
        if spec.derived_from is not None:
            if fam.derived_from_table is not None:
                base = self._kernel(fam.derived_from_table, spec.derived_from).scaled(fam.factor)
            else:
                base = self._kernel(table, spec.derived_from)
            return base.scaled(spec.factor, kernel)
        seq = tuple(float(s) for s in (spec.seq_lens or self.seq_lens))
        published = {}
        for backward, masks in ((False, spec.fwd), (True, spec.bwd)):
            for causal in (False, True):
                by_dim = None if masks is None else (masks.causal if causal else masks.non_causal)
                if by_dim:
                    published[(backward, causal)] = PassTable(
                        seq, {d: tuple(r * TFLOP for r in rs) for d, rs in by_dim.items()})
        reference = self._kernel(table, "fa2") if kernel != "fa2" and "fa2" in fam.kernels else None
        return complete(kernel, published, reference)
