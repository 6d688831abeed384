"""Piecewise-linear interpolation of a measured table, clamped at its ends: the one lookup the
compute efficiency curves (over log10 FLOPs) and the attention kernel tables (over log2
sequence length and head dimension) share."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

__all__ = ["interpolate_clamped"]


def interpolate_clamped(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """``ys`` linearly between the points of increasing ``xs`` at ``x``; the end values outside."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
