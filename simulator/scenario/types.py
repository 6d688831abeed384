"""Unit-carrying field types and the frozen base model, re-exported from :mod:`simulator.fields`
(they moved there so that :mod:`simulator.catalog` can use them without importing the scenario)."""

from simulator.fields import (
    PRECISIONS,
    Bytes,
    FlopRate,
    Fraction,
    Frozen,
    PositiveBytes,
    PositiveRate,
    Precision,
    Rate,
    Seconds,
)

__all__ = [
    "Frozen",
    "Bytes",
    "Rate",
    "Seconds",
    "FlopRate",
    "PositiveBytes",
    "PositiveRate",
    "Precision",
    "PRECISIONS",
    "Fraction",
]
