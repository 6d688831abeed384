"""Load of the network's link classes over time, from the engine's recorded series.

``run_simulation(..., record_series=True)`` keeps ``Simulation.series``: a list of snapshots
``(time_s, class_indices, load_bytes_per_s)``, each the complete load of every busy link
class from ``time_s`` until the next snapshot (classes not listed carry nothing). The load
of a class is the rate on *one* link of the class (under symmetry, the average over its
members), so ``load / capacity`` is that link's utilisation and the time integral of the
load is the bytes one link of the class carried (``LinkStat.bytes``).

:class:`LinkLoad` turns that record into the numbers traces and plots need: bytes per
class, the busiest classes, dense utilisation for chosen classes, and time-binned averages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

__all__ = ["LinkLoad"]


@dataclass(frozen=True)
class LinkLoad:
    """Piecewise-constant link-class loads between ``times_s[i]`` and ``times_s[i + 1]``.

    ``times_s``: non-decreasing snapshot times (s); ``classes[i]`` / ``loads_bytes_per_s[i]``:
    the busy classes of snapshot ``i`` and the load on one of their links (bytes/s);
    ``end_s``: when the last snapshot's load stops (the step end); ``labels``, ``kinds``,
    ``tiers``, ``capacity_bytes_per_s``: per class, indexed like the class indices.
    """

    times_s: np.ndarray
    classes: tuple[np.ndarray, ...]
    loads_bytes_per_s: tuple[np.ndarray, ...]
    end_s: float
    labels: tuple[str, ...]
    kinds: tuple[str, ...]
    tiers: tuple[str, ...]
    capacity_bytes_per_s: np.ndarray

    @classmethod
    def from_series(cls, series: dict[str, Any] | None, end_s: float) -> LinkLoad | None:
        """The load record of ``series`` (``Simulation.series``), or None when none was recorded.

        ``end_s`` (s) closes the last interval; it is raised to the last snapshot time if smaller.
        """
        if not series or not series.get("samples"):
            return None
        samples = series["samples"]
        times = np.array([float(t) for t, _, _ in samples])
        return cls(
            times_s=times,
            classes=tuple(np.asarray(c, dtype=np.int64) for _, c, _ in samples),
            loads_bytes_per_s=tuple(np.asarray(v, dtype=float) for _, _, v in samples),
            end_s=max(float(end_s), float(times[-1])),
            labels=tuple(series["labels"]),
            kinds=tuple(series["kinds"]),
            tiers=tuple(series["tiers"]),
            capacity_bytes_per_s=np.asarray(series["capacity"], dtype=float),
        )

    @property
    def n_classes(self) -> int:
        return len(self.labels)

    def durations_s(self) -> np.ndarray:
        """How long each snapshot's load lasts (s); zero for snapshots superseded at the same instant."""
        return np.diff(np.append(self.times_s, self.end_s))

    @cached_property
    def _flat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All snapshots' entries as flat arrays: (snapshot index, class index, load bytes/s)."""
        lengths = [len(c) for c in self.classes]
        snapshot = np.repeat(np.arange(len(self.classes)), lengths)
        if not snapshot.size:
            return snapshot, np.zeros(0, dtype=np.int64), np.zeros(0)
        return snapshot, np.concatenate(self.classes).astype(np.int64), np.concatenate(self.loads_bytes_per_s)

    def bytes_carried(self) -> np.ndarray:
        """Bytes one link of each class carried: the time integral of its load."""
        snapshot, cls, load = self._flat
        return np.bincount(cls, weights=load * self.durations_s()[snapshot], minlength=self.n_classes)

    def busiest(self, count: int) -> list[int]:
        """Indices of the ``count`` classes with the largest mean utilisation, busiest first
        (ties by label); classes that carried nothing are left out."""
        util = self.bytes_carried() / self.capacity_bytes_per_s
        order = sorted((i for i in range(self.n_classes) if util[i] > 0), key=lambda i: (-util[i], self.labels[i]))
        return order[:count]

    def dense_utilisation(self, chosen: Sequence[int]) -> np.ndarray:
        """Utilisation (load / capacity, a fraction) of the ``chosen`` classes at every
        snapshot: shape (snapshots, len(chosen))."""
        snapshot, cls, load = self._flat
        column = np.full(self.n_classes, -1, dtype=np.int64)
        column[np.asarray(chosen, dtype=np.int64)] = np.arange(len(chosen))
        keep = column[cls] >= 0
        out = np.zeros((len(self.times_s), len(chosen)))
        out[snapshot[keep], column[cls[keep]]] = load[keep] / self.capacity_bytes_per_s[cls[keep]]
        return out

    def binned_utilisation(self, chosen: Sequence[int], edges_s: np.ndarray) -> np.ndarray:
        """Time-averaged utilisation of the ``chosen`` classes in each bin ``[edges_s[k], edges_s[k+1])``:
        shape (len(chosen), len(edges_s) - 1). The average is exact for the piecewise-constant load."""
        util = self.dense_utilisation(chosen)  # (S, K)
        knots = np.append(self.times_s, self.end_s)
        # integral of utilisation from knots[0] up to each knot, per class
        cumulative = np.vstack([np.zeros(len(chosen)), np.cumsum(util * np.diff(knots)[:, None], axis=0)])
        widths = np.diff(edges_s)
        out = np.zeros((len(chosen), len(edges_s) - 1))
        for j in range(len(chosen)):
            at_edges = np.interp(edges_s, knots, cumulative[:, j])  # constant outside the record
            with np.errstate(divide="ignore", invalid="ignore"):
                out[j] = np.where(widths > 0, np.diff(at_edges) / widths, 0.0)
        return out
