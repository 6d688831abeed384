"""Scaling efficiency of a throughput curve (pure arithmetic; the sweep and the figures share it).

A point with ``N`` GPUs against the curve's smallest run (``N0`` GPUs; the highest
throughput among several such runs): ``efficiency = throughput_N / (N / N0 * throughput_N0)``.
1 is perfect linear scaling.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["scaling_efficiency"]


def scaling_efficiency(gpus: Sequence[float], throughput: Sequence[float]) -> list[float]:
    """Efficiency of each point against the baseline above, in input order.

    Raises ValueError for empty or unequal inputs or a non-positive baseline.
    """
    if len(gpus) != len(throughput) or not gpus:
        raise ValueError("gpus and throughput must be non-empty and of equal length")
    n0 = float(min(gpus))
    t0 = max(float(t) for n, t in zip(gpus, throughput, strict=True) if float(n) == n0)
    if n0 <= 0 or t0 <= 0:
        raise ValueError(f"baseline needs positive GPUs and throughput, got {n0} GPUs, {t0}")
    return [float(t) / (float(n) / n0 * t0) for n, t in zip(gpus, throughput, strict=True)]
