"""Fused-attention kernel speed from published benchmarks: rate by pass, mask, head dim, length.

A :class:`KernelRates` holds one kernel's measured throughput on one GPU (FLOP/s, the
FlashAttention papers' FLOP convention: forward ``4 * s^2 * d * heads * batch``, halved when
causal; backward 2.5x forward), for each pass (forward, backward) and mask (causal or not), per
head dimension, at a list of sequence lengths. :meth:`KernelRates.rate_flops_per_s`
interpolates linearly in log2(sequence length) and in log2(head dim) and clamps outside the
published points. :func:`complete` fills what a paper did not publish with the stated rules
(``topologies/kernels/attention.yaml``).

:class:`AttentionShape` says what one attention kernel call looks like to the table: the
sequence length of the block it runs (``s/cp`` under context parallelism, where each ring step
is a block of the local queries against one rank's keys), its head dim and the fraction of its
FLOPs in causally masked blocks (1 for a causal model without context parallelism; 1/cp with
load-balanced ring attention, where only the diagonal step is masked; 0 without a mask).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from simulator.costs.interp import interpolate_clamped

__all__ = ["AttentionShape", "KernelRates", "PassTable", "complete", "interpolate_log2",
           "SPEED_WITHOUT_TABLE"]

# Kernel speed relative to the compute profile's FLOP-efficiency curve on a GPU without a
# kernel table (V100, Trainium): FlashAttention-2 is "around 2x faster" than FlashAttention (Dao
# 2023, abstract) and 1.3-2.5x faster than the Triton FlashAttention of 2023 (Dao 2023, §4.1: the
# geometric middle 1.8); FlashAttention-3 is 1.5-2.0x faster than FlashAttention-2 (Shah et al.
# 2024, abstract: 1.5). Kernels without a relation (cudnn, triton) run at FlashAttention-2's.
SPEED_WITHOUT_TABLE: dict[str, float] = {"fa1": 0.5, "fa2": 1.0, "fa3": 1.5, "cudnn": 1.0, "triton": 1.0,
                                         "triton-2023": 1 / 1.8, "unfused": 1.0}

@dataclass(frozen=True)
class AttentionShape:
    """One attention call as the tables see it: block sequence length, head dim, masked share."""

    seq: float
    head_dim: float
    causal_fraction: float

    def __post_init__(self) -> None:
        if self.seq <= 0 or self.head_dim <= 0 or not 0.0 <= self.causal_fraction <= 1.0:
            raise ValueError(f"bad attention shape {self}")


def interpolate_log2(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear ``ys`` over log2(``xs``) at ``x``, clamped at both ends."""
    return interpolate_clamped([math.log2(v) for v in xs], ys, math.log2(x))


@dataclass(frozen=True)
class PassTable:
    """Rates (FLOP/s) of one pass and mask: head dim -> one rate per sequence length."""

    seq_lens: tuple[float, ...]
    by_head_dim: Mapping[int, tuple[float, ...]]

    def __post_init__(self) -> None:
        if not self.by_head_dim or any(len(r) != len(self.seq_lens) or min(r) <= 0
                                       for r in self.by_head_dim.values()):
            raise ValueError("a pass table needs positive rates, one per sequence length, for some head dim")
        if any(b <= a for a, b in zip(self.seq_lens, self.seq_lens[1:], strict=False)):
            raise ValueError("sequence lengths must increase")

    def rate(self, seq: float, head_dim: float) -> float:
        dims = sorted(self.by_head_dim)
        at_dims = [interpolate_log2(self.seq_lens, self.by_head_dim[d], seq) for d in dims]
        return interpolate_log2(dims, at_dims, head_dim)

    def scaled(self, factor: float) -> PassTable:
        return PassTable(self.seq_lens, {d: tuple(r * factor for r in rs) for d, rs in self.by_head_dim.items()})


@dataclass(frozen=True)
class KernelRates:
    """One kernel on one GPU: (backward, causal) -> :class:`PassTable`, all four present."""

    name: str
    tables: Mapping[tuple[bool, bool], PassTable]

    def __post_init__(self) -> None:
        missing = [k for k in ((False, False), (False, True), (True, False), (True, True)) if k not in self.tables]
        if missing:
            raise ValueError(f"kernel {self.name}: missing (backward, causal) tables {missing}")

    def rate_flops_per_s(self, seq: float, head_dim: float, *, causal: bool, backward: bool) -> float:
        """Published throughput at (``seq``, ``head_dim``), interpolated in log2 and clamped."""
        return self.tables[(backward, causal)].rate(seq, head_dim)

    def time_s(self, flops: float, shape: AttentionShape, *, backward: bool) -> float:
        """Seconds for ``flops`` at the table's rates: the masked share at the causal rate, the
        rest at the non-causal rate (both at ``shape.seq``)."""
        masked = flops * shape.causal_fraction
        seconds = 0.0
        if masked > 0:
            seconds += masked / self.rate_flops_per_s(shape.seq, shape.head_dim, causal=True, backward=backward)
        if flops - masked > 0:
            seconds += (flops - masked) / self.rate_flops_per_s(shape.seq, shape.head_dim, causal=False,
                                                                backward=backward)
        return seconds

    def scaled(self, factor: float, name: str | None = None) -> KernelRates:
        return KernelRates(name or self.name, {k: t.scaled(factor) for k, t in self.tables.items()})


def _ratio(num: PassTable, den: PassTable, base: PassTable) -> PassTable:
    """``base`` x num/den at each head dim the three share (elementwise over lengths)."""
    dims = set(num.by_head_dim) & set(den.by_head_dim) & set(base.by_head_dim)
    if not dims:
        raise ValueError("no head dim in common to derive a table from")
    return PassTable(base.seq_lens, {d: tuple(b * n / m for b, n, m in zip(
        base.by_head_dim[d], num.by_head_dim[d], den.by_head_dim[d], strict=True)) for d in sorted(dims)})


def complete(name: str, published: Mapping[tuple[bool, bool], PassTable],
             reference: KernelRates | None = None) -> KernelRates:
    """A kernel's four tables from what was published, by the rules of the data file:

    * backward causal = backward non-causal x (forward causal / forward non-causal);
    * no backward at all = forward x (``reference`` backward / ``reference`` forward), per mask
      (``reference`` is FlashAttention-2 on the same GPU).
    """
    tables = dict(published)
    if (True, False) not in tables and (True, True) not in tables:
        if reference is None:
            raise ValueError(f"kernel {name}: no backward table and no reference kernel to derive one")
        for causal in (False, True):
            ref_f, ref_b = reference.tables[(False, causal)], reference.tables[(True, causal)]
            tables[(True, causal)] = _ratio(ref_b, ref_f, tables[(False, causal)])
    if (True, True) not in tables:
        tables[(True, True)] = _ratio(tables[(False, True)], tables[(False, False)], tables[(True, False)])
    return KernelRates(name, tables)
