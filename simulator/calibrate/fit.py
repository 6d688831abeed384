"""From measurements to profile numbers (pure functions, numpy only; no torch).

The fits invert the simulator's own cost model (``simulator.costs.compute``), so that a
kernel of a measured size is predicted at its measured time:

* compute kernels take ``FLOPs / (peak * efficiency) + launch``, hence
  ``efficiency = FLOPs / (peak * (t - launch))`` (with ``t - launch`` kept at least half of
  ``t``, so a kernel no longer than its launch does not blow up), clamped to (0, 1];
* memory-bound kernels take ``bytes / (bandwidth * memory_efficiency) + launch``;
* a collective takes ``alpha + D * beta`` (shared/REFERENCE.md §1.1), fitted by least squares on
  relative error so small and large messages weigh alike.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np

__all__ = [
    "MIN_EFFICIENCY",
    "compute_seconds",
    "achieved_rate",
    "efficiency_curve",
    "fit_alpha_beta",
]

MIN_EFFICIENCY = 1e-4


def compute_seconds(t_s: float, launch_s: float) -> float:
    """The part of a measured kernel time the roofline attributes to work: t - launch, at least t/2."""
    return max(t_s - launch_s, 0.5 * t_s)


def achieved_rate(work: float, t_s: float, launch_s: float) -> float:
    """Work (FLOPs or bytes) per second of the kernel's compute time."""
    return work / compute_seconds(t_s, launch_s)


def efficiency_curve(points: Sequence[tuple[float, float]], *, bin_decades: float = 0.25) -> dict[str, list[float]]:
    """An efficiency table ``{"log10_flops": [...], "efficiency": [...]}`` from (FLOPs, efficiency) points.

    Points are grouped into bins ``bin_decades`` wide in log10(FLOPs) starting at the smallest;
    each bin gives one table entry: the mean log10(FLOPs) and the median efficiency of its
    points (shapes of equal work but different aspect ratio share a bin). Efficiencies are
    clamped to [MIN_EFFICIENCY, 1]. The table is not forced to be monotone: it is what was
    measured.
    """
    usable = sorted((math.log10(f), e) for f, e in points if f > 0 and e > 0 and math.isfinite(e))
    if not usable:
        raise ValueError("an efficiency curve needs at least one point with positive FLOPs and efficiency")
    x0 = usable[0][0]
    bins: dict[int, list[tuple[float, float]]] = {}
    for x, e in usable:
        bins.setdefault(int((x - x0) / bin_decades), []).append((x, e))
    xs: list[float] = []
    ys: list[float] = []
    for _, members in sorted(bins.items()):
        x = round(sum(m[0] for m in members) / len(members), 3)
        y = round(min(1.0, max(MIN_EFFICIENCY, statistics.median(m[1] for m in members))), 4)
        if xs and x <= xs[-1]:
            continue
        xs.append(x)
        ys.append(y)
    return {"log10_flops": xs, "efficiency": ys}


def fit_alpha_beta(nbytes: Sequence[float], times_s: Sequence[float]) -> tuple[float, float]:
    """(alpha_s, beta_s_per_byte) of ``t = alpha + nbytes * beta``, both non-negative.

    Weighted least squares minimising the sum of squared *relative* residuals
    ``((alpha + n*beta - t) / t)^2``. When the unconstrained optimum has a negative
    coefficient, the best fit with that coefficient at zero is returned instead.
    """
    n = np.asarray(nbytes, dtype=float)
    t = np.asarray(times_s, dtype=float)
    if n.shape != t.shape or n.size < 2 or np.any(t <= 0):
        raise ValueError("an alpha-beta fit needs at least two (size, positive time) points")
    w = 1.0 / t
    design = np.stack([np.ones_like(n), n], axis=1) * w[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    if alpha < 0:  # through the origin: beta = sum(w^2 n t) / sum(w^2 n^2)
        alpha, beta = 0.0, float(np.sum(w * w * n * t) / np.sum(w * w * n * n))
    if beta < 0:  # constant: alpha = weighted mean
        alpha, beta = float(np.sum(w * w * t) / np.sum(w * w)), 0.0
    return float(alpha), float(beta)
